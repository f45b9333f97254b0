"""Rules of what the scenario's faults did to this row itself: killed, frozen, made to
raise, interrupted, starved of CPU, out of memory or of file descriptors."""

from __future__ import annotations

import re
import signal
from typing import Optional

from ..classify import signal_name
from ._core import RULES, UNKNOWN, Cause, RankContext, _exc_line, _first_line, diagnose, rule
from ._shared import _starved


@rule(order=520, evidence=("steps", "causes"))
def starved_in_init(c: RankContext) -> Optional[Cause]:
    """A rank the scenario starved of CPU (cpu_contention) that failed or hung before it was
    through init: it came to the store too late; what it met there follows."""
    v = c.verdict
    st = _starved(c, v.label)
    if st is None or v.outcome not in ("timeout", "error", "hang") or v.phase != "init":
        return None
    then = diagnose(c, [r for r in RULES if r is not starved_in_init])
    return Cause(f"starved of CPU by the scenario's cpu_contention fault ({st.what}), it was "
                 "still in init when the others had given up"
                 + (f": {then.text}" if then is not None and then.text != UNKNOWN else ""),
                 [_exc_line(v) if v.exception else v.reason])


@rule(order=110, evidence=("signals",))
def killed_by_the_fault(c: RankContext) -> Optional[Cause]:
    """A row the scenario's fault killed (SIGKILL, SIGTERM...): said with the fault and time."""
    v, o = c.verdict, c.obs
    if o is None or v.outcome != "crash" or v.returncode is None or v.returncode >= 0:
        return None
    sent = [s for s in o.signals
            if "SIG" + s.signal.removeprefix("SIG") == signal_name(v.returncode)]
    if not sent:
        return None
    s = sent[0]
    return Cause(f"killed by SIG{s.signal.removeprefix('SIG')}, sent by the scenario's fault"
                 f"{f' ({s.why})' if s.why else ''} at {s.t:g} s"
                 + (f", in {v.phase}" if v.phase else ""), [v.reason])


@rule(order=130, evidence=("signals",))
def frozen_by_the_fault(c: RankContext) -> Optional[Cause]:
    """A hung row the scenario's fault had stopped (SIGSTOP) and nobody resumed."""
    o = c.obs
    if o is None or c.verdict.outcome != "hang":
        return None
    stops = [s for s in o.signals if s.signal.removeprefix("SIG") == "STOP"]
    if not stops or any(s.signal.removeprefix("SIG") == "CONT" and s.t > stops[-1].t
                        for s in o.signals):
        return None
    return Cause(f"frozen by SIGSTOP, sent by the scenario's fault at {stops[-1].t:g} s, and "
                 "never resumed: alive but not running at the deadline", [c.verdict.reason])


@rule(order=132, evidence=("signals", "causes"))
def frozen_then_resumed(c: RankContext) -> Optional[Cause]:
    """A row the scenario's fault stopped (SIGSTOP) and later resumed (SIGCONT), that failed
    after it was resumed: its clocks (torch's timeouts) ran on while it was stopped, and the
    world it came back to had moved on; what it met then follows."""
    v, o = c.verdict, c.obs
    if o is None or v.outcome not in ("timeout", "error"):
        return None
    stops = [s.t for s in o.signals if s.signal.removeprefix("SIG") == "STOP"]
    conts = [s.t for s in o.signals if s.signal.removeprefix("SIG") == "CONT"
             and stops and s.t > stops[0]]
    if not stops or not conts or v.duration is None or v.duration < conts[0]:
        return None
    t1, t2 = stops[0], conts[0]
    then = diagnose(c, [r for r in RULES if r is not frozen_then_resumed])
    return Cause(f"frozen by SIGSTOP{f' in {v.phase}' if v.phase else ''} from {t1:g} s until "
                 f"the scenario's fault resumed it (SIGCONT) at {t2:g} s, {t2 - t1:.1f} s "
                 f"stopped while the others' clocks ran on; it failed {v.duration - t2:.2f} s "
                 "later" + (f": {then.text}" if then is not None and then.text != UNKNOWN
                            else ""),
                 [v.reason if not v.exception else _exc_line(v)])


# before torch_refused_the_setup (30): the fault's ValueError in init is no word of torch's
@rule(order=25, evidence=("exception", "plan"))
def raised_by_the_fault(c: RankContext) -> Optional[Cause]:
    """The scenario's raise_exception fault made this rank raise where it did."""
    v = c.verdict
    var = (c.plan_rank(v.label).get("variation") or {}).get("raise_at") or {}
    if v.outcome != "error" or not var or var.get("phase") != v.phase:
        return None
    exc = str(var.get("exception") or "")
    if exc and exc.rsplit(".", 1)[-1] != (v.exception or "").rsplit(".", 1)[-1]:
        return None
    return Cause(f"raised {exc or v.exception} in {v.phase}: the scenario's raise_exception fault "
                 f"(a bug in the rank's own code)", [_exc_line(v)])


@rule(order=50, evidence=("exception", "signals"))
def interrupted_by_the_fault(c: RankContext) -> Optional[Cause]:
    """KeyboardInterrupt from a SIGINT the scenario's fault sent."""
    v, o = c.verdict, c.obs
    if o is None or v.outcome != "error" or "KeyboardInterrupt" not in (v.exception or ""):
        return None
    sent = [s for s in o.signals if s.signal.removeprefix("SIG") == "INT"]
    if not sent:
        return None
    return Cause(f"interrupted: SIGINT, sent by the scenario's fault at {sent[0].t:g} s, became "
                 f"KeyboardInterrupt when control came back to Python in {v.phase}",
                 [_exc_line(v)])


@rule(order=55, evidence=("exception", "signals"))
def agent_signalled_by_the_fault(c: RankContext) -> Optional[Cause]:
    """A torchrun agent that raised SignalException for the signal the scenario's fault sent
    it (SIGINT as a Ctrl-C, SIGTERM as a scheduler): torchrun stops its workers with that
    signal, then raises."""
    v, o = c.verdict, c.obs
    if o is None or v.role != "agent" or v.outcome != "error" \
            or "SignalException" not in (v.exception or "") or not o.signals:
        return None
    for s in o.signals:
        name = s.signal.removeprefix("SIG")
        num = getattr(signal, "SIG" + name, None)
        if num is not None and f"got signal: {int(num)}" in v.message:
            return Cause(f"SIG{name}, sent by the scenario's fault at {s.t:g} s, made torchrun "
                         f"raise SignalException in {v.phase or 'its run'}: it stopped its "
                         f"workers with SIG{name} and exited", [_exc_line(v)])
    return None


MEMORY = re.compile(r"OOM killer|can't allocate memory|Cannot allocate memory|MemoryError", re.I)


@rule(order=70, evidence=("exception",))
def out_of_memory(c: RankContext) -> Optional[Cause]:
    """Killed by the OOM killer (a cgroup's limit), or an allocation refused (RLIMIT_AS)."""
    v = c.verdict
    said = (v.reason or "") + " " + (v.message or "")
    if v.outcome not in ("crash", "error") or not MEMORY.search(said):
        return None
    if v.outcome == "crash":
        return Cause(f"out of memory in {v.phase}: {v.reason}", [v.reason])
    return Cause(f"out of memory in {v.phase}: an allocation was refused "
                 f"({_first_line(v.message)[:160]})", [_exc_line(v)])


@rule(order=620, evidence=("exception", "steps"))
def out_of_descriptors(c: RankContext) -> Optional[Cause]:
    """A rank that ran out of file descriptors (a socket, a file)."""
    v = c.verdict
    if v.outcome not in ("error", "crash") or not re.search(r"Too many open files",
                                                           v.message or "", re.I):
        return None
    limit = next((st for st in c.run.step_log if st.fault == "open_files_limit"
                  and st.target == f"rank {v.label}"), None)
    return Cause(f"ran out of file descriptors in {v.phase} (Too many open files)"
                 + (f": the scenario's open_files_limit fault ({limit.what})" if limit else ""),
                 [_exc_line(v)])

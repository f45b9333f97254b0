"""Rules of a row that failed for a peer: a peer frozen, dead or re-initialised under it, a
monitored barrier on a rank that could no longer come, gloo's mesh waiting for a failed peer,
a hang in a collective with a dead peer."""

from __future__ import annotations

import re
from typing import Optional

from ..classify import Verdict, signal_name
from ._core import Cause, RankContext, Rule, _cause_of, _exc_line, rule
from ._shared import _job

GLOO_SAYS = re.compile(r"gloo", re.I)
PEER_CLOSED = re.compile(r"closed by peer|reset by peer|connection closed|connection reset|"
                         r"timed out connecting: SO_ERROR: Connection refused", re.I)


@rule(order=550, evidence=("signals",))
def a_peer_was_frozen(c: RankContext) -> Optional[Cause]:
    """A row that timed out (or hung) while another rank of its job sat frozen by SIGSTOP."""
    v = c.verdict
    if v.outcome not in ("timeout", "hang") or v.role not in ("rank", "worker"):
        return None
    frozen = []
    for o in c.run.ranks:
        if o.label == v.label or _job(o.label) != _job(v.label):
            continue
        stops = [x for x in o.signals if x.signal.removeprefix("SIG") == "STOP"]
        if stops and (v.duration is None or stops[-1].t <= v.duration) and not any(
                x.signal.removeprefix("SIG") == "CONT" and x.t > stops[-1].t for x in o.signals):
            frozen.append((o.label, stops[-1].t))
    if len(frozen) != 1:
        return None
    label, t = frozen[0]
    return Cause(f"waited in {v.phase} for rank {label}, frozen by SIGSTOP (sent by the "
                 f"scenario's fault at {t:g} s) and never resumed",
                 [_exc_line(v)] if v.exception else [v.reason])


# a peer's end is recorded after its sockets closed (the supervisor's poll, an agent's reaping
# loop, its own result event written after the raise): a rank that saw the connection close may
# have raised up to this much before its closer's recorded end
END_SLACK = 0.25


def _ended_at(c: RankContext, v: Verdict) -> float:
    """When a row ended: its duration, or earlier the time the scenario's fault sent the signal
    that killed it (the supervisor notices an exit on its next poll, after the peer that saw
    the connection close may already have raised)."""
    end = float(v.duration if v.duration is not None else 1e9)
    o = c.obs_of(v.label)
    if o is not None and v.outcome in ("error", "crash"):
        # an observed program's atexit said "exit": its sockets close while the interpreter
        # finishes, before the supervisor sees the process go (0.4-0.6 s later, a sys.exit
        # with torch loaded)
        left = next((e for e in o.events if e.ev == "phase" and e.phase == "exit"), None)
        if left is not None:
            end = min(end, c.t(left))
    if o is not None and v.outcome == "crash" and v.returncode is not None and v.returncode < 0:
        fatal = [x.t for x in o.signals
                 if "SIG" + x.signal.removeprefix("SIG") == signal_name(v.returncode)]
        if fatal:
            end = min(end, float(fatal[0]))
        # a worker its agent stopped: the agent reaped it before the supervisor saw it end
        for a in c.run.ranks:
            if a.role == "agent" and o.pid:
                reaped = next((e for e in a.events if e.ev == "reaped"
                               and e.data.get("pid") == o.pid), None)
                if reaped is not None:
                    end = min(end, c.t(reaped))
    return end


@rule(order=300, evidence=("exception", "verdicts", "signals", "events", "causes"))
def peer_died(c: RankContext) -> Optional[Cause]:
    """gloo's connection to a peer closed or reset: the one other rank that had ended before it
    (killed, or failed on its own)."""
    msg = c.verdict.message or ""
    # gloo's own words (its pair.cc, or "Gloo connectFullMesh failed"): the same reset on the
    # store's socket (a DistNetworkError from TCPStore) is not a gloo pair, and not this rule's
    if not PEER_CLOSED.search(msg) or not GLOO_SAYS.search(msg) or c.verdict.duration is None:
        return None
    at = re.search(r"\[([^\]]+)\]:(\d+)", msg)
    own_end = c.verdict.duration
    # a restart's workers mesh only with each other: the earlier attempt's were stopped first
    peers = [v for v in c.verdicts if v.label != c.verdict.label and v.role in ("rank", "worker")
             and v.duration is not None and (at is None or v.addr in (at.group(1), ""))
             and v.attempt == c.verdict.attempt]
    dead = [v for v in peers if v.outcome in ("crash", "error", "timeout")
            and _ended_at(c, v) <= own_end + END_SLACK]
    if len(dead) > 1:   # one killed, the others failing after it: the killed one is the cause
        crashed = [v for v in dead if v.outcome == "crash"]
        dead = crashed if len(crashed) == 1 else dead
    if len(dead) > 1:   # a peer that ended before this rank raised, over one inside the slack
        before = [v for v in dead if _ended_at(c, v) <= own_end]
        dead = before if len(before) == 1 else dead
    # a peer that finished its work and exited (ok) before this rank raised, while no failed
    # peer had ended yet: its exit closed the pair (a rank-dependent branch that skips work)
    finished = [v for v in peers if v.outcome == "ok" and _job(v.label) == _job(c.verdict.label)
                and float(v.duration or 0.0) <= own_end]
    if len(finished) == 1 and not any(_ended_at(c, v) <= own_end for v in dead):
        f = finished[0]
        where = f" ([{at.group(1)}]:{at.group(2)})" if at else ""
        return Cause(f"its gloo connection to rank {f.label}{where} was closed: rank {f.label} "
                     f"had finished its work and exited (ok) at {f.duration:g} s while this "
                     f"rank was still in {c.verdict.phase}", [_exc_line(c.verdict),
                                                              f"rank {f.label}: {f.reason}"])
    if len(dead) != 1:
        return None
    d = dead[0]
    where = f" ([{at.group(1)}]:{at.group(2)})" if at else ""
    return Cause(f"its gloo connection to rank {d.label}{where} was closed: "
                 f"{_how_it_ended(c, d, peer_died)}",
                 [_exc_line(c.verdict), f"rank {d.label}: {d.reason}"], blames=(d.label,))


def _how_it_ended(c: RankContext, d: Verdict, rule: Rule) -> str:
    """"rank L had died at T s: its own cause" (or "had ended (error)"): a peer's end as the
    cause of this row; its own cause leaves ``rule`` out, so the two never explain each other."""
    own = _cause_of(c, d.label, [rule]) or (_exc_line(d) if d.exception else d.reason)
    how = "died" if d.outcome == "crash" else f"ended ({d.outcome})"
    return f"rank {d.label} had {how} at {round(_ended_at(c, d), 3):g} s: {own}"


BARRIER_FAILED = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier in (\d+) ms")


@rule(order=310, evidence=("exception", "plan", "verdicts", "signals", "causes"))
def barrier_peer_died(c: RankContext) -> Optional[Cause]:
    """monitored_barrier (wait_all_ranks) on rank 0 names the ranks that failed to pass it in
    the same words whether they never came within its timeout or had died: gloo's recv from a
    dead peer fails at once, and torch drops that error. A named rank that had ended (killed,
    or failed) before this rank raised is the cause, not a wait."""
    v = c.verdict
    m = BARRIER_FAILED.search(v.message or "")
    if m is None or v.duration is None:
        return None
    named = {n.strip() for n in m.group(1).split(",") if n.strip()}
    dead = [o for o in c.verdicts
            if o.label != v.label and o.role in ("rank", "worker") and o.duration is not None
            and _job(o.label) == _job(v.label)
            and c.env(o.label).get("RANK", o.label.rsplit(":", 1)[-1]) in named
            and o.outcome in ("crash", "error", "timeout")
            and _ended_at(c, o) <= v.duration + END_SLACK]
    if not dead:
        return None
    said = "; ".join(_how_it_ended(c, d, barrier_peer_died) for d in dead)
    return Cause(f"its monitored_barrier failed before its {int(m.group(2)) / 1000:g} s were "
                 f"up, on a rank that could no longer come: {said}",
                 [_exc_line(v)] + [f"rank {d.label}: {d.reason}" for d in dead],
                 blames=tuple(d.label for d in dead))


# before peer_died: a peer that re-initialised closed it, then failed
@rule(order=290, evidence=("exception", "events"))
def peer_reinitialised(c: RankContext) -> Optional[Cause]:
    """gloo's connection to a peer closed while that peer, alive, had entered a ``reinit`` step:
    it destroyed the process group this rank still used."""
    msg = c.verdict.message or ""
    if not PEER_CLOSED.search(msg) or not GLOO_SAYS.search(msg) or c.verdict.duration is None or (
            c.obs is not None and any(e.ev == "phase" and str(e.data.get("step") or "")
                                      .startswith("reinit") for e in c.obs.events)):
        return None   # (this rank re-initialised too: its new group is not the old one)
    end = c.verdict.duration
    for o in c.run.ranks:
        if o.label == c.verdict.label or o.role not in ("rank", "worker"):
            continue
        step = next((e for e in o.events if e.ev == "phase" and e.data.get("step")
                     == "reinit" and c.at(e) <= end), None)
        if step is not None:
            return Cause(f"its gloo connection to rank {o.label} was closed: rank {o.label} "
                         f"destroyed the process group to initialise a new one ({step.phase}, "
                         f"reinit, at {c.t(step):g} s) while this rank still used the old one",
                         [_exc_line(c.verdict)])
    return None


@rule(order=680, evidence=("exception", "verdicts", "steps", "causes"))
def mesh_peer_failed(c: RankContext) -> Optional[Cause]:
    """gloo's connect timeout in init while the peer of the pair had already failed in init."""
    v = c.verdict
    if "connectFullMesh" not in (v.message or "") or not re.search(r"Connect timeout|timed out",
                                                                   v.message or "", re.I):
        return None
    ended = [o for o in c.verdicts if o.label != v.label and o.role == v.role
             and _job(o.label) == _job(v.label) and o.outcome in ("error", "crash", "timeout")
             and o.phase == "init" and o.duration is not None and v.duration is not None
             and o.duration < v.duration]
    # a peer that failed first; else one that gave up in init waiting in the store for this
    # rank's own key (this rank came late to it: the peer left, its pair never came up), when
    # no fault step of the scenario acted on the run (a proxy's delay, say: its rule speaks)
    failed = [o for o in ended if o.outcome != "timeout"]
    if not failed and not any(st.fault for st in c.run.step_log):
        failed = [o for o in ended
                  if re.match(rf"waited [\d.]+ s for rank {re.escape(v.label)}'s key",
                              _cause_of(c, o.label, [mesh_peer_failed]))]
    if not failed:
        return None
    f = failed[0]
    why = _cause_of(c, f.label, [mesh_peer_failed]) or _exc_line(f)
    how = "gave up (timeout)" if f.outcome == "timeout" else "failed"
    return Cause(f"gloo's full mesh never connected: rank {f.label} {how} in init at "
                 f"{f.duration:g} s ({why}); this rank waited for the pair until gloo's connect "
                 "timeout", [_exc_line(v), _exc_line(f)], blames=(f.label,))


@rule(order=560, evidence=("verdicts", "plan", "signals", "causes"))
def hung_with_a_dead_peer(c: RankContext) -> Optional[Cause]:
    """A rank hung in a collective after the one peer of its job that failed had died: the
    collective never completes, and torch's timeout did not end it."""
    v = c.verdict
    if v.outcome != "hang" or v.role not in ("rank", "worker") or v.phase in ("init", "import"):
        return None
    dead = [o for o in c.verdicts if o.label != v.label and o.role in ("rank", "worker")
            and _job(o.label) == _job(v.label) and o.outcome in ("crash", "error")
            and o.duration is not None]
    if len(dead) != 1:
        return None
    d = dead[0]
    how = _cause_of(c, d.label, [hung_with_a_dead_peer]) or d.reason
    lazy = c.env(v.label).get("TORCH_GLOO_LAZY_INIT", "") in ("1", "true", "True")
    return Cause(f"waited in {v.phase} for rank {d.label}, which had ended ({d.outcome}) at "
                 f"{_ended_at(c, d):g} s ({how}): the collective never completed and torch's "
                 "timeout did not end it"
                 + (" (TORCH_GLOO_LAZY_INIT=1: this group's pairs connect at its first "
                    "collective, and a pair to a dead peer does not always fail)" if lazy else ""),
                 [v.reason, f"rank {d.label}: {d.reason}"], blames=(d.label,))

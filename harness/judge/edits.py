"""Plan edits: what a fault changed in the plan, per process, and its effect read back from
what the processes themselves reported (pure).

Many faults act through the plan alone, with no step at run time: they set or unset a rank's
variables (malformed_env, missing_env, wrong_addr, wrong_port, world_size_mismatch...), change
its init arguments, leave a rank out (absent_rank), release it late (delayed_rank), change what
its worker does (skip_collective, raise_exception, slow_rank, model_mismatch, rank_workload) or
add a second job's processes (concurrent_job). ``make_plan`` takes a :func:`snapshot` of the
planned processes before each fault's ``apply`` and another after it; :func:`diff` turns the
difference into :class:`Edit` records (the fault's number, the target process, what changed),
so that every such fault, a plugin's too, is covered by one mechanism and none says by hand
what it did. A fault that adds steps of its own is proven by their probes
(:meth:`harness.faults.steps.Step.effect`), not here.

At the end of the run, :func:`read` reads each edit's effect from the processes' own words
(never from the plan): the start record each process sends (``launched``: the argv and the
values of the variables its plan names, as it got them; an observed program's ``hello``), the
``init`` phase (the init_method, rank and world size the worker passed to
init_process_group), the worker's phase events (a skipped collective says ``skipped``, a slow
phase's duration is measured between its events, the ``ddp`` phase says its parameter count),
its result (the exception it raised, in which phase), the supervisor's release time of each
process, and whether a process ran at all under a label. One record per fault, target and kind
of edit, in the shape of :meth:`harness.faults.steps.Scheduler.effects` (``harness.judge.effects``
aggregates both):

* ``acted``: the process had what the plan gave it (the value, the skip, the delay...);
* ``no effect``: it never started, never reached the phase, or got something else;
* ``not observable``: it sent no word to read (a process that died before its first event,
  a program that reports nothing), with why.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..core import protocol as P

ACTED, NO_EFFECT, NOT_OBSERVABLE = "acted", "no effect", "not observable"
EARLY = 0.05          # seconds a release may come before its planned time (the poll's grain)
SLOW_GRAIN = 0.05     # seconds a measured slow phase may fall short of its planned sleep


@dataclass
class Edit:
    """One change a fault made to one planned process."""

    fault_no: int
    fault: str                       # the fault's kind
    target: str                      # the process's label ("1", "agent:node0", "job2:0")
    what: str                        # env | init | absent | release | process | skip | raise
    #                                  | slow | model | steps
    detail: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


# -- planning: a snapshot before and after each fault ------------------------------------------
def snapshot(plan: Any) -> Dict[str, Dict[str, Any]]:
    """What each planned process is told (label -> its environment, unset variables, init
    arguments, absence, release, worker variation, argv, job)."""
    out = {r.label: {"env": dict(r.env), "unset": list(r.unset), "init": asdict(r.init),
                     "absent": r.absent, "release": r.release.to_dict(),
                     "released": r.release.describe(),
                     "variation": asdict(r.variation), "argv": list(r.argv), "job": r.job}
           for r in plan.ranks}
    # the per-rank variations of a shared worker spec (torchrun, spawn, srun): only their
    # variation, read back from the worker that got the rank (attempt 0)
    for rank, v in getattr(plan, "shared_variations", {}).items():
        out.setdefault(str(rank), {"shared": True, "variation": asdict(v)})
    return out


_PLAIN = asdict(P.Variation())


def diff(before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]],
         fault_no: int, fault: str, workload: Sequence[str] = ()) -> List[Edit]:
    """The edits that turn ``before`` into ``after`` (two snapshots), as fault ``fault_no``'s."""
    out: List[Edit] = []

    def add(target: str, what: str, **detail: Any) -> None:
        out.append(Edit(fault_no, fault, target, what, detail))

    for label, a in after.items():
        b = before.get(label)
        if a.get("shared"):   # a shared spec's per-rank variation: what it changed, no more
            b = b or {"variation": _PLAIN}
            _variation_edits(add, label, a["variation"], b["variation"], workload)
            continue
        if b is None:
            add(label, "process", job=a["job"], release=a["release"], released=a["released"])
            continue
        env: Dict[str, Optional[str]] = {}
        for k, v in a["env"].items():
            if b["env"].get(k) != v:
                env[k] = v
        for k in a["unset"]:
            if k not in b["unset"] and k not in a["env"]:
                env[k] = None
        for k in b["env"]:   # dropped from the plan's variables without being unset
            if k not in a["env"] and k not in a["unset"]:
                env.setdefault(k, None)
        if env:
            add(label, "env", vars=env)
        init = {k: v for k, v in a["init"].items() if b["init"].get(k) != v and k != "port2"}
        if init:
            add(label, "init", **init)
        if a["absent"] and not b["absent"]:
            add(label, "absent")
            continue
        if a["release"] != b["release"]:
            add(label, "release", release=a["release"], released=a["released"])
        _variation_edits(add, label, a["variation"], b["variation"], workload)
    return out


def _variation_edits(add: Callable[..., None], label: str, va: Mapping[str, Any],
                     vb: Mapping[str, Any], workload: Sequence[str]) -> None:
    for ph in va["skip"]:
        if ph not in vb["skip"]:
            add(label, "skip", phase=ph)
    if va["raise_at"] and va["raise_at"] != vb["raise_at"]:
        add(label, "raise", **va["raise_at"])
    slow = {ph: s for ph, s in va["slow_at"].items() if vb["slow_at"].get(ph) != s}
    if slow:
        add(label, "slow", phases=slow)
    if va["model_change"] and va["model_change"] != vb["model_change"]:
        add(label, "model", change=va["model_change"])
    if va["steps"] is not None and va["steps"] != vb["steps"]:
        add(label, "steps", steps=list(va["steps"]), shared=list(workload))


# -- reading: what the processes said ----------------------------------------------------------
def _who(label: str) -> str:
    return f"rank {label}" if label.isdigit() else label


def _rel(t: Any, t0: Optional[float]) -> Optional[float]:
    if t is None or t0 is None:
        return None
    return round(float(t) - t0, 3)


def launched_env(obs: Any) -> Optional[Dict[str, Optional[str]]]:
    """The values of its plan's variables as the process got them: the worker's ``start``
    phase (``launched``), an observed process's ``hello``; None if it sent neither."""
    for e in obs.events:
        rec = e.data.get("launched")
        if isinstance(rec, dict) and isinstance(rec.get("env"), dict):
            return dict(rec["env"])
        if e.ev == P.HELLO and isinstance(e.data.get("env"), dict):
            return dict(e.data["env"])
    return None


def _start_t(obs: Any) -> Optional[float]:
    for e in obs.events:
        if e.ev == P.HELLO or (e.ev == P.PHASE and e.phase == "start"):
            return e.t
    return None


def _show(v: Optional[str]) -> str:
    return "unset" if v is None else repr(v if len(v) <= 60 else v[:57] + "...")


def _silent(obs: Any) -> str:
    rc = f", exit code {obs.returncode}" if obs.returncode is not None else ""
    return (f"its process (pid {obs.pid}) sent no start record{rc}: what it got is not "
            "known")


def _read_env(e: Edit, obs: Any, t0: Optional[float]) -> Tuple[str, str, Dict, List]:
    got = launched_env(obs)
    if got is None:
        return NOT_OBSERVABLE, _silent(obs), {}, []
    want: Dict[str, Optional[str]] = e.detail["vars"]
    off = {k: got.get(k) for k, v in want.items() if got.get(k) != v}
    nums = {"pid": obs.pid}
    t = _rel(_start_t(obs), t0)
    if off:
        said = ", ".join(f"{k}={_show(off[k])}, not {_show(want[k])}" for k in off)
        return NO_EFFECT, f"started with {said}", nums, []
    said = ", ".join(f"{k}={_show(v)}" if v is not None else f"{k} unset"
                     for k, v in want.items())
    ev = [{"t": t, "what": f"started (pid {obs.pid}) with {said}"}] if t is not None else []
    return ACTED, f"started with {said}", nums, ev


def _read_init(e: Edit, obs: Any, t0: Optional[float]) -> Tuple[str, str, Dict, List]:
    init = _phase_event(obs, "init")
    if init is None:
        return _unreached(obs, "init")
    if "init_method" not in init.data:
        return NOT_OBSERVABLE, ("it does not say its init arguments (a "
                                "program's own call to init_process_group)"), {}, []
    got = {"url": init.data.get("init_method"), "rank": init.data.get("init_rank"),
           "world_size": init.data.get("init_world_size")}
    want = {k: v for k, v in e.detail.items() if k in got}
    if "method" in e.detail and "url" not in want and e.detail["method"] == "env":
        want["url"] = "env://"
    off = {k: got[k] for k, v in want.items() if got[k] != v}
    if off:
        said = ", ".join(f"{k} {off[k]!r}, not {want[k]!r}" for k in off)
        return NO_EFFECT, f"called init_process_group with {said}", {}, []
    said = ", ".join(f"{k} {v!r}" for k, v in want.items())
    t = _rel(init.t, t0)
    return ACTED, f"called init_process_group with {said}", {}, \
        [{"t": t, "what": f"init_process_group({said})"}] if t is not None else []


def _read_release(e: Edit, obs: Any, t0: Optional[float],
                  now: float) -> Tuple[str, str, Dict, List]:
    at = e.detail["release"].get("at")
    planned = e.detail["released"]
    if obs.released_at is None:
        if not obs.ready():
            ended = f", ended at {obs.ended_at:g} s" if obs.ended_at is not None else ""
            return NO_EFFECT, (f"never reached the start line (never ready{ended}): the "
                               f"release {planned} held nothing"), {}, []
        end = obs.ended_at if obs.ended_at is not None else now
        return ACTED, (f"held for the whole run: not released by its end at "
                       f"{end:g} s (release {planned})"), {"held_until_s": end}, \
            [{"t": end, "what": "still held at its end"}]
    nums: Dict[str, Any] = {"released_at_s": obs.released_at}
    if at is not None:
        nums["planned_s"] = at
        if obs.released_at < float(at) - EARLY:
            return NO_EFFECT, (f"released at {obs.released_at:g} s, before its "
                               f"planned {at:g} s"), nums, []
    return ACTED, f"released at {obs.released_at:g} s (planned {planned})", nums, \
        [{"t": obs.released_at, "what": f"released (planned {planned})"}]


def _phase_event(obs: Any, phase: str) -> Optional[Any]:
    return next((ev for ev in obs.events if ev.ev == P.PHASE and ev.phase == phase), None)


def _unreached(obs: Any, what: str) -> Tuple[str, str, Dict, List]:
    if not obs.events:
        return NOT_OBSERVABLE, _silent(obs), {}, []
    return NO_EFFECT, (f"never reached {what} (its last phase: "
                       f"{P.last_phase(obs.events)})"), {}, []


def _read_skip(e: Edit, obs: Any, t0: Optional[float]) -> Tuple[str, str, Dict, List]:
    ph = e.detail["phase"]
    ev = _phase_event(obs, ph)
    if ev is None:
        return _unreached(obs, ph)
    if "skipped" not in ev.data:
        return NO_EFFECT, f"entered {ph} and did not skip it", {}, []
    t = _rel(ev.t, t0)
    what = f"skipped {ev.data['skipped']} in {ph}"
    return ACTED, what + (f" at {t:g} s" if t is not None else ""), \
        {}, [{"t": t, "what": what}] if t is not None else []


def _read_raise(e: Edit, obs: Any, t0: Optional[float]) -> Tuple[str, str, Dict, List]:
    ph, exc = e.detail["phase"], e.detail["exception"]
    res = obs.result()
    if _phase_event(obs, ph) is None:
        return _unreached(obs, ph)
    got = (res.data.get("exc") or {}) if res is not None else {}
    if res is None or res.data.get("status") != P.EXCEPTION or res.data.get("phase") != ph \
            or got.get("type") != exc:
        how = "sent no result" if res is None else (
            f"ended {res.data.get('status')}" if res.data.get("status") != P.EXCEPTION else
            f"raised {got.get('type')} in {res.data.get('phase')}")
        return NO_EFFECT, f"entered {ph} but {how}, not {exc} there", {}, []
    t = _rel(res.t, t0)
    what = f"raised {exc} entering {ph}"
    return ACTED, what + (f" at {t:g} s" if t is not None else ""), \
        {}, [{"t": t, "what": what}] if t is not None else []


def _read_slow(e: Edit, obs: Any, t0: Optional[float],
               now: float) -> Tuple[str, str, Dict, List]:
    phases: Dict[str, float] = e.detail["phases"]
    # phase, planned, measured, t, whether it was its last word
    seen: List[Tuple[str, float, float, Optional[float], bool]] = []
    for i, ev in enumerate(obs.events):
        if ev.ev != P.PHASE or ev.phase not in phases:
            continue
        after = next((x for x in obs.events[i + 1:]), None)
        nxt = after.t if after is not None and after.ev != P.RESULT else None
        if nxt is not None:
            took = nxt - ev.t
        elif after is not None:   # it raised there (a signal in its sleep): its last phase
            took = after.t - ev.t
        else:   # its last word: it was in that phase until it ended (or the run did)
            end = obs.ended_at if obs.ended_at is not None else now
            start = _rel(ev.t, t0)
            took = end - start if start is not None else 0.0
        seen.append((str(ev.phase), phases[str(ev.phase)], round(took, 3), _rel(ev.t, t0),
                     nxt is None))
    if not seen:
        return _unreached(obs, " or ".join(list(phases)[:3]))
    # the sleep comes first as it enters the phase: a phase that was its last word and lasted
    # less than the sleep ended in the sleep (killed, or the run's end), which still acted
    slow = [s for s in seen if s[2] >= s[1] - SLOW_GRAIN or s[4]]
    nums = {"phases_slowed": len(slow), "phases_reached": len(seen)}
    if not slow:
        said = ", ".join(f"{p} {m:g} s (planned {s:g} s)" for p, s, m, _, _ in seen[:3])
        return NO_EFFECT, f"spent less than planned: {said}", nums, []

    def one(p: str, s: float, m: float, last: bool) -> str:
        cut = " (it ended in its sleep)" if last and m < s - SLOW_GRAIN else ""
        return f"{m:g} s in {p}{cut}"

    said = ", ".join(one(p, s, m, last) for p, s, m, _, last in slow[:3]) + \
        (f" and {len(slow) - 3} more phases" if len(slow) > 3 else "")
    evs = [{"t": t, "what": f"{p}: {m:g} s (planned sleep {s:g} s)"}
           for p, s, m, t, _ in slow if t is not None]
    return ACTED, f"spent {said}", nums, evs


def model_params(entry: str, change: str = "") -> int:
    """The parameter count of the worker's model for a ``ddp`` entry (harness.ranks.worker)."""
    width, layers = P.model_shape(P.model_mb(entry))
    if change == "extra_layer":
        layers += 1
    elif change == "wider":
        width += 8
    return layers * (width * width + width)


def _read_model(e: Edit, obs: Any, t0: Optional[float]) -> Tuple[str, str, Dict, List]:
    ev = _phase_event(obs, "ddp")
    if ev is None:
        return _unreached(obs, "ddp")
    entry = str(ev.data.get("step") or "ddp")
    got, want = ev.data.get("params"), model_params(entry, e.detail["change"])
    plain = model_params(entry)
    nums = {"params": got, "planned_params": want, "others_params": plain}
    if got != want:
        return NO_EFFECT, (f"built a model of {got} parameters, not the "
                           f"changed {want} ({e.detail['change']})"), nums, []
    t = _rel(ev.t, t0)
    what = f"built its model {e.detail['change']}: {got} parameters (the others' {plain})"
    return ACTED, what, nums, \
        [{"t": t, "what": what}] if t is not None else []


def _read_steps(e: Edit, obs: Any, t0: Optional[float]) -> Tuple[str, str, Dict, List]:
    own, shared = list(e.detail["steps"]), list(e.detail["shared"])
    d = next((i for i, (a, b) in enumerate(zip(own, shared)) if a != b), min(len(own),
                                                                            len(shared)))
    if d < len(own):   # it runs another entry at position d + 1
        ph = f"workload step {d + 1}"
        ev = next((x for x in obs.events if x.ev == P.PHASE and x.data.get("step") == own[d]
                   and (x.phase == ph or not str(x.phase).startswith("workload step"))), None)
        if ev is None:
            return _unreached(obs, f"its own entry {d + 1} ({own[d]})")
        t = _rel(ev.t, t0)
        what = f"ran its own entry {d + 1}: {own[d]} (the others: " + \
            (f"{shared[d]})" if d < len(shared) else "none)")
        return ACTED, what, {}, [{"t": t, "what": what}] if t is not None else []
    if d >= len(shared):   # the same entries: nothing to tell apart
        return NOT_OBSERVABLE, "its own workload is the shared one", {}, []
    # its workload is a prefix of the shared one: it ends after entry d
    past = _phase_event(obs, f"workload step {d + 1}")
    if past is not None:
        return NO_EFFECT, f"entered workload step {d + 1}, past its own {d} entries", {}, []
    end = next((x for x in obs.events if x.ev == P.PHASE and x.phase in ("destroy", "exit")),
               None)
    if end is None:
        return _unreached(obs, f"the end of its own {d} entries")
    t = _rel(end.t, t0)
    what = f"ended its workload after its own {d} entries (the others run {len(shared)})"
    return ACTED, what, {}, [{"t": t, "what": what}] if t is not None else []


def _describe(e: Edit) -> str:
    d = e.detail
    if e.what == "env":
        return ", ".join(f"{k}={_show(v)}" if v is not None else f"{k} unset"
                         for k, v in d["vars"].items())
    if e.what == "init":
        return "init_process_group(" + ", ".join(f"{k}={v!r}" for k, v in d.items()) + ")"
    if e.what == "absent":
        return "never started"
    if e.what == "release":
        return f"released {d['released']}"
    if e.what == "process":
        return f"another process ({d.get('job') or 'the job'}'s), released {d['released']}"
    if e.what == "skip":
        return f"skips the collective of {d['phase']}"
    if e.what == "raise":
        return f"raises {d['exception']} entering {d['phase']}"
    if e.what == "slow":
        ph = list(d["phases"].items())
        return f"sleeps {ph[0][1]:g} s in " + (ph[0][0] if len(ph) == 1 else
                                                f"{len(ph)} phases")
    if e.what == "model":
        return f"model {d['change']}"
    if e.what == "steps":
        return f"its own workload {d['steps']}"
    return e.what



# the readers of a plan edit, by its kind of change (release and slow also take the run's end)
_READERS: Dict[str, Callable[[Edit, Any, Optional[float]], Tuple[str, str, Dict, List]]] = {
    "env": _read_env, "init": _read_init, "skip": _read_skip, "raise": _read_raise,
    "model": _read_model, "steps": _read_steps}


def read_one(e: Edit, rows: Mapping[str, Any], t0: Optional[float],
             now: float) -> Tuple[str, str, Dict[str, Any], List[Dict[str, Any]]]:
    """(status, summary, numbers, events) of one edit, from the run's rows by label."""
    obs: Any = rows.get(e.target)
    started = obs is not None and (obs.pid is not None or bool(obs.events))
    if e.what == "absent":
        if started:
            return NO_EFFECT, f"a process ran as it (pid {obs.pid})", {}, []
        return ACTED, "never started: no process ran as it", {}, []
    if not started:
        return NO_EFFECT, "never started", {}, []
    if e.what == "process":
        rel = f", released at {obs.released_at:g} s" if obs.released_at is not None else \
            ", never released"
        return ACTED, f"started (pid {obs.pid}){rel}", \
            {"pid": obs.pid, "released_at_s": obs.released_at}, \
            [{"t": obs.released_at, "what": f"{e.target} released"}] \
            if obs.released_at is not None else []
    if e.what in ("release", "slow"):      # they compare with the time the run ended
        return (_read_release if e.what == "release" else _read_slow)(e, obs, t0, now)
    reader = _READERS.get(e.what)
    if reader is not None:
        return reader(e, obs, t0)
    return NOT_OBSERVABLE, f"no reader for a plan edit of {e.what}", {}, []


def read(edits: Sequence[Edit], rows: Sequence[Any], t0: Optional[float], now: float,
         absent: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """Every edit's effect, in the records of :meth:`harness.faults.steps.Scheduler.effects`
    (``rows``: the run's RankObservations; ``t0``: the start line, monotonic; ``now``: seconds
    after it; ``absent``: the labels the plan never starts, whose other edits are moot). A
    reader that fails proves nothing: ``not observable``, with the error."""
    by_label = {o.label: o for o in rows}
    out: List[Dict[str, Any]] = []
    for e in edits:
        if e.target in absent and e.what != "absent":
            continue
        rec: Dict[str, Any] = {"fault_no": e.fault_no, "kind": e.fault,
                               "step": f"{e.fault}#{e.fault_no}.plan.{e.what}",
                               "target": _who(e.target), "what": _describe(e),
                               "done_at": None, "undone_at": None, "read_at": round(now, 3)}
        try:
            status, summary, numbers, events = read_one(e, by_label, t0, now)
        except Exception as exc:  # noqa: BLE001 - a reader that fails proves nothing
            status, summary, numbers, events = NOT_OBSERVABLE, (
                f"the reader failed: {type(exc).__name__}: {exc}"), {}, []
        rec.update(status=status, summary=summary, numbers=numbers, events=events)
        out.append(rec)
    return out


def to_json(edits: Sequence[Edit]) -> str:
    return json.dumps([e.to_dict() for e in edits])

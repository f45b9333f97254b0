"""Fault effects: what each fault of a case did in the run, per target, with its evidence (pure).

Every fault step may read its own effect at the end of the run, before teardown
(:meth:`harness.faults.steps.Step.effect`: an nft rule's packet counters, the fault proxy's log, the
signal delivered and to which pid, the DNS responder's answers for the faulted name). The
scheduler gives one record per step (:meth:`harness.faults.steps.Scheduler.effects`); this module
groups them per fault and per target and says, for each, one of three statuses:

* ``acted``: a probe saw the fault act (at least one of its steps, on that target);
* ``no effect``: the fault's probes saw nothing (0 packets matched, no connection met the
  toxic, the step never fired): the case fails with ``fault N (...) had no effect: ...``
  unless the fault says ``effect: optional``;
* ``not observable``: no probe reads this kind yet (or the probe failed): said as such, never
  a failure and never proof.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

ACTED, NO_EFFECT, NOT_OBSERVABLE = "acted", "no effect", "not observable"
STATUSES = (ACTED, NO_EFFECT, NOT_OBSERVABLE)
NO_STEP = ("no step at run time, and no change to a planned process that the processes report "
           "(harness.edits): nothing to read")


def combine(statuses: Sequence[str]) -> str:
    """One status of several: acted if any acted, else no effect if any probe saw none, else
    not observable."""
    if ACTED in statuses:
        return ACTED
    if NO_EFFECT in statuses:
        return NO_EFFECT
    return NOT_OBSERVABLE


def aggregate(faults: Sequence[Mapping[str, Any]],
              steps: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """Per fault (``faults``: the plan's ``faults``, numbered from 1), per target, the step
    records of ``steps`` (the scheduler's), with a status each."""
    out: List[Dict[str, Any]] = []
    for f in faults:
        n = int(f["n"])
        mine = [dict(s) for s in steps if int(s.get("fault_no") or 0) == n]
        targets: Dict[str, List[Dict[str, Any]]] = {}
        for s in mine:
            targets.setdefault(str(s.get("target") or ""), []).append(s)
        trecs: List[Dict[str, Any]] = []
        for target, ss in targets.items():
            status = combine([str(s.get("status")) for s in ss])
            said = [s for s in ss if s.get("status") == status] or ss
            trecs.append({"target": target, "status": status,
                          "summary": "; ".join(dict.fromkeys(str(s.get("summary") or "")
                                                             for s in said)),
                          "steps": ss})
        status = combine([t["status"] for t in trecs]) if trecs else NOT_OBSERVABLE
        lead = next((s for s in mine if s.get("status") != NOT_OBSERVABLE), None) \
            or (mine[0] if mine else None)
        what = str(f["kind"]) if lead is None else \
            f"{f['kind']} on {lead.get('target')}, {lead.get('what')}"
        if not trecs:
            summary = NO_STEP
        elif len(trecs) == 1:
            summary = trecs[0]["summary"]
        else:
            summary = "; ".join(f"{t['target']}: {t['summary']}" for t in trecs
                                if t["status"] == status or status == NOT_OBSERVABLE)
        out.append({"n": n, "kind": f["kind"], "optional": bool(f.get("optional")),
                    "what": what, "status": status, "summary": summary, "targets": trecs})
    return out


def label(e: Mapping[str, Any]) -> str:
    """``fault 1 (firewall on host node0, drop inbound ports [29999])``."""
    return f"fault {e['n']} ({e['what']})"


def no_effect_line(e: Mapping[str, Any]) -> str:
    """``fault 1 (...) had no effect: 0 packets matched``."""
    return f"{label(e)} had no effect: {e['summary']}"


def unproven(effects: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """The faults whose probes saw no effect and that do not say ``effect: optional``."""
    return [dict(e) for e in effects if e.get("status") == NO_EFFECT and not e.get("optional")]


def line(e: Mapping[str, Any]) -> str:
    """One line per fault for tables and ``harness explain``."""
    opt = ", optional" if e.get("optional") else ""
    return f"{label(e)}: {e['status']}{opt}: {e['summary']}"


def event_lines(e: Mapping[str, Any], limit: int = 8) -> List[str]:
    """The fault's timed evidence, per target: ``t=1.23 s  what`` (at most ``limit`` each)."""
    out: List[str] = []
    for t in e.get("targets") or []:
        evs = [ev for s in t.get("steps") or [] for ev in s.get("events") or []]
        nums = {k: v for s in t.get("steps") or [] for k, v in (s.get("numbers") or {}).items()}
        done = [s.get("done_at") for s in t.get("steps") or [] if s.get("done_at") is not None]
        head = f"{t['target']}: {t['status']}"
        if done:
            head += f", done at {min(done):.2f} s"
        if nums:
            head += " (" + ", ".join(f"{k} {v}" for k, v in nums.items()) + ")"
        out.append(head)
        for ev in evs[:limit]:
            out.append(f"  t={float(ev.get('t') or 0.0):.2f} s  {ev.get('what', '')}")
        if len(evs) > limit:
            out.append(f"  ... {len(evs) - limit} more")
    return out


def find(effects: Sequence[Mapping[str, Any]], n: int) -> Optional[Mapping[str, Any]]:
    return next((e for e in effects if int(e.get("n") or 0) == n), None)

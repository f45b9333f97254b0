"""The shared shape of the resource faults: a step that limits one rank after it imported torch
and before it is released (the rank's release waits for the step), undone at teardown; and what
their probes read: a limit read back from ``/proc/PID/limits`` when it is set (the rank is gone
when effects are read, at the end of the run) and the rank's own word on how it failed."""

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ..core.triggers import Trigger
from .steps import Step


@dataclass
class RankLimit(Step):
    rank: str = "1"

    def can_fire(self, rt):
        r = rt.rank(self.rank)
        return r.pid is not None and not r.ended


def limit_before_release(plan, fault, rank: int, step: RankLimit) -> RankLimit:
    """Add ``step`` at the start line and hold the rank's release until it was done."""
    step.trigger = Trigger.at_time(0.0)
    plan.add_step(fault, step)
    for r in plan.main_ranks([rank]):
        if r.release.after is None and (r.release.at or 0.0) == 0.0 and r.release.phase is None:
            r.release = Trigger.after_step(step.id)
    return step


def read_limit(pid: Optional[int], name: str) -> Optional[Dict[str, Any]]:
    """A limit of a live process as the kernel holds it: the row ``name`` ("Max open files",
    "Max address space") of ``/proc/PID/limits``, ``{"soft": n, "hard": n}`` (None: unlimited);
    None where there is no such process or row."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/limits") as f:
            text = f.read()
    except OSError:
        return None
    return parse_limit(text, name)


def parse_limit(text: str, name: str) -> Optional[Dict[str, Any]]:
    for ln in text.splitlines():
        if ln.startswith(name):
            parts = ln[len(name):].split()
            if len(parts) < 2:
                return None

            def num(s: str) -> Optional[int]:
                return None if s == "unlimited" else int(s)
            return {"soft": num(parts[0]), "hard": num(parts[1])}
    return None


def rank_errors(rt, labels: List[str], pattern: str) -> List[Dict[str, Any]]:
    """Where a rank's own words say it met the fault: for each rank of ``labels``, the first
    line matching ``pattern`` (case-insensitive) in the exceptions it reported (its result,
    then those it raised) or, when it reported none (a crash), its stderr's tail; with when it
    ended (seconds after the start line). Ranks whose words do not match are left out."""
    rx = re.compile(pattern, re.I)
    out: List[Dict[str, Any]] = []
    for label in labels:
        try:
            obs = rt.rank(label).obs
        except (KeyError, AttributeError):
            continue
        texts = [str((e.data.get("exc") or {}).get("message") or "")
                 for e in reversed(obs.events) if e.data.get("exc")]
        texts.append(obs.stderr_tail or "")
        for text in texts:
            hit = next((ln.strip() for ln in text.splitlines() if rx.search(ln)), None)
            if hit:
                out.append({"rank": label, "t": obs.ended_at, "line": _short(hit)})
                break
    return out


def _short(line: str, n: int = 160) -> str:
    return line if len(line) <= n else line[:n - 3] + "..."


def ended(rt, label: str) -> str:
    """How the rank ended, for a summary: ``ended at 1.23 s, exit code 1`` ("" if unknown)."""
    try:
        obs = rt.rank(label).obs
    except (KeyError, AttributeError):
        return ""
    if obs.ended_at is None:
        return ""
    rc = obs.returncode
    how = "" if rc is None else (f", killed by signal {-rc}" if rc < 0 else f", exit code {rc}")
    return f"ended at {obs.ended_at:.2f} s{how}"


def ended_event(rt, label: str) -> List[Dict[str, Any]]:
    e = ended(rt, label)
    if not e:
        return []
    return [{"t": rt.rank(label).obs.ended_at, "what": f"rank {label} {e}"}]

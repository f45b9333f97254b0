"""What every draw must hold: the invariants a space file names (``INVARIANTS``, their
parameters ``INVARIANT_PARAMS``), each read from a run's verdict rows (outcome, duration,
release, role, node and restart attempt)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ...core.protocol import parse_label

INVARIANTS: Dict[str, str] = {
    "no_hang": "no rank ends in hang; with within: S, every rank that is not ok ends within S s "
               "of its own start",
    "within_timeout": "every rank or worker that is not ok ends within factor x the draw's "
                      "timeout + slack s of its own start (factor: 2, slack: 5 unless given); "
                      "a hang breaks it",
    "ok_without_faults": "a draw without faults ends ok on every rank",
    "agents_agree_with_workers": "a torchrun agent (or a spawning parent) and its workers agree: "
                                 "it does not end ok while a worker of its last attempt failed, "
                                 "nor fail or hang while every worker of its last attempt "
                                 "ended ok (a row a fault of the draw targets itself is left "
                                 "out)",
    "restarts_recover": "under torchrun or launch with max_restarts R >= 1, a draw whose faults "
                        "are all kill_rank on workers, hitting at most R attempts, ends ok: "
                        "every agent ok, every worker of the last attempt ok",
    "no_error": "no rank ends in error (a deliberately strict invariant, for trying the "
                "explorer: any fault that raises breaks it)",
}
INVARIANT_PARAMS: Dict[str, Dict[str, float]] = {   # parameter -> default (None: optional)
    "no_hang": {"within": math.nan},
    "within_timeout": {"factor": 2.0, "slack": 5.0},
}
SUPERVISORS = ("agent", "parent")     # rows that start and watch workers (docs/launchers.md)


@dataclass
class Invariant:
    name: str
    within: Optional[float] = None
    factor: float = 2.0
    slack: float = 5.0

    def label(self) -> str:
        if self.name == "within_timeout":
            return f"within_timeout({self.factor:g} x timeout + {self.slack:g} s)"
        return self.name + (f"(within {self.within:g} s)" if self.within is not None else "")

    def broken(self, draw: Dict[str, Any], verdicts: List[Dict[str, Any]]) -> Optional[str]:
        """Why this run breaks the invariant, or None."""
        check = getattr(self, "_" + self.name)
        why: Optional[str] = check(draw, verdicts)
        return why

    def _no_hang(self, draw: Dict[str, Any], verdicts: List[Dict[str, Any]]) -> Optional[str]:
        for v in verdicts:
            if v["outcome"] == "hang":
                return f"rank {v['label']} ended in hang ({v['phase']})"
            d = _from_own_start(v)
            if self.within is not None and v["outcome"] not in ("ok", "absent") \
                    and d is not None and d > self.within:
                return (f"rank {v['label']} ended in {v['outcome']} {d:.1f} s after its "
                        f"start, later than {self.within:g} s")
        return None

    def _within_timeout(self, draw: Dict[str, Any], verdicts: List[Dict[str, Any]]
                        ) -> Optional[str]:
        timeout = float(draw.get("timeout", 30.0))
        limit = self.factor * timeout + self.slack
        for v in verdicts:
            if v.get("role", "rank") not in ("rank", "worker") or v["outcome"] in ("ok",
                                                                                   "absent"):
                continue
            if v["outcome"] == "hang":
                return f"rank {v['label']} ended in hang ({v['phase']}), timeout {timeout:g} s"
            d = _from_own_start(v)
            if d is not None and d > limit:
                return (f"rank {v['label']} ended in {v['outcome']} {d:.1f} s after its start "
                        f"({v.get('exception') or v['phase']}): {d / timeout:.1f} x the "
                        f"timeout {timeout:g} s, over {self.factor:g} x {timeout:g} + "
                        f"{self.slack:g} = {limit:g} s")
        return None

    def _ok_without_faults(self, draw: Dict[str, Any], verdicts: List[Dict[str, Any]]
                           ) -> Optional[str]:
        if draw.get("faults"):
            return None
        bad = [v for v in verdicts if v["outcome"] != "ok"]
        return (f"no fault, yet rank {bad[0]['label']} ended in {bad[0]['outcome']}"
                if bad else None)

    def _no_error(self, draw: Dict[str, Any], verdicts: List[Dict[str, Any]]) -> Optional[str]:
        bad = [v for v in verdicts if v["outcome"] == "error"]
        return (f"rank {bad[0]['label']} ended in error ({bad[0].get('exception')})"
                if bad else None)

    def _agents_agree_with_workers(self, draw: Dict[str, Any], verdicts: List[Dict[str, Any]]
                                   ) -> Optional[str]:
        targeted = _fault_targets(draw)
        for sup in verdicts:
            if sup.get("role") not in SUPERVISORS or sup["outcome"] == "absent" \
                    or sup["label"] in targeted:
                continue
            workers = last_attempt([w for w in verdicts if w.get("node") == sup["label"]
                                    and w["outcome"] != "absent"])
            if not workers:
                continue
            failed = [w for w in workers if w["outcome"] != "ok"]
            if sup["outcome"] == "ok" and failed:
                return (f"{sup['label']} ended ok while its worker" + "s" * (len(failed) > 1)
                        + " " + ", ".join(f"{w['label']} ended in {w['outcome']} "
                                          f"({w.get('exception') or w['phase']})"
                                          for w in failed))
            if sup["outcome"] != "ok" and not failed:
                how = f"{sup['outcome']} ({sup.get('exception') or sup['phase']})"
                return (f"{sup['label']} ended in {how} while every worker of its last "
                        f"attempt ended ok ({', '.join(w['label'] for w in workers)})")
        return None

    def _restarts_recover(self, draw: Dict[str, Any], verdicts: List[Dict[str, Any]]
                          ) -> Optional[str]:
        launcher = draw.get("launcher")
        if not isinstance(launcher, dict) or launcher.get("kind") not in ("torchrun", "launch"):
            return None
        restarts = int(launcher.get("max_restarts") or 0)
        faults = draw.get("faults") or []
        if restarts < 1 or not faults:
            return None
        attempts = set()
        for f in faults:
            p = parse_label(str(f.get("rank", 1))) if f.get("kind") == "kill_rank" else None
            if p is None or p.kind != "rank":
                return None       # another fault, or a kill of an agent: not a restart's job
            attempts.add(p.attempt)
        if len(attempts) > restarts:
            return None
        hit = (f"the kills hit {len(attempts)} attempt{'s' * (len(attempts) != 1)}, "
               f"max_restarts {restarts}")
        for v in verdicts:
            if v.get("role") == "agent" and v["outcome"] != "ok":
                return (f"{v['label']} ended in {v['outcome']} "
                        f"({v.get('exception') or v['phase']}): {hit}")
        for v in last_attempt([v for v in verdicts if v.get("role") == "worker"]):
            if v["outcome"] != "ok":
                return f"worker {v['label']} of the last attempt ended in {v['outcome']}: {hit}"
        return None


def _from_own_start(v: Dict[str, Any]) -> Optional[float]:
    d = v.get("duration")
    if d is None:
        return None
    return float(d) - float(v.get("released") or 0.0)   # a late rank's delay does not count


def _fault_targets(draw: Dict[str, Any]) -> set:
    """The row labels a draw's faults name (rank:, ranks:), as strings."""
    out = set()
    for f in draw.get("faults") or []:
        for k in ("rank", "ranks"):
            v = f.get(k)
            for x in (v if isinstance(v, list) else [v] if v is not None else []):
                out.add(str(x))
    return out


def last_attempt(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The rows no later restart attempt of the same rank (same job) replaced."""
    latest: Dict[Tuple[str, Optional[int]], int] = {}
    parsed = []
    for r in rows:
        p = parse_label(r["label"])
        parsed.append(p)
        if p is not None and p.kind == "rank":
            key = (p.job, p.rank)
            latest[key] = max(latest.get(key, 0), p.attempt)
    return [r for r, p in zip(rows, parsed)
            if p is None or p.kind != "rank" or p.attempt == latest[(p.job, p.rank)]]

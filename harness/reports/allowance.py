"""What a rank's duration may move by between two reports without being a change: the allowance
:mod:`harness.reports.diff` compares a duration against (its module doc says why each part):
the noise, the start-up's change, the machine's load (``cpu_wait``), the band of a torch retry
loop in multiples of the timeout T (T as torch's message names it, else the case's), the move of
the rows a row follows, an agent's monitor tick and the fault's firing."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ..core.protocol import parse_label

DEFAULT_ABS_TOL = 2.0
STARTUP_PHASES = ("start", "import")   # a rank's interpreter start-up and torch import
STORE_CLIENT_BAND = (1.0, 3.0)   # x T: a store client's give-up time (1.15-2.3 quiet, 2.8 loaded)
MESH_BAND = (1.0, 5.0)           # x T: gloo's full-mesh connect ("about five times the timeout")
OTHER_TIMEOUT = 1.5              # x T added for a timeout outcome of another mechanism


def startup_seconds(case: Dict[str, Any], label: str) -> float:
    """Seconds the row spent after the start line in its start/import phases (0 for a rank that
    imported before it: started directly or forked), from the case's timeline."""
    began: Optional[float] = None
    for e in (_timeline_row(case, label) or {}).get("events") or []:
        if e.get("ev") != "phase" or not isinstance(e.get("t"), (int, float)):
            continue
        if e.get("phase") in STARTUP_PHASES:
            began = e["t"] if began is None else began
        elif began is not None:
            return max(0.0, max(0.0, float(e["t"])) - max(0.0, float(began)))
    return 0.0


def _timeline_row(case: Dict[str, Any], label: str) -> Optional[Dict[str, Any]]:
    """The row ``label`` of the case's timeline (None where it has none)."""
    return next((r for r in (case.get("timeline") or {}).get("ranks") or []
                 if str(r.get("label")) == label), None)


def _ended_at(case: Dict[str, Any], label: str) -> Optional[float]:
    """When the row ended, in seconds after the start line (the case's timeline)."""
    row = _timeline_row(case, label) or {}
    return float(row["ended_at"]) if isinstance(row.get("ended_at"), (int, float)) else None


def _steps_done(case: Dict[str, Any]) -> Dict[str, float]:
    """Each fault step the run did, by id: when (s after the start line)."""
    out: Dict[str, float] = {}
    for e in case.get("effects") or []:
        for t in e.get("targets") or []:
            for st in t.get("steps") or []:
                if isinstance(st.get("done_at"), (int, float)) and st.get("step"):
                    out[str(st["step"])] = float(st["done_at"])
    return out


MONITOR_FLAG = re.compile(r"--monitor[-_]interval[= ]([0-9.]+)")


def monitor_interval(case: Dict[str, Any]) -> float:
    """The torchrun agents' monitor interval in the case, from the launch's own argv as the
    plan's notes give it (``--monitor-interval 5``); 0 where none is named (torch's default,
    0.1 s, is below the noise)."""
    for note in case.get("notes") or []:
        m = MONITOR_FLAG.search(str(note))
        if m:
            try:
                return float(m.group(1))
            except ValueError:
                return 0.0
    return 0.0


def fault_moved(oc: Dict[str, Any], nc: Dict[str, Any], label: str) -> float:
    """How much later (or earlier) the faults that came before the row's end fired in one run
    than in the other: a fault triggered by the ranks' progress ("when every rank has entered
    workload step 3") fires when they get there, and a row that ends for the fault ends that
    much later. Their progress up to there is no change of this case (the case without the
    fault shows it); what the fault did is, and is compared from when it fired. 0 where a
    report has no step times or the row ended before every step."""
    oe, ne = _ended_at(oc, label), _ended_at(nc, label)
    if oe is None or ne is None:
        return 0.0
    od, nd = _steps_done(oc), _steps_done(nc)
    return max((abs(nd[k] - od[k]) for k in od.keys() & nd.keys()
                if od[k] <= oe and nd[k] <= ne), default=0.0)


def _startup_change(o: Dict[str, Any], n: Dict[str, Any]) -> float:
    """The largest change of a row's start-up between the two runs of a case."""
    labels = {str(r.get("label")) for r in o.get("ranks") or []} & \
        {str(r.get("label")) for r in n.get("ranks") or []}
    return max([abs(startup_seconds(o, lb) - startup_seconds(n, lb)) for lb in labels] or [0.0])


_TORCH_SAYS_TIMEOUT = re.compile(r"\bafter (\d+)\s*ms\b", re.I)


def torch_said_timeout(r: Dict[str, Any]) -> Optional[float]:
    """The timeout (s) torch's own message says its loop ran to ("... timed out after 10000ms
    ..."), or None. It is the one the rank really used: a program (``program:``) passes its own
    to init_process_group or TCPStore, which the case's ``timeout:`` does not know."""
    m = _TORCH_SAYS_TIMEOUT.search(r.get("message") or "")
    return int(m.group(1)) / 1000.0 if m else None


def _band(case: Dict[str, Any], r: Dict[str, Any]) -> Optional[tuple]:
    """(name, lo, hi) in x T of the retry loop that drew the rank's end, if the diff knows it."""
    fam = (r.get("family") or "").lower()
    if not case.get("timeout") and torch_said_timeout(r) is None:
        return None
    if "connectfullmesh" in fam:
        return ("gloo full mesh", *MESH_BAND)
    if "client socket has" in fam:
        return ("store client", *STORE_CLIENT_BAND)
    return None


def _follows(label: str, o: Dict[str, Any], n: Dict[str, Any]) -> bool:
    """Whether the row's end follows another row's: an agent or parent, or a peer's end."""
    p = parse_label(label)
    if p is not None and p.kind in ("agent", "parent"):
        return True
    return any("by peer" in (r.get("family") or "").lower() for r in (o, n))


@dataclass
class Allowance:
    """What a rank's duration may move by without being a change, and why."""
    seconds: float
    parts: List[str]
    band: Optional[tuple] = None      # (name, lo s, hi s) of the retry loop, widened

    def note(self) -> str:
        s = f"allowance {self.seconds:.3g} s = " + " + ".join(self.parts)
        if self.band:
            s += f"; {self.band[0]} band {self.band[1]:.3g}..{self.band[2]:.3g} s"
        return s


def load_wait(oc: Dict[str, Any], nc: Dict[str, Any], o: Dict[str, Any],
              n: Dict[str, Any]) -> float:
    """What the machine's load added to the slower of the two runs of a rank, at most: the
    largest ``cpu_wait`` (seconds its threads were runnable and waited for a CPU, after the
    start line) of any rank of that run's case (ranks wait for each other: the slowed one need
    not be this one). 0 where the reports do not have it (older reports)."""
    od, nd = o.get("duration"), n.get("duration")
    if od is None or nd is None:
        return 0.0
    slower = nc if float(nd) > float(od) else oc
    waits = [float(r["cpu_wait"]) for r in slower.get("ranks") or []
             if r.get("cpu_wait") is not None]
    # summed over threads it can exceed the wall time; the load added at most the whole run
    return min(max(waits, default=0.0), max(float(od), float(nd)))


def duration_allowance(oc: Dict[str, Any], nc: Dict[str, Any], label: str, o: Dict[str, Any],
                       n: Dict[str, Any], abs_tol: float = DEFAULT_ABS_TOL,
                       others_moved: float = 0.0) -> Allowance:
    """The absolute allowance of one rank's duration in one case (the module doc says why each
    part). ``others_moved``: the largest duration move of the case's rows whose end is their own
    (carried by a row that follows another's)."""
    parts, total = [f"{abs_tol:g} s noise"], float(abs_tol)
    su = _startup_change(oc, nc)
    if su >= 0.05:
        total += su
        parts.append(f"{su:.2f} s start-up change")
    load = load_wait(oc, nc, o, n)
    if load >= 0.05:
        total += load
        parts.append(f"{load:.2f} s waited for a CPU (load)")
    p = parse_label(label)
    tick = max(monitor_interval(oc), monitor_interval(nc)) if p is not None and \
        p.kind == "agent" else 0.0
    if tick >= 0.5:
        total += tick
        parts.append(f"{tick:g} s the agent's monitor interval (it sees its workers' end on "
                     "its next tick)")
    fired = fault_moved(oc, nc, label)
    if fired >= 0.05:
        total += fired
        parts.append(f"{fired:.2f} s the fault's firing moved")
    t = float(oc.get("timeout") or 0)
    band = _band(oc, o) or _band(oc, n)
    said = {x for x in (torch_said_timeout(o), torch_said_timeout(n)) if x is not None}
    if len(said) == 1:
        t = said.pop()             # the timeout torch's loop ran to, said by torch itself
    elif said:                     # another timeout on each side (a `settings` change of its
        band, t = None, 0.0        # own): no common band, no timeout's allowance
    if band is None and t and "timeout" in (o.get("outcome"), n.get("outcome")):
        total += OTHER_TIMEOUT * t
        parts.append(f"{OTHER_TIMEOUT:g} x timeout {t:g} s")
    if others_moved > 0 and _follows(label, o, n):
        total += others_moved
        parts.append(f"{others_moved:.2f} s the rows it follows moved")
    widened = None
    if band is not None:
        widened = (band[0], band[1] * t - total, band[2] * t + total)
    return Allowance(total, parts, widened)


def _in_band(a: Allowance, oc: Dict[str, Any], nc: Dict[str, Any], label: str,
             od: Optional[float], nd: Optional[float]) -> bool:
    if a.band is None or od is None or nd is None:
        return False
    lo, hi = a.band[1], a.band[2]
    return lo <= float(od) - startup_seconds(oc, label) <= hi and \
        lo <= float(nd) - startup_seconds(nc, label) <= hi

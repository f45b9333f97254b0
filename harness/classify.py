"""Classification: what was observed of a rank -> one Verdict (pure).

Outcomes: ``ok`` | ``error`` (raised, not a timeout) | ``timeout`` (torch's own timeout fired) |
``hang`` (alive at the deadline, killed by the harness) | ``crash`` (died without a Python
exception: a signal, abort, OOM kill, or an exit with no result record).

Timeout versus error is decided by ``TIMEOUT_RULES``: the first rule whose class is in the
exception's MRO and whose pattern is found in the message decides. Message texts changed at
torch 2.2, 2.4 (libuv store) and 2.5, so the patterns are families, not exact strings; add a rule
when a new torch words a timeout differently.
"""

from __future__ import annotations

import re
import signal
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .observe import RankObservation, RunObservation
from .outcomes import job_outcome as _job
from .protocol import OK, ExceptionRecord, last_phase

# (class name anywhere in the MRO, pattern searched case-insensitively in the message)
TIMEOUT_RULES: List[Tuple[str, str]] = [
    # c10d store: "Timed out after 6 seconds waiting for clients. 1/2 clients joined." (>= 2.2),
    # "wait timeout after 5000ms, keys: ..." (libuv store, >= 2.4), "Socket Timeout" (< 2.4)
    ("DistStoreError", r"timed? ?out|timeout"),
    # "The client socket has timed out after 5000ms while trying to connect to (addr, port)."
    ("DistNetworkError", r"timed out|timeout"),
    ("DistBackendError", r"timed out|timeout"),
    # gloo: "Gloo connectFullMesh failed ... Connect timeout", "Wait timeout", FileStore "Timeout"
    # and, before 2.2, the store's plain RuntimeError "Socket Timeout" / "Timed out waiting ..."
    ("RuntimeError", r"connect timeout|wait timeout|timed out|socket timeout|\btimeout\b"),
    ("TimeoutError", r""),
]

# checked first: a message that says the peer refused is an error even if gloo's wording also
# says "timed out connecting" (gloo: "timed out connecting: SO_ERROR: Connection refused")
NOT_TIMEOUT_RULES: List[Tuple[str, str]] = [
    ("RuntimeError", r"connection refused"),
]

@dataclass
class Verdict:
    label: str
    outcome: str
    phase: str
    duration: Optional[float]          # seconds from the start line to the end
    exception: Optional[str] = None    # class name
    exception_mro: List[str] = field(default_factory=list)
    message: str = ""
    reason: str = ""                   # why this outcome, in words
    stacks: str = ""
    returncode: Optional[int] = None
    host: str = "local"
    addr: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def mro_names(mro: Sequence[str]) -> List[str]:
    """Short and qualified names: 'torch.distributed.DistStoreError' -> also 'DistStoreError'."""
    out = []
    for q in mro:
        out += [q, q.rsplit(".", 1)[-1]]
    return out


def is_timeout(mro: Sequence[str], message: str,
               rules: Sequence[Tuple[str, str]] = TIMEOUT_RULES) -> bool:
    names = set(mro_names(mro))
    if rules is TIMEOUT_RULES:
        for cls, pattern in NOT_TIMEOUT_RULES:
            if cls in names and re.search(pattern, message, re.I):
                return False
    for cls, pattern in rules:
        if cls in names and re.search(pattern, message, re.I):
            return True
    return False


def signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def classify(obs: RankObservation, t0: float = 0.0) -> Verdict:
    """One rank's verdict. ``t0``: the start line on the monotonic clock (event times are
    monotonic; ``released_at``/``ended_at`` are already relative to the start line)."""
    events = obs.events
    phase = last_phase(events)
    result = obs.result()
    duration = obs.ended_at
    if result is not None and t0:
        duration = max(0.0, round(result.t - t0, 3))   # 0: it ended before the start line
    v = Verdict(label=obs.label, outcome="crash", phase=phase, duration=duration,
                returncode=obs.returncode, host=obs.host, addr=obs.addr, stacks=obs.stacks)
    if obs.killed_at_deadline:
        v.outcome = "hang"
        v.reason = "alive at the harness's deadline; killed"
        v.duration = obs.ended_at
        stopped = [s for s in obs.signals if s.signal == "STOP"]
        if stopped:
            v.reason += f" (it had been sent SIGSTOP at {stopped[0].t:g} s)"
        return v
    if result is not None:
        v.phase = result.phase or phase
        if result.data.get("status") == OK:
            v.outcome, v.reason = "ok", "finished its workload"
            return v
        exc = ExceptionRecord.from_dict(result.data.get("exc") or {})
        v.exception = exc.type or None
        v.exception_mro = list(exc.classes)
        v.message = exc.message
        if is_timeout(v.exception_mro, v.message):
            v.outcome, v.reason = "timeout", "torch's own timeout fired"
        else:
            v.outcome, v.reason = "error", "raised an exception"
        return v
    rc = obs.returncode
    if rc is not None and rc < 0:
        sent = [s for s in obs.signals if _sig_matches(s.signal, rc)]
        v.reason = f"killed by {signal_name(rc)}" + (" (sent by the fault)" if sent else "")
    else:
        v.reason = f"exited with code {rc} without a result record"
    return v


def _sig_matches(name: Optional[str], rc: int) -> bool:
    return bool(name) and getattr(signal, f"SIG{name}", None) == -rc


def job_outcome(verdicts: Sequence[Verdict]) -> str:
    """The job's outcome: the most severe of its ranks' (see harness.outcomes)."""
    return _job([v.outcome for v in verdicts]) or "ok"


def classify_run(run: RunObservation) -> List[Verdict]:
    """All verdicts of a run."""
    return [classify(r, run.t0) for r in run.ranks]

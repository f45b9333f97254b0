"""Classification: what was observed of a process -> one Verdict (pure).

Outcomes: ``ok`` | ``error`` (raised, not a timeout) | ``timeout`` (torch's own timeout fired) |
``hang`` (alive at the deadline, killed by the harness) | ``crash`` (died without a Python
exception: a signal, abort, OOM kill, or an exit with no result record) | ``absent`` (part of
the world, never started: the plan marks it so; it has no observation).

Every row is classified the same way: a rank, a torchrun agent, a spawning parent, a worker.
An agent's elastic outcomes: ``RendezvousTimeoutError`` (the join timeout) is a timeout;
``RendezvousClosedError`` (a closed rendezvous) and ``RendezvousConnectionError`` (its store
is gone) are errors; ``ChildFailedError`` is an error whose reason names the root-cause rank
and its exit code; the reason counts the agent's restarts and says its exit code. A program
the harness observes (harness.ranks.observer) sends no result when it ends normally: its exit status
decides (0: ok; an exit after a torch call raised: that exception; an exit with a status after
a clean interpreter exit: error; a signal, or a status without a Python exit: crash).

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

from ..core.outcomes import ABSENT
from ..core.outcomes import job_outcome as _job
from ..core.protocol import (
    DONE,
    HELLO,
    OK,
    PHASE,
    RAISED,
    RESTART,
    ROLE_AGENT,
    ROLE_PARENT,
    ExceptionRecord,
    last_phase,
    parse_label,
)
from .observation import RankObservation, RunObservation

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
    # monitored_barrier: "[Rank 0]: Ranks 1 failed to pass monitoredBarrier in 5000 ms"
    ("RuntimeError", r"failed to pass monitoredBarrier"),
    # torchrun's agent: the rendezvous's join timeout (it raises it with no message)
    ("RendezvousTimeoutError", r""),
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
    role: str = "rank"                 # rank | agent | parent | worker
    attempt: int = 0                   # a worker's restart attempt
    node: Optional[str] = None         # a worker's agent or parent
    restarts: Optional[int] = None     # an agent's restarts of its workers
    root_cause: Optional[int] = None   # an agent's ChildFailedError: the rank that failed first
    cause: str = ""                    # the diagnosis, one line (harness.judge.diagnose)
    cause_evidence: List[str] = field(default_factory=list)   # the lines it rests on
    cause_rule: str = ""               # the diagnosis rule that gave the cause; "" for unknown
    claims: Optional[int] = None       # the rank it told torch, where not its row's (RANK=0 on 1)
    restart_of: Optional[str] = None   # the process this row started again (restart_after)

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
    """One process's verdict. ``t0``: the start line on the monotonic clock (event times are
    monotonic; ``released_at``/``ended_at`` are already relative to the start line). What the
    steps noted about the process (an OOM kill) ends its reason."""
    events = obs.events
    phase = last_phase(events)
    result = obs.result()
    duration = obs.ended_at
    if result is not None and t0:
        duration = max(0.0, round(result.t - t0, 3))   # 0: it ended before the start line
    v = Verdict(label=obs.label, outcome="crash", phase=phase, duration=duration,
                returncode=obs.returncode, host=obs.host, addr=obs.addr, stacks=obs.stacks,
                role=obs.role, attempt=obs.attempt, node=obs.node, restart_of=obs.restart_of)
    if obs.role == ROLE_AGENT:
        v.restarts = sum(1 for e in events if e.ev == RESTART)
    v.claims = claimed_rank(obs)
    _classify(v, obs, result, phase)
    if obs.role in (ROLE_AGENT, ROLE_PARENT):
        v.reason += _tail_words(v, obs)
    if obs.notes:
        v.reason += " (" + "; ".join(obs.notes) + ")"
    if obs.restart_of:
        at = f" at {obs.released_at:.2f} s" if obs.released_at is not None else ""
        v.reason += f"; a restart of {obs.restart_of} (restart_after), started{at}"
    return v


def claimed_rank(obs: RankObservation) -> Optional[int]:
    """The rank number a rank's process told torch when it is not the one its row is named
    after (a copied env file: rank 1's process with RANK=0), else None: the ``rank`` it passed
    to init_process_group (init_rank, tcp:// and file://), or else the RANK it started with
    (env://, its start record). A row whose label has no rank number (an agent) claims none."""
    own = parse_label(obs.label)
    if own is None or own.rank is None or obs.role not in ("rank", "worker"):
        return None
    told: Any = None
    for e in obs.events:
        if e.ev == PHASE and e.phase == "init" and e.data.get("init_rank") is not None:
            told = e.data["init_rank"]
            break
    if told is None:
        for e in obs.events:
            rec = e.data.get("launched")
            env = rec.get("env") if isinstance(rec, dict) else \
                e.data.get("env") if e.ev == HELLO else None
            if isinstance(env, dict) and env.get("RANK") is not None:
                told = env["RANK"]
                break
    try:
        n = int(str(told).strip())
    except ValueError:
        return None
    return None if n == own.rank else n


def _classify(v: Verdict, obs: RankObservation, result: Any, phase: str) -> None:
    if obs.killed_at_deadline:
        v.outcome = "hang"
        v.reason = "alive at the harness's deadline; killed"
        v.duration = obs.ended_at
        stopped = [s for s in obs.signals if s.signal == "STOP"]
        if stopped:
            v.reason += f" (it had been sent SIGSTOP at {stopped[0].t:g} s)"
        if obs.released_at is None:
            v.reason += " before its start line (its release was still to come)"
        marks = [e for e in obs.events if e.ev in (PHASE, DONE)]
        if marks and marks[-1].ev == DONE and marks[-1].phase == phase \
                and obs.role not in (ROLE_AGENT, ROLE_PARENT):
            v.reason += f" ({phase} had returned: it was in the program's own code)"
        return
    if result is not None:
        v.phase = result.phase or phase
        if result.data.get("status") == OK:
            v.outcome, v.reason = "ok", "finished its workload"
            return
        _exception(v, ExceptionRecord.from_dict(result.data.get("exc") or {}))
        root = result.data.get("root_cause")
        if isinstance(root, dict) and root.get("rank") is not None:
            v.root_cause = int(root["rank"])
            code = root.get("exitcode")
            how = f"killed by {signal_name(code)}" if isinstance(code, int) and code < 0 \
                else f"exit code {code}"
            v.reason = f"its worker rank {v.root_cause} failed first ({how})"
        return
    rc = obs.returncode
    if rc is not None and rc < 0:
        sent = [s for s in obs.signals if _sig_matches(s.signal, rc)]
        v.reason = f"killed by {signal_name(rc)}" + (" (sent by the fault)" if sent else "")
        return
    if obs.role == "rank" and not obs.info and not any(e.ev == HELLO for e in obs.events):
        # the harness's own worker always sends a result: without one it died hard
        v.reason = f"exited with code {rc} without a result record"
        return
    # an observed program: no result when it ends normally; its exit status decides
    clean = any(e.ev == PHASE and e.phase == "exit" for e in obs.events)
    raised = [e for e in obs.events if e.ev == RAISED]
    if rc == 0:
        v.outcome, v.reason = "ok", "exited with status 0"
    elif rc is None:
        if clean:
            v.outcome, v.reason = "ok", "ended through its normal exit (the exit status was " \
                "not collected: its agent or parent was gone)"
        else:
            v.reason = "ended without a word; its exit status was not collected (its agent " \
                "or parent was gone)"
    elif raised:
        _exception(v, ExceptionRecord.from_dict(raised[-1].data.get("exc") or {}))
        v.phase = raised[-1].phase or v.phase
        v.reason += f"; the program caught it and exited with status {rc}"
    elif clean:
        v.outcome, v.reason = "error", f"exited with status {rc}"
        before = [e.phase for e in obs.events if e.ev == PHASE and e.phase != "exit"]
        if before and before[-1] not in ("start", "import"):
            v.phase = str(before[-1])   # where it was when it chose to exit
    else:
        v.reason = f"exited with status {rc} without a Python exit (os._exit, a fatal error)"


def _exception(v: Verdict, exc: ExceptionRecord) -> None:
    v.exception = exc.type or None
    v.exception_mro = list(exc.classes)
    v.message = exc.message
    names = set(mro_names(v.exception_mro))
    if is_timeout(v.exception_mro, v.message):
        v.outcome = "timeout"
        v.reason = "the rendezvous timed out (join timeout)" \
            if "RendezvousTimeoutError" in names else "torch's own timeout fired"
    else:
        v.outcome = "error"
        v.reason = ELASTIC_REASONS.get(next((n for n in ELASTIC_REASONS if n in names), ""),
                                       "raised an exception")


# why an agent failed, by its exception's class
ELASTIC_REASONS = {
    "RendezvousClosedError": "the rendezvous was closed (another agent ended it)",
    "RendezvousConnectionError": "lost the rendezvous's store (its host is gone or never came)",
    "RendezvousStateError": "the rendezvous's state was corrupt",
    "ChildFailedError": "a worker failed",
    "SignalException": "it was sent a signal (torchelastic turns it into an exception)",
}


def _tail_words(v: Verdict, obs: RankObservation) -> str:
    words = []
    if v.restarts:
        words.append(f"restarted its workers {v.restarts} time{'s' * (v.restarts != 1)}")
    if obs.returncode is not None and obs.returncode >= 0:
        words.append(f"exit code {obs.returncode}")
    return ("; " + ", ".join(words)) if words else ""


def _sig_matches(name: Optional[str], rc: int) -> bool:
    return bool(name) and getattr(signal, f"SIG{name}", None) == -rc


def job_outcome(verdicts: Sequence[Verdict]) -> str:
    """The job's outcome: the most severe of its rows' (see harness.core.outcomes), leaving out a
    worker that a later restart attempt of the same rank replaced (its agent restarted it: the
    job went on; the row keeps its own verdict), and a killed process the run started again
    (restart_after: its restart's row stands for it)."""
    return _job([v.outcome for v in verdicts if not superseded(v, verdicts)]) or "ok"


def superseded(v: Verdict, verdicts: Sequence[Verdict]) -> bool:
    """A worker row replaced by a later restart attempt of its rank in the same job, or a
    process the run started again after it was killed (restart_after: its restart row
    carries the job on)."""
    if any(w.restart_of == v.label for w in verdicts):
        return True
    p = parse_label(v.label)
    if p is None or p.kind != "rank":
        return False
    for w in verdicts:
        q = parse_label(w.label)
        if q is not None and q.kind == "rank" and q.job == p.job and q.rank == p.rank \
                and q.attempt > p.attempt:
            return True
    return False


def absent_verdict(rank: Dict[str, Any]) -> Verdict:
    """The verdict of a rank the plan (its JSON form) marks absent: never started."""
    return Verdict(label=str(rank.get("label")), outcome=ABSENT, phase="", duration=None,
                   reason="part of the world but never started (a fault kept it out)",
                   host=str(rank.get("host") or "local"))


def classify_run(run: RunObservation) -> List[Verdict]:
    """All verdicts of a run, in the plan's rank order: one per observed rank, and an
    ``absent`` one for each rank the plan kept from starting."""
    seen = {r.label: classify(r, run.t0) for r in run.ranks}
    out: List[Verdict] = []
    for rp in run.plan.get("ranks", []):
        label = str(rp.get("label"))
        if label in seen:
            out.append(seen.pop(label))
        elif rp.get("absent"):
            out.append(absent_verdict(rp))
    return out + list(seen.values())

"""The worker protocol: everything a rank process and the supervisor say to each other.

Both sides import this module and nothing else defines an event name, a file-descriptor
variable, the start line or a phase name. It uses only the standard library, because a rank
imports it before torch and before anything slow.

The channel
-----------
* The rank's spec (what to run) is one JSON argument: :class:`WorkerSpec`.
* Events go as JSON lines to the inherited file descriptor named by ``HARNESS_EVENT_FD``; each
  line is one ``write(2)``, written before the next step starts, so that what a rank said
  survives a SIGKILL. :func:`encode` makes a line, :class:`EventReader` reads them back.
* ``HARNESS_STACK_FD`` is where ``faulthandler`` writes all threads' stacks on
  :data:`STACK_SIGNAL`, a real-time signal no program uses (it works while the rank is blocked
  inside C++: the store's connect, gloo's mesh). Not SIGUSR1: a scenario may send SIGUSR1 (as
  Slurm's ``--signal`` does) and the rank must meet it as a real program would.
* The start line: when every rank reported ``ready``, the supervisor writes :data:`GO_LINE` on
  a rank's stdin to release it. End of file instead means the supervisor is gone.

Events, in the order a rank sends them
--------------------------------------
``phase start`` (pid) -> ``phase import`` -> ``ready`` (torch version, python, pid, and
:func:`torch_identity`: which interpreter and which torch files the rank really runs) ->
``released`` -> ``phase init`` -> ``joined`` (rank, world_size) -> one phase per workload
entry ... -> ``phase destroy`` -> ``phase exit`` -> ``result`` (status ok | exception, phase,
exc). A rank that raises sends ``result`` with status ``exception`` and an
:class:`ExceptionRecord`. Every event carries ``t``, the rank's ``time.monotonic()`` (one clock
for the whole machine).

The workload and its phases
---------------------------
The workload's entries and the phases each enters are its step kinds' (one module each in
:mod:`harness.ranks.workload`, which has the grammar, ``workload_phases`` and
``phase_problem``); the phase names are this module's (:data:`PHASE_TABLE`), and so is the
model a ``ddp`` entry builds (:func:`model_shape`), which the judge reads back too.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Tuple

EVENT_FD_ENV = "HARNESS_EVENT_FD"
STACK_FD_ENV = "HARNESS_STACK_FD"
GO_LINE = b"go\n"
# faulthandler's stack dump: a real-time signal (default action: terminate) that no program
# or launcher sends, so SIGUSR1/SIGUSR2 stay the program's own
STACK_SIGNAL = signal.SIGRTMIN + 4

# the observer's channel (harness.ranks.observer): a process the harness did not write (a torchrun
# agent and its workers, a spawning parent and its children, a user's script) writes its events
# to a file of its own in the folder HARNESS_OBSERVE_DIR: an agent's workers inherit no file
# descriptor of the harness. A process the harness starts itself is told its own file, label
# and start-line descriptor (popped, so that what it starts does not inherit them).
OBSERVE_DIR_ENV = "HARNESS_OBSERVE_DIR"
OBSERVE_ROLE_ENV = "HARNESS_OBSERVE_ROLE"      # the role of the process this environment reaches
OBSERVE_EVENTS_ENV = "HARNESS_OBSERVE_EVENTS"  # a held process's own event file
OBSERVE_LABEL_ENV = "HARNESS_OBSERVE_LABEL"    # a held process's label; its children: NODE
OBSERVE_NODE_ENV = "HARNESS_OBSERVE_NODE"      # the label of the agent or parent of a worker
OBSERVE_JOB_ENV = "HARNESS_OBSERVE_JOB"        # "job2" for a second job's processes
GO_FD_ENV = "HARNESS_GO_FD"                    # where a held process reads the start line
# the names of the variables the plan sets or unsets for a process the harness starts: the
# process records their values as it got them (its start event), to compare with the plan
PLANNED_ENV = "HARNESS_PLANNED_ENV"


def planned_env_record(names: str) -> dict:
    """What this process got of the variables its plan names (``PLANNED_ENV``'s value, comma
    separated): name -> value, None where unset."""
    return {k: os.environ.get(k) for k in names.split(",") if k}
PID_RECORD_ENV = "HARNESS_PID_RECORD"          # the run's pid record (harness.machine.procs)
SUPERVISOR_ENV = "HARNESS_SUPERVISOR"          # "pid:start ticks" of the run's supervisor
OBSERVE_SITE = "_site"                         # harness/_site: the sitecustomize folder
# a run's own temp folder, in its run directory (harness.machine.rundir makes it): every process the
# run starts has it as TMPDIR (torchrun's agent makes a torchelastic_* log folder there each time
# and never removes it, a program its temp files), so the run's removal, or the sweep of a
# killed run, takes them along
RUN_TMP = "tmp"

# roles: ``rank`` a rank the harness started itself (direct launcher, a user's program);
# ``agent`` a torchrun agent; ``parent`` a process that spawns the ranks; ``worker`` a rank an
# agent or a parent started; ``child`` anything a rank starts (recorded, not a row)
ROLE_RANK, ROLE_AGENT, ROLE_PARENT, ROLE_WORKER, ROLE_CHILD = \
    "rank", "agent", "parent", "worker", "child"
ROLE_MP_WORKER = "mp-worker"   # (env only) a worker if a multiprocessing child, else a child
ROW_ROLES = (ROLE_RANK, ROLE_AGENT, ROLE_PARENT, ROLE_WORKER)

# event names
PHASE = "phase"
READY = "ready"
RELEASED = "released"
JOINED = "joined"
RESULT = "result"
HELLO = "hello"          # an observed process's first word: role, pid, ppid, rank, attempt...
IDENTITY = "identity"    # an observed worker learnt its rank (init_process_group, spawn index)
DONE = "done"            # a watched call returned (phase)
RAISED = "raised"        # a watched call raised (phase, exc), even if the program caught it
REAPED = "reaped"        # an agent or parent collected a child's exit (pid, returncode)
RESTART = "restart"      # a torchrun agent restarts its workers (attempt)
RENDEZVOUS_DONE = "rendezvous_done"   # an agent's rendezvous result (group rank, master...)
WORKERS_STARTED = "workers_started"   # an agent or parent started workers (pids)

# result statuses
OK = "ok"
EXCEPTION = "exception"

# phases: where a process was, in the order a rank meets them: (name, pattern, whether a
# trigger may wait for it). The harness's worker enters ``workload step N``; a program the
# observer watches (harness.ranks.observer) enters ``init``, ``ddp`` (DistributedDataParallel is
# being built: the parameter broadcast), ``train step N`` (the N-th forward of a DDP module),
# ``collective N`` (its N-th collective called from Python) and ``destroy``; a torchrun agent enters
# ``rendezvous`` and ``workers`` (it started its workers); a spawning parent ``spawn``.
PHASE_TABLE: Tuple[Tuple[str, str, bool], ...] = (
    ("start", r"start", False),
    ("import", r"import", False),
    ("init", r"init", True),
    ("model", r"model", True),
    ("ddp", r"ddp", True),
    ("train step N", r"train step [0-9]{1,6}", True),
    ("collective N", r"collective [0-9]{1,6}", True),
    ("workload step N", r"workload step [0-9]{1,4}", True),
    ("destroy", r"destroy", True),
    ("rendezvous", r"rendezvous", True),
    ("workers", r"workers", True),
    ("spawn", r"spawn", True),
    ("exit", r"exit", False),
)
PHASE_NAMES = tuple(name for name, _, _ in PHASE_TABLE)
PHASE_RE = re.compile(r"^(" + "|".join(p for _, p, _ in PHASE_TABLE) + r")\Z", re.ASCII)
# the phases a trigger can wait for (the ones after the start line that a process enters)
TRIGGER_PHASE_RE = re.compile(r"^(" + "|".join(p for _, p, t in PHASE_TABLE if t) + r")\Z",
                              re.ASCII)
TRIGGER_PHASE_HELP = ", ".join(repr(n) if " " in n else n for n, _, t in PHASE_TABLE if t)
PHASE_HELP = ", ".join(repr(n) if " " in n else n for n in PHASE_NAMES)


# -- the model of a ddp entry (harness.ranks.workload.ddp builds it; the judge reads it) --
DDP_DEFAULT_MB = 4.0
MODEL_WIDTH = 1024               # the model: Linear(1024, 1024) layers, 4 MiB each
TRAIN_BATCH = 8                  # rows of each training step's input


def model_mb(entry: str) -> float:
    """The model size (MiB) of a ``ddp`` entry: ``ddp`` -> 4, ``ddp 64MB`` -> 64, ``ddp 1GB``
    -> 1024."""
    parts = entry.split()
    if len(parts) == 1:
        return DDP_DEFAULT_MB
    size = parts[1]
    return float(size[:-2]) * (1024.0 if size.endswith("GB") else 1.0)


def model_shape(size_mb: float) -> Tuple[int, int]:
    """(width, layers) of the model of ``size_mb`` MiB: ``layers`` Linear(width, width) layers
    (weights and biases, float32). Sizes below one layer of MODEL_WIDTH get a narrower layer."""
    per_layer = (MODEL_WIDTH * MODEL_WIDTH + MODEL_WIDTH) * 4 / 2**20
    if size_mb >= per_layer:
        return MODEL_WIDTH, max(1, round(size_mb / per_layer))
    return max(1, int((size_mb * 2**20 / 4) ** 0.5)), 1


@dataclass
class RaiseSpec:
    """What a rank raises when it enters ``phase`` (a fault that makes it raise)."""

    phase: str
    exception: str                   # a builtin exception's name or torch.distributed's
    message: str = ""


@dataclass
class Variation:
    """How one rank's run differs from the others' (faults that act inside the rank)."""

    skip: List[str] = field(default_factory=list)    # phases whose collective it skips
    raise_at: Optional[RaiseSpec] = None
    model_change: str = ""           # "" | extra_layer | wider (DDP's parameter-shape check)
    slow_at: Dict[str, float] = field(default_factory=dict)   # phase -> seconds it sleeps there
    steps: Optional[List[str]] = None   # a workload of its own (a rank-dependent branch)

    def is_plain(self) -> bool:
        return not self.skip and self.raise_at is None and not self.model_change \
            and not self.slow_at and self.steps is None

    @classmethod
    def of(cls, d: Dict[str, Any]) -> Variation:
        """A Variation from its JSON (``asdict``) form."""
        var = dict(d or {})
        if var.get("raise_at"):
            var["raise_at"] = RaiseSpec(**var["raise_at"])
        return cls(**var)


# Where a launcher starts the workers from one shared spec (torchrun, launch, spawn, srun), the
# per-rank variations travel in this variable of the launcher's process, which its workers
# inherit: {rank: Variation as JSON}; each worker takes its own by the rank it was given, in
# every attempt (harness.run.plan.RunPlan.variations)
RANK_VARIATIONS_ENV = "HARNESS_RANK_VARIATIONS"


def own_rank(init_rank: Optional[int]) -> Optional[int]:
    """A worker's rank before init: the plan's, else as its launcher set it (torchrun, launch,
    spawn: RANK; srun: SLURM_PROCID); None when nothing says."""
    import os

    if init_rank is not None:
        return init_rank
    for v in (os.environ.get("RANK"), os.environ.get("SLURM_PROCID")):
        if v is not None and v.strip().isdigit():
            return int(v)
    return None


# -- labels ------------------------------------------------------------------------------------
# A row of the verdict table is one process: a rank "R" (attempt 0) or "R@A" (the A-th restart
# of a torchrun agent's workers), an agent "agent:HOST", a spawning parent "parent:HOST"; a
# second job's processes carry its prefix ("job2:0", "job2:agent:local").
AGENT_PREFIX = "agent:"
PARENT_PREFIX = "parent:"
_HOST = r"[A-Za-z0-9][A-Za-z0-9_-]{0,15}"
_LABEL_RE = re.compile(r"^(?:(?P<job>job[0-9]{1,3}):)?(?:(?P<rank>[0-9]{1,4})(?:@(?P<attempt>"
                       rf"[0-9]{{1,3}}))?|(?P<kind>agent|parent):(?P<host>{_HOST}))\Z", re.ASCII)


class Label(NamedTuple):
    kind: str                  # rank | agent | parent
    job: str = ""
    rank: Optional[int] = None
    attempt: int = 0
    host: str = ""


def worker_label(rank: int, attempt: int = 0, job: str = "") -> str:
    """"1" (attempt 0), "1@2" (its second restart), "job2:1"."""
    return (f"{job}:" if job else "") + str(rank) + (f"@{attempt}" if attempt else "")


def agent_label(host: str, job: str = "") -> str:
    return (f"{job}:" if job else "") + AGENT_PREFIX + host


def parent_label(host: str, job: str = "") -> str:
    return (f"{job}:" if job else "") + PARENT_PREFIX + host


def row_name(label: Any, claims: Any = None) -> str:
    """A row's label as every table shows it: with the rank its process told torch where that
    is not its own (``1 (claims rank 0)``: two processes said RANK=0)."""
    return f"{label}" if claims is None else f"{label} (claims rank {claims})"


def parse_label(label: str) -> Optional[Label]:
    """The parts of a row's label; None if it is not one (a provisional "pid1234", say)."""
    m = _LABEL_RE.match(label) if isinstance(label, str) else None
    if m is None:
        return None
    job = m.group("job") or ""
    if m.group("rank") is not None:
        return Label("rank", job, int(m.group("rank")), int(m.group("attempt") or 0))
    return Label(m.group("kind"), job, host=m.group("host"))


def check_trigger_phase(phase: str) -> str:
    """The one phase syntax of triggers; raises ValueError with the allowed forms."""
    if not isinstance(phase, str) or not TRIGGER_PHASE_RE.match(phase):
        raise ValueError(f"phase {str(phase)[:40]!r}: use {TRIGGER_PHASE_HELP}")
    return phase


# an anchor a timed step can wait for besides a phase: the process has ended, as the supervisor
# saw it (a gate on another process's exit, e.g. a signal sent once rank 0 is gone); not a
# phase a process enters, so never a verdict's phase nor a slow_rank's
ENDED = "ended"
# whose phase: every rank of the scenario's job (attempt 0), the trigger holding once the last
# of them entered it (a gate on the whole job's state, e.g. a signal once all ranks are in init)
EVERY_RANK = "*"
ANCHOR_HELP = f"{TRIGGER_PHASE_HELP}, or {ENDED} (the process has ended)"


def check_anchor(phase: str) -> str:
    """A timed step's anchor: a trigger phase or ``ended``; raises ValueError with the forms."""
    if phase == ENDED:
        return phase
    if not isinstance(phase, str) or not TRIGGER_PHASE_RE.match(phase):
        raise ValueError(f"phase {str(phase)[:40]!r}: use {ANCHOR_HELP}")
    return phase


def check_optional_trigger_phase(phase: Optional[str]) -> Optional[str]:
    """A fault's optional ``phase:`` (None: not given), in the one syntax of triggers."""
    return None if phase is None else check_trigger_phase(phase)


def url_host(addr: str) -> str:
    """An address as the host part of a URL: an IPv6 literal in brackets (RFC 3986)."""
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr


@dataclass
class InitSpec:
    """How a rank calls ``init_process_group``."""

    method: str                      # env | tcp | file
    url: Optional[str] = None        # tcp://addr:port or file:///path; None for env
    rank: Optional[int] = None       # passed to init_process_group (tcp/file); None: from env
    world_size: Optional[int] = None
    port2: Optional[int] = None      # a second reserved port: ``reinit new_port`` moves there

    def with_url(self, url: str) -> InitSpec:
        return replace(self, url=url)


@dataclass
class WorkerSpec:
    """What one rank runs: its argv's JSON."""

    label: str
    backend: Optional[str]            # None: not passed to init_process_group
    timeout: float
    steps: List[str]
    destroy: bool
    init: InitSpec
    variation: Variation = field(default_factory=Variation)
    rank_timeouts: Dict[str, float] = field(default_factory=dict)   # rank -> s (JSON keys)

    def timeout_of(self, rank: Optional[int]) -> float:
        """This rank's init_process_group timeout (rank_timeouts:, else timeout:)."""
        return self.rank_timeouts.get(str(rank), self.timeout) if rank is not None \
            else self.timeout

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        d = json.loads(text)
        d["init"] = InitSpec(**d["init"])
        d["variation"] = Variation.of(d.get("variation") or {})
        return cls(**d)


@dataclass(frozen=True)
class ExceptionRecord:
    """An exception as the rank saw it: class (with its MRO, for ``exception:`` matching),
    message and the formatted traceback. JSON keys: type, qualname, mro, message, traceback."""

    type: str
    qualname: str
    classes: List[str]               # the MRO, qualified names ("mro" in JSON)
    message: str
    traceback: str

    @classmethod
    def of(cls, exc: BaseException) -> ExceptionRecord:
        c = type(exc)
        return cls(type=c.__name__, qualname=f"{c.__module__}.{c.__qualname__}",
                   classes=[f"{k.__module__}.{k.__qualname__}" for k in c.__mro__],
                   message=str(exc),
                   traceback="".join(traceback.format_exception(c, exc, exc.__traceback__)))

    def to_dict(self) -> Dict[str, Any]:
        return {"type": self.type, "qualname": self.qualname, "mro": list(self.classes),
                "message": self.message, "traceback": self.traceback}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> ExceptionRecord:
        return cls(type=str(d.get("type", "")), qualname=str(d.get("qualname", "")),
                   classes=list(d.get("mro", [])), message=str(d.get("message", "")),
                   traceback=str(d.get("traceback", "")))


@dataclass(frozen=True)
class Event:
    """One event a rank sent. ``data`` holds the event's own fields (phase, rank, exc...)."""

    ev: str
    t: float
    data: Dict[str, Any] = field(default_factory=dict)

    @property
    def phase(self) -> Optional[str]:
        """The phase this event is about: a ``phase`` event's new phase, a result's phase."""
        p = self.data.get("phase")
        return str(p) if p is not None else None

    def to_dict(self) -> Dict[str, Any]:
        return {"ev": self.ev, "t": self.t, **self.data}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> Event:
        rest = {k: v for k, v in d.items() if k not in ("ev", "t")}
        return cls(ev=str(d.get("ev", "")), t=float(d.get("t", 0.0)), data=rest)


def encode(ev: str, **fields: Any) -> bytes:
    """One event as the bytes of one line (the rank writes it with a single ``write(2)``)."""
    rec = {"ev": ev, "t": time.monotonic(), **fields}
    return (json.dumps(rec, default=str) + "\n").encode()


def result_of(events: Iterable[Event]) -> Optional[Event]:
    """The rank's result event (its last word: ok, or the exception), if it sent one."""
    for e in events:
        if e.ev == RESULT:
            return e
    return None


def last_phase(events: Iterable[Event]) -> str:
    """The phase a rank was in at its last ``phase`` event ("start" if it sent none)."""
    phase = "start"
    for e in events:
        if e.ev == PHASE and e.phase:
            phase = e.phase
    return phase


def entered(events: Iterable[Event], phase: str) -> Optional[float]:
    """When (the rank's monotonic ``t``) the rank entered ``phase``; None if it did not."""
    for e in events:
        if e.ev == PHASE and e.phase == phase:
            return e.t
    return None


def torch_identity(torch: Any) -> Dict[str, str]:
    """What a rank says from inside about what it runs: its interpreter and the folder its
    torch was imported from (a report's torch is what its ranks said, never a guess from
    another interpreter)."""
    import os
    import sys

    return {"python": sys.executable,
            "torch_path": os.path.dirname(os.path.abspath(getattr(torch, "__file__", "") or ""))}


def ready_event(events: Iterable[Event]) -> Optional[Event]:
    for e in events:
        if e.ev == READY:
            return e
    return None


class EventReader:
    """Reads a rank's event file incrementally; a line still being written is kept for later,
    a line that is not JSON (a rank killed mid-write cannot produce one, but a hostile program
    can) is skipped."""

    def __init__(self, path: Any):
        self.path = path
        self._offset = 0
        self._partial = b""

    def read(self) -> List[Event]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return []
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        out: List[Event] = []
        for line in lines:
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if isinstance(d, dict):
                out.append(Event.from_dict(d))
        return out

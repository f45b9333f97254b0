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
``phase start`` (pid) -> ``phase import`` -> ``ready`` (torch version, pid) -> ``released`` ->
``phase init`` -> ``joined`` (rank, world_size) -> ``phase workload step N`` (step) ... ->
``phase destroy`` -> ``phase exit`` -> ``result`` (status ok | exception, phase, exc).
A rank that raises sends ``result`` with status ``exception`` and an :class:`ExceptionRecord`.
Every event carries ``t``, the rank's ``time.monotonic()`` (one clock for the whole machine).
"""

from __future__ import annotations

import json
import re
import signal
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, Iterable, List, Optional

EVENT_FD_ENV = "HARNESS_EVENT_FD"
STACK_FD_ENV = "HARNESS_STACK_FD"
GO_LINE = b"go\n"
# faulthandler's stack dump: a real-time signal (default action: terminate) that no program
# or launcher sends, so SIGUSR1/SIGUSR2 stay the program's own
STACK_SIGNAL = signal.SIGRTMIN + 4

# event names
PHASE = "phase"
READY = "ready"
RELEASED = "released"
JOINED = "joined"
RESULT = "result"

# result statuses
OK = "ok"
EXCEPTION = "exception"

# phases: where a rank was. ``start`` and ``import`` come before the start line.
PHASE_NAMES = ("start", "import", "init", "workload step N", "destroy", "exit")
PHASE_RE = re.compile(r"^(start|import|init|workload step [0-9]{1,4}|destroy|exit)\Z", re.ASCII)
# the phases a trigger can wait for (the ones after the start line that a rank enters)
TRIGGER_PHASE_RE = re.compile(r"^(init|workload step [0-9]{1,4}|destroy)\Z", re.ASCII)
TRIGGER_PHASE_HELP = "init, 'workload step N' or destroy"


def check_trigger_phase(phase: str) -> str:
    """The one phase syntax of triggers; raises ValueError with the allowed forms."""
    if not isinstance(phase, str) or not TRIGGER_PHASE_RE.match(phase):
        raise ValueError(f"phase {str(phase)[:40]!r}: use {TRIGGER_PHASE_HELP}")
    return phase


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

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        d = json.loads(text)
        d["init"] = InitSpec(**d["init"])
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

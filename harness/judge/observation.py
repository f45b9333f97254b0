"""Observations: what the supervisor saw of a run, typed (dicts only at the JSON edge).

A :class:`RunObservation` holds one :class:`RankObservation` per process the launcher made
(its events, exit, signals sent to it, stacks and output tails), the step log (what the
faults did and when), and the evidence taken around the run (who held the master port, the
nftables rules at the end). ``classify`` reads it; ``to_dict``/``from_dict`` are the JSON edge
(``observation.json`` in the evidence, the report).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ..core.protocol import READY, Event, result_of
from ..net.sockets import SocketRecord


@dataclass
class StepRecord:
    """The step log: what was done or undone, when, and how it went (evidence)."""

    step: str                    # the step's id
    fault: str
    action: str                  # do | undo
    what: str
    target: str
    t: float                     # seconds after the start line (0.0 for set-up)
    error: Optional[str] = None
    info: Dict[str, Any] = field(default_factory=dict)   # what do() returned (a helper's pid)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class SignalSent:
    """A signal a step sent to a rank (evidence: a rank killed by it is 'sent by the fault')."""

    signal: str                          # KILL, STOP, CONT...
    t: float                             # seconds after the start line
    why: str = ""                        # the fault kind

    def to_dict(self) -> Dict[str, Any]:
        return {"signal": self.signal, "t": self.t, "why": self.why}


@dataclass
class RankObservation:
    """One row: a rank, an agent, a spawning parent or a worker found through its events."""

    label: str
    pid: Optional[int] = None
    host: str = "local"
    addr: str = "127.0.0.1"
    events: List[Event] = field(default_factory=list)
    returncode: Optional[int] = None     # negative: killed by that signal
    killed_at_deadline: bool = False
    signals: List[SignalSent] = field(default_factory=list)
    stacks: str = ""                     # faulthandler's dump (all threads) of a hung rank
    stdout_tail: str = ""
    stderr_tail: str = ""
    stderr_key: str = ""                 # torch's warning/error and errno lines of the whole
    #                                      stderr (harness.judge.stderrlines), which the tail
    #                                      may lose
    native_stacks: str = ""              # py-spy's native stacks of a hung rank, as text
    native_threads: List[Dict[str, Any]] = field(default_factory=list)   # the same, as read
    #                                      (harness.judge.pyspy.trim of py-spy dump --native --json)
    released_at: Optional[float] = None  # seconds after the start line
    ended_at: Optional[float] = None     # seconds after the start line (as seen by the supervisor)
    notes: List[str] = field(default_factory=list)   # what steps found out about it (an OOM kill)
    role: str = "rank"                   # rank | agent | parent | worker (harness.core.protocol)
    node: Optional[str] = None           # a worker's agent or parent (its label)
    attempt: int = 0                     # a torchrun worker's restart attempt
    restart_of: Optional[str] = None     # the process this one started again (restart_after)
    info: Dict[str, Any] = field(default_factory=dict)   # what an observed process said first
    sockets: List[SocketRecord] = field(default_factory=list)   # its TCP sockets at the
    #     deadline (before the kill) or when its result said it raised (harness.net.sockets)
    # seconds its threads waited for a CPU (runqueue: the machine's load), read by the
    # supervisor at the deadline for a rank still alive (harness.machine.procs.runqueue_wait)
    waited_at_deadline: Optional[float] = None
    # (seconds after the start line, CPU seconds it had used) of a rank alive near the deadline:
    # read a little before it and at it (harness.run.supervisor), so a rank at work is told from a
    # stuck one (harness.machine.procs.cpu_seconds: user and system time of all its threads)
    cpu_samples: List[Tuple[float, float]] = field(default_factory=list)

    def result(self) -> Optional[Event]:
        return result_of(self.events)

    def cpu_wait(self) -> Optional[float]:
        """Seconds its threads waited for a CPU between the start line (or its own start, for a
        process started after it) and its end: what the machine's load added to its duration,
        at most (summed over threads). From its result, else the supervisor's read at the
        deadline; None when neither was taken (a rank killed by a signal)."""
        res = self.result()
        end = res.data.get("cpu_wait") if res is not None else None
        if end is None:
            end = self.waited_at_deadline
        if end is None:
            return None
        rel = next((e for e in self.events if e.ev == "released"), None)
        start = rel.data.get("cpu_wait", 0.0) if rel is not None else 0.0
        return round(max(0.0, float(end) - float(start or 0.0)), 3)

    def ready(self) -> bool:
        return any(e.ev == READY for e in self.events)

    def to_dict(self) -> Dict[str, Any]:
        return {"label": self.label, "pid": self.pid, "host": self.host, "addr": self.addr,
                "events": [e.to_dict() for e in self.events], "returncode": self.returncode,
                "killed_at_deadline": self.killed_at_deadline,
                "signals": [s.to_dict() for s in self.signals], "stacks": self.stacks,
                "stdout_tail": self.stdout_tail, "stderr_tail": self.stderr_tail,
                "stderr_key": self.stderr_key,
                "native_stacks": self.native_stacks,
                "native_threads": [dict(t) for t in self.native_threads],
                "released_at": self.released_at,
                "ended_at": self.ended_at, "notes": list(self.notes), "role": self.role,
                "node": self.node, "attempt": self.attempt, "info": dict(self.info),
                "sockets": [x.to_dict() for x in self.sockets],
                "waited_at_deadline": self.waited_at_deadline,
                "cpu_samples": [list(x) for x in self.cpu_samples],
                **({"restart_of": self.restart_of} if self.restart_of else {})}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> RankObservation:
        return cls(label=str(d["label"]), pid=d.get("pid"), host=d.get("host", "local"),
                   addr=d.get("addr", ""),
                   events=[Event.from_dict(e) for e in d.get("events", [])],
                   returncode=d.get("returncode"),
                   killed_at_deadline=bool(d.get("killed_at_deadline")),
                   signals=[SignalSent(str(s.get("signal")), float(s.get("t", 0.0)),
                                       str(s.get("why", ""))) for s in d.get("signals", [])],
                   stacks=d.get("stacks", ""), stdout_tail=d.get("stdout_tail", ""),
                   stderr_tail=d.get("stderr_tail", ""),
                   stderr_key=d.get("stderr_key", ""),
                   native_stacks=d.get("native_stacks", ""),
                   native_threads=[dict(t) for t in d.get("native_threads") or []
                                   if isinstance(t, dict)],
                   released_at=d.get("released_at"), ended_at=d.get("ended_at"),
                   notes=[str(n) for n in d.get("notes", [])],
                   role=str(d.get("role", "rank")), node=d.get("node"),
                   attempt=int(d.get("attempt") or 0), restart_of=d.get("restart_of"),
                   info=dict(d.get("info") or {}),
                   sockets=[SocketRecord.from_dict(x) for x in d.get("sockets") or []],
                   waited_at_deadline=d.get("waited_at_deadline"),
                   cpu_samples=[(float(x[0]), float(x[1])) for x in d.get("cpu_samples") or []
                                if isinstance(x, (list, tuple)) and len(x) == 2])


@dataclass
class RunObservation:
    plan: Dict[str, Any]                 # the plan as it ran (its JSON form)
    torch_version: str
    ranks: List[RankObservation]
    wall: float                          # seconds from the start line to the end of the run
    run_dir: str
    t0: float = 0.0                      # the start line, on the monotonic clock
    step_log: List[StepRecord] = field(default_factory=list)   # what the faults did, when
    port_owners: List[Dict[str, Any]] = field(default_factory=list)  # who held MASTER_PORT
    rules: Dict[str, str] = field(default_factory=dict)          # nft rules per host at the end
    counters: Dict[str, Dict[str, int]] = field(default_factory=dict)   # per host: its kernel's
    #                                            TCP counters at the end (listen overflows...)
    # the harness's own memory at the start line: supervisor and fork servers (RSS, MiB), and
    # per rank of the run (harness.run.supervisor)
    harness_memory: Dict[str, Any] = field(default_factory=dict)
    # what the run's store held, asked at the deadline or when a rank first raised
    # (harness.net.storeprobe.StoreSnapshot's dict; empty when never asked)
    store: Dict[str, Any] = field(default_factory=dict)
    # the other stores of the run, asked at the same moments: the stores torchrun's workers
    # host themselves (share_store: false), apart from the agents' rendezvous store above
    stores: List[Dict[str, Any]] = field(default_factory=list)
    # start: fork: the run's fork servers, one per host with forked ranks: host, warm (forked
    # from the session's zygote) or not, and a fresh one's note (why not warm)
    servers: List[Dict[str, Any]] = field(default_factory=list)
    # what each fault did, per target, with its evidence (harness.judge.effects.aggregate), read at
    # the end of the run before teardown
    effects: List[Dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return {"plan": self.plan, "torch_version": self.torch_version,
                "ranks": [r.to_dict() for r in self.ranks], "wall": self.wall,
                "run_dir": self.run_dir, "t0": self.t0,
                "step_log": [s.to_dict() for s in self.step_log],
                "port_owners": self.port_owners, "rules": self.rules,
                "counters": self.counters,
                "harness_memory": self.harness_memory, "store": self.store,
                "stores": self.stores, "servers": self.servers, "effects": self.effects}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> RunObservation:
        return cls(plan=d.get("plan", {}), torch_version=str(d.get("torch_version", "")),
                   ranks=[RankObservation.from_dict(r) for r in d.get("ranks", [])],
                   wall=float(d.get("wall", 0.0)), run_dir=str(d.get("run_dir", "")),
                   t0=float(d.get("t0", 0.0)),
                   step_log=[StepRecord(**s) for s in d.get("step_log", [])],
                   port_owners=list(d.get("port_owners", [])), rules=dict(d.get("rules", {})),
                   counters={str(h): {str(k): int(v) for k, v in c.items()}
                             for h, c in (d.get("counters") or {}).items()},
                   harness_memory=dict(d.get("harness_memory", {})),
                   store=dict(d.get("store") or {}),
                   stores=[dict(x) for x in d.get("stores") or []],
                   servers=[dict(x) for x in d.get("servers") or []],
                   effects=[dict(x) for x in d.get("effects") or []])

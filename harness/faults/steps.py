"""Steps: what a fault does to a run, each at its trigger, and the scheduler that fires them.

A fault's ``apply`` adds :class:`Step` objects to the plan (pure: a step is data until it is
fired). A step has a :class:`~harness.core.triggers.Trigger` for its ``do`` and, optionally, one for
its ``undo`` (a heal); a step that was done and not undone is undone at teardown, in reverse
order, so that nothing a step made outlives the run. ``do`` and ``undo`` act only through the
small :class:`Runtime` interface (ranks, hosts and their network, helper processes, the run
directory): the supervisor fires steps without knowing any fault by name.

A third-party fault adds its own Step subclasses the same way; see docs/architecture.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional, Protocol, Sequence

from ..core.triggers import Clock, Trigger
from ..judge.observation import StepRecord
from ..services import Service, ServiceSpec

RUN = "run"   # the "fault" of the run's own set-up steps (a directory, the resolver view)


class StepError(RuntimeError):
    """A step could not be done or undone: the harness failed, not the scenario."""


class RankControl(Protocol):
    """What a step may do to a rank."""

    label: str

    @property
    def pid(self) -> Optional[int]: ...

    @property
    def released(self) -> bool: ...

    @property
    def ended(self) -> bool: ...

    def signal(self, name: str) -> None:
        """Send SIG<name> to the rank's process group and record it as evidence."""

    def note(self, text: str) -> None:
        """Record what a step found out about the rank (its verdict's reason says it)."""


class Helper(Protocol):
    """A helper process a step started (a port holder, a one-shot job); owned by the run."""

    @property
    def pid(self) -> int: ...

    def stop(self) -> object: ...


class Runtime(Protocol):
    """The run as steps see it. Times are seconds after the start line (0 before it)."""

    plan: Any                    # the RunPlan (harness.run.plan) being run
    run_dir: Path

    def now(self) -> float: ...

    def rank(self, label: str) -> RankControl: ...

    def host(self, name: str) -> Any:
        """The plan's HostPlan of that name (its address, interface, namespace)."""

    @property
    def net(self) -> Any:
        """The run's network (:class:`harness.net.topology.Topology`); a StepError if it has
        none."""

    def start_helper(self, name: str, argv: Sequence[str], *, host: Optional[str] = None,
                     ready_line: Optional[bytes] = b"ready") -> Helper:
        """Start ``argv`` (a harness helper program) on ``host``, inside the run's lifetime,
        and wait for ``ready_line`` on its stdout (None: do not wait). A service whose
        readiness is that line."""

    def start_service(self, spec: ServiceSpec) -> Service:
        """Start a service (harness.services) on ``spec.host``, owned by the run (recorded,
        stopped with the run, swept after a killed one), and wait until it answers."""

    def service(self, name: str) -> Service:
        """A service this run started, by name (a StepError if there is none)."""

    def run_helper(self, name: str, argv: Sequence[str], *, host: Optional[str] = None,
                   timeout: float = 180.0) -> Any:
        """Run ``argv`` to its end (a subprocess.CompletedProcess with text output)."""

    def python(self, module: str, *args: str) -> List[str]:
        """argv that runs ``python -m module args`` with the ranks' interpreter."""

    def step_done(self, step_id: str) -> Optional[float]:
        """When the step ``step_id`` was done (s after the start line), None if not yet."""

    def restart(self, label: str) -> RankControl:
        """Start the plan's restart ``label`` (``RunPlan.restarts``: a copy of a process the
        launcher started, same argv, environment and host) through the launcher, owned by the
        run like every process it started; its row is ``label``."""


@dataclass
class Effect:
    """What a step's probe saw: whether the step acted on the run, in a few words with their
    numbers ("0 packets matched", "SIGKILL delivered to pid 812, alive"), the numbers by name,
    and timed events (seconds after the start line) where the probe has them."""

    acted: bool
    summary: str
    numbers: Dict[str, Any] = field(default_factory=dict)
    events: List[Dict[str, Any]] = field(default_factory=list)   # [{"t": 1.2, "what": ...}]

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Step:
    """One thing done to a run at ``trigger``; undone at ``undo_trigger`` or at teardown.

    Subclasses are dataclasses with the step's parameters as fields; they override ``do``
    (and ``undo`` when there is something to take back) and ``describe``. State a step keeps
    between do and undo (a rule handle, a helper process) goes in fields declared with
    ``field(default=None, init=False, repr=False, compare=False)`` whose names start with ``_``:
    they are not part of the plan."""

    trigger: Trigger = field(default_factory=Trigger.setup)
    undo_trigger: Optional[Trigger] = None
    id: str = ""                 # set by the plan: "<fault kind>#<fault index>.<step index>"
    fault: str = ""              # the kind of the fault that added it
    fault_no: int = 0            # set by the plan: the fault's number in its case (1, 2...);
    #                              0 for the run's own set-up steps
    target: str = ""             # what it acts on, for tables and the timeline: "rank 1", "host a"
    # undone at teardown when done and not undone yet; a change to the run's own network needs
    # no undo there (it goes with the namespaces), a change to the file system does
    UNDO_AT_TEARDOWN: ClassVar[bool] = True

    def do(self, rt: Runtime) -> Optional[Dict[str, Any]]:
        """Do it; may return evidence for the step log (a helper's pid, say)."""
        raise NotImplementedError

    def undo(self, rt: Runtime) -> None:
        """Take back what ``do`` did (default: nothing to take back)."""

    def effect(self, rt: Runtime) -> Optional[Effect]:
        """What ``do`` achieved, read at the end of the run, before teardown (the nft counters
        while the namespace is still there, the proxy's log while it runs): an :class:`Effect`
        that says whether it acted, with its numbers and times. None (the default): this kind
        has no probe yet, and its effect reads "not observable", never as proof. Called only
        for a step that was done; a step that never fired reads "no effect" when its kind has
        a probe. A step whose undo (a heal) takes away what it reads keeps what it read there."""
        return None

    @property
    def probed(self) -> bool:
        return type(self).effect is not Step.effect

    def can_fire(self, rt: Runtime) -> bool:
        """Whether the step may fire now that its trigger holds (default: yes). A signal to a
        rank, for instance, waits until the rank was released and never fires once it ended."""
        return True

    def holds_run(self, rt: Runtime) -> bool:
        """Whether the run must go on (until the deadline at most) although every process has
        ended, because this step has yet to fire (default: no). A restart of a killed process
        holds it: the process is due to start again."""
        return False

    def can_undo(self, rt: Runtime) -> bool:
        """Whether the undo may run now that its trigger holds (default: yes): an undo gated
        on what other processes did (etcd started again once every agent dialled it)."""
        return True

    @property
    def undoable(self) -> bool:
        return type(self).undo is not Step.undo

    def describe(self) -> str:
        """What it does, in a few words, for `harness show` and the timeline."""
        return type(self).__name__

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"step": type(self).__name__, "id": self.id, "fault": self.fault,
                             "target": self.target, "what": self.describe(),
                             "trigger": self.trigger.to_dict(), "when": self.trigger.describe()}
        if self.undo_trigger is not None:
            d["undo"] = self.undo_trigger.to_dict()
            d["undo_when"] = self.undo_trigger.describe()
        for f in dataclasses.fields(self):
            if f.name not in d and f.name not in ("trigger", "undo_trigger") \
                    and not f.name.startswith("_"):
                d[f.name] = getattr(self, f.name)
        return d


class Scheduler:
    """Fires a plan's steps: set-up steps before the ranks start, the others when their
    trigger holds, undos at their own trigger, and every remaining undo at teardown."""

    def __init__(self, steps: Sequence[Step], rt: Runtime, clock: Clock):
        self.steps = list(steps)
        self.rt = rt
        self.clock = clock
        self.done: Dict[str, float] = {}
        self.undone: Dict[str, float] = {}
        self.log: List[StepRecord] = []

    # the Clock side of steps: "after another step"
    def step_done(self, step_id: str) -> Optional[float]:
        return self.done.get(step_id)

    def _record(self, s: Step, action: str, t: float, error: Optional[str] = None,
                info: Optional[Dict[str, Any]] = None) -> None:
        self.log.append(StepRecord(s.id, s.fault, action, s.describe(), s.target,
                                   round(t, 3), error, dict(info or {})))

    def _do(self, s: Step, t: float) -> None:
        try:
            info = s.do(self.rt)
        except StepError:
            raise
        except Exception as e:  # noqa: BLE001 - a step's failure is the harness's, said as such
            raise StepError(f"{s.id} ({s.describe()}): {type(e).__name__}: {e}") from e
        self.done[s.id] = t
        self._record(s, "do", t, info=info if isinstance(info, dict) else None)

    def _undo(self, s: Step, t: float) -> None:
        self.undone[s.id] = t
        try:
            s.undo(self.rt)
        except Exception as e:  # noqa: BLE001
            self._record(s, "undo", t, f"{type(e).__name__}: {e}")
            raise StepError(f"undo of {s.id} ({s.describe()}): {type(e).__name__}: {e}") from e
        self._record(s, "undo", t)

    def setup(self) -> None:
        """Do every set-up step, in plan order (before any rank starts)."""
        for s in self.steps:
            if s.trigger.is_setup:
                self._do(s, 0.0)

    def tick(self, now: float) -> None:
        """Fire what is due at ``now`` (seconds after the start line)."""
        clock = _Both(self.clock, self)
        for s in self.steps:
            if s.id not in self.done:
                if not s.trigger.is_setup and s.trigger.due(now, clock) and s.can_fire(self.rt):
                    self._do(s, now)
            elif s.undo_trigger is not None and s.id not in self.undone \
                    and s.undo_trigger.due(now, clock) and s.can_undo(self.rt):
                self._undo(s, now)

    def holding(self) -> bool:
        """A step not done yet holds the run open (:meth:`Step.holds_run`)."""
        return any(s.id not in self.done and s.holds_run(self.rt) for s in self.steps)

    def effects(self, now: float) -> List[Dict[str, Any]]:
        """Every fault step's effect, read now (before teardown): one record per step (its
        fault's number, target, status and evidence; harness.judge.effects aggregates them)."""
        out: List[Dict[str, Any]] = []
        for s in self.steps:
            if s.fault_no <= 0:
                continue
            rec: Dict[str, Any] = {"fault_no": s.fault_no, "kind": s.fault, "step": s.id,
                                   "target": s.target, "what": s.describe(),
                                   "done_at": self.done.get(s.id),
                                   "undone_at": self.undone.get(s.id), "read_at": round(now, 3)}
            if s.id not in self.done:
                rec.update(status="no effect" if s.probed else "not observable",
                           summary=f"never fired: its trigger ({s.trigger.describe()}) did not "
                           "come before the run ended"
                           + ("" if s.probed else "; no probe for this kind"),
                           numbers={}, events=[])
                out.append(rec)
                continue
            try:
                eff = s.effect(self.rt)
            except Exception as e:  # noqa: BLE001 - a probe that fails proves nothing
                rec.update(status="not observable", numbers={}, events=[],
                           summary=f"the probe failed: {type(e).__name__}: {e}")
                out.append(rec)
                continue
            if eff is None:
                rec.update(status="not observable", numbers={}, events=[],
                           summary=f"no probe for {s.fault} yet")
            else:
                rec.update(status="acted" if eff.acted else "no effect", summary=eff.summary,
                           numbers=dict(eff.numbers), events=list(eff.events))
            out.append(rec)
        return out

    def teardown(self, now: float) -> List[str]:
        """Undo, in reverse order, every step done and not undone; return the problems."""
        problems: List[str] = []
        for s in reversed(self.steps):
            if s.id in self.done and s.id not in self.undone and s.undoable \
                    and s.UNDO_AT_TEARDOWN:
                try:
                    self._undo(s, now)
                except StepError as e:
                    problems.append(str(e))
        return problems


class _Both:
    """A clock that knows rank phases (the supervisor's) and step times (the scheduler's)."""

    def __init__(self, ranks: Clock, steps: Scheduler):
        self.ranks, self.steps = ranks, steps

    def phase_entered(self, rank: str, phase: str) -> Optional[float]:
        return self.ranks.phase_entered(rank, phase)

    def step_done(self, step_id: str) -> Optional[float]:
        return self.steps.step_done(step_id)

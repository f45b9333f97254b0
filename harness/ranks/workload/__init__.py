"""The workload's step kinds: one module each, registered by discovery (no hand-kept list).

The workload and its phases
---------------------------
The workload is a list of entries (:data:`WORKLOAD_RE`), each of one step kind. An entry is
the phase ``workload step N`` (N: its place in the list, from 1) unless its kind says
otherwise: ``ddp SIZE`` (``ddp 64MB``) builds a model of that size (phase ``model``) and wraps
it in DistributedDataParallel (phase ``ddp``: the parameter-shape check and the broadcast of
rank 0's parameters); ``train N`` runs N training steps through it (phases ``train step K``, K
counted over every ``train`` entry), each a forward, a backward with DDP's gradient
all-reduce, and an optimizer step. :func:`workload_phases` lists the phases a workload enters,
for the worker and for checks.

The registry
------------
A step kind is one module here defining one :class:`StepKind` subclass with a ``NAME`` (the
entry's first word), its ``GRAMMAR`` (a regular expression of the whole entry), ``HELP`` (how
it is written, for messages), ``ABOUT`` (what a rank does, for the reference page),
``EXAMPLES`` (entries it takes), ``COLLECTIVE`` (every rank of its group must enter it:
``skip_collective`` can skip it), ``ORDER`` (its place in messages and the reference table),
the phases it enters (:meth:`StepKind.phases`, ``workload step N`` unless it says otherwise)
and what the harness's worker does for it (:meth:`StepKind.act`, or the whole of
:meth:`StepKind.run`), on a :class:`Running` that holds the rank's torch, its process groups
and what the workload keeps between entries. The schema's grammar, its help, the collectives,
the phases, the worker's dispatch and the reference page are all read from here.

Adding a step kind touches its module here, a catalog scenario that uses it and tests
(``tests/test_registries.py`` names what is missing); the reference page is regenerated.

Standard library only (and :mod:`harness.core.protocol`, :mod:`harness.core.registry`): a rank
imports this before torch, and the schema imports it too. torch comes in on the
:class:`Running`, never by import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ...core.protocol import JOINED, model_mb  # noqa: F401 - model_mb: the ddp entry's size
from ...core.registry import discover


@dataclass
class Running:
    """A rank's workload while it runs: what a step kind acts on and keeps between entries."""

    spec: Any                          # the rank's protocol.WorkerSpec
    dist: Any                          # torch.distributed
    torch: Any
    device: Any
    init_kwargs: Dict[str, Any]        # what init_process_group was given (reinit repeats it)
    phase: Callable[..., str]          # enter a phase (the worker's: events, raise, sleep)
    emit: Callable[..., None]          # send an event
    skip: Set[str] = field(default_factory=set)      # phases whose collective it skips
    rank: int = -1
    world: int = 0
    groups: List[Any] = field(default_factory=list)  # process groups made, in order
    model: Any = None                  # the ddp entry's DDP module, optimizer, input width
    optimizer: Any = None
    width: int = 0
    trained: int = 0                   # training steps so far (train step K)
    state: Dict[str, Any] = field(default_factory=dict)   # a kind's own, by its NAME

    def joined(self) -> None:
        """The rank joined a process group: its rank and world size, said as an event."""
        self.rank, self.world = self.dist.get_rank(), self.dist.get_world_size()
        self.emit(JOINED, rank=self.rank, world_size=self.world)


class StepKind:
    """One kind of workload entry (see the package doc)."""

    NAME: ClassVar[str] = ""
    GRAMMAR: ClassVar[str] = ""
    HELP: ClassVar[str] = ""
    ABOUT: ClassVar[str] = ""
    EXAMPLES: ClassVar[Tuple[str, ...]] = ()
    COLLECTIVE: ClassVar[bool] = False
    ORDER: ClassVar[int] = 1000

    def matches(self, entry: str) -> bool:
        return re.fullmatch(self.GRAMMAR, entry, re.ASCII) is not None

    def phases(self, entry: str, index: int, seen: Dict[str, int]) -> List[str]:
        """The phases a rank enters for ``entry``, the ``index``-th of its workload; ``seen``
        is shared by every entry of the workload (a kind that counts across entries)."""
        return [f"workload step {index}"]

    def prepare(self, torch: Any) -> None:
        """Imports a rank makes before the start line for this entry, so that its phases time
        the entry's own work (ddp: DDP's lazy imports)."""

    def run(self, w: Running, entry: str, index: int) -> None:
        """The entry as the worker runs it: its phase ``workload step N``, skipped where the
        rank's variation says (skip_collective) or where it cannot run, else :meth:`act`."""
        name = f"workload step {index}"
        if name in w.skip:
            w.phase(name, step=entry, skipped=entry)
            self.skipped(w, entry)
            return
        why = self.skips(w, entry)
        if why is not None:
            w.phase(name, step=entry, skipped=why)
            return
        w.phase(name, step=entry)
        self.act(w, entry)

    def skipped(self, w: Running, entry: str) -> None:
        """What a rank that skipped this entry keeps instead (new_group: a group it never
        made, so the group's collectives go too)."""

    def skips(self, w: Running, entry: str) -> Optional[str]:
        """Why the rank passes this entry by on its own (None: it runs it)."""
        return None

    def act(self, w: Running, entry: str) -> None:
        raise NotImplementedError(f"{type(self).__name__}.act")


def _discover() -> Dict[str, StepKind]:
    """Every StepKind subclass with a NAME in this package's modules, by ORDER then name."""
    kinds = discover(__name__, __path__, StepKind, "workload step")
    found = {name: cls() for name, cls in kinds.items()}
    return dict(sorted(found.items(), key=lambda kv: (kv[1].ORDER, kv[0])))


KINDS: Dict[str, StepKind] = _discover()
STEP_KINDS: Tuple[str, ...] = tuple(KINDS)
COLLECTIVES: Tuple[str, ...] = tuple(n for n, k in KINDS.items() if k.COLLECTIVE)
WORKLOAD_RE = re.compile(r"^(" + "|".join(k.GRAMMAR for k in KINDS.values()) + r")\Z",
                         re.ASCII)
WORKLOAD_HELP = ", ".join(k.HELP for k in KINDS.values())


def kind_of(entry: str) -> Optional[StepKind]:
    """The kind of a workload entry (None: no kind takes it)."""
    kind = KINDS.get(entry.split(" ", 1)[0])
    return kind if kind is not None and kind.matches(entry) else None


def is_collective(entry: str) -> bool:
    """A workload entry every rank of its group must enter (skip_collective can skip it)."""
    kind = KINDS.get(entry.split(" ", 1)[0])
    return kind is not None and kind.COLLECTIVE


def workload_phases(steps: Iterable[str]) -> List[Tuple[str, str]]:
    """(phase, entry) for every phase the workload enters, in order (init and destroy apart)."""
    out: List[Tuple[str, str]] = []
    seen: Dict[str, int] = {}
    for i, entry in enumerate(steps, start=1):
        kind = kind_of(entry)
        phases = kind.phases(entry, i, seen) if kind is not None else [f"workload step {i}"]
        out += [(p, entry) for p in phases]
    return out


def phase_problem(phase: str, steps: Sequence[str], destroy: bool = True) -> Optional[str]:
    """Why a rank running this workload never enters ``phase`` (None: it does)."""
    if phase == "init" or (phase == "destroy" and destroy):
        return None
    if phase == "destroy":
        return "the workload does not destroy the process group (destroy: false)"
    names = {p for p, _ in workload_phases(steps)}
    if phase in names:
        return None
    have = ", ".join(_ranges(p for p, _ in workload_phases(steps))) or "none"
    return f"the workload never enters {phase!r} (its phases after init: {have})"


def _ranges(phases: Iterable[str]) -> List[str]:
    """'train step 1', 'train step 2', 'train step 3' -> 'train step 1..3'."""
    out: List[str] = []
    run: List[int] = []

    def flush() -> None:
        if run:
            out.append(f"train step {run[0]}" + (f"..{run[-1]}" if len(run) > 1 else ""))
            run.clear()

    for p in phases:
        if p.startswith("train step "):
            run.append(int(p.rsplit(" ", 1)[1]))
            continue
        flush()
        out.append(p)
    flush()
    return out


def check_workload_steps(steps: Optional[List[str]]) -> Optional[List[str]]:
    """Workload steps a fault gives a rank or a job (rank_workload, concurrent_job): each in
    the workload's vocabulary; raises ValueError naming the first unknown one."""
    for s in steps or []:
        if len(s) > 600 or not WORKLOAD_RE.match(s):
            raise ValueError(f"unknown step {s[:80]!r}: use {WORKLOAD_HELP}")
    return steps

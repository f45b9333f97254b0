"""Faults: one module per fault kind, each owning everything about itself.

A fault is a small pydantic model (its YAML parameters, ``kind`` first) and owns:

* ``check(scenario)``: located problems the schema alone cannot see (a rank outside the world,
  the wrong init method...); ``scenario`` is the :class:`harness.scenario.schema.Scenario`, ``plan``
  below the :class:`harness.run.plan.RunPlan` (typed loosely here: this package is below both);
* ``requirements(scenario)``: what it needs from the machine (root, a tool, a kernel feature),
  as :class:`harness.run.requirements.Requirement` objects; the skip reason of a scenario and
  ``harness doctor`` both read them (``REQUIRES`` lists every one a kind may need);
* ``apply(plan, scenario)``: its effect on the run plan: environment and init arguments of
  ranks, extra ranks, and :class:`harness.faults.steps.Step` objects with their triggers.

Every fault kind, the built-in ones included, is registered through the entry-point group
``torchdist_harness.faults``. An entry point may name a Fault subclass, a module, or a package
(every Fault subclass with a ``kind`` defined in the module, or in the package's modules, is
registered). The built-in faults are the entry point ``builtin = "harness.faults"``: this
package, scanned, with no hand-kept list. A plugin that fails to load is one warning naming it;
the other kinds still work.
"""

from __future__ import annotations

import importlib
import inspect
import types
import warnings
from typing import (
    Any,
    ClassVar,
    Dict,
    Iterable,
    List,
    Literal,
    Optional,
    Sequence,
    Tuple,
    Type,
)

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from ..core.limits import Target  # noqa: F401 - a fault's rank field: a number or a label
from ..core.protocol import ENDED, EVERY_RANK
from ..core.registry import classes_defined, package_modules
from ..core.triggers import Trigger, When  # noqa: F401 - for fault modules, with Fault
from ..machine.requirement import Requirement
from .steps import Effect, Step  # noqa: F401 - for fault modules, with Fault

Problem = Tuple[Tuple[Any, ...], str]   # (location inside the fault, message)
# hints that more than one module speaks of (see Fault.HINTS)
OUTSIDE = "a rank number outside the world"
COLLISION = "a rank number that another process has"
ENTRY_POINT_GROUP = "torchdist_harness.faults"
UNSAID = "<unsaid>"     # Fault.ON_ALLOCATION's default: the kind did not say
NEEDS_ROOT = ("needs root on the allocation's nodes (the harness's own network namespaces, "
              "nftables and tc); a real allocation gives neither")



class HarnessPluginWarning(UserWarning):
    """A fault plugin could not be loaded (or clashes with a kind already registered)."""


class Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    kind: str
    # a fault proves it acted (harness.judge.effects): its steps' probes (Step.effect) read what it
    # did in the run; one that saw no effect fails the case unless the fault may have none
    effect: Literal["required", "optional"] = Field(
        "required", description="required (default): a fault whose probe saw no effect in the "
        "run (0 packets matched, no connection met the toxic...) fails the case; optional: the "
        "fault's point is that it may not matter (its evidence is still reported)")
    summary: ClassVar[str] = ""
    # what a user may ask for in other words ("a master name that does not resolve"); other
    # rooms point at the kind through the registry (REGISTRY.kind_for), never by its name
    HINTS: ClassVar[Tuple[str, ...]] = ()
    REQUIRES: ClassVar[Sequence[Requirement]] = ()   # everything this kind may need
    needs_netns: ClassVar[bool] = False   # the run must have network namespaces
    needs_link: ClassVar[bool] = False    # ... and hosts joined by a real link (not only lo)
    # across a real allocation's nodes (harness.tools.allocation_catalog): None = it works there
    # (what it does reaches the ranks through their environment, their worker spec, their release
    # or a signal the node's task helper sends); a text = why it is skipped there. Left at UNSAID, a
    # kind that needs network namespaces is skipped as needing root, any other kind as one
    # that never said it works there: never a silent pass
    ON_ALLOCATION: ClassVar[Optional[str]] = UNSAID
    # True: a run with this fault needs the machine to itself (it starves a rank of CPU and
    # measures what that did, which any run beside it would change): harness.machine.admission
    # admits it only when no other run is in flight, and holds every other run while it waits
    ALONE: ClassVar[bool] = False

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> Any:
        """A fault's dump says ``effect`` only where it is not the default (its parameters,
        as written, for plugins, captures and plans)."""
        d = handler(self)
        if isinstance(d, dict) and d.get("effect") == "required":
            d.pop("effect")
        return d

    def check(self, scn: Any) -> List[Problem]:
        """Problems the schema cannot see (ranks outside the world, wrong init method...)."""
        problems: List[Problem] = []
        for name in ("ranks", "rank", "of", "heal_rank"):
            value = getattr(self, name, None)
            if value is None:
                continue
            for i, r in enumerate(value if isinstance(value, list) else [value]):
                loc = (name, i) if isinstance(value, list) else (name,)
                # "*" (every rank of the job) where the field only says whose phase starts
                # the fault (harness.core.triggers.When.WILDCARD_FIELDS: rank; kill_rank: of)
                # or heals it (heal_rank, with heal_phase)
                if r == EVERY_RANK and name in getattr(self, "WILDCARD_FIELDS", ()) \
                        and getattr(self, "phase", None) is not None:
                    continue   # whose phase: every rank's (harness.core.triggers)
                if r == EVERY_RANK and name == "heal_rank":
                    continue
                if isinstance(r, str):   # a process by its label: "agent:node1", "1@1"
                    why = target_problem(r, scn)
                    if why:
                        problems.append((loc, why))
                elif not 0 <= r < scn.world_size:
                    problems.append((loc, f"rank {r} is outside the world (world_size "
                                          f"{scn.world_size}: ranks 0..{scn.world_size - 1})"))
        heal_phase = getattr(self, "heal_phase", None)
        if heal_phase is not None and heal_phase != ENDED:
            from ..ranks.workload import phase_problem

            who = getattr(self, "heal_rank", None)
            who = getattr(self, "rank", 0) if who is None else who
            # a worker's phases are known in advance; an agent's or a user program's are not
            if (isinstance(who, int) or who == EVERY_RANK) and not scn.program_argv():
                why = phase_problem(heal_phase, scn.workload.steps, scn.workload.destroy)
                if why:   # it would never be healed
                    problems.append((("heal_phase",), why))
        return problems

    def requirements(self, scn: Any) -> Sequence[Requirement]:
        """What this fault, with these parameters, needs from the machine."""
        return self.REQUIRES

    def apply(self, plan: Any, scn: Any) -> None:
        raise NotImplementedError

    def allocation_problem(self, scn: Any) -> Optional[str]:
        """Why this fault cannot act across a real allocation's nodes (None: it can)."""
        said = type(self).ON_ALLOCATION
        if said is not UNSAID:
            return said
        if self.needs_netns or self.needs_link:
            return NEEDS_ROOT
        return (f"the fault kind {self.kind} does not say that it works on a real allocation's "
                "nodes (its class's ON_ALLOCATION)")

    def extra_labels(self, scn: Any) -> List[str]:
        """Labels of ranks this fault adds (beyond the scenario's own 0..world_size-1)."""
        return []

    def id_suffix(self) -> Optional[str]:
        """Something that must appear in the test id (a faker seed, say)."""
        return None

    def is_random(self) -> bool:
        """The fault draws at random while the run goes on (a packet is dropped or not), so
        one run's timings are one draw: ``harness diff`` compares them only across repeats."""
        return False


def target_problem(label: str, scn: Any) -> Optional[str]:
    """None if a run of ``scn`` can have a process labelled ``label`` (a rank "1", a restart
    "1@1", an agent "agent:node0", a parent "parent:local"), else why not."""
    from ..core.rows import key_ok

    if "*" in label:
        return f"{label[:40]!r}: a fault targets one process, not a wildcard"
    return key_ok(label, scn.row_sets())


def kind_of(cls: Type[Fault]) -> Optional[str]:
    field = cls.model_fields.get("kind")
    kind = field.default if field is not None else None
    return kind if isinstance(kind, str) else None


class Registry:
    """Fault kinds by name, loaded from the entry points on first use."""

    def __init__(self) -> None:
        self._kinds: Dict[str, Type[Fault]] = {}
        self._origin: Dict[str, str] = {}
        self._loaded = False
        self.problems: List[str] = []      # plugins that failed, as warned

    def _warn(self, text: str) -> None:
        self.problems.append(text)
        warnings.warn(text, HarnessPluginWarning, stacklevel=3)

    def add(self, cls: Type[Fault], origin: str) -> None:
        kind = kind_of(cls)
        if kind is None:
            raise TypeError(f"{cls.__name__}.kind needs a default (its registered name)")
        if kind in self._kinds and self._kinds[kind] is not cls:
            self._warn(f"torchdist-harness: fault kind {kind!r} from {origin} is ignored: "
                       f"{self._origin[kind]} already registered it")
            return
        self._kinds[kind] = cls
        self._origin[kind] = origin

    def _add_from(self, obj: Any, origin: str) -> int:
        """Register a Fault subclass, or every one defined in a module or package."""
        if inspect.isclass(obj):
            if not issubclass(obj, Fault):
                raise TypeError(f"{obj!r} is not a harness.faults.Fault subclass")
            self.add(obj, origin)
            return 1
        if not isinstance(obj, types.ModuleType):
            raise TypeError(f"{obj!r} is neither a Fault subclass nor a module")
        modules = [obj]
        if hasattr(obj, "__path__"):   # a package: its modules, in name order
            modules += package_modules(obj.__name__, obj.__path__)
        n = 0
        for mod in modules:
            for cls in classes_defined(mod, Fault):
                if kind_of(cls) is not None and not inspect.isabstract(cls):
                    self.add(cls, origin)
                    n += 1
        return n

    def load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        from importlib.metadata import entry_points

        eps = list(entry_points(group=ENTRY_POINT_GROUP))
        # the built-in kinds first, so that a plugin cannot shadow one
        eps.sort(key=lambda ep: (ep.value.split(":")[0] != __name__, ep.name))
        if not any(ep.value.split(":")[0] == __name__ for ep in eps):
            # a source checkout that was never installed has no entry points: same scan
            self._add_from(importlib.import_module(__name__), "harness (not installed)")
        for ep in eps:
            origin = f"entry point {ep.name!r} ({ep.value})"
            try:
                self._add_from(ep.load(), origin)
            except Exception as e:  # noqa: BLE001 - one plugin must never hide the others
                self._warn(f"torchdist-harness: the fault plugin {origin} failed to load and "
                           f"is not available: {type(e).__name__}: {e}")

    def get(self, kind: str) -> Optional[Type[Fault]]:
        self.load()
        return self._kinds.get(kind)

    def kinds(self) -> List[str]:
        self.load()
        return sorted(self._kinds)

    def items(self) -> Iterable[Tuple[str, Type[Fault]]]:
        self.load()
        return sorted(self._kinds.items())

    def kind_for(self, hint: str) -> str:
        """The kind that declares ``hint`` in its HINTS ("a fault for that" if none does)."""
        for kind, cls in self.items():
            if hint in cls.HINTS:
                return kind
        return "a fault for that"

    def origin(self, kind: str) -> str:
        self.load()
        return self._origin.get(kind, "")


REGISTRY = Registry()


def fault_class(kind: str) -> Optional[Type[Fault]]:
    return REGISTRY.get(kind)

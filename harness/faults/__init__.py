"""Faults: one module per fault kind, registered by name.

A fault is a small pydantic model (its YAML parameters, ``kind`` first) with two pure methods:
``check(scenario)`` returns located problems the schema alone cannot see, and
``apply(plan, scenario)`` edits the RunPlan (env, init args, start delays, port holders, timed
signals, on-disk preparation). The supervisor executes plans and knows no fault by name.

Third-party faults register through the ``torchdist_harness.faults`` entry-point group, each entry
pointing at a Fault subclass.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, ClassVar, Dict, List, Optional, Tuple, Type

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from ..plan import RunPlan
    from ..schema import Scenario

Problem = Tuple[Tuple[Any, ...], str]   # (location inside the fault, message)


class Fault(BaseModel):
    # every float is finite (and bounded by its field): see schema.Seconds
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    kind: str
    summary: ClassVar[str] = ""
    needs_netns: ClassVar[bool] = False   # network faults: the run must have namespaces
    needs_link: ClassVar[bool] = False    # ... and hosts joined by a real link (not only lo)

    def check(self, scn: Scenario) -> List[Problem]:
        """Problems the schema cannot see (ranks outside the world, wrong init method...)."""
        problems: List[Problem] = []
        for name in ("ranks", "rank"):
            value = getattr(self, name, None)
            if value is None:
                continue
            for i, r in enumerate(value if isinstance(value, list) else [value]):
                if not 0 <= r < scn.world_size:
                    loc = (name, i) if isinstance(value, list) else (name,)
                    problems.append((loc, f"rank {r} is outside the world (world_size "
                                          f"{scn.world_size}: ranks 0..{scn.world_size - 1})"))
        return problems

    def apply(self, plan: RunPlan, scn: Scenario) -> None:
        raise NotImplementedError

    def extra_labels(self, scn: Scenario) -> List[str]:
        """Labels of ranks this fault adds (beyond the scenario's own 0..world_size-1)."""
        return []

    def id_suffix(self) -> Optional[str]:
        """Something that must appear in the test id (a faker seed, say)."""
        return None


FAULTS: Dict[str, Type[Fault]] = {}

BUILTIN = ["wrong_port", "wrong_addr", "rank_collision", "rank_out_of_range",
           "world_size_mismatch", "missing_env", "malformed_env", "delayed_rank", "busy_port",
           "signal_rank", "file_init", "concurrent_job",
           # network faults: need the run's network namespaces (root, ip, nft, tc)
           "firewall", "partition", "unreachable_master", "unresolvable_host", "wrong_interface",
           "bandwidth", "packet_loss", "latency"]


def register(cls: Type[Fault]) -> Type[Fault]:
    kind = cls.model_fields["kind"].default
    if not isinstance(kind, str):
        raise TypeError(f"{cls.__name__}.kind needs a default (its registered name)")
    FAULTS[kind] = cls
    return cls


def _load() -> None:
    for mod in BUILTIN:
        importlib.import_module(f"{__name__}.{mod}")
    try:
        from importlib.metadata import entry_points
        eps = entry_points()
        group = (eps.select(group="torchdist_harness.faults") if hasattr(eps, "select")
                 else eps.get("torchdist_harness.faults", []))  # type: ignore
        for ep in group:
            register(ep.load())
    except Exception:  # a broken third-party plugin must not hide the built-in faults
        pass


def resolve(scn: Scenario) -> List[Fault]:
    """The scenario's faults as validated plugin objects (the loader has already checked them)."""
    return [FAULTS[f.kind].model_validate(f.model_dump()) for f in scn.faults]


_load()

"""Planning: one Scenario case -> a concrete RunPlan (pure: no processes, no sockets).

The plan says everything the supervisor will do: which ranks start with which environment and
init arguments, when each is released after the start line, which port holders exist, which
signals are sent at which time or phase, what is prepared on disk, and the deadline. Faults only
edit the plan (``Fault.apply``); the supervisor executes it without knowing any fault by name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from .schema import Scenario


@dataclass
class InitSpec:
    method: str                      # env | tcp | file
    url: Optional[str] = None        # tcp://addr:port or file:///path; None for env
    rank: Optional[int] = None       # passed to init_process_group (tcp/file); None: torch reads env
    world_size: Optional[int] = None


@dataclass
class RankPlan:
    label: str                       # "0", "1", ... ; "job2:0" for a second job's ranks
    rank: Optional[int]              # the rank number it is told (None when it is told none)
    env: Dict[str, str]              # set for the rank on top of the harness's environment
    init: InitSpec
    unset: List[str] = field(default_factory=list)   # variables removed from its environment
    start_delay: float = 0.0         # released this long after the start line
    user: Optional[str] = None       # run as this user (only used when the harness is root)
    host: str = "local"


@dataclass
class PortHolderPlan:
    port: int
    mode: str                        # bound | listening | accepting
    release_after: Optional[float] = None   # seconds after the start line; None: held to the end
    label: str = "holder"


@dataclass
class ActionPlan:
    """Send ``signal`` to rank ``target`` at ``at`` s after the start line, or ``after`` s after
    the rank reports entering ``at_phase``."""

    target: str
    signal: str                      # KILL | STOP | TERM | SEGV | ...
    at: Optional[float] = None
    at_phase: Optional[str] = None
    after: float = 0.0
    why: str = ""


@dataclass
class PrepPlan:
    """Something made on disk before launch."""

    kind: str                        # unwritable_dir | stale_filestore
    path: str
    world_size: int = 1


@dataclass
class RunPlan:
    scenario: str
    case: Optional[str]
    backend: str
    world_size: int
    timeout: float
    deadline: float
    steps: List[str]
    destroy: bool
    master_addr: str
    master_port: int
    run_dir: str
    ranks: List[RankPlan]
    holders: List[PortHolderPlan] = field(default_factory=list)
    actions: List[ActionPlan] = field(default_factory=list)
    preps: List[PrepPlan] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)   # what each fault did, for humans
    take_port: Optional[Callable[[], int]] = field(default=None, repr=False, compare=False)

    def rank(self, label: Any) -> RankPlan:
        for r in self.ranks:
            if r.label == str(label):
                return r
        raise KeyError(f"no rank {label!r} in the plan")

    def main_ranks(self, selected: Optional[List[int]] = None) -> List[RankPlan]:
        """Ranks of the scenario's own job, optionally only those with the given numbers."""
        main = [r for r in self.ranks if ":" not in r.label]
        if selected is None:
            return main
        return [r for r in main if int(r.label) in selected]

    def new_port(self) -> int:
        if self.take_port is None:
            raise RuntimeError("this plan has no port source")
        return self.take_port()

    def to_dict(self) -> Dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("take_port", None)
        return d


def file_store_path(run_dir: str) -> str:
    return str(Path(run_dir) / "filestore" / "pg")


def init_spec(scn: Scenario, addr: str, port: int, rank: int, world: int, run_dir: str) -> InitSpec:
    if scn.init == "env":
        return InitSpec("env")
    if scn.init == "tcp":
        return InitSpec("tcp", f"tcp://{addr}:{port}", rank, world)
    return InitSpec("file", f"file://{file_store_path(run_dir)}", rank, world)


def base_env(scn: Scenario, addr: str, port: int, rank: int, world: int) -> Dict[str, str]:
    env = {
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world),
    }
    env.update(scn.env)
    return env


def make_plan(scn: Scenario, run_dir: str, take_port: Callable[[], int]) -> RunPlan:
    """Build the RunPlan for one scenario case. ``take_port`` hands out ports reserved for this
    run (the supervisor's port lease; tests pass a counter)."""
    from .faults import resolve

    port = take_port()
    ranks = []
    for r in range(scn.world_size):
        ranks.append(RankPlan(
            label=str(r), rank=r,
            env=base_env(scn, scn.master_addr, port, r, scn.world_size),
            init=init_spec(scn, scn.master_addr, port, r, scn.world_size, run_dir),
        ))
    plan = RunPlan(
        scenario=scn.name, case=scn.case, backend=scn.backend, world_size=scn.world_size,
        timeout=scn.timeout, deadline=scn.deadline, steps=list(scn.workload.steps),
        destroy=scn.workload.destroy, master_addr=scn.master_addr, master_port=port,
        run_dir=run_dir, ranks=ranks, take_port=take_port,
    )
    for fault in resolve(scn):
        fault.apply(plan, scn)
    return plan

"""world_size_mismatch: chosen ranks are told another WORLD_SIZE.

Its evidence (harness.judge.edits, read back from what the processes said): the WORLD_SIZE each
target started with (its start record) and the world size it passed to init_process_group.
"""

from typing import List, Literal

from pydantic import Field

from ..core.limits import MAX_WORLD
from . import Fault


class WorldSizeMismatch(Fault):
    kind: Literal["world_size_mismatch"] = "world_size_mismatch"
    ON_ALLOCATION = None   # works on an allocation's nodes
    summary = "chosen ranks are told another WORLD_SIZE"
    ranks: List[int] = Field(default_factory=lambda: [0], max_length=MAX_WORLD,
                             description="the ranks told another WORLD_SIZE")
    world_size: int = Field(ge=1, le=1024, description="the WORLD_SIZE they are told")

    def check(self, scn):
        problems = super().check(scn)
        if self.world_size == scn.world_size:
            problems.append((("world_size",), "equals the scenario's world_size: no mismatch"))
        return problems

    def apply(self, plan, scn):
        for r in plan.main_ranks(self.ranks):
            r.env["WORLD_SIZE"] = str(self.world_size)
            if r.init.world_size is not None:
                r.init.world_size = self.world_size
        plan.notes.append(f"world_size_mismatch: ranks {self.ranks} are told "
                          f"WORLD_SIZE={self.world_size}")

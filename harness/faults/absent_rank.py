"""absent_rank: ranks that are part of the world but are never started ("only rank 0 came up").

Its evidence (harness.judge.edits, read back from what the processes said): no process ran under the
absent rank's label.
"""

from typing import List, Literal

from pydantic import Field

from ..core.limits import MAX_WORLD
from . import Fault


class AbsentRank(Fault):
    kind: Literal["absent_rank"] = "absent_rank"
    ON_ALLOCATION = None   # works on an allocation's nodes
    summary = "chosen ranks are never started (the world counts them; their verdict is absent)"
    HINTS = ("a rank that never came up",)
    ranks: List[int] = Field(default_factory=lambda: [1], min_length=1, max_length=MAX_WORLD,
                             description="the ranks that never start")

    def check(self, scn):
        problems = super().check(scn)
        if not problems and len(set(self.ranks)) >= scn.world_size:
            problems.append((("ranks",), f"every rank of the world ({scn.world_size}) would be "
                                         "absent: at least one must start"))
        for other in scn.faults:   # a fault that acts on a rank that never starts
            target = getattr(other, "rank", None)
            if other is not self and isinstance(target, int) and target in self.ranks:
                problems.append((("ranks",), f"rank {target} is absent, and the fault "
                                             f"{other.kind} acts on it"))
        return problems

    def apply(self, plan, scn):
        for r in plan.main_ranks(self.ranks):
            r.absent = True
        plan.notes.append(f"absent_rank: ranks {sorted(set(self.ranks))} are never started "
                          f"(world_size stays {scn.world_size})")

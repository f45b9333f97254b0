"""rank_workload: a rank runs a workload of its own (a rank-dependent branch in user code):
it never calls new_group while the others do, makes groups in another order, re-initialises
when the others do not.

Its evidence (harness.judge.edits, read back from what the processes said): the rank's phase event
for the first entry of its own workload that differs from the shared one (or its end after its own
entries).
"""

from typing import List, Literal

from pydantic import Field, field_validator

from ..core.limits import MAX_STEPS
from ..ranks.workload import check_workload_steps
from . import Fault


class RankWorkload(Fault):
    kind: Literal["rank_workload"] = "rank_workload"
    ON_ALLOCATION = None   # works on an allocation's nodes
    summary = "a rank runs other workload steps than the others (a rank-dependent branch)"
    rank: int = Field(1, description="the rank")
    steps: List[str] = Field(max_length=MAX_STEPS, description="its steps after init, in the "
                             "workload's vocabulary; its phases are numbered by its own list")

    _steps = field_validator("steps")(check_workload_steps)

    def check(self, scn):
        problems = super().check(scn)
        if not 0 <= self.rank < scn.world_size:
            problems.append((("rank",), f"rank {self.rank} is outside the world (world_size "
                                        f"{scn.world_size})"))
        return problems

    def apply(self, plan, scn):
        for v in plan.variations([self.rank]):
            v.steps = list(self.steps)
        plan.notes.append(f"rank_workload: rank {self.rank} runs {self.steps}")

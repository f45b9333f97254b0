"""rank_out_of_range: a process is told a rank number outside 0..world_size-1.

Its evidence (harness.judge.edits, read back from what the processes said): the RANK the process
started with (its start record) and the rank it passed to init_process_group.
"""

from typing import Literal, Optional

from pydantic import Field

from . import COLLISION, OUTSIDE, REGISTRY, Fault


class RankOutOfRange(Fault):
    kind: Literal["rank_out_of_range"] = "rank_out_of_range"
    ON_ALLOCATION = None   # works on an allocation's nodes
    HINTS = (OUTSIDE,)
    summary = "a process is told a rank >= world_size (or negative)"
    rank: int = Field(1, description="the process that is told the bad number")
    value: Optional[int] = Field(None, ge=-2**31, lt=2**31,
                                 description="the number; default: world_size")

    def check(self, scn):
        problems = super().check(scn)
        if self.value is not None and 0 <= self.value < scn.world_size:
            problems.append((("value",), f"{self.value} is inside the world (0.."
                                         f"{scn.world_size - 1}); use "
                                         f"{REGISTRY.kind_for(COLLISION)}"))
        return problems

    def apply(self, plan, scn):
        value = plan.world_size if self.value is None else self.value
        r = plan.rank(self.rank)
        r.rank = value
        r.env["RANK"] = r.env["LOCAL_RANK"] = str(value)
        if r.init.rank is not None:
            r.init.rank = value
        plan.notes.append(f"rank_out_of_range: process {self.rank} is told RANK={value}")

"""rank_collision: one process claims another's rank number (two ranks with one number).

Its evidence (harness.judge.edits, read back from what the processes said): the RANK and LOCAL_RANK
the process started with (its start record) and the rank it passed to init_process_group.
"""

from typing import Literal

from pydantic import Field

from . import COLLISION, OUTSIDE, REGISTRY, Fault


class RankCollision(Fault):
    kind: Literal["rank_collision"] = "rank_collision"
    ON_ALLOCATION = None   # works on an allocation's nodes
    HINTS = (COLLISION,)
    summary = "a process claims the rank of another"
    rank: int = Field(1, description="the process that is told the wrong number")
    claims: int = Field(0, description="the rank number it claims")

    def check(self, scn):
        problems = super().check(scn)
        if not 0 <= self.claims < scn.world_size:
            problems.append((("claims",), f"rank {self.claims} is outside the world; use "
                                          f"{REGISTRY.kind_for(OUTSIDE)} for that"))
        if self.claims == self.rank:
            problems.append((("claims",), "a rank claiming its own number is no collision"))
        return problems

    def apply(self, plan, scn):
        r = plan.rank(self.rank)
        r.rank = self.claims
        r.env["RANK"] = r.env["LOCAL_RANK"] = str(self.claims)
        if r.init.rank is not None:
            r.init.rank = self.claims
        plan.notes.append(f"rank_collision: process {self.rank} claims RANK={self.claims}")

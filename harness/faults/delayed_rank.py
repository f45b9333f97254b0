"""delayed_rank: chosen ranks start late, measured from the common start line."""

from typing import List, Literal

from pydantic import Field

from ..limits import MAX_WORLD, Seconds
from ..triggers import Trigger
from . import Fault


class DelayedRank(Fault):
    kind: Literal["delayed_rank"] = "delayed_rank"
    summary = "chosen ranks are released this many seconds after the start line"
    ranks: List[int] = Field(default_factory=lambda: [1], max_length=MAX_WORLD)
    delay: Seconds = Field(description="seconds after the start line")

    def apply(self, plan, scn):
        for r in plan.main_ranks(self.ranks):
            r.release = Trigger.at_time(self.delay)
        plan.notes.append(f"delayed_rank: ranks {self.ranks} start {self.delay:g} s late")

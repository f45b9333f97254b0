"""delayed_rank: chosen ranks start late, measured from the common start line.

Its evidence (harness.judge.edits, read back from what the processes said): the supervisor's release
time of each target against the planned delay (or that it was still held when it ended).
"""

from typing import List, Literal

from pydantic import Field

from ..core.limits import MAX_WORLD, Seconds
from ..core.triggers import Trigger
from . import Fault, Target


def _one() -> List[Target]:
    return [1]


class DelayedRank(Fault):
    kind: Literal["delayed_rank"] = "delayed_rank"
    ON_ALLOCATION = None   # works on an allocation's nodes
    summary = "chosen ranks are released this many seconds after the start line"
    ranks: List[Target] = Field(
        default_factory=_one, max_length=MAX_WORLD,
        description="rank numbers (launcher direct), or the labels of processes the launcher "
        "starts: 'agent:node1' (a torchrun agent), 'parent:node1' (a spawning parent)")
    delay: Seconds = Field(description="seconds after the start line")

    def apply(self, plan, scn):
        for r in plan.processes(self.ranks):
            r.release = Trigger.at_time(self.delay)
        plan.notes.append(f"delayed_rank: ranks {self.ranks} start {self.delay:g} s late")

"""The shared shape of the resource faults: a step that limits one rank after it imported torch
and before it is released (the rank's release waits for the step), undone at teardown."""

from dataclasses import dataclass

from ..steps import Step
from ..triggers import Trigger


@dataclass
class RankLimit(Step):
    rank: str = "1"

    def can_fire(self, rt):
        r = rt.rank(self.rank)
        return r.pid is not None and not r.ended


def limit_before_release(plan, fault, rank: int, step: RankLimit) -> RankLimit:
    """Add ``step`` at the start line and hold the rank's release until it was done."""
    step.trigger = Trigger.at_time(0.0)
    plan.add_step(fault, step)
    for r in plan.main_ranks([rank]):
        if r.release.after is None and (r.release.at or 0.0) == 0.0 and r.release.phase is None:
            r.release = Trigger.after_step(step.id)
    return step

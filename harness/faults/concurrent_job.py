"""concurrent_job: a second job with the same MASTER_ADDR/MASTER_PORT starts beside the first
(started by the scenario's own launcher: a second torchrun job has its own agents)."""

from typing import Literal, Optional

from pydantic import Field

from ..limits import MAX_WORLD, Seconds
from ..triggers import Trigger
from . import Fault


class ConcurrentJob(Fault):
    kind: Literal["concurrent_job"] = "concurrent_job"
    ON_ALLOCATION = (
        "a second job on the same port would be a second srun step beside the case's one: not "
        "built for an allocation")
    summary = "a second job on the same MASTER_PORT (two jobs on one machine, default port)"
    delay: Seconds = Field(0.0, description="the second job starts this long after the first")
    world_size: Optional[int] = Field(None, ge=1, le=MAX_WORLD, description="default: the "
                                      "scenario's (both jobs together: at most MAX_WORLD)")

    def _n(self, scn) -> int:
        return self.world_size or scn.world_size

    def extra_labels(self, scn):
        return [f"job2:{i}" for i in range(self._n(scn))]

    def apply(self, plan, scn):
        n = self._n(scn)
        # the same launcher starts it (two torchrun jobs, two spawning parents, two sets of
        # ranks), on the same master address and port
        plan.add_job(scn, "job2", n, release=Trigger.at_time(self.delay))
        plan.notes.append(f"concurrent_job: a second job of {n} ranks (job2:0..{n - 1}), its "
                          f"{plan.store('job2').describe()} (the first job's: "
                          f"{plan.store().endpoint()}), {self.delay:g} s after the first")

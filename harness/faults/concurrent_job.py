"""concurrent_job: a second job with the same MASTER_ADDR/MASTER_PORT starts beside the first
(started by the scenario's own launcher: a second torchrun job has its own agents). Each
concurrent_job of a case is a job of its own: job2, job3... in the order they are written.

Its evidence (harness.edits, read back from what the processes said): the second job's processes
started (their pids) and when each was released.
"""

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

    def job(self, scn) -> str:
        """This job's label: job2 for the case's first concurrent_job, job3 for its second...
        (each job its own rows)."""
        jobs = [f for f in scn.faults if isinstance(f, ConcurrentJob)]
        return f"job{2 + next(i for i, f in enumerate(jobs) if f is self)}"

    def extra_labels(self, scn):
        job = self.job(scn)
        return [f"{job}:{i}" for i in range(self._n(scn))]

    def apply(self, plan, scn):
        n = self._n(scn)
        job = self.job(scn)
        # the same launcher starts it (two torchrun jobs, two spawning parents, two sets of
        # ranks), on the same master address and port
        plan.add_job(scn, job, n, release=Trigger.at_time(self.delay))
        plan.notes.append(f"concurrent_job: another job of {n} ranks ({job}:0..{n - 1}), its "
                          f"{plan.store(job).describe()} (the first job's: "
                          f"{plan.store().endpoint()}), {self.delay:g} s after the first")

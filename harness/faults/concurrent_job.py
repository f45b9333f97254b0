"""concurrent_job: a second job with the same MASTER_ADDR/MASTER_PORT starts beside the first
(started by the scenario's own launcher: a second torchrun job has its own agents). Each
concurrent_job of a case is a job of its own: job2, job3... in the order they are written.

Its evidence (harness.judge.edits, read back from what the processes said): the second job's
processes started (their pids) and when each was released.
"""

from typing import List, Literal, Optional

from pydantic import Field, field_validator

from ..core.errors import PlanRefusal
from ..core.limits import MAX_STEPS, MAX_WORLD, Seconds
from ..core.protocol import ANCHOR_HELP, ENDED, check_anchor
from ..core.triggers import Trigger
from ..ranks.workload import check_workload_steps, phase_problem
from ..scenario.programs import check_args
from . import Fault, Target


class ConcurrentJob(Fault):
    kind: Literal["concurrent_job"] = "concurrent_job"
    ON_ALLOCATION = (
        "a second job on the same port would be a second srun step beside the case's one: not "
        "built for an allocation")
    summary = "a second job on the same MASTER_PORT (two jobs on one machine, default port)"
    delay: Seconds = Field(0.0, description="the second job starts this long after the first "
                           "(with phase: this long after `rank` entered it)")
    phase: Optional[str] = Field(None, description="or: the second job starts when `rank` of "
                                 f"the first job enters this phase ({ANCHOR_HELP}), plus "
                                 "delay: ordered on the first job's progress, not on a clock "
                                 "that races it (`ended`: one job after another on one port)")
    rank: Target = Field(0, description="with phase: whose phase (a rank of the first job, or "
                         "a label such as 'agent:local' or another job's 'job2:0')")
    world_size: Optional[int] = Field(None, ge=1, le=MAX_WORLD, description="default: the "
                                      "scenario's (both jobs together: at most MAX_WORLD)")
    workload: Optional[List[str]] = Field(None, max_length=MAX_STEPS, description="this job's "
                                          "own steps after init, in the workload's vocabulary "
                                          "(default: the scenario's): a job that only inits, "
                                          "or trains longer than the first")

    args: Optional[List[str]] = Field(None, max_length=MAX_STEPS, description="with the "
                                      "scenario's program: this job's own arguments, in place "
                                      "of program.args (the same script, another flag: a sweep's "
                                      "next trial, a job started with a typo)")
    _workload = field_validator("workload")(check_workload_steps)

    @field_validator("args")
    @classmethod
    def _args(cls, v: Optional[List[str]]) -> Optional[List[str]]:
        return None if v is None else check_args(v)

    @field_validator("phase")
    @classmethod
    def _phase(cls, v: Optional[str]) -> Optional[str]:
        return None if v is None else check_anchor(v)

    def check(self, scn):
        problems = super().check(scn)
        if self.workload is not None and not scn.launcher.STARTS_RANKS:
            problems.append((("workload",), f"a job's own workload needs a launcher that "
                             f"starts each rank itself (direct); {scn.launcher.kind}'s job "
                             "starts its workers from one shared spec"))
        if self.workload is not None and scn.program_argv():
            problems.append((("workload",), "a job's own workload is the harness worker's: "
                             "this scenario runs a program of its own"))
        if self.args is not None and not scn.program_argv():
            problems.append((("args",), "args are a program's: this scenario runs the "
                             "harness's worker (give the job its own workload: instead)"))
        if self.phase is None and "rank" in self.model_fields_set:
            problems.append((("rank",), "rank is whose phase starts the second job: give "
                             "phase too"))
        elif self.phase is not None and self.phase != ENDED and isinstance(self.rank, int):
            # a rank of the first job runs its workload: a phase it never enters would start
            # the second job never (an agent's phases are its own: rendezvous, workers...)
            why = phase_problem(self.phase, scn.workload.steps, scn.workload.destroy)
            if why:
                problems.append((("phase",), why))
        return problems

    def release(self) -> Trigger:
        """When the second job starts: delay s after the start line, or after ``rank``
        entered ``phase``."""
        if self.phase is not None:
            return Trigger.on_phase(self.rank, self.phase, self.delay)
        return Trigger.at_time(self.delay)

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
        release = self.release()
        plan.add_job(scn, job, n, release=release)
        if self.workload is not None:
            for r in plan.ranks:
                if r.job == job:
                    r.variation.steps = list(self.workload)
        if self.args is not None:
            self._own_args(plan, scn, job)
        plan.notes.append(f"concurrent_job: another job of {n} ranks ({job}:0..{n - 1}), its "
                          f"{plan.store(job).describe()} (the first job's: "
                          f"{plan.store().endpoint()}), started {release.describe()}"
                          + (f", its own workload {self.workload}"
                             if self.workload is not None else "")
                          + (f", its own arguments {self.args}" if self.args is not None
                             else ""))

    def _own_args(self, plan, scn, job: str) -> None:
        """The job's processes run the program with ``args`` in place of program.args: every
        process of the job whose command line ends with the program's own (its ranks, or the
        agents or parent that start them) gets the job's instead. A launcher whose command
        lines end otherwise is refused, never left with the first job's arguments."""
        own = [str(a) for a in (scn.program.args if scn.program is not None else [])]
        argv = scn.program_argv()
        tail = argv[len(argv) - len(own):] if own else []
        changed = 0
        for r in plan.ranks:
            if r.job != job or not r.argv:
                continue
            if not own or list(r.argv[len(r.argv) - len(own):]) == tail:
                r.argv = list(r.argv[:len(r.argv) - len(own)]) + list(self.args or [])
                changed += 1
        if not changed:
            raise PlanRefusal(f"the {scn.launcher.kind} launcher's command lines for {job} do "
                              "not end with the program's arguments: args cannot be given to "
                              "this job", ("args",))

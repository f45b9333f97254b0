"""slow_rank: a rank is slow: it sleeps as it enters chosen phases (a straggler).

Its evidence (harness.judge.edits, read back from what the processes said): each slowed phase's
duration, measured between the rank's own phase events, against the planned sleep.
"""

from typing import Literal, Optional

from pydantic import Field, field_validator

from ..core.limits import PositiveSeconds
from ..core.protocol import check_optional_trigger_phase
from ..ranks.workload import phase_problem, workload_phases
from . import Fault


class SlowRank(Fault):
    kind: Literal["slow_rank"] = "slow_rank"
    ON_ALLOCATION = None   # works on an allocation's nodes
    summary = "a rank sleeps this long as it enters a phase (or every phase after init): a " \
        "straggler the others wait for in their next collective"
    rank: int = Field(1, description="the slow rank")
    seconds: PositiveSeconds = Field(description="how long it sleeps in each phase")
    phase: Optional[str] = Field(None, description="only this phase (default: every phase of "
                                                   "the workload after init)")

    _phase = field_validator("phase")(check_optional_trigger_phase)

    def check(self, scn):
        problems = super().check(scn)
        if self.phase is not None:
            why = phase_problem(self.phase, scn.workload.steps, scn.workload.destroy)
            if why:
                problems.append((("phase",), why))
        elif not scn.workload.steps:
            problems.append((("phase",), "the workload is empty: name a phase (init)"))
        return problems

    def phases(self, scn) -> list:
        if self.phase is not None:
            return [self.phase]
        return [p for p, _ in workload_phases(scn.workload.steps)]

    def apply(self, plan, scn):
        for v in plan.variations([self.rank]):
            for p in self.phases(scn):
                v.slow_at[p] = float(self.seconds)
        where = self.phase or "every phase after init"
        plan.notes.append(f"slow_rank: rank {self.rank} sleeps {self.seconds:g} s in {where}")

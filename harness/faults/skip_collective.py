"""skip_collective: a rank skips one collective the others enter (a rank-dependent branch).

Its evidence (harness.judge.edits, read back from what the processes said): the rank's phase event
that says it skipped the collective (or the last phase it reached, when it never got there).
"""

from typing import Literal

from pydantic import Field, field_validator

from ..core.protocol import check_trigger_phase
from ..ranks.workload import COLLECTIVES, is_collective, phase_problem, workload_phases
from . import Fault


class SkipCollective(Fault):
    kind: Literal["skip_collective"] = "skip_collective"
    ON_ALLOCATION = None   # works on an allocation's nodes
    summary = "a rank skips the collective of one phase ('workload step N' or a training " \
        "step's gradient all-reduce) that the others enter"
    rank: int = Field(1, description="the rank that skips it")
    phase: str = Field(description="'workload step N' (a collective) or 'train step K'")

    @field_validator("phase")
    @classmethod
    def _phase(cls, v: str) -> str:
        return check_trigger_phase(v)

    def check(self, scn):
        problems = super().check(scn)
        why = phase_problem(self.phase, scn.workload.steps, scn.workload.destroy)
        if why:
            return problems + [(("phase",), why)]
        entry = dict(workload_phases(scn.workload.steps)).get(self.phase, "")
        if not (self.phase.startswith("train step ") or is_collective(entry)):
            problems.append((("phase",), f"{self.phase} is {entry or self.phase!r}, not a "
                                         f"collective ({', '.join(COLLECTIVES)} or a training "
                                         "step)"))
        return problems

    def apply(self, plan, scn):
        for v in plan.variations([self.rank]):
            v.skip.append(self.phase)
        plan.notes.append(f"skip_collective: rank {self.rank} skips the collective of "
                          f"{self.phase}")

"""raise_exception: a rank raises an exception as it enters a phase (a bug in one rank's code).

Its evidence (harness.judge.edits, read back from what the processes said): the rank's result: the
exception it raised, in the planned phase.
"""

import re
from typing import Literal

from pydantic import Field, field_validator

from ..core.limits import MAX_SHORT, MAX_TEXT
from ..core.protocol import RaiseSpec, check_trigger_phase
from ..ranks.workload import phase_problem
from . import Fault

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}\Z", re.ASCII)


class RaiseException(Fault):
    kind: Literal["raise_exception"] = "raise_exception"
    ON_ALLOCATION = None   # works on an allocation's nodes
    summary = "a rank raises an exception as it enters a phase (init, ddp, 'train step K'...)"
    rank: int = Field(1, description="the rank that raises")
    phase: str = Field(description="the phase it raises in (init, 'workload step N', model, "
                                   "ddp, 'train step K', destroy)")
    exception: str = Field("RuntimeError", max_length=MAX_SHORT,
                           description="a builtin exception class (RuntimeError, "
                                       "MemoryError...) or one of torch.distributed's "
                                       "(DistBackendError...)")
    message: str = Field("raised by the harness (raise_exception)", max_length=MAX_TEXT,
                         description="the exception's message")

    @field_validator("phase")
    @classmethod
    def _phase(cls, v: str) -> str:
        return check_trigger_phase(v)

    @field_validator("exception")
    @classmethod
    def _exception(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(f"{v[:40]!r}: a class name (RuntimeError, DistBackendError)")
        return v

    def check(self, scn):
        problems = super().check(scn)
        why = phase_problem(self.phase, scn.workload.steps, scn.workload.destroy)
        if why:
            problems.append((("phase",), why))
        return problems

    def apply(self, plan, scn):
        for v in plan.variations([self.rank]):
            v.raise_at = RaiseSpec(self.phase, self.exception, self.message)
        plan.notes.append(f"raise_exception: rank {self.rank} raises {self.exception} as it "
                          f"enters {self.phase}")

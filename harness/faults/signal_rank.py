"""kill_rank and stop_rank: a signal to a rank at a time or when it enters a phase."""

import re
from typing import Literal, Optional

from pydantic import Field, model_validator

from ..plan import ActionPlan
from ..schema import Seconds
from . import Fault, register

PHASE_RE = re.compile(r"^(init|workload step [0-9]{1,4}|destroy)\Z", re.ASCII)


class _SignalRank(Fault):
    rank: int = Field(1, description="the rank that gets the signal")
    at: Optional[Seconds] = Field(None, description="seconds after the start line")
    phase: Optional[str] = Field(
        None, description="or: when the rank enters this phase (init, workload step N, destroy)")
    after: Seconds = Field(0.0, description="extra seconds after the phase is entered")

    @model_validator(mode="after")
    def _when(self):
        if (self.at is None) == (self.phase is None):
            raise ValueError("give exactly one of 'at' (seconds) or 'phase'")
        if self.phase is not None and not PHASE_RE.match(self.phase):
            raise ValueError(f"phase {self.phase[:40]!r}: use init, 'workload step N' or destroy")
        return self

    def _signal(self) -> str:
        raise NotImplementedError

    def apply(self, plan, scn):
        sig = self._signal()
        plan.actions.append(ActionPlan(target=str(self.rank), signal=sig, at=self.at,
                                       at_phase=self.phase, after=self.after, why=self.kind))
        when = f"at {self.at:g} s" if self.at is not None else f"{self.after:g} s into {self.phase}"
        plan.notes.append(f"{self.kind}: SIG{sig} to rank {self.rank} {when}")


@register
class KillRank(_SignalRank):
    kind: Literal["kill_rank"] = "kill_rank"
    summary = "SIGKILL (or another fatal signal) to a rank at a time or phase"
    signal: Literal["KILL", "TERM", "SEGV", "ABRT", "INT"] = "KILL"

    def _signal(self) -> str:
        return self.signal


@register
class StopRank(_SignalRank):
    kind: Literal["stop_rank"] = "stop_rank"
    summary = "SIGSTOP a rank at a time or phase (it freezes, like a stuck host)"

    def _signal(self) -> str:
        return "STOP"

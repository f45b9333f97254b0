"""When things happen: the one trigger model for every timed thing of a run (pure).

A rank's release (a late rank), a signal, a port holder's exit, a network rule and its heal,
a step of a third-party fault: each has a :class:`Trigger` with exactly one anchor:

* set-up: before the ranks start (nothing anchors it);
* ``at``: seconds after the start line;
* ``phase``: when a rank enters a phase (one syntax: :mod:`harness.core.protocol`), or has ended
  (``ended``: a gate on another process's exit), plus ``delay``;
* ``after``: when another step was done, plus ``delay`` (a heal ``heal_after`` s later).

A trigger is data; whether it holds is asked of a :class:`Clock`, which the supervisor gives
(phase entry times of the ranks, when each step was done). The YAML side is :class:`When`, the
fields every timed fault shares (``at`` | ``phase`` + ``rank`` + ``after``, and ``heal_after``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Optional, Protocol, Tuple

from pydantic import BaseModel, Field, field_validator, model_validator

from .limits import PositiveSeconds, Seconds, Target
from .protocol import ANCHOR_HELP, ENDED, EVERY_RANK, check_anchor


class Clock(Protocol):
    """What a trigger needs to know about the run so far (seconds from the start line)."""

    def phase_entered(self, rank: str, phase: str) -> Optional[float]: ...

    def step_done(self, step_id: str) -> Optional[float]: ...


@dataclass(frozen=True)
class Trigger:
    """When: at set-up (no anchor), ``at`` s after the start line, ``delay`` s after rank
    ``rank`` enters ``phase``, or ``delay`` s after step ``after`` was done."""

    at: Optional[float] = None
    rank: Optional[str] = None
    phase: Optional[str] = None
    after: Optional[str] = None
    delay: float = 0.0

    def __post_init__(self) -> None:
        anchors = sum(x is not None for x in (self.at, self.phase, self.after))
        if anchors > 1:
            raise ValueError("a trigger has at most one of at, phase and after")
        if (self.phase is None) != (self.rank is None):
            raise ValueError("a phase trigger names both the rank and the phase")
        if self.phase is not None:
            check_anchor(self.phase)
        if self.delay < 0 or (self.at is not None and self.at < 0):
            raise ValueError("trigger times are never negative")

    # -- the four kinds --------------------------------------------------------------------------
    @classmethod
    def setup(cls) -> Trigger:
        return cls()

    @classmethod
    def at_time(cls, t: float) -> Trigger:
        return cls(at=float(t))

    @classmethod
    def on_phase(cls, rank: Any, phase: str, delay: float = 0.0) -> Trigger:
        return cls(rank=str(rank), phase=phase, delay=float(delay))

    @classmethod
    def after_step(cls, step_id: str, delay: float = 0.0) -> Trigger:
        return cls(after=step_id, delay=float(delay))

    @property
    def is_setup(self) -> bool:
        return self.at is None and self.phase is None and self.after is None

    def when(self, clock: Clock) -> Optional[float]:
        """The time (s after the start line) this trigger holds from, if it is known yet."""
        if self.at is not None:
            return self.at
        if self.phase is not None:
            assert self.rank is not None
            t = clock.phase_entered(self.rank, self.phase)
            return None if t is None else t + self.delay
        if self.after is not None:
            t = clock.step_done(self.after)
            return None if t is None else t + self.delay
        return 0.0

    def due(self, now: float, clock: Clock) -> bool:
        t = self.when(clock)
        return t is not None and now >= t

    def describe(self) -> str:
        if self.at is not None:
            return f"at {self.at:g} s"
        if self.phase is not None:
            if self.phase == ENDED:
                what = "has ended"
            elif self.rank == EVERY_RANK:
                what = f"has entered {self.phase}"
            else:
                what = f"enters {self.phase}"
            who = "every rank" if self.rank == EVERY_RANK else \
                f"rank {self.rank}" if str(self.rank)[:1].isdigit() else self.rank
            return f"when {who} {what}" + (
                f" + {self.delay:g} s" if self.delay else "")
        if self.after is not None:
            return f"{self.delay:g} s after {self.after}"
        return "at set-up"

    def to_dict(self) -> Dict[str, Any]:
        return {k: v for k, v in (("at", self.at), ("rank", self.rank), ("phase", self.phase),
                                  ("after", self.after), ("delay", self.delay or None))
                if v is not None}


class When(BaseModel):
    """The YAML fields of a timed fault: ``at`` (s after the start line) or ``phase`` (+ whose:
    ``rank``, + ``after`` s), and ``heal_after`` (undone that many seconds after it was done) or
    ``heal_phase`` (+ whose: ``heal_rank``; undone once that process entered the phase, or
    ended: a heal gated on another process's state).

    Subclasses say whether a time is required (``WHEN_REQUIRED``) and which rank's phase is
    meant by default (``rank``, whose default a subclass may change)."""

    WHEN_REQUIRED: ClassVar[bool] = False   # True: a time (at or phase) must be given
    # ``rank`` only says whose phase, so it takes "*" (every rank's); a subclass whose ``rank``
    # is also the process it acts on says otherwise (kill_rank: its ``of`` names the anchor)
    WILDCARD_FIELDS: ClassVar[Tuple[str, ...]] = ("rank",)

    at: Optional[Seconds] = Field(None, description="seconds after the start line (at most "
                                  "one of at and phase; with neither, where the kind allows "
                                  "it, the fault holds from the start)")
    phase: Optional[str] = Field(None, description=f"or: when `rank` enters this phase "
                                 f"({ANCHOR_HELP})")
    rank: Target = Field(0, description="with phase: whose phase (a rank number, '*' for "
                         "every rank of the job: once the last of them entered it, or a "
                         "label such as 'agent:node0')")
    after: Seconds = Field(0.0, description="with phase: extra seconds after it is entered")
    heal_after: Optional[PositiveSeconds] = Field(None, description="undo it this many "
                                                  "seconds after it was done (a fault in "
                                                  "place from the start: after the start "
                                                  "line)")
    heal_phase: Optional[str] = Field(None, description="or: undo it when `heal_rank` enters "
                                      f"this phase, once it was done ({ANCHOR_HELP})")
    heal_rank: Optional[Target] = Field(None, description="with heal_phase: whose phase heals "
                                        "it (a rank number, '*' for every rank of the job, or "
                                        "a label such as 'agent:node0', 'job2:0'); default: "
                                        "`rank`")

    @field_validator("phase", "heal_phase")
    @classmethod
    def _phase(cls, v: Optional[str]) -> Optional[str]:
        return None if v is None else check_anchor(v)

    @model_validator(mode="after")
    def _one_anchor(self) -> When:
        if self.at is not None and self.phase is not None:
            raise ValueError("give at most one of 'at' and 'phase'")
        if self.WHEN_REQUIRED and self.at is None and self.phase is None:
            raise ValueError("give exactly one of 'at' (seconds) or 'phase'")
        if self.heal_after is not None and self.heal_phase is not None:
            raise ValueError("give at most one of 'heal_after' (seconds after it was done) "
                             "and 'heal_phase' (when heal_rank enters a phase)")
        if self.heal_rank is not None and self.heal_phase is None:
            raise ValueError("'heal_rank' says whose phase heals it: give 'heal_phase' with it")
        return self

    @property
    def heals(self) -> bool:
        """Whether the scenario asks for it to be undone during the run."""
        return self.heal_after is not None or self.heal_phase is not None

    def trigger(self) -> Trigger:
        if self.at is not None:
            return Trigger.at_time(self.at)
        if self.phase is not None:
            return Trigger.on_phase(self.rank, self.phase, self.after)
        return Trigger.setup()

    def heal(self, step_id: str) -> Optional[Trigger]:
        """When the step is undone: ``heal_after`` s after it was done, or once ``heal_rank``
        (default: ``rank``) entered ``heal_phase`` (never before the step was done: the run
        looks at an undo only after its step)."""
        if self.heal_phase is not None:
            who = self.heal_rank if self.heal_rank is not None else self.rank
            return Trigger.on_phase(who, self.heal_phase)
        return None if self.heal_after is None else Trigger.after_step(step_id, self.heal_after)

    def healed(self) -> str:
        """How it is healed, in words ("" where it is not)."""
        if self.heal_phase is not None:
            return ", healed " + (self.heal(".") or Trigger()).describe()
        return f", healed {self.heal_after:g} s later" if self.heal_after else ""

    def when(self) -> str:
        w = self.trigger().describe()
        w = "from the start" if w == "at set-up" else w
        return w + self.healed()

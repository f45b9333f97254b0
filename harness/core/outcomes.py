"""Outcomes of a rank and of a job: the words and their severity, defined once (pure).

``ok`` finished its workload; ``error`` raised, not a timeout; ``timeout`` torch's own timeout
fired; ``crash`` died without a Python exception (a signal, abort, OOM kill); ``hang`` alive at
the harness's deadline, killed. ``absent``: part of the world but never started (a fault
kept it out: "only rank 0 came up").

A job's outcome is the most severe outcome of the ranks that were started. An absent rank does
not count: it is the cause, and what the ranks that ran did about it (rank 0's store timing out
while it waits for the missing rank) is the job's outcome; a job whose every rank is absent is
``absent``. So ``job: timeout`` still reads "the job timed out" when one rank never came up.
"""

from __future__ import annotations

from typing import Iterable, Literal, Optional

# in order of severity, mildest first: the outcomes of a rank that was started
OUTCOMES = ("ok", "error", "timeout", "crash", "hang")
ABSENT = "absent"
# every outcome word a verdict or an expectation can hold
ALL_OUTCOMES = OUTCOMES + (ABSENT,)
Outcome = Literal["ok", "error", "timeout", "crash", "hang", "absent"]


def severity(outcome: str) -> int:
    """The rank of ``outcome`` in OUTCOMES; ``absent`` is below every outcome (-1)."""
    return -1 if outcome == ABSENT else OUTCOMES.index(outcome)


def job_outcome(outcomes: Iterable[str]) -> Optional[str]:
    """The most severe of the outcomes (hang > crash > timeout > error > ok), absent ranks
    not counted unless every rank is absent; None if empty."""
    worst: Optional[str] = None
    for o in outcomes:
        if worst is None or severity(o) > severity(worst):
            worst = o
    return worst

"""Outcomes of a rank and of a job: the words and their severity, defined once (pure).

``ok`` finished its workload; ``error`` raised, not a timeout; ``timeout`` torch's own timeout
fired; ``crash`` died without a Python exception (a signal, abort, OOM kill); ``hang`` alive at
the harness's deadline, killed. A job's outcome is the most severe of its ranks'.
"""

from __future__ import annotations

from typing import Iterable, Literal, Optional

# in order of severity, mildest first
OUTCOMES = ("ok", "error", "timeout", "crash", "hang")
Outcome = Literal["ok", "error", "timeout", "crash", "hang"]


def severity(outcome: str) -> int:
    return OUTCOMES.index(outcome)


def job_outcome(outcomes: Iterable[str]) -> Optional[str]:
    """The most severe of the outcomes (hang > crash > timeout > error > ok); None if empty."""
    worst: Optional[str] = None
    for o in outcomes:
        if worst is None or severity(o) > severity(worst):
            worst = o
    return worst

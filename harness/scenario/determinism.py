"""Whether a case's expectation can fail (pure): the strict reading of the scenario format.

A case is deterministic unless it declares ``race:``. A deterministic case pins one outcome per
row; an expectation that allows ``ok`` and a failure, or two outcomes, passes whether or not the
fault acts, so it tests nothing that a run could contradict. These are the widenings this module
finds, each located at the line where it is written:

* ``job`` allowing ``ok`` and a failure, or two outcomes (outside a race case);
* a row allowing more than one outcome, or carrying frequency bounds (outside a race case);
* a ``within`` window that is vacuous: it starts at 0 and ends at or past the deadline;
* a failing row pinned only by ``cause:`` (the harness's own diagnosis, not torch's behaviour):
  it must also pin the exception, the message or the phase.

A case whose ``about:`` still holds the template's ``TODO`` (``harness new``) is not written
down yet: where the report came from and what was watched are missing.

A row whose key a ``tally:`` counts may allow the outcomes the tally names: which rows end
which way may vary, how many of each may not, and a run can contradict that.

``harness validate --strict`` reports them as problems; tests/test_determinism.py holds the
catalog to them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from .schema import RankExpect, Scenario

FAILURES = frozenset({"error", "timeout", "hang", "crash"})


@dataclass(frozen=True)
class Widening:
    """One expectation that a run cannot contradict, where it is written."""

    line: Optional[int]
    field: str
    message: str


def _cause_only(row: RankExpect) -> bool:
    fails = row.outcome is None or bool(FAILURES & set(row.outcome))
    return bool(row.cause) and fails and not (row.exception or row.message or row.phase)


def widenings(scn: Scenario) -> List[Widening]:
    """Every widening of this case (empty: each of its expectations can fail)."""
    out: List[Widening] = []
    if "TODO" in (scn.about or ""):
        out.append(Widening(scn._about_line, "about", "still holds the template's TODO: "
                            "write in its place where the report came from and what you "
                            "watched (torch, runs, numbers)"))
    race = scn.race is not None
    for i, block in enumerate(scn.expect):
        at = f"expect[{i}]." if len(scn.expect) > 1 else "expect."
        job = set(block.job or ())
        if not race and "ok" in job and job & FAILURES:
            out.append(Widening(block.job_line or block.line, at + "job",
                                f"allows ok and a failure ({'|'.join(block.job or ())}): "
                                "it passes whether or not the fault acts; pin one outcome, "
                                "or declare race: and measure it"))
        elif not race and len(job) > 1:
            out.append(Widening(block.job_line or block.line, at + "job",
                                f"allows {'|'.join(block.job or ())}: the job is the most "
                                "severe of its rows; pin the one outcome they give, or "
                                "declare race:"))
        for label, row in block.ranks.items():
            field = f"{at}ranks.{label}"
            counted = block.tally.get(label)
            if counted is not None and set(row.outcome or ()) <= set(counted):
                pass                     # the tally pins how many end each way
            elif not race and len(row.outcome or ()) > 1:
                out.append(Widening(row.line, field + ".outcome",
                                    f"allows {'|'.join(row.outcome or ())}: pin one outcome "
                                    "(find the order that decides it), or declare race:"))
            elif not race and row.frequency:
                out.append(Widening(row.line, field + ".outcome", "frequency bounds belong "
                                    "to a race case (race:, repeat: >= 10)"))
            if row.within is not None and row.within[0] <= 0 and \
                    row.within[1] >= scn.deadline:
                out.append(Widening(row.line, field + ".within",
                                    f"[{row.within[0]:g}, {row.within[1]:g}] holds for any "
                                    f"end before the deadline ({scn.deadline:g} s): give the "
                                    "window you measured, or none"))
            if _cause_only(row) and counted is None:
                out.append(Widening(row.line, field + ".cause",
                                    "a failing row pinned only by cause: (the harness's own "
                                    "diagnosis): pin the exception, message or phase torch "
                                    "gives too"))
    return out

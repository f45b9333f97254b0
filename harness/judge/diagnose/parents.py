"""Rules of spawning parents and Slurm jobs: a parent's first failed child, srun's status
and the task that failed first, a task Slurm stopped."""

from __future__ import annotations

import re
from typing import Optional

from ..classify import Verdict
from ._core import Cause, RankContext, _cause_of, _exc_line, _first_line, rule
from ._shared import _first_failed_child
from .agents import stopped_by_agent

SRUN_ROW = "parent:srun"
SLURM_STOPS = re.compile(r"srun: (?:launch/slurm: _step_signal: Terminating StepId=\S+|"
                         r"error: Node failure on \S+|Force Terminated StepId=\S+)")


def _first_failed_task(c: RankContext) -> Optional[Verdict]:
    """The task of a Slurm job that ended first without being stopped by Slurm (srun's own
    lines are on the parent:srun row)."""
    tasks = [v for v in c.verdicts if v.label != SRUN_ROW and v.role in ("worker", "agent")
             and v.outcome not in ("ok", "absent") and v.returncode != -15
             and "Node failure" not in v.reason and v.duration is not None]
    return min(tasks, key=lambda v: v.duration or 0.0) if tasks else None


@rule(order=170, evidence=("exception", "verdicts", "causes"))
def srun_failed(c: RankContext) -> Optional[Cause]:
    """The Slurm job script: srun's status, and the task that failed first with its cause."""
    v = c.verdict
    if v.label != SRUN_ROW or v.exception != "SrunFailed":
        return None
    head = _first_line(v.message)
    stop = SLURM_STOPS.search(v.message or "")
    first = _first_failed_task(c)
    if first is None:
        return Cause(head + (f" ({stop.group(0)})" if stop else ""), [head])
    why = _cause_of(c, first.label, [srun_failed, stopped_by_slurm]) or first.reason
    return Cause(f"{head.split(';')[0]}: task {first.label} failed first: {why}",
                 [head] + ([stop.group(0)] if stop else []))


@rule(order=180, evidence=("verdicts",))
def stopped_by_slurm(c: RankContext) -> Optional[Cause]:
    """A task Slurm stopped: SIGTERM from srun's --kill-on-bad-exit, or a node set DOWN; srun's
    own line says which, and the task that failed first is named."""
    v = c.verdict
    srun = c.verdict_of(SRUN_ROW)
    if srun is None or v.label == SRUN_ROW or v.outcome != "crash" or \
            not (v.returncode == -15 or "Node failure" in v.reason):
        return None
    stop = SLURM_STOPS.search(srun.message or "")
    if stop is None:
        return None
    what = "the node failed" if "Node failure" in stop.group(0) else "Slurm terminated the step"
    first = _first_failed_task(c)
    after = ""
    if first is not None and first.label != v.label:
        after = f" after task {first.label} failed ({first.reason})"
    return Cause(f"stopped by Slurm: {what}{after}", [stop.group(0)])


@rule(order=160, evidence=("exception", "events", "causes"))
def parent_child_failed(c: RankContext) -> Optional[Cause]:
    """A spawning parent's ProcessExitedException/ProcessRaisedException: the child it collected
    failing first, and that child's own cause."""
    v = c.verdict
    if v.role != "parent" or not re.search(r"Process(Exited|Raised)Exception", v.exception or ""):
        return None
    first = _first_failed_child(c, v.label)
    if first is None:
        return None
    why = _cause_of(c, first.label, [parent_child_failed, stopped_by_agent]) or \
        (c.verdict_of(first.label) or v).reason
    return Cause(f"its child rank {first.label} failed first: {why}", [_exc_line(v)])

"""monitored_barrier: gloo's barrier that names the ranks that did not arrive within the
rank's timeout (the schema refuses it on another backend)."""

from __future__ import annotations

from datetime import timedelta

from . import Running, StepKind


class MonitoredBarrier(StepKind):
    NAME = "monitored_barrier"
    GRAMMAR = r"monitored_barrier"
    HELP = "monitored_barrier"
    ABOUT = ("torch.distributed.monitored_barrier(wait_all_ranks=True) within the timeout "
             "(gloo only): names the ranks that did not arrive")
    EXAMPLES = ("monitored_barrier",)
    COLLECTIVE = True
    ORDER = 40

    def act(self, w: Running, entry: str) -> None:
        w.dist.monitored_barrier(timeout=timedelta(seconds=w.spec.timeout), wait_all_ranks=True)

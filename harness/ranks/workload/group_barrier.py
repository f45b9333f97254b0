"""group_barrier: a barrier on the last group the workload made."""

from __future__ import annotations

from . import Running
from ._groups import OnLastGroup


class GroupBarrier(OnLastGroup):
    NAME = "group_barrier"
    GRAMMAR = r"group_barrier"
    HELP = "group_barrier"
    ABOUT = ("a barrier on the last group made (a non-member calls it on torch's non-member "
             "handle, as user code does)")
    EXAMPLES = ("group_barrier",)
    ORDER = 100

    def act(self, w: Running, entry: str) -> None:
        w.dist.barrier(group=self.group(w, entry))

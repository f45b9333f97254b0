"""group_all_reduce: a one-element all_reduce on the last group the workload made; a member
checks that the sum is the group's size."""

from __future__ import annotations

from . import Running
from ._groups import OnLastGroup


class GroupAllReduce(OnLastGroup):
    NAME = "group_all_reduce"
    GRAMMAR = r"group_all_reduce"
    HELP = "group_all_reduce (on the last group)"
    ABOUT = ("an all_reduce on the last group made, checked by its members (a non-member calls "
             "it on torch's non-member handle, as user code does)")
    EXAMPLES = ("group_all_reduce",)
    ORDER = 110

    def act(self, w: Running, entry: str) -> None:
        group = self.group(w, entry)
        t = w.torch.tensor([1.0], device=w.device)
        w.dist.all_reduce(t, group=group)
        size = w.dist.get_world_size(group) if self.member(w, group) else None
        if size is not None and float(t.item()) != float(size):
            raise AssertionError(f"group all_reduce gave {t.item()}, expected {size} (the "
                                 "group's size)")

"""What the subgroup steps share: the groups a workload made, and a group a rank never made."""

from __future__ import annotations

from typing import Any, Optional

from . import Running, StepKind

SKIPPED = object()   # a group this rank never made (skip_collective on its new_group)


class MakesGroup(StepKind):
    """A step that makes a process group (appended to ``Running.groups``)."""

    COLLECTIVE = True

    def skipped(self, w: Running, entry: str) -> None:
        w.groups.append(SKIPPED)   # it has no such group: its collectives on it go too


class OnLastGroup(StepKind):
    """A collective on the last group the workload made. A rank outside the group has torch's
    non-member handle, as user code does; a collective on it is what torch does with that (a
    warning and no-op)."""

    COLLECTIVE = True

    def skips(self, w: Running, entry: str) -> Optional[str]:
        if w.groups and w.groups[-1] is SKIPPED:
            return f"{entry} (its group was never made)"
        return None

    def group(self, w: Running, entry: str) -> Any:
        if not w.groups:
            raise RuntimeError(f"{entry}: the workload made no group before it")
        return w.groups[-1]

    def member(self, w: Running, group: Any) -> bool:
        return group not in (None, w.dist.GroupMember.NON_GROUP_MEMBER)

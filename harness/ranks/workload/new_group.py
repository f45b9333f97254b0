"""new_group [RANKS|all] [local]: ``torch.distributed.new_group`` (``local``:
use_local_synchronization, where only members call it: a non-member gets torch's non-member
handle without calling)."""

from __future__ import annotations

from typing import List, Optional, Tuple

from . import Running
from ._groups import MakesGroup

RANKS = r"[0-9]{1,3}(,[0-9]{1,3}){0,127}"


def group_ranks(entry: str, world: int) -> Tuple[Optional[List[int]], bool]:
    """``new_group 0,1 local`` -> ([0, 1], True); ``new_group`` / ``new_group all`` -> (None:
    every rank, False)."""
    parts = entry.split()[1:]
    local = "local" in parts
    ranks = [p for p in parts if p not in ("local", "all")]
    return ([int(x) for x in ranks[0].split(",")] if ranks else None), local


class NewGroup(MakesGroup):
    NAME = "new_group"
    GRAMMAR = rf"new_group( all| {RANKS})?( local)?"
    HELP = "'new_group [RANKS|all] [local]'"
    ABOUT = ("torch.distributed.new_group of RANKS (default all); local: "
             "use_local_synchronization=True (then only members call it, torch's rule)")
    EXAMPLES = ("new_group", "new_group all", "new_group 0,1", "new_group 0,2 local",
                "new_group local")
    ORDER = 80

    def act(self, w: Running, entry: str) -> None:
        ranks, local = group_ranks(entry, w.world)
        kw = {"use_local_synchronization": True} if local else {}
        if local and ranks is not None and w.dist.get_rank() not in ranks:
            # with local synchronization only members call new_group (torch's rule)
            w.groups.append(w.dist.GroupMember.NON_GROUP_MEMBER)
            return
        w.groups.append(w.dist.new_group(ranks=ranks, **kw))

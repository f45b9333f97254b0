"""split_group R,R|R,R: ``torch.distributed.split_group`` into those groups (where this torch
has it; else the rank raises, saying so)."""

from __future__ import annotations

from typing import List

from . import Running
from ._groups import MakesGroup
from .new_group import RANKS


def split_ranks(entry: str) -> List[List[int]]:
    """``split_group 0,1|2,3`` -> [[0, 1], [2, 3]]."""
    return [[int(x) for x in part.split(",")] for part in entry.split()[1].split("|")]


class SplitGroup(MakesGroup):
    NAME = "split_group"
    GRAMMAR = rf"split_group {RANKS}(\|{RANKS}){{0,127}}"
    HELP = "'split_group R,R|R,R'"
    ABOUT = ("torch.distributed.split_group into the groups written (torch >= 2.6; with an "
             "older torch the rank raises, naming its torch)")
    EXAMPLES = ("split_group 0,1|2,3", "split_group 0,1")
    ORDER = 90

    def act(self, w: Running, entry: str) -> None:
        if not hasattr(w.dist, "split_group"):
            raise RuntimeError(f"torch {w.torch.__version__} has no torch.distributed.split_group")
        w.groups.append(w.dist.split_group(split_ranks=split_ranks(entry)))

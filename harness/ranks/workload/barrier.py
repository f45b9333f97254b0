"""barrier: every rank waits for every other (``torch.distributed.barrier``)."""

from __future__ import annotations

from . import Running, StepKind


class Barrier(StepKind):
    NAME = "barrier"
    GRAMMAR = r"barrier"
    HELP = "barrier"
    ABOUT = "torch.distributed.barrier(): every rank waits for every other"
    EXAMPLES = ("barrier",)
    COLLECTIVE = True
    ORDER = 10

    def act(self, w: Running, entry: str) -> None:
        w.dist.barrier()

"""all_reduce: a sum over the world, checked (rank r gives r + 1: the sum is known)."""

from __future__ import annotations

from . import Running, StepKind


class AllReduce(StepKind):
    NAME = "all_reduce"
    GRAMMAR = r"all_reduce"
    HELP = "all_reduce"
    ABOUT = "a one-element all_reduce (sum) over the world, its result checked"
    EXAMPLES = ("all_reduce",)
    COLLECTIVE = True
    ORDER = 20

    def act(self, w: Running, entry: str) -> None:
        t = w.torch.tensor([float(w.rank + 1)], device=w.device)
        w.dist.all_reduce(t)
        want = w.world * (w.world + 1) / 2
        if float(t.item()) != want:
            raise AssertionError(f"all_reduce sum is {t.item()}, expected {want} "
                                 f"(world_size {w.world})")

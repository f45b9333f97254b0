"""broadcast: rank 0's value reaches every rank, checked."""

from __future__ import annotations

from . import Running, StepKind


class Broadcast(StepKind):
    NAME = "broadcast"
    GRAMMAR = r"broadcast"
    HELP = "broadcast"
    ABOUT = "a one-element broadcast from rank 0, its result checked"
    EXAMPLES = ("broadcast",)
    COLLECTIVE = True
    ORDER = 30

    def act(self, w: Running, entry: str) -> None:
        t = w.torch.tensor([float(w.rank == 0) * 42.0], device=w.device)
        w.dist.broadcast(t, src=0)
        if float(t.item()) != 42.0:
            raise AssertionError(f"broadcast gave {t.item()}, expected 42.0")

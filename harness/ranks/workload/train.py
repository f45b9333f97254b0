"""train N: N training steps through the ddp entry's model (phases ``train step K``, K counted
over every train entry): a forward, a backward with DDP's gradient all-reduce, an optimizer
step. A rank that skips a step's collective (skip_collective) keeps its gradients local."""

from __future__ import annotations

import contextlib
from typing import Dict, List

from ...core import protocol as P
from . import Running, StepKind


class Train(StepKind):
    NAME = "train"
    GRAMMAR = r"train [0-9]{1,6}"
    HELP = "'train STEPS'"
    ABOUT = ("STEPS training steps through the model of a ddp entry before it (phases train "
             "step K, K counted over every train entry: [ddp, train 2, barrier, train 2] enters "
             "train step 1..4): forward, backward with DDP's gradient all-reduce, an SGD step")
    EXAMPLES = ("train 3",)
    ORDER = 70

    def phases(self, entry: str, index: int, seen: Dict[str, int]) -> List[str]:
        out = []
        for _ in range(int(entry.split()[1])):
            seen["train"] = seen.get("train", 0) + 1
            out.append(f"train step {seen['train']}")
        return out

    def run(self, w: Running, entry: str, index: int) -> None:
        x = w.torch.ones(P.TRAIN_BATCH, w.width, device=w.device)
        for _ in range(int(entry.split()[1])):
            w.trained += 1
            name = f"train step {w.trained}"
            skipped = name in w.skip
            w.phase(name, step=entry, **({"skipped": "gradient all-reduce"} if skipped else {}))
            # a rank that skips the step's collective: no_sync keeps its gradients local
            with (w.model.no_sync() if skipped else contextlib.nullcontext()):
                w.model(x).mean().backward()
            w.optimizer.step()
            w.optimizer.zero_grad()

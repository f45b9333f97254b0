"""ddp SIZE: a model of SIZE (Linear layers of ``protocol.model_shape``, the same on every rank
unless a fault changes this rank's) wrapped in DistributedDataParallel: phases ``model`` and
``ddp`` (DDP's parameter-shape check and the broadcast of rank 0's parameters)."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from ...core import protocol as P
from . import Running, StepKind


def build_model(torch: Any, entry: str, change: str, device: Any) -> Tuple[Any, int]:
    """The entry's model and its width: Linear layers of protocol.model_shape, the same on
    every rank (seeded) unless a fault changes this rank's (one layer more, or wider)."""
    width, layers = P.model_shape(P.model_mb(entry))
    if change == "extra_layer":
        layers += 1
    elif change == "wider":
        width += 8
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    return model.to(device), width


class Ddp(StepKind):
    NAME = "ddp"
    GRAMMAR = r"ddp( [0-9]+(\.[0-9]+)?(MB|GB))?"
    HELP = "'ddp SIZE' (e.g. ddp 64MB)"
    ABOUT = ("builds a model of SIZE (default 4MB; phase model): Linear(1024, 1024) layers, "
             "float32, the same on every rank (seeded); then wraps it in "
             "DistributedDataParallel (phase ddp: the shape check, rank 0's parameters sent)")
    EXAMPLES = ("ddp", "ddp 64MB", "ddp 0.5MB", "ddp 1GB")
    ORDER = 60

    def phases(self, entry: str, index: int, seen: Dict[str, int]) -> List[str]:
        return ["model", "ddp"]

    def prepare(self, torch: Any) -> None:
        # DDP's constructor imports torch._dynamo on first use (2-4 s here, and its memory)
        import torch._dynamo  # noqa: F401
        import torch.nn.parallel  # noqa: F401

    def run(self, w: Running, entry: str, index: int) -> None:
        w.phase("model", step=entry)
        model, w.width = build_model(w.torch, entry, w.spec.variation.model_change, w.device)
        w.phase("ddp", step=entry, params=sum(p.numel() for p in model.parameters()))
        from torch.nn.parallel import DistributedDataParallel

        w.model = DistributedDataParallel(
            model, device_ids=[w.device.index] if w.device.type == "cuda" else None)
        w.optimizer = w.torch.optim.SGD(w.model.parameters(), lr=1e-3)

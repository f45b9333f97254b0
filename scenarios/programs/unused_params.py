"""A user's DDP script whose forward takes a rank-dependent branch: rank 1 never uses layer b,
and the model is wrapped without find_unused_parameters=True."""
import datetime
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo", timeout=datetime.timedelta(
    seconds=float(os.environ.get("TIMEOUT_S", "5"))))
rank = dist.get_rank()


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        x = self.a(x)
        return self.b(x) if rank == 0 else x     # the bug: rank 1 never uses b


model = DDP(Model())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    model(torch.ones(4, 8)).sum().backward()
    opt.step()
dist.destroy_process_group()

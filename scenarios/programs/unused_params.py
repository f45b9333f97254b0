"""A user's DDP script whose forward takes a rank-dependent branch: rank 1 never uses layer b,
and the model is wrapped without find_unused_parameters=True."""
import datetime
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

# TIMEOUT_S: torch's timeout in seconds; "30 5" gives rank 0 30 s and rank 1 5 s, so rank 0
# waits out rank 1's exit (read before init: env:// gives RANK)
timeouts = os.environ.get("TIMEOUT_S", "5").split()
mine = timeouts[min(int(os.environ.get("RANK", "0")), len(timeouts) - 1)]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(mine)))
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

"""A user's script with a rank-dependent collective: only rank 0 calls barrier() before the
all_reduce every rank calls (``if rank == 0: dist.barrier()``, a debugging line left in)."""
import datetime
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(
    seconds=float(os.environ.get("TIMEOUT_S", "5"))))
rank = dist.get_rank()
t = torch.ones(4)
if rank == 0:
    dist.barrier()          # the bug: only rank 0 syncs here
dist.all_reduce(t)
dist.all_reduce(t)
dist.destroy_process_group()

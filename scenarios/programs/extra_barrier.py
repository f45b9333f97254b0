"""A user's script with a rank-dependent collective: only rank 0 calls barrier() before the
all_reduce every rank calls (``if rank == 0: dist.barrier()``, a debugging line left in)."""
import datetime
import os

import torch
import torch.distributed as dist

# TIMEOUT_S: torch's timeout in seconds; "5 15" gives rank 0 5 s and rank 1 15 s, so which
# rank's timer fires first is decided, not raced (read before init: env:// gives RANK)
timeouts = os.environ.get("TIMEOUT_S", "5").split()
mine = timeouts[min(int(os.environ.get("RANK", "0")), len(timeouts) - 1)]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(mine)))
rank = dist.get_rank()
t = torch.ones(4)
if rank == 0:
    dist.barrier()          # the bug: only rank 0 syncs here
dist.all_reduce(t)
dist.all_reduce(t)
dist.destroy_process_group()

"""A user's training script, written as people write one: torchrun (or a cluster script) sets
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; the script initialises, wraps its model in
DistributedDataParallel and trains. Nothing in it knows the harness. Its flags reproduce the
reports the scenarios beside it are about:

  --slow-rank R   rank R spends for ever loading its data before it builds DDP
  --wide-rank R   rank R builds a wider model than the others (a stale checkpoint, a config)
  --crash-step N  --crash-rank R: rank R exits with status 3 in training step N (after its
                  forward, before its backward)
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=5)
p.add_argument("--hidden", type=int, default=64)
p.add_argument("--slow-rank", type=int, default=-1)
p.add_argument("--wide-rank", type=int, default=-1)
p.add_argument("--crash-rank", type=int, default=-1)
p.add_argument("--crash-step", type=int, default=-1)
p.add_argument("--step-time", type=float, default=0.0)
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
hidden = args.hidden * 2 if rank == args.wide_rank else args.hidden
model = torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.ReLU(),
                            torch.nn.Linear(hidden, 1))
if rank == args.slow_rank:
    time.sleep(3600)           # the data loader that never comes back
ddp = DDP(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for step in range(1, args.steps + 1):
    loss = ddp(torch.randn(8, 16)).sum()
    if rank == args.crash_rank and step == args.crash_step:
        raise SystemExit(3)    # a bad batch, an assertion of the user's: sys.exit(3)
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(args.step_time)
dist.destroy_process_group()

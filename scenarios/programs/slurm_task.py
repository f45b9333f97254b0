"""A user's Slurm task, written as people write one for ``srun python slurm_task.py``: rank and
world from the environment the job script exported (RANK from SLURM_PROCID, WORLD_SIZE from
SLURM_NTASKS, MASTER_ADDR from the node list), gloo, one all_reduce. Nothing in it knows the
harness. Its flags reproduce the reports the Slurm scenarios are about:

  --exit-rank R --code C   rank R exits with status C before init_process_group (a bad
                           import, a missing file on one node)
  --timeout S              init_process_group's timeout (default 10 s)
"""

import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--exit-rank", type=int, default=-1)
p.add_argument("--code", type=int, default=7)
p.add_argument("--timeout", type=float, default=10.0)
args = p.parse_args()

rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
if rank == args.exit_rank:
    print(f"task {rank}: cannot load the data set on {os.uname().nodename}", file=sys.stderr)
    sys.exit(args.code)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()}/{dist.get_world_size()}: {t.item()}")
dist.destroy_process_group()

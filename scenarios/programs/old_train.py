"""A training script written for torch 1.x and `python -m torch.distributed.launch`: it reads
its local rank from a --local_rank argument (underscore), as the old launcher passed it, and
nothing else from the launcher. Nothing in it knows the harness."""

import argparse

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--local_rank", type=int, default=-1)   # as most torch 1.x examples
args = p.parse_args()

dist.init_process_group("gloo", init_method="env://")
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == dist.get_world_size()
dist.destroy_process_group()
print(f"rank {dist.get_rank() if dist.is_initialized() else '-'} local_rank {args.local_rank} ok")

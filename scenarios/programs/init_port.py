"""A training script that names its own rendezvous port in init_method (tcp://MASTER_ADDR:PORT),
as scripts written before torchrun often do, whatever port the launcher's store has.

Usage: init_port.py --port PORT [--timeout SECONDS]   (rank and world size from the launcher)
"""

import argparse
import datetime
import os

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--timeout", type=float, default=10.0)
args = ap.parse_args()
dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{args.port}",
                        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                        timeout=datetime.timedelta(seconds=args.timeout))
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == dist.get_world_size()
dist.destroy_process_group()

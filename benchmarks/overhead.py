"""What the harness costs over launching the same ranks by hand, measured side by side.

Both sides run a healthy 2-rank gloo job (init + all_reduce + destroy) from fresh interpreters:
- bare: two `python -c` processes with MASTER_ADDR/PORT/RANK/WORLD_SIZE, waited for;
- harness: `harness.launch.run_scenario` on the same job (plan, port lease, run dir, start line,
  supervision, event channel, cleanup; in a private network namespace when the harness can).
Runs alternate (bare, harness, bare, ...) so that machine noise hits both alike; the result is
quoted as a ratio of medians. Usage: python benchmarks/overhead.py [ROUNDS]
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time

from harness.run.supervisor import run_scenario
from harness.scenario.loader import load_text

BARE = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1); dist.all_reduce(t); assert t.item() == 2
dist.destroy_process_group()
"""

SCENARIO = """
name: bench
about: healthy 2-rank job for the overhead benchmark
world_size: 2
timeout: 30
deadline: 60
workload: [all_reduce]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bare_once() -> float:
    port = free_port()
    t = time.perf_counter()
    procs = []
    for r in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                   WORLD_SIZE="2")
        procs.append(subprocess.Popen([sys.executable, "-c", BARE], env=env))
    rcs = [p.wait() for p in procs]
    if any(rcs):
        raise SystemExit(f"bare run failed: {rcs}")
    return time.perf_counter() - t


def harness_once(scn) -> float:
    t = time.perf_counter()
    obs = run_scenario(scn)
    if any(r.result() is None or r.result().get("status") != "ok" for r in obs.ranks):
        raise SystemExit("harness run was not ok")
    return time.perf_counter() - t


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    scn = load_text(SCENARIO)[0]
    bare, harn = [], []
    for _ in range(rounds):
        bare.append(bare_once())
        harn.append(harness_once(scn))
    mb, mh = statistics.median(bare), statistics.median(harn)
    print(f"rounds: {rounds}")
    print(f"bare ranks     median {mb:.2f} s  (min {min(bare):.2f}, max {max(bare):.2f})")
    print(f"harness run    median {mh:.2f} s  (min {min(harn):.2f}, max {max(harn):.2f})")
    print(f"ratio harness/bare: {mh / mb:.2f}x")


if __name__ == "__main__":
    main()

"""From the deadline to a finished verdict with every hung rank's stacks: how long?

A world of N ranks (default 8) where rank 0, the store's host, is released only after the
deadline: ranks 1..N-1 hang in init_process_group, dialling the store, and are caught at the
deadline (py-spy's native stacks where installed and permitted, faulthandler's Python stacks).
The latency is the run's wall time past its deadline (stack capture, kill, the last events,
the step teardown) as the harness reports it; the stacks' size shows they were captured.
Usage: python benchmarks/verdict_latency.py [N] [ROUNDS] [fresh|fork]
"""

from __future__ import annotations

import statistics
import sys
import time

import yaml

from harness.judge.classify import classify_run
from harness.run.supervisor import native_stacks_available, run_scenario
from harness.scenario.loader import load_text

DEADLINE = 10.0


def scenario(n: int, start: str = "fresh"):
    data = {"start": start, "name": "latency", "about": "N-1 ranks hung in init at the deadline",
            "world_size": n, "timeout": 120, "deadline": DEADLINE, "workload": "init",
            "faults": [{"kind": "delayed_rank", "ranks": [0], "delay": 1000}]}
    (s,) = load_text(yaml.safe_dump(data), "latency.yaml")
    return s


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    start = sys.argv[3] if len(sys.argv) > 3 else "fresh"
    lat = []
    for i in range(rounds):
        t = time.monotonic()
        obs = run_scenario(scenario(n, start))
        verdicts = classify_run(obs)
        hung = [v for v in verdicts if v.outcome == "hang"]
        stacks = sum(1 for r in obs.ranks if r.stacks)
        native = sum(1 for r in obs.ranks if r.native_stacks and "py-spy failed" not in
                     r.native_stacks and r.native_stacks.strip())
        lat.append(obs.wall - DEADLINE)
        print(f"round {i + 1}: {len(hung)} hung ranks, Python stacks of {stacks}, native stacks "
              f"of {native}; deadline -> verdict {obs.wall - DEADLINE:.2f} s (whole run "
              f"{time.monotonic() - t:.1f} s)")
    print(f"py-spy: {'yes' if native_stacks_available() else 'not installed'}; "
          f"median deadline -> verdict over {rounds} rounds, N={n}, start {start}: "
          f"{statistics.median(lat):.2f} s")


if __name__ == "__main__":
    main()

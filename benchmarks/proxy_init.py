"""What a transparent fault proxy with no effect adds to a real start-up, side by side.

Two hosts, gloo, init + barrier + all_reduce, run alternately:
- plain: no fault;
- proxied: every TCP connection of host a through the fault proxy (traffic: all, nftables
  redirect), whose only toxic never applies (a slow_close drawn with probability 0.001, and a
  close it would delay by 1 ms).
Printed: the medians and ranges of rank 1's duration (start line to exit) and their difference.
Needs root (namespaces). Usage: python benchmarks/proxy_init.py [RUNS]
"""

from __future__ import annotations

import statistics
import sys

from harness.judge.classify import classify_run
from harness.run.supervisor import run_scenario
from harness.scenario.loader import load_text

BASE = """\
name: bench
about: proxy cost
hosts: [{name: a}, {name: b}]
timeout: 10
deadline: 60
workload: [barrier, all_reduce]
"""
PROXIED = BASE + "faults: [{kind: slow_close, delay_ms: 1, probability: 0.001}]\n"


def once(text: str) -> float:
    (scn,) = load_text(text, "bench.yaml")
    verdicts = classify_run(run_scenario(scn))
    assert [v.outcome for v in verdicts] == ["ok", "ok"], verdicts
    return float(verdicts[1].duration or 0.0)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    plain, proxied = [], []
    for _ in range(runs):
        plain.append(once(BASE))
        proxied.append(once(PROXIED))
    for name, xs in (("plain", plain), ("proxied", proxied)):
        print(f"{name:8} median {statistics.median(xs):.3f} s, range {min(xs):.3f}-{max(xs):.3f} s")
    print(f"difference of medians: {statistics.median(proxied) - statistics.median(plain):+.3f} s")


if __name__ == "__main__":
    main()

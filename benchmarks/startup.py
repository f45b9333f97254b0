"""Start-up cost of the harness against a minimal hand-written launcher, side by side.

One run measures, alternating (harness, hand, harness, hand...) so that the machine's noise
hits both alike, for each world size N (default 2, 8, 32, 64):

- fresh: ``harness run JOB.yaml --start fresh`` against N ``python -c`` ranks started with
  ``subprocess.Popen`` (MASTER_ADDR/PORT, RANK, WORLD_SIZE) and waited for;
- fork: ``harness run JOB.yaml --start fork`` against one parent that imports torch and
  ``os.fork``s the N ranks (its import counted);

each rank: ``init_process_group("gloo")`` + one all_reduce + destroy. And a wrong-port job
(2 ranks, rank 1 dials another port, torch's timeout 5 s) both ways. The harness is timed as a
user meets it, the whole command (pytest, the plan, its namespace, the supervision, the
cleanup); the hand launcher is the least that runs the same ranks. Prints one row per job with
the ratio harness / hand and the load average before it.

Usage: python benchmarks/startup.py [--sizes 2,8,32,64] [--rounds 1] [--no-fresh 64]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent

RANK = """
import os, torch, torch.distributed as dist
from datetime import timedelta
try:
    dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ["T"])))
    t = torch.ones(1); dist.all_reduce(t); assert t.item() == dist.get_world_size()
    dist.destroy_process_group()
except Exception:
    os._exit(1)
os._exit(0)
"""

FORKING_PARENT = """
import os, sys, torch, torch.distributed as dist
from datetime import timedelta
n, port, bad, t = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
pids = []
for r in range(n):
    pid = os.fork()
    if pid == 0:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port + (r == bad)),
                          RANK=str(r), WORLD_SIZE=str(n))
        try:
            dist.init_process_group("gloo", timeout=timedelta(seconds=t))
            x = torch.ones(1); dist.all_reduce(x); dist.destroy_process_group()
        except Exception:
            os._exit(1)
        os._exit(0)
    pids.append(pid)
rc = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
print(sum(1 for c in rc if c == 0))
"""

JOB = """name: startup{n}
about: a healthy all_reduce at world size {n} (benchmarks/startup.py)
world_size: {n}
timeout: 60
deadline: 300
workload: [all_reduce]
expect:
  job: ok
"""

WRONG_PORT = """name: startup_wrong_port
about: rank 1 dials another port (benchmarks/startup.py)
world_size: 2
timeout: 5
deadline: 120
workload: [all_reduce]
faults: [{kind: wrong_port, ranks: [1]}]
expect:
  job: timeout
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def harness(job: Path, start: str) -> float:
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "harness", "run", str(job), "--start", start,
                        "--no-progress"], cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t
    if p.returncode != 0:
        raise SystemExit(f"harness run {job.name} --start {start} failed (rc {p.returncode}):\n"
                         f"{p.stdout[-2000:]}")
    return wall


def hand_fresh(n: int, bad: int = -1, timeout: float = 60.0) -> float:
    port = free_port()
    t = time.monotonic()
    procs = []
    for r in range(n):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port + (r == bad)),
                   RANK=str(r), WORLD_SIZE=str(n), T=str(timeout), PYTHONWARNINGS="ignore")
        procs.append(subprocess.Popen([sys.executable, "-c", RANK], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    rcs = [p.wait() for p in procs]
    wall = time.monotonic() - t
    if bad < 0 and any(rcs):
        raise SystemExit(f"hand fresh N={n}: ranks failed {rcs}")
    return wall


def hand_fork(n: int, bad: int = -1, timeout: float = 60.0) -> float:
    port = free_port()
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-c", FORKING_PARENT, str(n), str(port), str(bad),
                        str(timeout)], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONWARNINGS="ignore"))
    wall = time.monotonic() - t
    if bad < 0 and p.stdout.strip() != str(n):
        raise SystemExit(f"hand fork N={n}: {p.stdout} {p.stderr[-1000:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2,8,32,64")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--no-fresh", default="", help="sizes measured with fork only (fresh "
                    "64 takes minutes on 2 cores)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x]
    skip_fresh = {int(x) for x in args.no_fresh.split(",") if x}
    times: Dict[Tuple[str, str], List[float]] = {}
    loads: Dict[str, List[str]] = {}
    with tempfile.TemporaryDirectory(prefix="harness-startup-") as tmp:
        jobs = {}
        for n in sizes:
            jobs[n] = Path(tmp) / f"startup{n}.yaml"
            jobs[n].write_text(JOB.format(n=n))
        wrong = Path(tmp) / "startup_wrong_port.yaml"
        wrong.write_text(WRONG_PORT)
        plan: List[Tuple[str, str, object]] = []
        for n in sizes:
            for start in ("fresh", "fork"):
                if start == "fresh" and n in skip_fresh:
                    continue
                row = f"ok N={n} {start}"
                plan.append((row, "harness", lambda j=jobs[n], s=start: harness(j, s)))
                plan.append((row, "hand", (lambda n=n: hand_fresh(n)) if start == "fresh"
                             else (lambda n=n: hand_fork(n))))
        for start in ("fresh", "fork"):
            row = f"wrong port N=2 {start}"
            plan.append((row, "harness", lambda s=start: harness(wrong, s)))
            plan.append((row, "hand", (lambda: hand_fresh(2, bad=1, timeout=5.0))
                         if start == "fresh" else (lambda: hand_fork(2, bad=1, timeout=5.0))))
        for _ in range(args.rounds):
            for row, side, fn in plan:
                loads.setdefault(row, []).append(load())
                times.setdefault((row, side), []).append(fn())   # type: ignore[operator]
                print(f"  {row:24} {side:8} {times[(row, side)][-1]:6.2f} s  load {loads[row][-1]}",
                      file=sys.stderr, flush=True)
    print(f"{'job':24} {'harness s':>10} {'hand s':>8} {'ratio':>6}  load (1 min) before")
    for row in dict.fromkeys(r for r, _, _ in plan):
        h = statistics.median(times[(row, "harness")])
        b = statistics.median(times[(row, "hand")])
        print(f"{row:24} {h:10.2f} {b:8.2f} {h / b:6.2f}  {' '.join(loads[row])}")


if __name__ == "__main__":
    main()

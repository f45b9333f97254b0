"""What the session's zygote saves per case, measured side by side.

Both sides are the same `harness run FILES --start fork -n WORKERS --report R.json`; one with
`HARNESS_ZYGOTES=0` (every run's per-host fork server a fresh interpreter that imports torch:
the start before the zygote), one with the default (each run's servers forked from a zygote
that imported torch once per session). Sessions alternate, off first in odd rounds and on
first in even ones, so that the machine's load, and a load that rises or falls through the
benchmark, hits both alike. Per session it prints the per-case overhead (pytest's duration of
a case minus its run's wall from the start line: interpreters, imports, namespaces, stacks,
cleanup), summed and as a median, the report's time ratio (session time over the scenarios'
own waits divided by the workers) and the 1-minute load before it; then the ratios of the
medians over the rounds.

Usage: python benchmarks/zygote.py [--rounds R] [-n WORKERS] FILE... (default: healthy,
wrong_port, busy_port, delayed_rank and malformed_env of the catalog, 2 rounds, -n 2)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parent.parent
FILES = ["scenarios/healthy.yaml", "scenarios/wrong_port.yaml", "scenarios/busy_port.yaml",
         "scenarios/delayed_rank.yaml", "scenarios/malformed_env.yaml"]


def session(files: List[str], workers: int, zygotes: bool, out: Path) -> Dict[str, Any]:
    env = dict(os.environ)
    env.pop("HARNESS_ZYGOTES", None)
    if not zygotes:
        env["HARNESS_ZYGOTES"] = "0"
    load = os.getloadavg()[0]
    subprocess.run([sys.executable, "-m", "harness", "run", *files, "--start", "fork",
                    "-n", str(workers), "--no-progress", "--report", str(out)], cwd=ROOT,
                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rep = json.loads(out.read_text())
    ran = [c for c in rep["cases"] if c.get("duration") is not None and c.get("wall") is not None]
    over = [c["duration"] - c["wall"] for c in ran]
    servers = [w for c in rep["cases"] for w in ((c.get("started") or {}).get("servers") or {})
               .values()]
    return {"zygotes": zygotes, "load": load, "cases": len(ran), "overhead": sum(over),
            "median": statistics.median(over) if over else 0.0,
            "ratio": (rep.get("time") or {}).get("ratio"),
            "duration": (rep.get("time") or {}).get("duration"),
            "warm": sum(1 for w in servers if w == "warm"), "servers": len(servers),
            "failed": sum(1 for c in rep["cases"] if c.get("status") in ("failed", "error"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("-n", type=int, default=2, help="pytest-xdist workers per session")
    ap.add_argument("files", nargs="*", default=FILES)
    args = ap.parse_args()
    rows: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="harness-bench-zygote-") as tmp:
        for r in range(args.rounds):
            for zygotes in ((False, True) if r % 2 == 0 else (True, False)):
                row = session(args.files, args.n, zygotes, Path(tmp) / f"{r}-{zygotes}.json")
                rows.append(row)
                print(f"round {r + 1} zygotes {'on ' if zygotes else 'off'}: load "
                      f"{row['load']:.1f}, {row['cases']} cases ({row['failed']} failed), "
                      f"overhead {row['overhead']:.1f} s (median {row['median']:.2f} s per "
                      f"case), session {row['duration']:.0f} s, time ratio {row['ratio']}, "
                      f"warm servers {row['warm']}/{row['servers']}", flush=True)
    for key in ("overhead", "median", "duration", "ratio"):
        off = statistics.median(r[key] for r in rows if not r["zygotes"] and r[key] is not None)
        on = statistics.median(r[key] for r in rows if r["zygotes"] and r[key] is not None)
        print(f"{key}: off {off:.2f}, on {on:.2f}, on/off {on / off:.2f}")


if __name__ == "__main__":
    main()

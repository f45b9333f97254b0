"""The catalog's schedule, measured side by side: as before against longest first with the gate.

Three sides, each one `harness run FILES --report R.json` session, in one benchmark run:

* `-n 2`, the files' order, no admission gate (`--harness-order collected`,
  `HARNESS_ADMISSION=0`): the README's catalog command before the schedule;
* `-n 4`, the same;
* `-n N` (default 8), longest first (`scenarios/durations.json` and pytest's cache) with the
  admission gate (harness/admission.py).

Sides alternate their order per round (a load that rises or falls through the benchmark hits
all alike). Per session: wall, the floor (the larger of the longest case and the CPU the
session's processes used over the cores), wall / floor, the cases and how many failed; then
each side's median wall as a ratio to the new schedule's.

Usage: python benchmarks/schedule.py [--rounds R] [-n N] [FILE_OR_DIR...] (default: the
whole catalog, scenarios/, 1 round)
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


def session(files: List[str], workers: int, new: bool, out: Path) -> Dict[str, Any]:
    env = dict(os.environ)
    extra: List[str] = []
    if new:
        env.pop("HARNESS_ADMISSION", None)
    else:
        env["HARNESS_ADMISSION"] = "0"
        extra = ["--", "--harness-order", "collected"]
    load = os.getloadavg()[0]
    subprocess.run([sys.executable, "-m", "harness", "run", *files, "-n", str(workers),
                    "--no-progress", "--report", str(out), *extra], cwd=ROOT, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rep = json.loads(out.read_text())
    t = rep.get("time") or {}
    cases = rep.get("cases") or []
    return {"side": f"-n {workers} {'longest+gate' if new else 'collected'}", "load": load,
            "wall": t.get("duration"), "floor": t.get("floor"), "over_floor": t.get("over_floor"),
            "cpu_s": t.get("cpu_s"), "cases": len(cases),
            "failed": sum(1 for c in cases if c.get("status") in ("failed", "error"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("-n", type=int, default=8, help="workers of the new schedule's side")
    ap.add_argument("files", nargs="*", default=["scenarios/"])
    a = ap.parse_args()
    sides = [(2, False), (4, False), (a.n, True)]
    rows: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = sides if r % 2 == 0 else list(reversed(sides))
            for i, (n, new) in enumerate(order):
                row = session(a.files, n, new, Path(tmp) / f"r{r}-{i}.json")
                rows.append(row)
                print(f"round {r + 1}: {row['side']:<22} wall {row['wall']:7.1f} s  floor "
                      f"{row['floor']:6.1f} s  wall/floor {row['over_floor']:.2f}  cpu "
                      f"{row['cpu_s']:.0f} s  {row['cases']} cases, {row['failed']} failed  "
                      f"(load before {row['load']:.1f})", flush=True)
    med = {s: statistics.median(r["wall"] for r in rows if r["side"] == s)
           for s in dict.fromkeys(r["side"] for r in rows)}
    new_side = [s for s in med if "longest" in s][0]
    for s, w in med.items():
        print(f"{s:<22} median wall {w:7.1f} s  = {w / med[new_side]:.2f}x the new schedule's")


if __name__ == "__main__":
    main()

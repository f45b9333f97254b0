"""Does capping rank output (harness.capture) hold a chatty rank up? Measured side by side.

A child process writes N MB to stdout in 64 KiB writes (what a rank printing a lot does):
- file: stdout is a file in the run directory (the harness before the cap: unbounded);
- capture: stdout is a pipe drained by harness.capture's selector thread (1 MiB head + 256 KiB
  tail kept, a marker for the rest).
The time is the child's own, from start to exit as the parent sees it. Runs alternate so that
machine noise hits both alike; the result is quoted as a ratio of medians, with the bytes each
side left on disk. Usage: python benchmarks/capture.py [MB] [ROUNDS]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.machine.output_caps import Capture

WRITER = """
import os, sys
block = b"x" * 65535 + b"\\n"
for _ in range(int(sys.argv[1]) * 16):
    os.write(1, block)
"""


def to_file(d: Path, mb: int) -> tuple:
    path = d / "out.file"
    with open(path, "wb") as f:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", WRITER, str(mb)], stdout=f, check=True)
        wall = time.perf_counter() - t
    return wall, path.stat().st_size


def through_capture(d: Path, mb: int) -> tuple:
    path = d / "out.capture"
    cap = Capture()
    w = cap.pipe(path)
    t = time.perf_counter()
    try:
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(mb)], stdout=w)
    finally:
        os.close(w)
    p.wait()
    wall = time.perf_counter() - t
    cap.close()
    return wall, path.stat().st_size


def main() -> None:
    mb = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    files, caps = [], []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for _ in range(rounds):
            files.append(to_file(d, mb))
            caps.append(through_capture(d, mb))
    f = statistics.median(w for w, _ in files)
    c = statistics.median(w for w, _ in caps)
    print(f"{mb} MB written by the child, {rounds} rounds each, alternating")
    print(f"file    : median {f:.3f} s  (runs {', '.join(f'{w:.3f}' for w, _ in files)}), "
          f"{files[-1][1]:,} bytes on disk")
    print(f"capture : median {c:.3f} s  (runs {', '.join(f'{w:.3f}' for w, _ in caps)}), "
          f"{caps[-1][1]:,} bytes on disk")
    print(f"ratio capture/file: {c / f:.2f}")


if __name__ == "__main__":
    main()

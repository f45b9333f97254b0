"""Run directories under ``<tmp>/torchdist-harness`` and the sweep of what killed runs left.

Each run has ``run-<id>/`` holding ``owner.json`` (the supervisor's pid and start time) and
``pids.jsonl`` (every process it started: ranks, port holders, helpers). A run that ends tidies
up after itself; a run that was killed cannot, so every new run first sweeps: a run directory
whose owner is gone has its recorded processes killed (only if pid and start time still match)
and is removed. Runs of live owners (concurrent pytest-xdist workers) are left alone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import List, Optional

import psutil


def base_dir() -> Path:
    d = Path(os.environ.get("HARNESS_TMP", tempfile.gettempdir())) / "torchdist-harness"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _start_time(pid: int) -> Optional[float]:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _same_process(pid: int, create_time: float) -> bool:
    t = _start_time(pid)
    return t is not None and abs(t - create_time) < 0.05


class RunDir:
    def __init__(self, base: Optional[Path] = None):
        self.base = base or base_dir()
        self.id = uuid.uuid4().hex[:8]
        self.path = self.base / f"run-{self.id}"
        # made under a name the sweep ignores, owned, then renamed: a concurrent sweep never
        # sees a run-* directory without its owner
        tmp = self.base / f".new-{self.id}"
        tmp.mkdir(mode=0o755)
        me = os.getpid()
        (tmp / "owner.json").write_text(json.dumps({"pid": me, "create_time": _start_time(me)}))
        os.rename(tmp, self.path)

    def record_pid(self, pid: int) -> None:
        with open(self.path / "pids.jsonl", "a") as f:
            f.write(json.dumps({"pid": pid, "create_time": _start_time(pid)}) + "\n")

    def remove(self) -> None:
        _rmtree(self.path)


def _rmtree(path: Path) -> None:
    ro = path / "readonly"   # made unwritable (0555, and chattr +i as root) by file_init
    if ro.exists() and shutil.which("chattr"):
        subprocess.run(["chattr", "-i", str(ro)], capture_output=True)

    def onerror(func, p, exc):
        try:
            os.chmod(os.path.dirname(p), 0o755)
            os.chmod(p, 0o755)
            func(p)
        except OSError:
            pass
    shutil.rmtree(path, onerror=onerror)


def kill_recorded(run: Path) -> List[int]:
    killed: List[int] = []
    pids = run / "pids.jsonl"
    if not pids.exists():
        return killed
    for line in pids.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("create_time") and _same_process(rec["pid"], rec["create_time"]):
            try:
                os.killpg(rec["pid"], signal.SIGKILL)
            except OSError:
                pass
            try:
                os.kill(rec["pid"], signal.SIGKILL)
                killed.append(rec["pid"])
            except OSError:
                pass
    return killed


def sweep(base: Optional[Path] = None) -> List[str]:
    """Remove leftovers of dead runs; returns what was removed (for `harness doctor`)."""
    removed = []
    base = base or base_dir()
    for run in sorted(base.glob("run-*")):
        try:
            owner = json.loads((run / "owner.json").read_text())
        except (OSError, ValueError):
            owner = {}
        if owner.get("pid") and owner.get("create_time") and \
                _same_process(owner["pid"], owner["create_time"]):
            continue
        pids = kill_recorded(run)
        _rmtree(run)
        removed.append(f"{run.name}" + (f" (killed {pids})" if pids else ""))
    return removed


def leftovers(base: Optional[Path] = None) -> List[str]:
    """Run dirs of dead owners and harness processes without a live run (read-only)."""
    out = []
    base = base or base_dir()
    for run in sorted(base.glob("run-*")):
        try:
            owner = json.loads((run / "owner.json").read_text())
        except (OSError, ValueError):
            owner = {}
        if not (owner.get("pid") and owner.get("create_time")
                and _same_process(owner["pid"], owner["create_time"])):
            out.append(str(run))
    return out

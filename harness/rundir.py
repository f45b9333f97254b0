"""Per-user state folders, run directories in them, and the sweep of what killed runs left.

State lives in ``<tmp>/torchdist-harness-<uid>/`` (``<tmp>``: ``$HARNESS_TMP``, else the
system's temp dir), mode 0700, one folder per user: a root run and a non-root run on one
machine never share (or lock each other out of) a state folder. A folder that is a symlink, is
not a directory, or belongs to another user is refused with one line (a HarnessError), never
used. Port locks are the one thing shared across users (``harness.ports``).

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
import stat
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import List, Optional

import psutil

from .errors import HarnessError

STATE_PREFIX = "torchdist-harness-"


def tmp_root() -> Path:
    return Path(os.environ.get("HARNESS_TMP") or tempfile.gettempdir())


def _refuse(d: Path, why: str) -> HarnessError:
    return HarnessError(f"state folder {d}: {why}; remove it, or set HARNESS_TMP to a folder "
                        "of your own")


def private_dir(d: Path) -> Path:
    """``d`` as a folder of this user only (0700): made if missing; refused if it is a
    symlink, not a folder, another user's, or not writable."""
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise _refuse(d, f"cannot create it ({e.strerror or e})") from None
    try:
        st = os.lstat(d)
    except OSError as e:
        raise _refuse(d, f"cannot read it ({e.strerror or e})") from None
    me = os.geteuid()
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(d, "it is a symbolic link (refused: it could point anywhere)")
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(d, "it is not a folder")
    if st.st_uid != me:
        raise _refuse(d, f"it belongs to uid {st.st_uid}, not to you (uid {me})")
    if st.st_mode & 0o077:
        try:
            os.chmod(d, 0o700)
        except OSError as e:
            raise _refuse(d, f"cannot make it private ({e.strerror or e})") from None
    if not os.access(d, os.W_OK | os.X_OK):
        raise _refuse(d, "it is not writable")
    return d


def base_dir() -> Path:
    """This user's state folder, ``<tmp>/torchdist-harness-<uid>`` (see the module's doc)."""
    return private_dir(tmp_root() / f"{STATE_PREFIX}{os.geteuid()}")


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
        try:
            tmp.mkdir(mode=0o755)
            me = os.getpid()
            (tmp / "owner.json").write_text(json.dumps({"pid": me,
                                                        "create_time": _start_time(me)}))
            os.rename(tmp, self.path)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise HarnessError(f"cannot make a run directory in {self.base}: "
                               f"{e.strerror or e}") from None

    def record_pid(self, pid: int) -> None:
        with open(self.path / "pids.jsonl", "a") as f:
            f.write(json.dumps({"pid": pid, "create_time": _start_time(pid)}) + "\n")

    def remove(self) -> None:
        _rmtree(self.path)


def _rmtree(path: Path) -> None:
    ro = path / "readonly"   # made unwritable (0555, and chattr +i as root) by file_init
    if ro.exists() and shutil.which("chattr"):
        subprocess.run(["chattr", "-i", str(ro)], capture_output=True, start_new_session=True)

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
    try:
        lines = pids.read_text().splitlines()
    except OSError:
        return killed
    for line in lines:
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

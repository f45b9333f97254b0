"""Control groups of a run: a memory limit or a CPU quota on one rank, and their sweep.

The mechanism behind the resource faults (the faults are in ``harness/faults``; this module
knows none by name). A run's cgroup is a child of the harness's own cgroup in the hierarchy
that has the controller (so every limit above the harness still holds), named
``torchdist-harness-<run id>-<name>``:

* cgroup v2 (the unified hierarchy, ``/sys/fs/cgroup`` or ``/sys/fs/cgroup/unified``) when the
  controller is enabled there: ``memory.max`` (and ``memory.swap.max`` 0), ``cpu.max``;
* else cgroup v1 (``/sys/fs/cgroup/memory``, ``/sys/fs/cgroup/cpu``): ``memory.limit_in_bytes``
  (and ``memory.memsw.limit_in_bytes`` where swap accounting is on), ``cpu.cfs_quota_us``.

A process moved in keeps what it had charged elsewhere (neither version moves charges by
default): the limit counts what the rank allocates after it was moved. ``remove`` takes a
cgroup away once its processes are gone; :func:`sweep` removes the cgroups of runs whose
directory is gone or whose owner died (a run killed with SIGKILL), after killing what is still
in them.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
PREFIX = "torchdist-harness-"


@dataclass(frozen=True)
class Hierarchy:
    """Where a controller lives: its mount, the version, and the harness's own cgroup there."""

    controller: str              # memory | cpu
    version: int                 # 1 | 2
    mount: Path
    own: Path                    # the harness's cgroup (the parent of the run's)


def _self_path(version: int, controller: str) -> Optional[str]:
    try:
        lines = PROC_SELF_CGROUP.read_text().splitlines()
    except OSError:
        return None
    for ln in lines:
        parts = ln.split(":", 2)
        if len(parts) != 3:
            continue
        if version == 2 and parts[0] == "0" and parts[1] == "":
            return parts[2]
        if version == 1 and controller in parts[1].split(","):
            return parts[2]
    return None


def _v2_mount() -> Optional[Path]:
    for m in (ROOT, ROOT / "unified"):
        if (m / "cgroup.controllers").exists():
            return m
    return None


def hierarchy(controller: str) -> Hierarchy:
    """The hierarchy the run's cgroups for ``controller`` go in; raises CgroupError (the
    reason, in words) when there is none the harness can use."""
    if os.geteuid() != 0:
        raise CgroupError(f"cgroup {controller} limits need root (the harness runs as uid "
                          f"{os.geteuid()})")
    v2 = _v2_mount()
    why: List[str] = []
    if v2 is not None:
        own = _self_path(2, controller)
        if own is not None:
            here = v2 / own.lstrip("/")
            try:
                enabled = (here / "cgroup.subtree_control").read_text().split()
                avail = (here / "cgroup.controllers").read_text().split()
            except OSError:
                enabled, avail = [], []
            if controller in enabled or controller in avail:
                return Hierarchy(controller, 2, v2, here)
            why.append(f"cgroup v2 at {v2} has no {controller} controller for the harness's "
                       f"cgroup ({own})")
    v1 = ROOT / controller
    own1 = _self_path(1, controller)
    if own1 is not None and (v1 / "cgroup.procs").exists():
        return Hierarchy(controller, 1, v1, v1 / own1.lstrip("/"))
    why.append(f"no cgroup v1 {controller} hierarchy at {v1}")
    raise CgroupError("; ".join(why))


def missing(controller: str) -> Optional[str]:
    """Why the harness cannot make a ``controller`` cgroup here (None: it can). Tries it."""
    try:
        h = hierarchy(controller)
        probe = h.own / f"{PREFIX}probe-{os.getpid()}"
        probe.mkdir()
        probe.rmdir()
    except CgroupError as e:
        return str(e)
    except OSError as e:
        return f"cannot make a {controller} cgroup: {e.strerror or e}"
    return None


class CgroupError(RuntimeError):
    """No usable cgroup hierarchy, or a write the kernel refused."""


class Cgroup:
    """One cgroup of one run. ``limit_memory``/``limit_cpu`` set its limit, ``add`` moves a
    process (all its threads) in, ``remove`` takes it away."""

    def __init__(self, controller: str, run_id: str, name: str):
        self.h = hierarchy(controller)
        self.path = self.h.own / f"{PREFIX}{run_id}-{name}"
        self.path.mkdir(exist_ok=True)
        if self.h.version == 2 and controller not in \
                (self.h.own / "cgroup.subtree_control").read_text().split():
            self._write(self.h.own / "cgroup.subtree_control", f"+{controller}")

    def _write(self, path: Path, value: str) -> None:
        try:
            path.write_text(value)
        except OSError as e:
            raise CgroupError(f"{path}: cannot write {value!r}: {e.strerror or e}") from None

    def limit_memory(self, nbytes: int) -> str:
        """Set the memory limit; returns what was written, for the step log."""
        if self.h.version == 2:
            self._write(self.path / "memory.max", str(nbytes))
            if (self.path / "memory.swap.max").exists():
                self._write(self.path / "memory.swap.max", "0")
            return f"cgroup v2 memory.max {nbytes}"
        self._write(self.path / "memory.limit_in_bytes", str(nbytes))
        if (self.path / "memory.memsw.limit_in_bytes").exists():
            self._write(self.path / "memory.memsw.limit_in_bytes", str(nbytes))
        return f"cgroup v1 memory.limit_in_bytes {nbytes}"

    def limit_cpu(self, percent: float, period_us: int = 100000) -> str:
        quota = max(1000, int(period_us * percent / 100))
        if self.h.version == 2:
            self._write(self.path / "cpu.max", f"{quota} {period_us}")
            return f"cgroup v2 cpu.max {quota} {period_us}"
        self._write(self.path / "cpu.cfs_period_us", str(period_us))
        self._write(self.path / "cpu.cfs_quota_us", str(quota))
        return f"cgroup v1 cpu.cfs_quota_us {quota} / cpu.cfs_period_us {period_us}"

    def add(self, pid: int) -> None:
        """Move the process and every thread it has into the cgroup."""
        self._move(pid, self.path)

    def release(self, pid: int) -> None:
        """Move the process (every thread) back out, to the harness's own cgroup, where the
        ranks start: before ``remove``, which kills what is still inside (a heal, not an end)."""
        self._move(pid, self.h.own)

    def _move(self, pid: int, to: Path) -> None:
        if self.h.version == 2:
            self._write(to / "cgroup.procs", str(pid))
            return
        tids = [pid]
        try:
            tids += [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
        except OSError:
            pass
        for tid in tids:
            try:
                (to / "tasks").write_text(str(tid))
            except OSError as e:
                if tid == pid:
                    raise CgroupError(f"{to}: cannot move pid {pid} in: "
                                      f"{e.strerror or e}") from None

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer killed in this cgroup."""
        name = "memory.events" if self.h.version == 2 else "memory.oom_control"
        try:
            for ln in (self.path / name).read_text().splitlines():
                key, _, value = ln.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def limit_hits(self) -> Tuple[int, int, int]:
        """(how often usage hit the limit, the peak usage, the limit) in bytes; zeros where the
        kernel does not say (v1: memory.failcnt, max_usage_in_bytes, limit_in_bytes; v2:
        memory.events max, memory.peak, memory.max)."""
        def num(name: str, key: str = "") -> int:
            try:
                text = (self.path / name).read_text()
                if not key:
                    return int(text.split()[0]) if text.strip() != "max" else 0
                for ln in text.splitlines():
                    k, _, v = ln.partition(" ")
                    if k == key:
                        return int(v)
            except (OSError, ValueError, IndexError):
                pass
            return 0
        if self.h.version == 2:
            return num("memory.events", "max"), num("memory.peak"), num("memory.max")
        return (num("memory.failcnt"), num("memory.max_usage_in_bytes"),
                num("memory.limit_in_bytes"))

    def cpu_stat(self) -> Dict[str, int]:
        """The quota's own counters (``cpu.stat``): ``nr_periods``, ``nr_throttled`` and
        ``throttled_usec``, the time its processes were held back (v1 says
        ``throttled_time`` in ns: given in us too); {} where the kernel does not say."""
        try:
            text = (self.path / "cpu.stat").read_text()
        except OSError:
            return {}
        out: Dict[str, int] = {}
        for ln in text.splitlines():
            k, _, v = ln.partition(" ")
            try:
                out[k] = int(v)
            except ValueError:
                continue
        if "throttled_usec" not in out and "throttled_time" in out:
            out["throttled_usec"] = out["throttled_time"] // 1000
        return out

    def remove(self) -> None:
        _remove(self.path)


def _procs(path: Path) -> List[int]:
    try:
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _remove(path: Path, timeout: float = 5.0) -> None:
    """Kill what is left in the cgroup, wait until it is empty, remove it."""
    limit = time.monotonic() + timeout
    while True:
        pids = _procs(path)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if time.monotonic() > limit:
                raise CgroupError(f"cannot remove {path}: {e.strerror or e} "
                                  f"(processes {pids})") from None
        time.sleep(0.05)


def run_cgroups() -> Iterator[Path]:
    """Every harness cgroup on this machine (a few levels deep under each mount)."""
    seen = set()
    for m in (ROOT / "memory", ROOT / "cpu", ROOT / "unified", ROOT):
        for path in _walk(m, 4) if m.is_dir() else ():
            if path not in seen:
                seen.add(path)
                yield path


def _walk(d: Path, depth: int) -> Iterator[Path]:
    try:
        entries = [e for e in os.scandir(d) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for e in entries:
        if e.name.startswith(PREFIX):
            yield Path(e.path)
        elif depth > 0:
            yield from _walk(Path(e.path), depth - 1)


def sweep(live_run_ids: Optional[Dict[str, bool]] = None) -> List[str]:
    """Remove the cgroups of runs that are over (``live_run_ids``: run id -> alive; by default
    the run directories of this user's state folder, harness.machine.rundir). Returns what went.

    A cgroup whose run is not in ``live_run_ids`` belongs to a run this sweep cannot judge (a
    state folder elsewhere: another ``TMPDIR``, another session's test): it is removed only
    when no process is in it, never by killing what runs there."""
    if os.geteuid() != 0 or not ROOT.is_dir():
        return []
    if live_run_ids is None:
        from .rundir import live_runs

        live_run_ids = live_runs()
    removed = []
    for path in list(run_cgroups()):
        run_id = path.name[len(PREFIX):].split("-", 1)[0]
        if run_id == "probe" or live_run_ids.get(run_id):
            continue
        if run_id not in live_run_ids and _procs(path):
            continue   # not a run of this state folder, and something runs there
        try:
            _remove(path)
            removed.append(str(path))
        except CgroupError:
            pass
    return removed

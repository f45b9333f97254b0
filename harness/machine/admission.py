"""The gate every scenario run passes before its start line: how many runs this machine starts
at once.

A catalog case mostly waits (on torch's and gloo's timeouts), so many can run beside each other
on a few cores; but one that starts while the CPU is busy starts late and slow, and a case that
starves a rank (``cpu_contention``: a fault class's ``ALONE``) measures the machine it
shares. The gate admits a run:

* at once while fewer runs than the machine has cores are in flight (a single case is never
  held; at ``-n 2`` on 2 cores no run waits), unless a run that must run alone is waiting;
* alone (``alone=True``) when no other run is in flight; while such a run waits or runs, no
  other run is admitted, so that it is not starved by a stream of short ones;
* with as many runs in flight as cores or more, when the machine's CPU has been idle for at
  least ``idle_needed`` of its cores over the last ``window`` seconds (``/proc/stat``; every
  process counts, the harness's ranks and whatever runs beside them) and the previous
  admission was at least ``spacing`` seconds ago (a run's start-up burst shows in the CPU
  only once it has begun).

The runs in flight are files in ``<state folder>/admission/`` each held with ``flock`` by the
process whose run it is: a run killed with its process releases its place with it (a file
whose lock can be taken is stale, and removed). pytest-xdist workers, ``harness run`` and a
second catalog started beside the first all share the one folder, so the gate sees them all.

A run's times are measured from its own start line, after the gate: waiting here changes no
verdict, only when the run begins (the report's ``admission`` says how long it waited).
``HARNESS_ADMISSION=0`` turns the gate off (benchmarks/schedule.py's "as before" sides).
"""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple

from .rundir import base_dir

DIR_NAME = "admission"
OFF_ENV = "HARNESS_ADMISSION"   # "0": no gate (every run starts at once, as before the gate)
POLL = 0.2          # s between looks while held (the gate waits on a condition, not a time)


def cpu_times() -> Tuple[float, float]:
    """(idle, total) jiffies of the whole machine, from /proc/stat's first line."""
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    vals = [float(x) for x in parts]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0.0)   # idle + iowait
    return idle, sum(vals)


def idle_cores(window: float, cores: int,
               sample: Callable[[], Tuple[float, float]] = cpu_times) -> float:
    """How many of ``cores`` were idle, on average, over the next ``window`` seconds."""
    i0, t0 = sample()
    time.sleep(window)
    i1, t1 = sample()
    if t1 <= t0:
        return float(cores)
    return cores * (i1 - i0) / (t1 - t0)


@dataclass
class Admitted:
    waited: float          # s from asking to being admitted
    beside: int            # other runs in flight when admitted
    alone: bool
    why_waited: str        # the last reason it was held ("" if admitted at once)

    def to_dict(self) -> dict:
        return {"waited": round(self.waited, 2), "beside": self.beside, "alone": self.alone,
                "held_for": self.why_waited}


class Gate:
    def __init__(self, root: Optional[Path] = None, cores: Optional[int] = None,
                 idle_needed: float = 0.5, spacing: float = 0.3, window: float = 0.25,
                 idle: Optional[Callable[[float, int], float]] = None) -> None:
        self.root = root if root is not None else base_dir() / DIR_NAME
        self.cores = cores or os.cpu_count() or 1
        self.idle_needed = idle_needed
        self.spacing = spacing
        self.window = window
        self._idle = idle or idle_cores

    # -- the folder ------------------------------------------------------------------------

    def _live(self, prefix: str) -> List[Path]:
        """The files ``prefix*`` whose holders are alive; stale ones are removed."""
        live = []
        for p in sorted(self.root.glob(prefix + "*")):
            try:
                fd = os.open(p, os.O_RDONLY)
            except OSError:
                continue   # removed meanwhile
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                live.append(p)   # held: its run is in flight
            else:
                try:
                    p.unlink()   # nobody holds it: its process is gone
                except OSError:
                    pass
            finally:
                os.close(fd)
        return live

    def _hold(self, prefix: str) -> Tuple[Path, int]:
        p = self.root / f"{prefix}{os.getpid()}-{time.monotonic_ns()}"
        fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return p, fd

    @staticmethod
    def _drop(held: Optional[Tuple[Path, int]]) -> None:
        if held is None:
            return
        p, fd = held
        try:
            p.unlink()
        except OSError:
            pass
        os.close(fd)

    def _last(self) -> Path:
        return self.root / "last-admitted"

    # -- the decision ----------------------------------------------------------------------

    def _try(self, alone: bool) -> Tuple[bool, int, str]:
        """Under the folder's lock: (admitted, runs in flight, why not)."""
        running = self._live("run-")
        if alone:
            if running:
                return False, len(running), f"to run alone, {len(running)} run(s) in flight"
            return True, 0, ""
        if any(p.name.startswith("run-alone-") for p in running):
            return False, len(running), "a run that must run alone is in flight"
        if self._live("alone-"):
            return False, len(running), "a run that must run alone is waiting"
        if len(running) < self.cores:
            return True, len(running), ""   # fewer runs than cores: none can crowd it out
        try:
            since = time.time() - self._last().stat().st_mtime
        except OSError:
            since = float("inf")
        if since < self.spacing:
            return False, len(running), "the previous run had just been admitted"
        free = self._idle(self.window, self.cores)
        if free < self.idle_needed:
            return False, len(running), (f"{free:.2f} of {self.cores} cores idle (needs "
                                         f"{self.idle_needed:g})")
        return True, len(running), ""

    @contextmanager
    def admitted(self, alone: bool = False) -> Iterator[Admitted]:
        """Held until the run may start; the run's place is kept until the block ends."""
        if os.environ.get(OFF_ENV) == "0":
            yield Admitted(0.0, 0, alone, "")
            return
        self.root.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        waiting = self._hold("alone-") if alone else None
        run: Optional[Tuple[Path, int]] = None
        why = ""
        try:
            while True:
                lock = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    ok, beside, not_yet = self._try(alone)
                    if ok:
                        run = self._hold("run-alone-" if alone else "run-")
                        self._last().touch()
                        break
                    why = not_yet
                finally:
                    os.close(lock)
                time.sleep(POLL)
            self._drop(waiting)
            waiting = None
            yield Admitted(time.monotonic() - t0, beside, alone, why)
        finally:
            self._drop(waiting)
            self._drop(run)

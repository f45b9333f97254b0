"""What the supervisor takes of the rows still alive at the deadline: their stacks (each
rank's faulthandler dump, py-spy's native stacks where permitted) and two reads of their CPU
seconds, before the kill.

Native stacks of a rank that looks stuck are started ``STACK_LEAD`` s before the deadline, so
that the verdict does not wait for py-spy (it symbolizes libtorch: ~0.4 s of CPU per rank); a
faulthandler dump is kept up to ``STACKS_MAX`` bytes per rank.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..core.protocol import STACK_SIGNAL
from ..judge import pyspy
from ..launchers import RankProcess
from ..machine import interrupts
from ..machine.procs import cpu_seconds
from .runtime import StepRuntime, _remote

# native stacks (py-spy symbolizes libtorch: ~0.4 s of CPU per rank) are started this long
# before the deadline for the ranks alive then, so that the verdict does not wait for them
STACK_LEAD = float(os.environ.get("HARNESS_STACK_LEAD", "2.0"))
STACKS_MAX = 1 << 20     # a faulthandler dump is kept up to this many bytes per rank


def _read_stacks(path: Path) -> str:
    """A rank's faulthandler dump, at most STACKS_MAX bytes (the file is cut to that too, with
    a marker: it is evidence, and a rank with thousands of threads must not make it huge)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            data = f.read(STACKS_MAX)
    except OSError:
        return ""
    if size > STACKS_MAX:
        note = f"\n[harness: {size - STACKS_MAX} bytes of stacks cut here]\n".encode()
        data += note
        try:
            with open(path, "r+b") as f:
                f.seek(STACKS_MAX)
                f.write(note)
                f.truncate()
        except OSError:
            pass
    return data.decode(errors="replace")


def native_stacks_available() -> bool:
    return pyspy.executable() is not None


def native_stacks(pid: int) -> Tuple[List[Dict[str, Any]], str]:
    """A stuck rank's C++ frames (TCPStore::ping -> recv ...) by ``py-spy dump --native
    --json`` (harness.judge.pyspy; py-spy pauses it while reading): (threads, their text). Empty
    without py-spy; the text is py-spy's error when it is not permitted (CAP_SYS_PTRACE)."""
    return pyspy.dump(pid)


class DeadlineStacks(StepRuntime):
    """The supervisor's part that takes the live rows' stacks and CPU samples."""

    def _capture_stacks(self, live: List[RankProcess]) -> None:
        """Every live rank's stacks, all ranks at once: py-spy's native stacks where permitted
        (one py-spy per rank, in parallel), then the faulthandler dump of every rank
        (protocol.STACK_SIGNAL; SIGCONT too, so that a stopped rank can write it). What a
        resumed rank does after the deadline is not part of the run: its events are cut at
        the deadline."""
        import psutil

        early = self._native or {}
        spied: List[RankProcess] = []
        remote = [r for r in live if _remote(r)]
        for r in remote:     # on an allocation's node: its task helper signals it there
            r.proc.dump_stacks()
        live_here = [r for r in live if not _remote(r)]
        for r in live:
            r.read_events()
            r.cutoff = len(r.obs.events)
        for r in live_here:
            if r.label in early:
                continue
            try:
                stopped = psutil.Process(r.proc.pid).status() == psutil.STATUS_STOPPED
            except psutil.Error:
                stopped = False
            if stopped and native_stacks_available():
                r.obs.native_stacks = ("(no native stacks: the rank is stopped (SIGSTOP) and "
                                       "py-spy cannot attach to a stopped process)")
            else:
                spied.append(r)
        # the dump signal first: py-spy pauses a rank while it reads it, which would hold up
        # the rank's own dump
        for r in live_here:
            try:
                os.kill(r.proc.pid, STACK_SIGNAL)
                os.kill(r.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        pool = ThreadPoolExecutor(max_workers=max(1, len(spied)), thread_name_prefix="py-spy")
        try:
            self._read_dumps(live, remote, early,
                             {r.label: (pool.submit(native_stacks, r.proc.pid), self.now())
                              for r in spied})
        finally:
            # also when interrupted: an idle worker no shutdown woke would hold the
            # interpreter's exit for good (its py-spy, if any, ends by its own timeout)
            with interrupts.shield():
                pool.shutdown(wait=False)

    def _read_dumps(self, live: List[RankProcess], remote: List[RankProcess],
                    early: Dict[str, Tuple[Future, float]],
                    late: Dict[str, Tuple[Future, float]]) -> None:
        """Each live rank's faulthandler dump once complete, and its py-spy dump: ``early``
        (taken before the deadline) or ``late`` (now)."""
        # faulthandler writes from its signal handler at once; a dump is complete when the
        # file stopped growing (three looks 10 ms apart: 20 ms without a byte); a rank gets up
        # to 3 s
        sizes: Dict[str, int] = {}
        stable: Dict[str, int] = {}
        # a remote rank's dump goes through its helper (a command file, a poll) and a shared
        # file system: more time
        limit = time.monotonic() + (10.0 if remote else 3.0)
        while time.monotonic() < limit:
            done = True
            for r in live:
                size = r.stacks_path.stat().st_size if r.stacks_path.exists() else 0
                stable[r.label] = stable.get(r.label, 0) + 1 \
                    if size and sizes.get(r.label) == size else 0
                if stable[r.label] < 2:
                    done = False
                sizes[r.label] = size
            if done:
                break
            time.sleep(0.01)
        for r in live:
            r.obs.stacks = _read_stacks(r.stacks_path)
            taken = early.get(r.label) or late.get(r.label)
            if taken is not None:
                future, at = taken
                threads, text = future.result()
                r.obs.native_stacks = (f"(taken at {at:.2f} s)\n" + text) if text else text
                r.obs.native_threads = threads

    def _sample_cpu(self, rows: Optional[Sequence[RankProcess]] = None) -> None:
        """(seconds after the start line, CPU seconds used) of each live row on this machine,
        appended to its ``cpu_samples``: read twice, before the deadline and at it, they tell a
        rank still at work from one blocked in a call (harness.judge.diagnose: still
        progressing)."""
        now = round(self.now(), 3)
        for r in (self.ranks if rows is None else rows):
            if _remote(r) or r.ended or r.proc.pid is None:
                continue
            used = cpu_seconds(int(r.proc.pid))
            if used is not None:
                r.obs.cpu_samples.append((now, used))

    def _start_native_stacks(self) -> None:
        """py-spy, in parallel, ``STACK_LEAD`` s (at most a quarter of the deadline) before the
        deadline, once, for every rank that is alive and has said nothing for that long (it
        looks stuck: py-spy pauses a process while it reads its native stack, which must not
        slow down a rank still at work; those are read at the deadline). The ranks still alive
        at the deadline keep theirs, marked with the time they were taken (a stuck rank's
        native stack does not change); the others' are dropped."""
        import psutil

        self._native = {}
        self._sample_cpu()     # the first of two reads: a rank at work uses CPU between them
        if not native_stacks_available():
            return
        alive = []
        quiet_since = time.monotonic() - min(STACK_LEAD, self.plan.deadline / 4)
        for r in self.ranks:
            if _remote(r) or r.ended or r.proc.poll() is not None:
                continue
            r.read_events()
            if r.obs.events and r.obs.events[-1].t > quiet_since:
                continue
            try:
                if psutil.Process(r.proc.pid).status() == psutil.STATUS_STOPPED:
                    continue
            except psutil.Error:
                continue
            alive.append(r)
        if alive:
            self._native_pool = ThreadPoolExecutor(max_workers=len(alive))
            now = self.now()
            self._native = {r.label: (self._native_pool.submit(native_stacks, r.proc.pid), now)
                            for r in alive}


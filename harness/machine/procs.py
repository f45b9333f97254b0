"""Process lifetime: the one owner of every process the harness starts.

Ranks, torchrun agents, port holders, helper interpreters and services are all started through
:class:`ManagedProcess`: in a session of their own (their own process group, so one signal
reaches everything they start), recorded with their start time in the run's pid record (so that
a sweep after a killed run kills exactly them, never a reused pid), and killed with their whole
group when the run ends. Children die with the harness too: a harness program calls
:func:`die_with_parent` first thing, and any other program is started through
``python -m harness.machine.procs --exec -- ARGV`` which does the same and then execs it.

Liveness is one test everywhere (:func:`alive`): the same pid with the same start time (clock
ticks since boot, ``/proc/PID/stat`` field 22) on the same boot, and not a zombie. This module
uses only the standard library: ranks import it before torch.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any, Dict, List, Mapping, Optional, Sequence, Union

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """PR_SET_PDEATHSIG: the kernel sends ``sig`` to this process when its parent dies. If the
    parent died before the call took effect, exit at once (status 3)."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except OSError:
        pass
    if os.getppid() != parent:
        os._exit(3)


# signals a shell started in the background (`cmd &`, nohup) hands down ignored, and that the
# catalog's scenarios send; a rank must meet them as a program started from a terminal does
INHERITED_IGNORES = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM")


def default_signal_dispositions() -> List[str]:
    """Undo what the harness's own start left ignored: a signal ignored when this process
    started (``nohup pytest``, or pytest in a non-interactive shell's background, which ignores
    SIGINT and SIGQUIT) gets its default action again, SIGINT Python's KeyboardInterrupt. So a
    scenario's verdict does not depend on how the harness was started. Returns the names reset."""
    done = []
    for name in INHERITED_IGNORES:
        sig = getattr(signal, name)
        try:
            if signal.getsignal(sig) == signal.SIG_IGN:
                signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT
                              else signal.SIG_DFL)
                done.append(name)
        except (OSError, ValueError):   # not the main thread, or not settable
            continue
    return done


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def start_ticks(pid: int) -> Optional[int]:
    """Start time of a live process in clock ticks since boot; None if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if len(fields) < 20 or fields[0] in ("Z", "X", "x"):
        return None
    return int(fields[19])



def runqueue_wait(pid: int = 0) -> Optional[float]:
    """Seconds the live threads of ``pid`` (0: this process) spent runnable but waiting for a
    CPU, summed (the kernel's schedstat: its second field, in ns, per thread). Load makes it
    grow; sleeping, blocking on a socket or a timeout do not. None where schedstat is missing.
    Threads that already ended are not counted."""
    base = f"/proc/{pid or 'self'}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return None
    total, seen = 0, False
    for tid in tids:
        try:
            with open(f"{base}/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
            seen = True
        except (OSError, ValueError, IndexError):
            continue
    return round(total / 1e9, 3) if seen else None


def cpu_seconds(pid: int = 0) -> Optional[float]:
    """CPU seconds ``pid`` (0: this process) has used so far, user and system, all its threads
    (``/proc/PID/stat`` fields 14 and 15, in clock ticks): two reads tell a process at work from
    one blocked in a call. None when the process is gone or /proc does not say."""
    try:
        with open(f"/proc/{pid or 'self'}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])   # utime, stime (fields 14, 15 of the line)
    except (OSError, ValueError, IndexError):
        return None
    return round(ticks / os.sysconf("SC_CLK_TCK"), 3)


def identity(pid: int) -> Dict[str, Any]:
    """What identifies a process beyond its (reusable) pid."""
    return {"pid": pid, "start_time": start_ticks(pid), "boot_id": boot_id()}


def alive(rec: Mapping[str, Any]) -> bool:
    """The process of an :func:`identity` record still runs (same pid, start, boot)."""
    try:
        pid = int(rec["pid"])
        start = rec["start_time"]
    except (KeyError, TypeError, ValueError):
        return False
    if rec.get("boot_id", "") != boot_id():
        return False
    return start is not None and start_ticks(pid) == start


class PidRecord:
    """The run's record of every process it started (``pids.jsonl``, one identity per line)."""

    def __init__(self, path: Union[str, Path]):
        self.path = Path(path)

    def add(self, pid: int, name: str = "") -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({**identity(pid), "name": name}) + "\n")

    def add_identity(self, ident: Mapping[str, Any], name: str = "") -> None:
        """Record a process whose identity another process took (a fork server's child)."""
        with open(self.path, "a") as f:
            f.write(json.dumps({**ident, "name": name}) + "\n")

    def entries(self) -> List[Dict[str, Any]]:
        try:
            text = self.path.read_text()
        except OSError:
            return []
        out = []
        for line in text.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out

    def kill_all(self) -> List[int]:
        """SIGKILL every recorded process (and its group) that is still the same process."""
        killed = []
        for rec in self.entries():
            if alive(rec):
                pid = int(rec["pid"])
                for kill in (os.killpg, os.kill):
                    try:
                        kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                killed.append(pid)
        return killed


Stream = Union[None, int, IO[Any]]


class ManagedProcess:
    """One child process's whole life: started in its own session, recorded, killed with its
    group. ``exec_wrapper``: start a program that is not the harness's own through
    ``python -m harness.machine.procs --exec``, so that it too dies with the harness."""

    def __init__(self, argv: Sequence[str], *, name: str = "", record: Optional[PidRecord] = None,
                 env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                 stdin: Stream = subprocess.DEVNULL, stdout: Stream = None,
                 stderr: Stream = None, pass_fds: Sequence[int] = (),
                 exec_wrapper: bool = False, prefix: Sequence[str] = ()):
        argv = list(argv)
        if exec_wrapper:
            argv = [sys.executable, "-m", "harness.machine.procs", "--exec", "--"] + argv
        self.name = name
        self.argv = list(prefix) + argv
        self.popen = subprocess.Popen(self.argv, env=dict(env) if env is not None else None,
                                      cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr,
                                      pass_fds=tuple(pass_fds), start_new_session=True)
        self.pid = self.popen.pid
        if record is not None:
            record.add(self.pid, name)

    @property
    def returncode(self) -> Optional[int]:
        return self.popen.returncode

    def poll(self) -> Optional[int]:
        return self.popen.poll()

    def running(self) -> bool:
        return self.popen.poll() is None

    def wait(self, timeout: Optional[float] = None) -> int:
        return self.popen.wait(timeout)

    def signal_group(self, sig: int) -> None:
        """``sig`` to the process's whole group (what it started in its session too)."""
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        """SIGKILL the group, reap the process and close its pipes."""
        self.signal_group(signal.SIGKILL)
        try:
            self.popen.kill()
        except OSError:
            pass
        self.popen.wait()
        for s in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass

    stop = kill


class ForeignProcess:
    """A process of the run that the harness did not start itself (a worker a torchrun agent
    started, a parent's child): known by its identity (pid and start time, recorded in the run's
    pid record by the observer inside it). It is signalled only while it is still that process;
    its exit status is what its own parent collected (``returncode``, set by the supervisor from
    the parent's ``reaped`` event), None when nobody said."""

    def __init__(self, pid: int, start_time: Optional[int]):
        self.pid = pid
        self.name = f"pid {pid}"
        self.rec = {"pid": pid, "start_time": start_time, "boot_id": boot_id()}
        self.returncode: Optional[int] = None

    def running(self) -> bool:
        return alive(self.rec)

    def poll(self) -> Optional[int]:
        return None if self.running() else self.returncode

    def signal_group(self, sig: int) -> None:
        """``sig`` to its group when it leads one (a torchrun worker runs in a session of its
        own), else to the process alone (a child in its parent's group)."""
        if not self.running():
            return
        try:
            if os.getpgid(self.pid) == self.pid:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Until it is gone (a zombie counts as gone: its parent reaps it), at most ``timeout``."""
        import time

        limit = None if timeout is None else time.monotonic() + timeout
        while self.running() and (limit is None or time.monotonic() < limit):
            time.sleep(0.02)
        return self.returncode

    def kill(self) -> None:
        self.signal_group(signal.SIGKILL)
        self.wait(5.0)

    stop = kill


def kill_observed(record: PidRecord) -> List[int]:
    """SIGKILL every process the observer recorded in the run's record (workers, their
    children) that still runs; returns their pids."""
    out = []
    for rec in record.entries():
        if str(rec.get("name", "")).startswith("observed") and alive(rec):
            p = ForeignProcess(int(rec["pid"]), rec.get("start_time"))
            p.signal_group(signal.SIGKILL)
            try:
                os.kill(p.pid, signal.SIGKILL)
            except OSError:
                pass
            out.append(p.pid)
    return out


def _exec_main(argv: List[str]) -> None:
    """``python -m harness.machine.procs --exec -- PROGRAM ARGS``: die with the parent, then
    exec."""
    if not argv:
        sys.exit("usage: python -m harness.machine.procs --exec -- PROGRAM [ARGS...]")
    die_with_parent()
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        sys.stderr.write(f"harness: cannot start {argv[0]}: {e}\n")
        os._exit(127)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--exec"]:
        args = args[1:]
        if args[:1] == ["--"]:
            args = args[1:]
        _exec_main(args)
    else:
        sys.exit("usage: python -m harness.machine.procs --exec -- PROGRAM [ARGS...]")

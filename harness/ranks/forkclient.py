"""The supervisor's side of the warm start (``start: fork``): a host's fork server and the
ranks it forked, the session's zygotes and the servers they forked, as the supervisor sees
them. The processes themselves are :mod:`harness.ranks.forkserver` (``python -m
harness.ranks.forkserver [--zygote] FD``); both sides speak its messages.

:class:`ForkServer` is the supervisor's side of a server; :class:`ForkedProcess` a forked rank
as the supervisor sees it (the interface of :class:`harness.machine.procs.ManagedProcess` it
uses); :class:`Zygote` and :class:`WarmServerProcess` the zygote and a server it forked, as the
supervisor sees them; :func:`warm_zygote` the session's pool (``HARNESS_ZYGOTES``: how many
zygotes at most, default 2, the least recently used idle one closed first; 0: none, every
server fresh).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..machine.procs import PidRecord, alive, boot_id
from .forkserver import MAX_MSG, _kill_groups, _send

# --------------------------------------------------------------------------------------------
# the supervisor's side


class ForkServerError(RuntimeError):
    pass


def _hang_up(sock: socket.socket, proc: Any) -> None:
    """End a process the supervisor speaks to over ``sock`` (a server, a zygote): its end of
    the socket closed tells it to kill its children and exit; given 5 s, it is then killed."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
    try:
        proc.wait(5.0)
    except Exception:  # noqa: BLE001 - one that does not go is killed
        pass
    proc.kill()


class ForkServer:
    """One host's server as the supervisor sees it: started through ``spawn`` (a callable
    that starts ``argv`` with the descriptor to pass, returning a ManagedProcess), awaited until
    ready, asked to fork ranks, told to end."""

    def __init__(self, spawn: Any, python: str, ddp: bool, host: str):
        self.host = host
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [python, "-m", "harness.ranks.forkserver", str(theirs.fileno())] + \
            (["--ddp"] if ddp else [])
        try:
            self.proc = spawn(argv, theirs.fileno())
        finally:
            theirs.close()
        self.children: Dict[int, ForkedProcess] = {}
        self._pending: List[Dict[str, Any]] = []   # fork answers not asked for yet
        self.info: Dict[str, Any] = {}
        self.closed = False
        self.warm = False   # forked from the session's zygote (else started fresh)
        self.note = ""      # why it was started fresh (start: fork asked for a warm one)

    @property
    def pid(self) -> int:
        return int(self.proc.pid or 0)

    def record(self) -> Dict[str, Any]:
        """How this server came to be, for the run's observation (``servers``)."""
        out: Dict[str, Any] = {"host": self.host, "warm": self.warm,
                               "ready": bool(self.info.get("ready")),
                               "import_s": self.info.get("import_s")}
        if self.note:
            out["note"] = self.note
        if self.info.get("zygote"):
            out["zygote"] = self.info["zygote"]
        return out

    def fatal(self) -> bool:
        """Its failure is what a fresh server would meet too (torch's import failed, or left
        threads): no other server is tried."""
        return bool(getattr(self.proc, "fatal", False))

    def _recv(self, timeout: Optional[float]) -> Optional[Dict[str, Any]]:
        r, _, _ = select.select([self.sock], [], [], timeout)
        if not r:
            return None
        data = self.sock.recv(MAX_MSG)
        if not data:
            raise ForkServerError(f"the fork server of host {self.host} ended")
        return dict(json.loads(data))

    def _dispatch(self, msg: Dict[str, Any]) -> None:
        if "exit" in msg:
            child = self.children.get(int(msg["exit"]))
            if child is not None:
                child.returncode = int(msg["returncode"])
        else:
            self._pending.append(msg)

    def wait_ready(self, timeout: float) -> Optional[str]:
        """None when ready; else why it cannot fork (its ranks then start fresh)."""
        limit = time.monotonic() + timeout
        while True:
            left = limit - time.monotonic()
            if left <= 0:
                return f"the fork server of host {self.host} was not ready in {timeout:.0f} s"
            try:
                msg = self._recv(min(left, 0.5))
            except (ForkServerError, OSError) as e:
                rc = self.proc.poll()
                return getattr(self.proc, "why", None) or f"{e} before it was ready (rc {rc})"
            if msg is None:
                if self.proc.poll() is not None:
                    return getattr(self.proc, "why", None) or (
                        f"the fork server of host {self.host} exited with status "
                        f"{self.proc.returncode} before it was ready")
                continue
            self.info = msg
            return None if msg.get("ready") else str(msg.get("why"))

    def fork(self, requests: Sequence[Dict[str, Any]], fds: Sequence[Sequence[int]],
             record: PidRecord, timeout: float = 60.0) -> List[ForkedProcess]:
        """Fork one rank per request (sent all at once, answered in order); each child is
        recorded in the run's pid record as soon as its pid is known."""
        for req, f in zip(requests, fds):
            _send(self.sock, req, f)
        out: List[ForkedProcess] = []
        limit = time.monotonic() + timeout
        while len(out) < len(requests):
            while self._pending and len(out) < len(requests):
                msg = self._pending.pop(0)
                if "pid" not in msg:
                    raise ForkServerError(f"the fork server of host {self.host} could not fork "
                                          f"rank {msg.get('label')}: {msg.get('error')}")
                pid = int(msg["pid"])
                name = f"rank {msg.get('label')} (forked)"
                child = ForkedProcess(self, pid, msg.get("start_time"), name)
                self.children[pid] = child
                record.add_identity({"pid": pid, "start_time": msg.get("start_time"),
                                     "boot_id": boot_id()}, name)
                out.append(child)
            if len(out) == len(requests):
                break
            left = limit - time.monotonic()
            if left <= 0:
                raise ForkServerError(f"the fork server of host {self.host} did not fork "
                                      f"{len(requests) - len(out)} rank(s) in {timeout:.0f} s")
            got = self._recv(left)
            if got is not None:
                self._dispatch(got)
        return out

    def pump(self) -> None:
        """Read what the server said (children that ended), without waiting."""
        if self.closed:
            return
        try:
            while True:
                msg = self._recv(0)
                if msg is None:
                    return
                self._dispatch(msg)
        except (ForkServerError, OSError, ValueError):
            self.closed = True

    def wait_any(self, timeout: float) -> None:
        if self.closed:
            time.sleep(min(timeout, 0.02))
            return
        try:
            msg = self._recv(timeout)
        except (ForkServerError, OSError, ValueError):
            self.closed = True
            return
        if msg is not None:
            self._dispatch(msg)

    def close(self) -> None:
        """The end of the run: the server kills its children still alive and exits."""
        self.pump()
        self.closed = True
        _hang_up(self.sock, self.proc)


class ForkedProcess:
    """A rank forked by a host's server: signalled by its identity (pid and start time), its
    exit status the server's word (its parent reaped it)."""

    def __init__(self, server: ForkServer, pid: int, start_time: Optional[int], name: str):
        self.server = server
        self.pid = pid
        self.name = name
        self.rec = {"pid": pid, "start_time": start_time, "boot_id": boot_id()}
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            self.server.pump()
            if self.returncode is None and self.server.closed and not alive(self.rec):
                self.returncode = -signal.SIGKILL   # its server died and took it along
        return self.returncode

    def running(self) -> bool:
        return self.poll() is None

    def signal_group(self, sig: int) -> None:
        if self.returncode is not None or not alive(self.rec):
            return
        for kill in (os.killpg, os.kill):
            try:
                kill(self.pid, sig)
                return
            except (ProcessLookupError, PermissionError):
                continue

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        limit = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if limit is not None and time.monotonic() >= limit:
                break
            self.server.wait_any(0.05)
        return self.returncode

    def kill(self) -> None:
        self.signal_group(signal.SIGKILL)
        self.wait(10.0)

    stop = kill


# --------------------------------------------------------------------------------------------
# the supervisor's side of the zygote

# what differs from run to run in a server's environment but is read only after its import
# (the server enters its resolver view and read-only folders after it imported torch)
PER_RUN_ENV = frozenset(("HARNESS_RESOLVER_VIEW", "HARNESS_READ_ONLY", "TMPDIR"))
ZYGOTES_ENV = "HARNESS_ZYGOTES"   # how many zygotes a session keeps at most; 0: none
DEFAULT_ZYGOTES = 2


def zygote_key(python: str, env: Mapping[str, str], ddp: bool) -> Tuple[Any, ...]:
    """What a zygote's import depended on: its interpreter, DDP's imports, and the server's
    environment but its per-run paths (PER_RUN_ENV; the rank variables are not in it). A
    zygote serves only runs whose server would have imported torch with exactly this."""
    return (python, bool(ddp),
            tuple(sorted((k, v) for k, v in env.items() if k not in PER_RUN_ENV)))


class Zygote:
    """One zygote as its supervisor sees it: started at once, not awaited (its import runs while
    the run's fresh ranks import); asked for servers; closed at the session's end. Its state
    folder (``zygote-<id>`` beside the run directories: owner, pid record, log) lets the sweep
    of a later run kill it after its supervisor was SIGKILLed."""

    def __init__(self, python: str, env: Mapping[str, str], ddp: bool,
                 base: Optional[Any] = None):
        import subprocess

        from ..machine import interrupts
        from ..machine.procs import ManagedProcess
        from ..machine.rundir import RunDir

        self.key = zygote_key(python, env, ddp)
        self.state = RunDir(base, kind="zygote")
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        zenv = {k: v for k, v in env.items() if k not in PER_RUN_ENV}
        log = os.open(self.state.path / "zygote.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                      0o644)
        try:
            with interrupts.shield():
                self.proc = ManagedProcess(
                    [python, "-m", "harness.ranks.forkserver", "--zygote", str(theirs.fileno())]
                    + (["--ddp"] if ddp else []), name="zygote", record=self.state.pids,
                    env=zenv, cwd="/", stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    pass_fds=(theirs.fileno(),))
        except BaseException:
            self.sock.close()
            self.state.remove()
            raise
        finally:
            theirs.close()
            os.close(log)
        self.info: Dict[str, Any] = {}       # its ready message
        self.answers: Dict[int, Dict[str, Any]] = {}
        self.exits: Dict[int, int] = {}      # server pid -> exit status
        self.serving: Dict[int, WarmServerProcess] = {}   # request id -> server not closed yet
        self.ended = False
        self._ids = 0

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def usable(self) -> bool:
        self.pump(0)
        return not self.ended and (not self.info or bool(self.info.get("ready")))

    def why(self) -> Optional[str]:
        """Why it serves nothing (None while it starts or serves)."""
        if self.info and not self.info.get("ready"):
            return str(self.info.get("why"))
        if self.ended:
            return f"the zygote ended (status {self.proc.poll()})"
        return None

    def pump(self, timeout: float) -> None:
        """Read what it said (its ready message, answers, servers that ended), waiting at most
        ``timeout`` for the first message."""
        while not self.ended:
            try:
                r, _, _ = select.select([self.sock], [], [], timeout)
                if not r:
                    return
                data = self.sock.recv(MAX_MSG)
            except ConnectionResetError:
                # it exited with a request unread: the kernel says so before the messages it
                # sent last (its ready message with why it failed), which are read next
                timeout = 0
                continue
            except (OSError, ValueError):
                data = b""
            timeout = 0
            if not data:
                self.ended = True
                return
            msg = dict(json.loads(data))
            if "exit" in msg:
                self.exits[int(msg["exit"])] = int(msg["returncode"])
            elif "id" in msg:
                self.answers[int(msg["id"])] = msg
            else:
                self.info = msg

    def request(self, fd: int, log_fd: int, env: Mapping[str, str],
                host_entry: Optional[Mapping[str, Any]], record: str, host: str
                ) -> WarmServerProcess:
        """Ask for a server of ``host`` speaking on ``fd`` (the run's end of it is the
        supervisor's), logging to ``log_fd``; sent at once, answered when the zygote is ready."""
        self._ids += 1
        _send(self.sock, {"id": self._ids, "env": dict(env), "host_entry": host_entry,
                          "record": record, "host": host}, [fd, log_fd])
        proc = WarmServerProcess(self, self._ids, host)
        self.serving[self._ids] = proc
        return proc

    def close(self) -> None:
        """End it: its servers still alive are SIGKILLed by it, then it exits (or is killed);
        its state folder goes."""
        self.ended = True
        _hang_up(self.sock, self.proc)
        self.state.remove()


class WarmServerProcess:
    """A per-run server a zygote forked, as the supervisor sees it (the interface of
    :class:`harness.machine.procs.ManagedProcess` that :class:`ForkServer` uses): known by the
    zygote's answer (pid and start time), its exit status the zygote's word."""

    def __init__(self, zygote: Zygote, rid: int, host: str):
        self.zygote = zygote
        self.rid = rid
        self.host = host
        self.returncode: Optional[int] = None
        self.why: Optional[str] = None   # why it never served (the zygote's words)
        self.fatal = False               # ... and a fresh server would meet it too
        self.rec: Optional[Dict[str, Any]] = None

    def _answer(self) -> Optional[Dict[str, Any]]:
        if self.rec is None:
            ans = self.zygote.answers.get(self.rid)
            if ans is not None and "pid" in ans:
                self.rec = {"pid": int(ans["pid"]), "start_time": ans.get("start_time"),
                            "boot_id": boot_id()}
            return ans
        return self.zygote.answers.get(self.rid)

    @property
    def pid(self) -> Optional[int]:
        limit = time.monotonic() + 10.0
        while self._answer() is None and not self.zygote.ended and time.monotonic() < limit:
            self.zygote.pump(0.05)
        return None if self.rec is None else int(self.rec["pid"])

    def poll(self) -> Optional[int]:
        if self.returncode is not None:
            return self.returncode
        self.zygote.pump(0)
        ans = self._answer()
        if ans is None:
            if self.zygote.ended:
                self.returncode = self.zygote.proc.poll()
                if self.returncode is None:
                    self.returncode = -signal.SIGKILL
                self.why = self.zygote.why() or "the zygote ended before it forked the server"
                self.fatal = bool(self.zygote.info.get("fatal"))
            return self.returncode
        if self.rec is None:
            self.returncode, self.why = 1, f"the zygote could not fork: {ans.get('error')}"
            return self.returncode
        if self.rec["pid"] in self.zygote.exits:
            self.returncode = self.zygote.exits[self.rec["pid"]]
        elif self.zygote.ended and not alive(self.rec):
            self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        limit = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if self.rec is not None and not alive(self.rec):
                break   # ended; the zygote's report of its status may come later
            if limit is not None and time.monotonic() >= limit:
                break
            self.zygote.pump(0.05)
        return self.returncode

    def kill(self) -> None:
        if self.rec is not None and alive(self.rec):
            _kill_groups([self.rec["pid"]])
            self.wait(5.0)
        self.zygote.serving.pop(self.rid, None)
        self.zygote.exits.pop(int(self.rec["pid"]) if self.rec else -1, None)
        self.zygote.answers.pop(self.rid, None)

    stop = kill


_POOL: Dict[Tuple[Any, ...], Zygote] = {}   # key -> zygote, least recently used first
_AT_EXIT = False


def zygote_cap() -> int:
    try:
        return max(0, int(os.environ.get(ZYGOTES_ENV, DEFAULT_ZYGOTES)))
    except ValueError:
        return DEFAULT_ZYGOTES


def warm_zygote(python: str, env: Mapping[str, str], ddp: bool
                ) -> Tuple[Optional[Zygote], str]:
    """This session's zygote for a server of this import environment (started if there is
    none: lazily, on the first fork-start run that needs it), or None and why not."""
    import threading

    global _AT_EXIT
    prune_zygotes()
    cap = zygote_cap()
    if cap == 0:
        return None, f"warm servers are off ({ZYGOTES_ENV}=0)"
    key = zygote_key(python, env, ddp)
    z = _POOL.pop(key, None)
    if z is not None:
        if z.usable():
            _POOL[key] = z     # the most recently used last
            return z, ""
        z.close()
    if threading.current_thread() is not threading.main_thread():
        return None, ("this run is not in its process's main thread: a zygote's death signal "
                      "would follow the thread that started it")
    for old in [k for k, v in _POOL.items() if not v.serving][:max(0, len(_POOL) + 1 - cap)]:
        _POOL.pop(old).close()
    try:
        z = Zygote(python, env, ddp)
    except Exception as e:  # noqa: BLE001 - the run goes on with a fresh server
        return None, f"could not start a zygote: {e}"
    _POOL[key] = z
    if not _AT_EXIT:
        import atexit

        atexit.register(close_zygotes)
        _AT_EXIT = True
    return z, ""


def prune_zygotes(failed: Optional[Zygote] = None) -> None:
    """Close the zygotes that can serve nothing more (ended, or failed to import), and
    ``failed`` (whose server could not serve) if it never said it was ready: stuck in its
    import, it would keep later runs waiting as long."""
    for key in [k for k, z in _POOL.items()
                if not z.usable() or (z is failed and not z.info)]:
        _POOL.pop(key).close()


def zygotes() -> List[Zygote]:
    return list(_POOL.values())


def close_zygotes() -> None:
    """The session's end: every zygote goes, and what it still serves."""
    while _POOL:
        _POOL.popitem()[1].close()


"""The warm start (``start: fork``): one server per host imports torch once and forks ranks.

The server is ``python -m harness.forkserver FD [--ddp]``, started by the direct launcher like
any rank (through :mod:`harness.procs`, with the host's exec prefix, so it lives in the host's
network namespace; recorded in the run's pid record). In this order, while single-threaded, it
enters the host's resolver view (``harness.resolver``), asks for a death signal, imports torch,
``torch.distributed`` (and DDP's lazy imports with ``--ddp``) and the worker, checks that it is
still single-threaded (a fork after threads is unsafe: it then says why, and the launcher
starts its ranks fresh, recording that reason), freezes its objects for the garbage collector
and says ``ready`` on FD, a UNIX seqpacket socket to the supervisor.

Then, for each request (one JSON message: label, the rank's whole environment, its spec, its
cwd; with five descriptors: events, stacks, stdout, stderr, stdin), it forks a child that makes
itself the rank: a session of its own (one signal reaches its group), PR_SET_PDEATHSIG against
the server (which has its own against the supervisor: killing the supervisor takes both), the
descriptors on 0/1/2 and its event/stack channels, the rank's environment (``os.environ``,
which also sets the C environment torch reads later), its cwd and argv; then it runs the
worker from its ``start`` phase (:func:`harness.worker.run_rank`: its import phase finds torch
imported). The server answers with the child's pid and start time (the supervisor records it
in the pid record: the sweep kills it), and says when a child ended, with its exit status as
``Popen.returncode`` has it (the server is its parent and reaps it through a pidfd).

When the socket closes (the run ends, or the supervisor died) the server SIGKILLs the groups
of its children still alive and exits.

:class:`ForkServer` is the supervisor's side; :class:`ForkedProcess` a forked rank as the
supervisor sees it (the interface of :class:`harness.procs.ManagedProcess` it uses).
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import socket
import sys
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

from .procs import (
    PidRecord,
    alive,
    boot_id,
    default_signal_dispositions,
    die_with_parent,
    start_ticks,
)

MAX_MSG = 1 << 20
N_FDS = 5     # events, stacks, stdout, stderr, stdin


def _send(sock: socket.socket, msg: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(msg).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


# --------------------------------------------------------------------------------------------
# the server (inside the host's namespace)


def _child(sock: socket.socket, pidfds: Dict[int, int], req: Dict[str, Any],
           fds: List[int]) -> None:
    """In the forked child: become the rank. Never returns."""
    try:
        os.setsid()
        die_with_parent()
        sock.close()
        for fd in pidfds:
            os.close(fd)
        # the descriptors at the numbers a fresh rank has them: 0/1/2, and the event and
        # stack channels at the supervisor's numbers (Popen's pass_fds keeps them). An
        # open-files limit (RLIMIT_NOFILE bounds the numbers, not the count) then leaves a
        # forked rank exactly the room a fresh one has.
        ev, st = (int(n) for n in req["fd_numbers"])
        park = max(ev, st, 2) + 1     # above every target: parking clobbers none
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, park) for fd in fds]
        for fd in fds:
            os.close(fd)
        for src, dst in zip(high, (ev, st, 1, 2, 0)):
            os.dup2(src, dst, inheritable=True)
            os.close(src)
        os.chdir(req.get("cwd") or "/")
        env = dict(req["env"])
        os.environ.clear()
        os.environ.update(env)
        from . import protocol as P
        from . import resolver, worker

        os.environ.pop(resolver.ENV_VIEW, None)    # entered by the server: the host's view
        os.environ.pop(resolver.ENV_READ_ONLY, None)
        sys.argv = [worker.__file__, req["spec"]]
        spec = P.WorkerSpec.from_json(req["spec"])
    except BaseException as e:  # noqa: B036 - nothing may return into the server's loop
        try:
            os.write(2, f"harness fork server: the forked rank could not start: {e!r}\n"
                        .encode())
        finally:
            os._exit(5)
    worker.run_rank(spec, ev, st)


def serve(fd: int, ddp: bool = False) -> None:
    from . import resolver

    try:
        resolver.enter_from_env()
    except resolver.ViewError as e:
        print(f"harness fork server: cannot enter the resolver view: {e}", file=sys.stderr)
        os._exit(4)
    die_with_parent()
    default_signal_dispositions()   # what its forked ranks inherit
    sock = socket.socket(fileno=fd)
    t = time.monotonic()
    try:
        import torch
        import torch.distributed  # noqa: F401

        if ddp:
            import torch._dynamo  # noqa: F401
            import torch.nn.parallel  # noqa: F401
        from . import worker  # noqa: F401
    except BaseException as e:  # noqa: B036
        _send(sock, {"ready": False, "why": f"the server could not import torch: {e!r}"})
        os._exit(1)
    threads = len(os.listdir("/proc/self/task"))
    if threads > 1:
        _send(sock, {"ready": False, "why": f"after import torch the server has {threads} "
                     "threads; a fork after threads is unsafe"})
        os._exit(1)
    import gc

    gc.freeze()   # the imported objects stay out of every child's collections (fewer copies)
    sys.stdout.flush()
    sys.stderr.flush()
    _send(sock, {"ready": True, "torch": torch.__version__, "pid": os.getpid(),
                 "import_s": round(time.monotonic() - t, 3)})
    pidfds: Dict[int, int] = {}          # pidfd -> child pid
    children: Dict[int, int] = {}        # child pid -> pidfd
    while True:
        try:
            watched: List[Any] = [sock, *pidfds]
            ready, _, _ = select.select(watched, [], [])
        except InterruptedError:
            continue
        for r in ready:
            if r is sock:
                try:
                    data, fds, _, _ = socket.recv_fds(sock, MAX_MSG, N_FDS)
                except OSError:
                    data, fds = b"", []
                if not data:   # the supervisor is done (or gone): nothing outlives the run
                    for pid in children:
                        for kill in (os.killpg, os.kill):
                            try:
                                kill(pid, signal.SIGKILL)
                            except OSError:
                                pass
                    os._exit(0)
                req = json.loads(data)
                if len(fds) != N_FDS:
                    for f in fds:
                        os.close(f)
                    _send(sock, {"label": req.get("label"), "error": f"{len(fds)} descriptors"})
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(sock, pidfds, req, fds)
                for f in fds:
                    os.close(f)
                pfd = os.pidfd_open(pid)
                pidfds[pfd] = pid
                children[pid] = pfd
                _send(sock, {"label": req.get("label"), "pid": pid,
                             "start_time": start_ticks(pid)})
            else:
                pid = pidfds.pop(r)
                children.pop(pid, None)
                _, status = os.waitpid(pid, 0)
                os.close(r)
                _send(sock, {"exit": pid, "returncode": os.waitstatus_to_exitcode(status)})


# --------------------------------------------------------------------------------------------
# the supervisor's side


class ForkServerError(RuntimeError):
    pass


class ForkServer:
    """One host's server as the supervisor sees it: started through ``spawn`` (a callable
    that starts ``argv`` with the descriptor to pass, returning a ManagedProcess), awaited until
    ready, asked to fork ranks, told to end."""

    def __init__(self, spawn: Any, python: str, ddp: bool, host: str):
        self.host = host
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [python, "-m", "harness.forkserver", str(theirs.fileno())] + \
            (["--ddp"] if ddp else [])
        try:
            self.proc = spawn(argv, theirs.fileno())
        finally:
            theirs.close()
        self.children: Dict[int, ForkedProcess] = {}
        self._pending: List[Dict[str, Any]] = []   # fork answers not asked for yet
        self.info: Dict[str, Any] = {}
        self.closed = False

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

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
                return f"{e} before it was ready (rc {self.proc.poll()})"
            if msg is None:
                if self.proc.poll() is not None:
                    return (f"the fork server of host {self.host} exited with status "
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
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.closed = True
        try:
            self.proc.wait(5.0)
        except Exception:  # noqa: BLE001 - a server that does not go is killed
            pass
        self.proc.kill()


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


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or not args[0].isdigit():
        sys.exit("usage: python -m harness.forkserver FD [--ddp] (the harness starts it)")
    serve(int(args[0]), ddp="--ddp" in args[1:])


if __name__ == "__main__":
    main()

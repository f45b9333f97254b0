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

A server usually does not import torch itself: it is forked **warm** from the session's
*zygote* (``python -m harness.forkserver --zygote FD [--ddp]``), one per supervisor process and
import environment (:func:`zygote_key`: the interpreter, DDP's imports, the server's
environment but its per-run paths), started lazily by the first ``start: fork`` run that needs
it, in the machine's own namespaces, and kept until the session ends (``close_zygotes``, at
pytest's session finish and at exit; its death signal and its socket's end when the supervisor
dies; its ``zygote-<id>`` state folder for the sweep after a SIGKILL). It imports what a
server imports, checks it is single-threaded, and for each request (the run's channel and the
server's log as descriptors; the server's environment, the host's namespaces as
:meth:`harness.topology.Topology.host_entry` gives them, the run's pid record) forks a child
that records itself there (through the zygote) and becomes the server
(:func:`_become_server`): a session of its own, a death signal against the zygote, the
host's UTS and network namespaces and a mount namespace made as ``ip netns exec`` makes it
(:func:`enter_host`), cwd /, the server's environment, uname's cache emptied, the resolver
view; then it says ``ready`` (``import_s`` 0, ``zygote``: its pid) and serves as above. A
zygote that cannot import or fork says why; the launcher then starts a fresh server (or, where
a fresh one would meet the same import failure, starts the ranks fresh) with the reason.

:class:`ForkServer` is the supervisor's side; :class:`ForkedProcess` a forked rank as the
supervisor sees it (the interface of :class:`harness.procs.ManagedProcess` it uses);
:class:`Zygote` and :class:`WarmServerProcess` the zygote and a server it forked, as the
supervisor sees them; :func:`warm_zygote` the session's pool (``HARNESS_ZYGOTES``: how many
zygotes at most, default 2, the least recently used idle one closed first; 0: none, every
server fresh).
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import socket
import sys
import tempfile
import time
from typing import Any, Dict, List, Mapping, NoReturn, Optional, Sequence, Tuple

from ..machine.procs import (
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
        tempfile.tempdir = None    # gettempdir() reads this run's TMPDIR again
        from ..core import protocol as P
        from ..net import resolver
        from . import worker

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


def _import_torch(ddp: bool) -> Tuple[Optional[str], str]:
    """Import what every rank imports (and DDP's lazy imports with ``ddp``); (why not, version):
    why is None when the process imported it and is still single-threaded (a fork after
    threads is unsafe)."""
    try:
        import torch
        import torch.distributed  # noqa: F401

        if ddp:
            import torch._dynamo  # noqa: F401
            import torch.nn.parallel  # noqa: F401
        from . import worker  # noqa: F401
    except BaseException as e:  # noqa: B036
        return f"the server could not import torch: {e!r}", ""
    threads = _threads()
    if threads > 1:
        return (f"after import torch the server has {threads} threads; a fork after threads is "
                "unsafe"), ""
    return None, str(torch.__version__)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def serve(fd: int, ddp: bool = False) -> None:
    """The fresh server (``python -m harness.forkserver FD``): started in the host's namespaces
    by its exec prefix, it enters the resolver view, imports torch, then forks ranks."""
    from ..net import resolver

    try:
        resolver.enter_from_env()
    except resolver.ViewError as e:
        print(f"harness fork server: cannot enter the resolver view: {e}", file=sys.stderr)
        os._exit(4)
    die_with_parent()
    default_signal_dispositions()   # what its forked ranks inherit
    sock = socket.socket(fileno=fd)
    t = time.monotonic()
    why, version = _import_torch(ddp)
    if why is not None:
        _send(sock, {"ready": False, "why": why})
        os._exit(1)
    import gc

    gc.freeze()   # the imported objects stay out of every child's collections (fewer copies)
    sys.stdout.flush()
    sys.stderr.flush()
    _send(sock, {"ready": True, "torch": version, "pid": os.getpid(),
                 "import_s": round(time.monotonic() - t, 3)})
    _loop(sock)


def _loop(sock: socket.socket) -> NoReturn:
    """A ready server's life: fork a rank per request, report each child's end; when the
    socket closes, SIGKILL the children's groups still alive and exit."""
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
                    _kill_groups(children)
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


def _kill_groups(pids: Any) -> None:
    for pid in pids:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass


# --------------------------------------------------------------------------------------------
# entering a host from outside it: what its exec prefix does (``nsenter --uts=PIN ip netns exec
# NS``), for a process forked from the zygote in the machine's own namespaces

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 0x1
MS_BIND = 0x1000
MS_REC = 0x4000
MS_SLAVE = 0x80000
MNT_DETACH = 2


def _libc() -> Any:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.unshare.argtypes = [ctypes.c_int]
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_void_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return libc


def _check(rc: int, what: str) -> None:
    import ctypes

    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _setns(libc: Any, path: str, kind: int) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(libc.setns(fd, kind), f"setns {path}")
    finally:
        os.close(fd)


def enter_host(entry: Mapping[str, Any]) -> None:
    """Make this (single-threaded) process a process of a host, as the host's exec prefix
    (:meth:`harness.topology.Topology.exec_prefix`) makes the program it starts: the host's UTS
    namespace where it has a name of its own (``nsenter --uts=PIN``), then what ``ip netns exec
    NS`` does (iproute2's ``netns_switch``): its network namespace, a mount namespace of its
    own whose mounts do not propagate back (``/`` made rslave), a sysfs of that network
    namespace over ``/sys``, and each file of ``/etc/netns/NS`` bound over its ``/etc``
    namesake (a file that cannot be bound is said on stderr and skipped, as ``ip`` does).

    ``entry``: :meth:`harness.topology.Topology.host_entry` (``netns`` the name, ``net`` its
    pinned file, ``etc`` its /etc folder, ``uts`` the UTS pin or None). Raises OSError naming
    the call that failed (setns needs CAP_SYS_ADMIN)."""
    libc = _libc()
    if entry.get("uts"):
        _setns(libc, str(entry["uts"]), CLONE_NEWUTS)
    _setns(libc, str(entry["net"]), CLONE_NEWNET)
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(libc.mount(b"", b"/", b"none", MS_SLAVE | MS_REC, None), "mount --make-rslave /")
    flags = 0
    if libc.umount2(b"/sys", MNT_DETACH) != 0:
        try:   # not unmounted: overlay it; a read-only sysfs cannot be shadowed read-write
            if os.statvfs("/sys").f_flag & os.ST_RDONLY:
                flags = MS_RDONLY
        except OSError:
            pass
    _check(libc.mount(str(entry["netns"]).encode(), b"/sys", b"sysfs", flags, None),
           "mount of /sys")
    etc = str(entry["etc"])
    try:
        names = os.listdir(etc)
    except OSError:
        names = []
    for name in names:
        src, dst = f"{etc}/{name}", f"/etc/{name}"
        if libc.mount(src.encode(), dst.encode(), b"none", MS_BIND, None) != 0:
            import ctypes

            print(f"Bind {src} -> {dst} failed: {os.strerror(ctypes.get_errno())}",
                  file=sys.stderr)


# --------------------------------------------------------------------------------------------
# the zygote: warm for a whole session, outside every host; forks a run's per-host servers

N_ZYGOTE_FDS = 2   # the run's channel to the supervisor, the server's log


def zygote(fd: int, ddp: bool = False) -> None:
    """``python -m harness.forkserver --zygote FD [--ddp]``: one per supervisor process and
    import environment (:func:`zygote_key`), started in the machine's own namespaces with no
    resolver view. It imports what a fresh server imports, then forks one server per request
    (:func:`_become_server`: it enters the host and the view and serves the run's ranks as a
    fresh server does), records each in the run's pid record, and reports their ends. When
    FD closes (the session ended, or its supervisor died: it also has a death signal) it
    SIGKILLs the groups of its servers still alive and exits."""
    die_with_parent()
    default_signal_dispositions()
    ctl = socket.socket(fileno=fd)
    t = time.monotonic()
    why, version = _import_torch(ddp)
    if why is not None:
        _send(ctl, {"ready": False, "why": why, "fatal": True})
        os._exit(1)
    import gc

    gc.freeze()
    sys.stdout.flush()
    sys.stderr.flush()
    _send(ctl, {"ready": True, "torch": version, "pid": os.getpid(),
                "import_s": round(time.monotonic() - t, 3)})
    pidfds: Dict[int, int] = {}
    servers: Dict[int, int] = {}
    while True:
        try:
            watched: List[Any] = [ctl, *pidfds]
            ready, _, _ = select.select(watched, [], [])
        except InterruptedError:
            continue
        for r in ready:
            if r is not ctl:
                pid = pidfds.pop(r)
                servers.pop(pid, None)
                _, status = os.waitpid(pid, 0)
                os.close(r)
                _send(ctl, {"exit": pid, "returncode": os.waitstatus_to_exitcode(status)})
                continue
            try:
                data, fds, _, _ = socket.recv_fds(ctl, MAX_MSG, N_ZYGOTE_FDS)
            except OSError:
                data, fds = b"", []
            if not data:
                _kill_groups(servers)
                os._exit(0)
            req = json.loads(data)
            why = f"{len(fds)} descriptors" if len(fds) != N_ZYGOTE_FDS else ""
            if not why and _threads() > 1:
                why = f"the zygote has {_threads()} threads; a fork after threads is unsafe"
            if why:
                for f in fds:
                    os.close(f)
                _send(ctl, {"id": req.get("id"), "error": why})
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _become_server(ctl, pidfds, req, fds)
            for f in fds:
                os.close(f)
            pfd = os.pidfd_open(pid)
            pidfds[pfd] = pid
            servers[pid] = pfd
            ident = {"pid": pid, "start_time": start_ticks(pid), "boot_id": boot_id()}
            try:   # tracked before the supervisor hears of it: the sweep finds it
                PidRecord(str(req["record"])).add_identity(
                    ident, f"fork server {req.get('host')} (warm)")
            except (OSError, KeyError):
                pass
            _send(ctl, {"id": req.get("id"), "pid": pid, "start_time": ident["start_time"]})


def forget_uname() -> None:
    """Empty what Python cached of uname(2): ``platform`` keeps the node name it saw first
    (torch's import asks), which was the machine's in the zygote and is the host's in a
    fresh server."""
    platform: Any = sys.modules.get("platform")
    if platform is not None and hasattr(platform, "_uname_cache"):
        platform._uname_cache = None


def _become_server(ctl: socket.socket, pidfds: Dict[int, int], req: Dict[str, Any],
                   fds: List[int]) -> NoReturn:
    """In the zygote's child: become the run's server of one host, in the state a fresh one
    has when its import is done: a session of its own, a death signal (against the zygote),
    stdin from /dev/null and stdout/stderr to the server's log, inside the host
    (:func:`enter_host`), cwd /, the server's environment, signal dispositions as the
    harness's start left none ignored, uname's cache emptied (``platform`` kept the machine's
    node name from the import); then the resolver view, and it serves the run's ranks."""
    chan = socket.socket(fileno=fds[0])
    try:
        os.setsid()
        die_with_parent()
        ctl.close()
        for p in pidfds:
            os.close(p)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(fds[1], 1)
        os.dup2(fds[1], 2)
        os.close(fds[1])
        if req.get("host_entry"):
            enter_host(req["host_entry"])
        os.chdir("/")
        os.environ.clear()
        os.environ.update(dict(req["env"]))
        tempfile.tempdir = None    # the zygote's import may have cached its own
        forget_uname()
        default_signal_dispositions()
    except BaseException as e:  # noqa: B036 - nothing may return into the zygote's loop
        try:
            _send(chan, {"ready": False, "why": f"the warm server could not enter host "
                                                f"{req.get('host')}: {e}"})
        finally:
            os._exit(6)
    from ..net import resolver

    try:
        resolver.enter_from_env()
    except resolver.ViewError as e:
        print(f"harness fork server: cannot enter the resolver view: {e}", file=sys.stderr)
        os._exit(4)
    if _threads() > 1:
        _send(chan, {"ready": False, "why": f"the warm server has {_threads()} threads"})
        os._exit(1)
    import torch

    sys.stdout.flush()
    sys.stderr.flush()
    _send(chan, {"ready": True, "torch": str(torch.__version__), "pid": os.getpid(),
                 "import_s": 0.0, "zygote": os.getppid()})
    _loop(chan)


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
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.ended = True
        try:
            self.proc.wait(5.0)
        except Exception:  # noqa: BLE001 - a zygote that does not go is killed
            pass
        self.proc.kill()
        self.state.remove()


class WarmServerProcess:
    """A per-run server a zygote forked, as the supervisor sees it (the interface of
    :class:`harness.procs.ManagedProcess` that :class:`ForkServer` uses): known by the
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


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    as_zygote = args[:1] == ["--zygote"]
    if as_zygote:
        args = args[1:]
    if not args or not args[0].isdigit():
        sys.exit("usage: python -m harness.ranks.forkserver [--zygote] FD [--ddp] (the harness "
                 "starts it)")
    (zygote if as_zygote else serve)(int(args[0]), ddp="--ddp" in args[1:])


if __name__ == "__main__":
    main()

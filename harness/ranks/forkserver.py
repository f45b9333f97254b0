"""The warm start (``start: fork``): one server per host imports torch once and forks ranks.

The server is ``python -m harness.ranks.forkserver FD [--ddp]``, started by the direct launcher
like any rank (through :mod:`harness.machine.procs`, with the host's exec prefix, so it lives in
the host's network namespace; recorded in the run's pid record). In this order, while
single-threaded, it enters the host's resolver view (``harness.net.resolver``), asks for a death
signal, imports torch, ``torch.distributed`` (and DDP's lazy imports with ``--ddp``) and the
worker, checks that it is still single-threaded (a fork after threads is unsafe: it then says why,
and the launcher starts its ranks fresh, recording that reason), freezes its objects for the
garbage collector and says ``ready`` on FD, a UNIX seqpacket socket to the supervisor.

Then, for each request (one JSON message: label, the rank's whole environment, its spec, its cwd;
with five descriptors: events, stacks, stdout, stderr, stdin), it forks a child that makes itself
the rank: a session of its own (one signal reaches its group), PR_SET_PDEATHSIG against the server
(which has its own against the supervisor: killing the supervisor takes both), the descriptors on
0/1/2 and its event/stack channels, the rank's environment (``os.environ``, which also sets the C
environment torch reads later), its cwd and argv; then it runs the worker from its ``start`` phase
(:func:`harness.ranks.worker.run_rank`: its import phase finds torch imported). The server answers
with the child's pid and start time (the supervisor records it in the pid record: the sweep kills
it), and says when a child ended, with its exit status as ``Popen.returncode`` has it (the server
is its parent and reaps it through a pidfd).

When the socket closes (the run ends, or the supervisor died) the server SIGKILLs the groups
of its children still alive and exits.

A server usually does not import torch itself: it is forked **warm** from the session's *zygote*
(``python -m harness.ranks.forkserver --zygote FD [--ddp]``), one per supervisor process and import
environment (:func:`harness.ranks.forkclient.zygote_key`: the interpreter, DDP's imports, the
server's environment but its per-run paths), started lazily by the first ``start: fork`` run that
needs it, in the machine's own namespaces, and kept until the session ends (``close_zygotes``, at
pytest's session finish and at exit; its death signal and its socket's end when the supervisor
dies; its ``zygote-<id>`` state folder for the sweep after a SIGKILL). It imports what a server
imports, checks it is single-threaded, and for each request (the run's channel and the server's log
as descriptors; the server's environment, the host's namespaces as
:meth:`harness.net.topology.Topology.host_entry` gives them, the run's pid record) forks a child
that records itself there (through the zygote) and becomes the server (:func:`_become_server`): a
session of its own, a death signal against the zygote, the host's UTS and network namespaces and a
mount namespace made as ``ip netns exec`` makes it (:func:`enter_host`), cwd /, the server's
environment, uname's cache emptied, the resolver view; then it says ``ready`` (``import_s`` 0,
``zygote``: its pid) and serves as above. A zygote that cannot import or fork says why; the
launcher then starts a fresh server (or, where a fresh one would meet the same import failure,
starts the ranks fresh) with the reason.

The supervisor's side of all this (:class:`ForkServer`, :class:`ForkedProcess`,
:class:`Zygote`, :class:`WarmServerProcess` and the session's pool of zygotes) is
:mod:`harness.ranks.forkclient`; it speaks the messages of this module (:func:`_send`).
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
    """The fresh server (``python -m harness.ranks.forkserver FD``): started in the host's
    namespaces by its exec prefix, it enters the resolver view, imports torch, then forks
    ranks."""
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
    (:meth:`harness.net.topology.Topology.exec_prefix`) makes the program it starts: the host's UTS
    namespace where it has a name of its own (``nsenter --uts=PIN``), then what ``ip netns exec
    NS`` does (iproute2's ``netns_switch``): its network namespace, a mount namespace of its
    own whose mounts do not propagate back (``/`` made rslave), a sysfs of that network
    namespace over ``/sys``, and each file of ``/etc/netns/NS`` bound over its ``/etc``
    namesake (a file that cannot be bound is said on stderr and skipped, as ``ip`` does).

    ``entry``: :meth:`harness.net.topology.Topology.host_entry` (``netns`` the name, ``net`` its
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
    """``python -m harness.ranks.forkserver --zygote FD [--ddp]``: one per supervisor process and
    import environment (:func:`harness.ranks.forkclient.zygote_key`), started in the machine's own
    namespaces with no resolver view. It imports what a fresh server imports, then forks one server
    per request (:func:`_become_server`: it enters the host and the view and serves the run's ranks
    as a fresh server does), records each in the run's pid record, and reports their ends. When FD
    closes (the session ended, or its supervisor died: it also has a death signal) it
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

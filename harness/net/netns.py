"""The plumbing under a run's network (:mod:`harness.net.topology`): named network namespaces
and the commands and threads that act inside them.

A namespace is made by a short-lived thread that unshared one and pinned at ``/run/netns`` as
``ip netns add`` pins it (pyroute2's ``netns.attach``: no fork of the supervisor); netlink
(pyroute2 ``IPRoute``) and the kernel files that show the opener's namespace (``/proc/sys/net``,
``/proc/thread-self/net``) are used from a thread that entered it (setns). Commands (``nft``,
``unshare``) run with check semantics and a bound, and their errors name the command. Also the
owner record a topology writes before it makes anything, which the sweep reads. Everything
here is module functions; the parts of a :class:`harness.net.topology.Topology` call them.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, TypeVar

from pyroute2 import IPRoute, NetlinkError
from pyroute2 import netns as pyroute2_netns

from ..machine.procs import alive, identity

PREFIX = "thx-"
STATE_DIR = Path("/run/thx")
UTS_DIR = STATE_DIR / "uts"    # hosts' own UTS namespaces, pinned: <dir>/<host's netns name>
MNT_DETACH = 2
NETNS_RUN_DIR = Path("/run/netns")
NETNS_ETC_DIR = Path("/etc/netns")
COMMAND_TIMEOUT_S = 30.0

_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,7}-$")
_SBIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")


class TopologyError(RuntimeError):
    """The harness could not make, change or remove its network: an error of the test itself."""

    def __init__(
        self,
        message: str,
        *,
        argv: Optional[Sequence[str]] = None,
        returncode: Optional[int] = None,
        stderr: str = "",
    ) -> None:
        super().__init__(message)
        self.argv = list(argv) if argv is not None else None
        self.returncode = returncode
        self.stderr = stderr


# --------------------------------------------------------------------------------------------
# running commands


def _tool(name: str) -> Optional[str]:
    """Absolute path of a program, looking in PATH and then in the sbin directories."""
    found = shutil.which(name)
    if found:
        return found
    return shutil.which(name, path=os.pathsep.join(_SBIN_DIRS))


def _argv(argv: Sequence[str]) -> List[str]:
    first = _tool(argv[0]) or argv[0]
    return [first, *argv[1:]]


def _run(argv: Sequence[str], *, stdin: Optional[str] = None) -> subprocess.CompletedProcess[str]:
    """Run a command with check semantics; the error names the command and its stderr (quoted
    for a person: nothing is read from it)."""
    full = _argv(argv)
    try:
        proc = subprocess.run(
            full,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
            start_new_session=True,  # never gets the terminal's Ctrl-C: teardown must finish
        )
    except FileNotFoundError as exc:
        raise TopologyError(
            f"`{shlex.join(argv)}` could not start: {exc}; see harness.net.topology.missing()",
            argv=full,
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise TopologyError(
            f"`{shlex.join(argv)}` did not finish within {COMMAND_TIMEOUT_S:.0f} s", argv=full
        ) from exc
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip() or "(no output)"
        where = f"\ninput:\n{stdin.rstrip()}" if stdin else ""
        raise TopologyError(
            f"`{shlex.join(argv)}` failed with exit status {proc.returncode}: {detail}{where}",
            argv=full,
            returncode=proc.returncode,
            stderr=proc.stderr,
        )
    return proc


def _list_netns() -> List[str]:
    try:
        return sorted(p.name for p in NETNS_RUN_DIR.iterdir())
    except FileNotFoundError:
        return []


def _netns_pids(netns: str) -> List[int]:
    """The processes inside a named namespace: those whose ``/proc/<pid>/ns/net`` is the file
    pinned in /run/netns (what ``ip netns pids`` looks at, without reading its output)."""
    try:
        pinned = os.stat(NETNS_RUN_DIR / netns)
    except OSError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (pinned.st_dev, pinned.st_ino):
            pids.append(int(entry))
    return pids


# --------------------------------------------------------------------------------------------
# namespaces: netlink (pyroute2), from a thread in the namespace

_T = TypeVar("_T")
_CLONE_NEWNET = 0x40000000
_GONE_ERRNOS = (errno.ENODEV, errno.ENOENT)


def _in_thread(netns: Optional[str], call: Callable[[], _T]) -> _T:
    """``call()`` in a short-lived thread that entered the named namespace (setns affects that
    thread only), or, with ``netns`` None, a new network namespace of its own (unshare). What
    it opens there stays there: a netlink socket, ``/proc/sys/net``, ``/proc/thread-self/net``
    (``/proc/self/net`` is the process's, not the thread's). Not pyroute2's own ``NetNS`` or
    ``netns.create``: those fork the calling process, and a fork of the supervisor runs its
    signal handlers and test session in the child. What ``call`` raises is raised here."""
    out: List[Any] = []

    def run() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if netns is None:
                if libc.unshare(_CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
            else:
                fd = os.open(NETNS_RUN_DIR / netns, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    if libc.setns(fd, _CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), f"setns {NETNS_RUN_DIR / netns}")
                finally:
                    os.close(fd)
            out.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
            out.append(exc)

    t = threading.Thread(target=run, name=f"netns-{netns or 'new'}")
    t.start()
    t.join()
    got = out[0] if out else RuntimeError("the namespace thread ended without an answer")
    if isinstance(got, BaseException):
        raise got
    return got  # type: ignore[no-any-return]


def _in_netns(netns: str, what: str, call: Callable[[Any], _T], *,
              ok_if_gone: bool = False) -> Optional[_T]:
    """``call(ipr)`` with a netlink socket (pyroute2 ``IPRoute``) made inside ``netns``
    (:func:`_in_thread`). Errors become TopologyError naming the namespace and ``what``; with
    ``ok_if_gone``, "no such device/namespace" (by errno) is no error."""
    def with_socket() -> _T:
        with IPRoute() as ipr:
            return call(ipr)

    try:
        return _in_thread(netns, with_socket)
    except (NetlinkError, OSError) as exc:
        code = exc.code if isinstance(exc, NetlinkError) else exc.errno
        if ok_if_gone and code in _GONE_ERRNOS:
            return None
        raise TopologyError(f"{what} in {netns} failed: {exc}") from exc


def _in_netns_files(netns: str, what: str, call: Callable[[], _T]) -> _T:
    """``call()`` in a thread inside ``netns`` (:func:`_in_thread`), for files that show the
    opener's namespace (``/proc/sys/net``, ``/proc/thread-self/net``); OSError becomes
    TopologyError."""
    try:
        return _in_thread(netns, call)
    except OSError as exc:
        raise TopologyError(f"{what} in {netns} failed: {exc}") from exc


def _index(ipr: Any, ifname: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise NetlinkError(errno.ENODEV, f"no interface {ifname}")
    return int(found[0])


def _delete_link(netns: str, ifname: str) -> None:
    """Remove an interface (no error if it or its namespace is gone)."""
    _in_netns(netns, f"deleting link {ifname}",
              lambda ipr: ipr.link("del", index=_index(ipr, ifname)), ok_if_gone=True)


def _add_netns(netns: str) -> None:
    """A new named network namespace, pinned at ``/run/netns/<netns>`` as ``ip netns add``
    pins it (pyroute2's ``netns.attach``: the same shared mount of /run/netns and bind mount
    that iproute2 makes, so ``ip netns exec`` and the sweep see it), made by a thread that
    unshared its network namespace (no fork)."""
    path = NETNS_RUN_DIR / netns
    try:
        _in_thread(None, lambda: pyroute2_netns.attach(str(path), "thread-self"))
    except OSError as exc:
        if exc.errno != errno.EEXIST:   # a failed mount leaves the empty mount point behind
            with contextlib.suppress(OSError):
                if not os.path.ismount(path):
                    path.unlink()
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        raise TopologyError(f"making the network namespace {netns} failed: {path}: {why}") \
            from exc


def _remove_netns(netns: str) -> None:
    """Unpin a named namespace as ``ip netns delete`` does (pyroute2's ``netns.remove``: a lazy
    unmount, then the file); no error if it is gone already."""
    try:
        pyroute2_netns.remove(str(NETNS_RUN_DIR / netns))
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise TopologyError(f"removing the network namespace {netns} failed: {exc}") from exc


def _kill_netns_processes(netns: str) -> List[int]:
    """SIGKILL every process still inside a namespace (they would keep it alive unnamed)."""
    killed = []
    for pid in _netns_pids(netns):
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed


def _delete_netns(netns: str) -> None:
    _kill_netns_processes(netns)
    _remove_netns(netns)
    shutil.rmtree(NETNS_ETC_DIR / netns, ignore_errors=True)
    _unpin(UTS_DIR / netns)


def _unpin(path: Path) -> None:
    """Unmount a pinned namespace file (lazily: a process may still hold it) and remove it."""
    if not path.exists():
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    if libc.umount2(str(path).encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):   # EINVAL: nothing mounted there
            raise OSError(err, f"umount {path}: {os.strerror(err)}")
    path.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------
# owner records


def _owner_record() -> Dict[str, Any]:
    return identity(os.getpid())


def _owner_alive(owner: Mapping[str, Any]) -> bool:
    return alive(owner)


def _create_json_exclusively(path: Path, data: Mapping[str, Any]) -> None:
    """Write a JSON file that appears whole or not at all; FileExistsError if it exists."""
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    try:
        os.link(tmp, path)
    finally:
        tmp.unlink()


def _write_text_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


"""Topology: the hosts of one harness run, made of Linux network namespaces, and their faults.

This module owns everything a run does to the network: it makes one network namespace per
scenario host, links them, applies network changes (filter rules, cuts, random drops,
rate limits, each host's resolver view in ``/etc/netns``) and always removes all of it.
It never configures anything in the root network namespace: no interface, no bridge, no
nftables table there. Namespaces, links, addresses and qdiscs are made over netlink with
pyroute2, from a short-lived thread that entered the namespace (or unshared a new one: no fork
of the supervisor); namespaces are pinned under ``/run/netns`` as ``ip netns add`` pins them
(pyroute2's ``netns.attach``/``netns.remove``), so that commands run in a host with ``ip netns
exec`` (which also mounts its resolver view from ``/etc/netns``). Kernel files that show the
opener's namespace (``/proc/sys/net``, ``/proc/thread-self/net/snmp``) are read and written
from such a thread too. It needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN); see :func:`missing`.
nftables is driven through its JSON interface only (``nft -j``, :mod:`harness.nftjson`): rules
go in as JSON and their handles come back as JSON, and whether a table or rule is still there
is asked (``nft -j list``), never read from an error's words; :meth:`Topology.rules` renders
``nft -j list table`` back to the text ``nft -a list table`` prints, for reports and the
diagnosis. No program's human-readable output is parsed here.

Layout
------
* Names: host ``h`` of run ``r`` lives in namespace ``thx-<r>-<h>``; a multi-host run also has
  a switch namespace ``thx-<r>.sw``. Run ids may not contain ``-`` or ``.`` and host names may not
  contain ``.``, so names of different runs never collide. Namespace names are not interface
  names; the interfaces are short fixed names (``eth0``, ``br0``, ``p<i>``), unique per
  namespace, so the 15-character interface limit never depends on the run id.
* Single host (``Topology(r, ["local"])``): one namespace, only ``lo`` up; the host's address is
  ``127.0.0.1`` and its ``ifname`` is ``lo``. This gives a run private ports and nothing else.
* Several hosts: the switch namespace holds a Linux bridge ``br0``; each host gets a veth pair,
  ``eth0`` inside its own namespace and ``p<i>`` in the switch namespace, enslaved to the bridge.
  Hosts get ``.1``, ``.2``, ... of one /24 picked from ``subnet`` by a hash of the run id (each
  run's network is private anyway). IPv6 address generation is off on every link
  (``addrgenmode none``), so gloo cannot pick a link-local v6 address. ``ip`` picks the
  families: ``"4"`` (default) IPv4 only; ``"6"`` IPv6 only: hosts get ``::1``, ``::2``... of a
  unique local /64 of the run (``fd74:6878:<crc of the run id>::/64``, RFC 4193: never routed)
  and no IPv4 address on the link; ``"dual"`` both. ``lo`` is up in every namespace (``::1``
  included). Faults match the families the hosts have (``ip``/``ip6`` in nftables).
* Each host namespace gets one nftables table ``inet thx`` (the prefix without its dash) with
  base chains ``input`` and ``output`` (filter hooks, priority 0, policy accept); every fault
  rule goes there, inside the host's namespace. A regular chain ``conntrack`` holds one
  ``ct state`` rule, never jumped to: it turns connection tracking on from the start, so that a
  later ``ct state new`` rule sees the connections made before it as established.

Owner and sweep
---------------
Before it makes anything, ``__enter__`` writes ``/run/thx/<prefix><run_id>.json`` holding the
owner (pid, the process start time in clock ticks from ``/proc/<pid>/stat`` field 22, and the
kernel boot id) and the list of namespaces it is about to make. Teardown removes the file last.
:func:`sweep` lists namespaces and ``/etc/netns`` directories first and reads the state files
second (so a run that is being made concurrently is never taken for an orphan); it removes
every namespace with the prefix that is not listed by a state file whose owner is alive (same
pid, same start time, same boot, not a zombie), kills processes still inside those namespaces,
and removes their ``/etc/netns`` directories and the dead runs' state files. The pid check
assumes sweep runs in the same pid namespace as the runs it judges.

Faults
------
Firewall rules match every interface of the host, loopback included: a process dialing its
own host's address is subject to them, as it would be behind a host packet filter that filters
``lo`` too. Random drops and rate limits act on the host's link (``ifname``) only. Cuts drop,
on each side, inbound packets whose source is a host of the other side. Latency cannot be
added only with the ``netem`` qdisc (:meth:`Topology.add_delay`; :func:`qdisc_missing` says if
the kernel has one; tbf's own queue-bound argument adds no delay).
Names
-----
Every host namespace gets the harness's resolver view (:mod:`harness.resolver`) in
``/etc/netns/<ns>/``: ``hosts`` (loopback names and the machine's host name only),
``nsswitch.conf`` (``hosts: files``: no DNS) and ``resolv.conf`` (``nameserver 127.0.0.1``).
``ip netns exec`` bind-mounts them over ``/etc`` when a process starts, so change them
(:meth:`Topology.set_hosts_file`, :meth:`Topology.set_resolv_conf`) before starting the
processes that should see the change. A host's hosts-file entries accumulate (each change
replaces the lines of the names it gives).

A host as a whole machine
-------------------------
:meth:`Topology.set_hostname` gives a host a name of its own: a UTS namespace pinned at
``/run/thx/uts/<namespace>`` (a bind mount, as ``ip netns`` pins network namespaces) that
:meth:`Topology.exec_prefix` enters with ``nsenter --uts`` in front of ``ip netns exec``;
teardown and :func:`sweep` unmount and remove pins. :meth:`Topology.set_sysctl` writes a key
of the host's own network namespace (``harness.hostspec.SYSCTL_KEYS``), :meth:`set_mtu` its
link's MTU, :meth:`counters` reads its kernel's TCP counters.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import (
    Any,
    Callable,
    Dict,
    List,
    Literal,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    Type,
    TypeVar,
    Union,
)

from pyroute2 import IPRoute, NetlinkError
from pyroute2 import netns as pyroute2_netns
from pyroute2.netlink.rtnl import TC_H_ROOT

from ..machine.procs import alive, identity
from . import nft as nftjson
from . import resolver

__all__ = [
    "PREFIX",
    "STATE_DIR",
    "HostNet",
    "Ports",
    "Topology",
    "TopologyError",
    "capabilities",
    "missing",
    "sweep",
]

PREFIX = "thx-"
STATE_DIR = Path("/run/thx")
UTS_DIR = STATE_DIR / "uts"    # hosts' own UTS namespaces, pinned: <dir>/<host's netns name>
MNT_DETACH = 2
NETNS_RUN_DIR = Path("/run/netns")
NETNS_ETC_DIR = Path("/etc/netns")
LOOPBACK_ADDR = "127.0.0.1"
IP_FAMILIES = ("4", "6", "dual")
ULA_PREFIX = "fd74:6878"    # "thx": the harness's unique local addresses, fd74:6878:<run>::/64
LINK_IFNAME = "eth0"
BRIDGE_IFNAME = "br0"
MAX_HOSTS = 253
COMMAND_TIMEOUT_S = 30.0
IFA_F_TENTATIVE = 0x40      # an IPv6 address still in duplicate address detection
LINK_LOCAL_WAIT = 5.0       # s for a link-local address to settle (DAD: ~1 s on this kernel)

_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,7}-$")
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9_]{1,24}$")
_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,15}$")
_HOSTNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,252}$")
_TC_VALUE_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)$")
_SBIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")
_CAP_NET_ADMIN = 12
_CAP_SYS_ADMIN = 21

Action = Literal["drop", "reject"]
Direction = Literal["in", "out"]
LossDirection = Literal["in", "out", "both"]
Proto = Literal["tcp", "udp"]
Ports = Union[Literal["all"], int, Sequence[int], Tuple[int, int], Mapping[str, Sequence[int]]]
"""``"all"``; a port or a list of ports; a 2-tuple ``(low, high)`` for an inclusive range;
``{"except": [ports]}`` for every port but these."""


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


@dataclass(frozen=True)
class HostNet:
    """What a rank needs to know about its host."""

    name: str  # scenario host name, e.g. "a"
    netns: str  # namespace name, e.g. "thx-<runid>-a"
    ifname: str  # the host's link interface inside its namespace: "eth0", or "lo" alone
    addr: str  # the address ranks use: IPv4 on the private link ("127.0.0.1" alone); with
    #            ip "6" the IPv6 one ("::1" alone)
    addr4: str = ""  # its IPv4 address ("" with ip "6")
    addr6: str = ""  # its IPv6 (ULA) address ("" with ip "4")


@dataclass(frozen=True)
class _Rule:
    host: str
    chain: str
    nft_handle: int


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
# namespaces, links, addresses, qdiscs: netlink (pyroute2), from a thread in the namespace

_T = TypeVar("_T")
_CLONE_NEWNET = 0x40000000
# IFLA_AF_SPEC for ``addrgenmode none``: no IPv6 link-local address on the link
_NO_ADDRGEN = {"attrs": [("AF_INET6", {"attrs": [("IFLA_INET6_ADDR_GEN_MODE", 1)]})]}
_IFA_F_NODAD = 0x02
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


def _root_qdisc(ipr: Any, index: int) -> Optional[Any]:
    """The qdisc the harness set at the root of a link, if any (a default one the kernel
    attached by itself has handle 0 and is nothing to remove)."""
    for msg in ipr.get_qdiscs(index=index):
        if msg["index"] == index and msg["parent"] == TC_H_ROOT and msg["handle"]:
            return msg
    return None


def _clear_root_qdisc(netns: str, dev: str) -> None:
    """Remove the root qdisc of a link (none there, or the link or namespace gone: no error)."""
    def clear(ipr: Any) -> None:
        index = _index(ipr, dev)
        q = _root_qdisc(ipr, index)
        if q is not None:   # no kind given: pyroute2 would encode that kind's options
            ipr.tc("del", index=index, handle=q["handle"], parent=TC_H_ROOT)

    _in_netns(netns, f"removing the qdisc of {dev}", clear, ok_if_gone=True)


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


# --------------------------------------------------------------------------------------------
# nft rule expressions (JSON, harness.nftjson)


def _port_list(ports: Sequence[int]) -> List[int]:
    values = [_check_port(p) for p in ports]
    if not values:
        raise ValueError("a port list must not be empty")
    return sorted(set(values))


def _check_port(port: object) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"a port must be an integer in 1..65535, got {port!r}")
    return port


def _ports_value(ports: List[int]) -> Union[int, List[int]]:
    """One port as itself, several as a set (what nft itself keeps of a one-element set)."""
    return ports[0] if len(ports) == 1 else ports


def _port_match(proto: str, ports: Ports) -> Tuple[nftjson.Expr, bool]:
    """nft match (JSON) for the destination ports, and whether it is an 'every port but' match."""
    dport = nftjson.payload(proto, "dport")
    if isinstance(ports, str):
        if ports != "all":
            raise ValueError(
                f"ports must be 'all', a port list, a (low, high) range or "
                f"{{'except': [...]}}, got {ports!r}"
            )
        return nftjson.match(nftjson.meta("l4proto"), proto), False
    if isinstance(ports, Mapping):
        if set(ports) != {"except"}:
            raise ValueError(f"a ports mapping must be {{'except': [ports]}}, got {ports!r}")
        return nftjson.match(dport, _ports_value(_port_list(ports["except"])), "!="), True
    if isinstance(ports, tuple):
        if len(ports) != 2:
            raise ValueError(f"a port range is a (low, high) tuple, got {ports!r}")
        low, high = _check_port(ports[0]), _check_port(ports[1])
        if low > high:
            raise ValueError(f"port range {ports!r} has low > high")
        return nftjson.match(dport, {"range": [low, high]}), False
    if isinstance(ports, int):
        return nftjson.match(dport, _check_port(ports)), False
    return nftjson.match(dport, _ports_value(_port_list(list(ports)))), False


# tc's units (tc(8), "UNITS"), read as tc reads them (case-insensitive): the harness gives the
# kernel numbers, so the words of a scenario must mean what they meant to tc
_RATE_BITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12, "bps": 8,
              "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}
_SIZE_BYTES = {"b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3,
               "gb": 1024**3, "kbit": 1024 / 8, "mbit": 1024**2 / 8, "gbit": 1024**3 / 8}
_TIME_US = {"s": 1e6, "sec": 1e6, "secs": 1e6, "ms": 1e3, "msec": 1e3, "msecs": 1e3,
            "us": 1, "usec": 1, "usecs": 1}


def _tc_value(what: str, value: str, units: Mapping[str, float], default: str) -> float:
    m = _TC_VALUE_RE.match(value) if isinstance(value, str) else None
    unit = (m.group(2) or default).lower() if m else ""
    if not m or unit not in units:
        raise ValueError(f"{what} must be a number and one of tc's units "
                         f"({', '.join(units)}), got {value!r}")
    return float(m.group(1)) * units[unit]


def tc_rate(rate: str) -> int:
    """tc's rate words (``1mbit``, ``100kbps``; a bare number is bits) in bytes per second."""
    return max(1, int(_tc_value("rate", rate, _RATE_BITS, "bit") / 8))


def tc_size(size: str) -> int:
    """tc's size words (``16kb``: 16384 bytes; a bare number is bytes) in bytes."""
    return int(_tc_value("size", size, _SIZE_BYTES, "b"))


def tc_time(time_: str) -> int:
    """tc's time words (``400ms``; a bare number is microseconds) in microseconds."""
    return int(_tc_value("time", time_, _TIME_US, "us"))


# --------------------------------------------------------------------------------------------
# the topology


class Topology:
    """A private network of hosts for one run; a context manager whose teardown always runs.

    ``hosts`` are scenario host names. One host and ``link=None`` (the default) gives a
    loopback-only namespace; several hosts (or ``link=True``) give a bridged link between them.
    """

    def __init__(
        self,
        run_id: str,
        hosts: Sequence[str],
        *,
        subnet: str = "10.213.0.0/16",
        link: Optional[bool] = None,
        prefix: str = PREFIX,
        ip: str = "4",
        service_hosts: Sequence[str] = (),
    ) -> None:
        if ip not in IP_FAMILIES:
            raise ValueError(f"ip must be one of {IP_FAMILIES}, got {ip!r}")
        if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix):
            raise ValueError(
                f"prefix must be 1-8 lower-case letters/digits and a '-', got {prefix!r}"
            )
        if not isinstance(run_id, str) or not _RUN_ID_RE.match(run_id):
            raise ValueError(f"run_id must be 1-24 characters of [A-Za-z0-9_], got {run_id!r}")
        if isinstance(hosts, str):
            raise ValueError("hosts must be a list of host names, not a string")
        names = list(hosts)
        if not names:
            raise ValueError("a topology needs at least one host")
        if len(names) > MAX_HOSTS:
            raise ValueError(f"at most {MAX_HOSTS} hosts, got {len(names)}")
        for name in names:
            if not isinstance(name, str) or not _HOST_RE.match(name):
                raise ValueError(
                    f"host name must be 1-16 characters of [A-Za-z0-9_-] starting "
                    f"with a letter or digit, got {name!r}"
                )
        # hosts of the run's services (the name server): linked, with the LAST addresses of
        # the run's networks (.254, ::fe downwards), so that the scenario hosts' addresses and
        # the numbers right after them stay what they are without a service
        services = list(service_hosts)
        if services and link is False:
            raise ValueError("service hosts need a link")
        if services:
            link = True
        names = names + services
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate host names: {dupes}")
        try:
            net = ipaddress.ip_network(subnet, strict=True)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"subnet {subnet!r} is not a network: {exc}") from exc
        if not isinstance(net, ipaddress.IPv4Network) or net.prefixlen > 24:
            raise ValueError(f"subnet must be an IPv4 network of /24 or larger, got {subnet!r}")
        if net.is_loopback or net.is_multicast or net.is_unspecified or net.is_reserved:
            raise ValueError(f"subnet {subnet!r} is loopback, multicast or reserved")

        self.run_id = run_id
        self.prefix = prefix
        self.link = len(names) > 1 if link is None else bool(link)
        self.table = prefix.rstrip("-")
        self.state_file = STATE_DIR / f"{prefix}{run_id}.json"
        self.switch_netns: Optional[str] = f"{prefix}{run_id}.sw" if self.link else None
        blocks = list(net.subnets(new_prefix=24)) if net.prefixlen < 24 else [net]
        pick = zlib.crc32(run_id.encode()) % len(blocks)
        self.network: ipaddress.IPv4Network = blocks[pick]
        # the pool's next block: addresses of spare links, a subnet no link of the run routes
        self.spare_network: ipaddress.IPv4Network = blocks[(pick + 1) % len(blocks)]
        # a unique local /64 (RFC 4193, fd00::/8) of the run: never routed, never outside
        crc = zlib.crc32(run_id.encode())
        self.network6 = ipaddress.IPv6Network(
            f"{ULA_PREFIX}:{crc >> 16:04x}:{crc & 0xFFFF:04x}::/64")
        self.ip = ip
        self._hosts: Dict[str, HostNet] = {}
        self._ports: Dict[str, str] = {}  # host -> switch-side veth name
        first_service = len(names) - len(services)
        for index, name in enumerate(names):
            if self.link:
                n = index + 1 if index < first_service else 254 - (index - first_service)
                addr4 = str(self.network.network_address + n)
                addr6 = str(self.network6.network_address + n)
                ifname = LINK_IFNAME
                self._ports[name] = f"p{index}"
            else:
                addr4, addr6, ifname = LOOPBACK_ADDR, "::1", "lo"
            addr4 = "" if ip == "6" else addr4
            addr6 = "" if ip == "4" else addr6
            self._hosts[name] = HostNet(
                name=name, netns=f"{prefix}{run_id}-{name}", ifname=ifname,
                addr=addr6 if ip == "6" else addr4, addr4=addr4, addr6=addr6,
            )
        self._entered = False
        self._closed = False
        self._made: List[str] = []  # namespaces this object created, in order
        self._state_written = False
        self._rules: Dict[str, List[_Rule]] = {}
        self._counter = 0
        self._names: Dict[str, Dict[str, List[str]]] = {}   # host -> its hosts file's entries
        self._hostnames: Dict[str, str] = {}                 # host -> its own name
        self._uts: List[Path] = []                           # pinned UTS namespaces

    # ---- names ----------------------------------------------------------------------------

    @property
    def hosts(self) -> Dict[str, HostNet]:
        """Host name -> HostNet, in the order given."""
        return dict(self._hosts)

    @property
    def namespaces(self) -> List[str]:
        """Every namespace of this topology: the switch (if any) first, then the hosts."""
        ns = [h.netns for h in self._hosts.values()]
        return ([self.switch_netns] if self.switch_netns else []) + ns

    def host(self, name: str) -> HostNet:
        try:
            return self._hosts[name]
        except KeyError:
            raise KeyError(
                f"no host {name!r} in this topology; hosts: {sorted(self._hosts)}"
            ) from None

    def exec_prefix(self, host: str) -> List[str]:
        """Argv prefix that runs a command inside the host's namespace (``ip`` as absolute path
        when found), and in its UTS namespace when it has a name of its own."""
        ns = [_tool("ip") or "ip", "netns", "exec", self.host(host).netns]
        if host in self._hostnames:
            return [_tool("nsenter") or "nsenter", f"--uts={self.uts_file(host)}", *ns]
        return ns

    def host_entry(self, host: str) -> Dict[str, Optional[str]]:
        """What :meth:`exec_prefix` enters, for a process that enters it by itself (a warm fork
        server forked outside every host, ``harness.forkserver.enter_host``): the network
        namespace's name (``netns``), its pinned file (``net``), its /etc folder (``etc``), the
        pinned UTS namespace where the host has a name of its own (``uts``, else None). Keep
        the two in step."""
        ns = self.host(host).netns
        return {"netns": ns, "net": str(NETNS_RUN_DIR / ns), "etc": str(NETNS_ETC_DIR / ns),
                "uts": str(self.uts_file(host)) if host in self._hostnames else None}

    # ---- life cycle -----------------------------------------------------------------------

    def __enter__(self) -> Topology:
        if self._entered:
            raise RuntimeError("a Topology can be entered only once")
        self._entered = True
        try:
            self._write_state()
            self._build()
        except BaseException:
            self._teardown()  # best effort: the original error matters; sweep() gets the rest
            raise
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        problems = self._teardown()
        if problems and exc_type is None:
            raise TopologyError("teardown left things behind:\n" + "\n".join(problems))

    def close(self) -> None:
        """Tear down now (what ``__exit__`` does); raises TopologyError if anything remains."""
        self.__exit__(None, None, None)

    def _write_state(self) -> None:
        record = {
            "run_id": self.run_id,
            "prefix": self.prefix,
            "owner": _owner_record(),
            "namespaces": self.namespaces,
            "created": time.time(),
        }
        try:
            _create_json_exclusively(self.state_file, record)
        except FileExistsError:
            raise TopologyError(
                f"run id {self.run_id!r} is in use: {self.state_file} exists "
                f"(a leftover of a dead run is removed by sweep())"
            ) from None
        except OSError as exc:
            raise TopologyError(f"cannot write the owner record {self.state_file}: {exc}") from exc
        self._state_written = True

    def _build(self) -> None:
        for netns in self.namespaces:
            _add_netns(netns)
            self._made.append(netns)
        for netns in self.namespaces:
            _in_netns(netns, "setting lo up",
                      lambda ipr: ipr.link("set", index=_index(ipr, "lo"), state="up"))
        if self.switch_netns:
            sw = self.switch_netns

            def bridge(ipr: Any) -> None:
                ipr.link("add", ifname=BRIDGE_IFNAME, kind="bridge")
                index = _index(ipr, BRIDGE_IFNAME)
                ipr.link("set", index=index, IFLA_AF_SPEC=_NO_ADDRGEN)
                ipr.link("set", index=index, state="up")

            _in_netns(sw, f"making the bridge {BRIDGE_IFNAME}", bridge)
            for name, host in self._hosts.items():
                port = self._ports[name]
                _in_netns(host.netns, f"making {LINK_IFNAME} and its peer {port}",
                          functools.partial(self._host_link, host=host, port=port))
                _in_netns(sw, f"putting {port} on the bridge",
                          functools.partial(self._port_up, port=port))
        table = [
            nftjson.add_table("inet", self.table),
            nftjson.add_chain("inet", self.table, "input", type="filter", hook="input", prio=0),
            nftjson.add_chain("inet", self.table, "output", type="filter", hook="output",
                              prio=0),
            # connection tracking from the namespace's birth: a ct expression loaded in any
            # chain turns it on. Without it, the first `ct state new` rule (firewall ports:
            # data, added mid-run) turned it on late and saw the mesh's live connections as
            # new: their next inbound packet was dropped (1 packet, 100 bytes, in a catalog
            # run under load), so "new connections only" hit an established one
            {"add": {"chain": {"family": "inet", "table": self.table, "name": "conntrack"}}},
            nftjson.add_rule("inet", self.table, "conntrack", [nftjson.ct_state("established")],
                             comment="track connections from the start"),
        ]
        for host in self._hosts.values():
            self._nft(host.netns, table)
        for host in self._hosts.values():
            # every process started in the host (ip netns exec) resolves with the harness's
            # resolver view: loopback names only, no DNS
            resolver.write_view(NETNS_ETC_DIR / host.netns)

    def _host_link(self, ipr: Any, host: HostNet, port: str) -> None:
        """In the host's namespace: ``eth0``, its peer ``port`` sent to the switch, addresses
        (IPv6 without DAD: usable at once), no IPv6 link-local, up."""
        fd = os.open(NETNS_RUN_DIR / str(self.switch_netns), os.O_RDONLY | os.O_CLOEXEC)
        try:
            ipr.link("add", ifname=LINK_IFNAME, kind="veth",
                     peer={"ifname": port, "net_ns_fd": fd})
        finally:
            os.close(fd)
        eth = _index(ipr, LINK_IFNAME)
        ipr.link("set", index=eth, IFLA_AF_SPEC=_NO_ADDRGEN)
        if host.addr4:
            ipr.addr("add", index=eth, address=host.addr4, prefixlen=self.network.prefixlen)
        if host.addr6:
            ipr.addr("add", index=eth, address=host.addr6, prefixlen=self.network6.prefixlen,
                     flags=_IFA_F_NODAD)
        ipr.link("set", index=eth, state="up")

    @staticmethod
    def _port_up(ipr: Any, port: str) -> None:
        """In the switch: the host's peer on the bridge, no IPv6 link-local, up."""
        index = _index(ipr, port)
        ipr.link("set", index=index, master=_index(ipr, BRIDGE_IFNAME))
        ipr.link("set", index=index, IFLA_AF_SPEC=_NO_ADDRGEN)
        ipr.link("set", index=index, state="up")

    def _teardown(self) -> List[str]:
        """Remove everything this object made, in order; return what could not be removed."""
        if self._closed or not self._entered:
            return []
        self._closed = True
        problems: List[str] = []
        made = set(self._made)

        def attempt(netns: str, ifname: str) -> None:
            try:
                _delete_link(netns, ifname)
            except TopologyError as exc:
                problems.append(str(exc))

        for host in self._hosts.values():
            if host.netns in made:
                try:
                    self._delete_table(host.netns)
                except TopologyError as exc:
                    problems.append(str(exc))
                if self.link:
                    attempt(host.netns, LINK_IFNAME)
        if self.switch_netns and self.switch_netns in made:
            attempt(self.switch_netns, BRIDGE_IFNAME)
        for path in self._uts:
            try:
                _unpin(path)
            except OSError as exc:
                problems.append(f"could not remove the UTS namespace {path}: {exc}")
        for netns in reversed(self._made):
            try:
                _delete_netns(netns)
            except (TopologyError, OSError) as exc:
                problems.append(str(exc))
        left = sorted(made & set(_list_netns()))
        if left:
            problems.append(f"namespaces still present: {left}")
        elif self._state_written:
            try:
                self.state_file.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                problems.append(f"could not remove {self.state_file}: {exc}")
        self._rules.clear()
        return problems

    def _require_up(self) -> None:
        if not self._entered or self._closed:
            raise RuntimeError("the topology is not up: use it inside its `with` block")

    # ---- nftables -------------------------------------------------------------------------

    def _nft(self, netns: str, commands: Sequence[nftjson.Expr]) -> Dict[str, Any]:
        """One batch of JSON commands (``nft -j --echo --handle -f -``: all or nothing); what
        nft echoed back (the added objects with their handles), as JSON."""
        out = _run(["ip", "netns", "exec", netns, "nft", "-j", "--echo", "--handle", "-f", "-"],
                   stdin=nftjson.script(commands)).stdout
        try:
            return dict(json.loads(out)) if out.strip() else {}
        except ValueError as exc:
            raise TopologyError(f"nft in {netns} echoed no JSON ({exc}): {out[:300]}") from exc

    def _nft_list(self, netns: str, *what: str) -> Dict[str, Any]:
        """``nft -j list WHAT`` in the namespace, as JSON."""
        out = _run(["ip", "netns", "exec", netns, "nft", "-j", "list", *what]).stdout
        try:
            return dict(json.loads(out))
        except ValueError as exc:
            raise TopologyError(f"nft -j list {' '.join(what)} in {netns} gave no JSON ({exc}): "
                                f"{out[:300]}") from exc

    def _has_table(self, netns: str) -> bool:
        """Whether the namespace still exists and holds the run's table (asked, not guessed
        from an error's words)."""
        if not (NETNS_RUN_DIR / netns).exists():
            return False
        return ("inet", self.table) in nftjson.tables_of(self._nft_list(netns, "tables"))

    def _delete_table(self, netns: str) -> None:
        """Remove the run's table from a namespace (no error when it or the namespace is
        gone)."""
        if self._has_table(netns):
            self._nft(netns, [nftjson.delete_table("inet", self.table)])

    def _add_rules(self, kind: str,
                   rules: Mapping[str, Sequence[Tuple[str, Sequence[nftjson.Expr]]]]) -> str:
        """Add rules (host -> [(chain, rule expressions)]) atomically per host; return a
        handle."""
        self._require_up()
        self._counter += 1
        handle = f"{kind}{self._counter}"
        added: List[_Rule] = []
        try:
            for host, chain_rules in rules.items():
                netns = self.host(host).netns
                echoed = self._nft(netns, [
                    nftjson.add_rule("inet", self.table, chain, expr, comment=handle)
                    for chain, expr in chain_rules])
                got = [_Rule(host, str(r["chain"]), int(r["handle"]))
                       for r in nftjson.rules_of(echoed)
                       if r.get("comment") == handle and "handle" in r]
                added.extend(got)
                if len(got) != len(chain_rules):
                    raise TopologyError(
                        f"nft in {netns} did not echo a handle for every rule of {handle}: "
                        f"{json.dumps(echoed)[:500]}"
                    )
        except BaseException:
            self._delete_rules(added)
            raise
        self._rules[handle] = added
        return handle

    def _delete_rules(self, rules: Sequence[_Rule]) -> None:
        """Remove rules by their handles: per host, those the table still holds (listed first,
        so that a rule already gone never fails the batch that removes the others)."""
        by_host: Dict[str, List[_Rule]] = {}
        for rule in rules:
            by_host.setdefault(rule.host, []).append(rule)
        for host, host_rules in by_host.items():
            netns = self.host(host).netns
            if not self._has_table(netns):
                continue
            there = {(str(r.get("chain")), r.get("handle"))
                     for r in nftjson.rules_of(self._nft_list(netns, "table", "inet",
                                                              self.table))}
            gone = [nftjson.delete_rule("inet", self.table, r.chain, r.nft_handle)
                    for r in host_rules if (r.chain, r.nft_handle) in there]
            if gone:
                self._nft(netns, gone)

    def rules_json(self, host: str) -> Dict[str, Any]:
        """The host's nftables table as ``nft -j list table`` gives it."""
        self._require_up()
        return self._nft_list(self.host(host).netns, "table", "inet", self.table)

    def rules(self, host: str) -> str:
        """The host's nftables table in nft's own text (what ``nft -a list table`` prints),
        rendered from its JSON (for reports and the diagnosis)."""
        return nftjson.render_table(self.rules_json(host))

    def _peer_addr(self, peer: str) -> str:
        if peer in self._hosts:
            return self._hosts[peer].addr
        try:
            return str(ipaddress.ip_address(peer))
        except ValueError:
            raise ValueError(
                f"peer must be a host of this topology or an IP address, got {peer!r}"
            ) from None

    def filter_rule(
        self,
        host: str,
        *,
        action: Action,
        direction: Direction,
        ports: Ports,
        proto: Proto = "tcp",
        peer: Optional[str] = None,
        new_only: Optional[bool] = None,
        counter: bool = False,
    ) -> str:
        """Drop or reject packets at a host; return a handle for :meth:`remove_rule`.

        ``direction="in"`` matches packets arriving at the host whose destination port is in
        ``ports`` (input chain); ``"out"`` matches packets the host sends to such a port
        (output chain). ``peer`` (a host name or IPv4 address) narrows the rule to packets
        from (in) or to (out) that peer. ``reject`` answers TCP with a reset and anything else
        with ICMP port-unreachable. ``new_only`` adds ``ct state new`` so that only new
        connections are hit and established ones keep working; by default it is on for
        ``{"except": [...]}`` (otherwise the replies of the excepted connections, which come
        back to ephemeral ports, would be dropped too) and off otherwise (so a rule cuts live
        connections as well). ``counter``: the rule counts the packets and bytes it matched
        (read back with :meth:`rule_counters`: a fault's evidence that it acted).
        """
        self._require_up()
        self.host(host)
        if action not in ("drop", "reject"):
            raise ValueError(f"action must be 'drop' or 'reject', got {action!r}")
        if direction not in ("in", "out"):
            raise ValueError(f"direction must be 'in' or 'out', got {direction!r}")
        if proto not in ("tcp", "udp"):
            raise ValueError(f"proto must be 'tcp' or 'udp', got {proto!r}")
        parts: List[nftjson.Expr] = []
        if peer is not None:
            paddr = self._peer_addr(peer)
            family = "ip6" if ":" in paddr else "ip"
            parts.append(nftjson.match(
                nftjson.payload(family, "saddr" if direction == "in" else "daddr"), paddr))
        match, is_except = _port_match(proto, ports)
        parts.append(match)
        if is_except if new_only is None else new_only:
            parts.append(nftjson.ct_state("new"))
        if counter:
            parts.append({"counter": None})
        if action == "drop":
            parts.append({"drop": None})
        elif proto == "tcp":
            parts.append({"reject": {"type": "tcp reset"}})
        else:
            parts.append({"reject": {"type": "icmpx", "expr": "port-unreachable"}})
        chain = "input" if direction == "in" else "output"
        return self._add_rules("fw", {host: [(chain, parts)]})

    def redirect(
        self,
        host: str,
        *,
        ports: Ports,
        in_port: int,
        out_port: int,
        mark: int,
    ) -> str:
        """Send the host's TCP connections to ``ports`` through a proxy listening in the host
        (nftables ``redirect``, in ``nat`` chains of the host's own table); returns a handle for
        :meth:`remove_rule`.

        Connections arriving at the host (prerouting) go to ``in_port``, connections the host
        opens (output, loopback ones included) to ``out_port``; the proxy finds where each was
        going with ``SO_ORIGINAL_DST``. Connections of sockets carrying firewall mark ``mark``
        (the proxy's own, on their way to the real destination) pass unchanged, as do
        connections to the proxy's two ports. NAT acts on a connection's first packet only:
        connections open before the rule keep their path.
        """
        self._require_up()
        net = self.host(host)
        for port in (in_port, out_port):
            _check_port(port)
        if isinstance(mark, bool) or not isinstance(mark, int) or not 0 < mark < 2**32:
            raise ValueError(f"mark must be an integer in 1..2**32-1, got {mark!r}")
        match, _ = _port_match("tcp", ports)
        own = nftjson.match(nftjson.payload("tcp", "dport"),
                            _ports_value(_port_list([in_port, out_port])), "!=")
        self._nft(net.netns, [
            nftjson.add_chain("inet", self.table, "nat_in", type="nat", hook="prerouting",
                              prio=-100),
            nftjson.add_chain("inet", self.table, "nat_out", type="nat", hook="output",
                              prio=-100),
        ])
        not_own = nftjson.match(nftjson.meta("mark"), mark, "!=")
        return self._add_rules(
            "redir",
            {
                host: [
                    ("nat_in", [match, own, {"redirect": {"port": in_port}}]),
                    ("nat_out", [not_own, match, own, {"redirect": {"port": out_port}}]),
                ]
            },
        )

    def rule_counters(self, host: str, handle: str,
                      chain: Optional[str] = None) -> Dict[str, int]:
        """The packets and bytes the rules behind ``handle`` (made with ``counter``) matched so
        far, summed over them (``chain``: only that chain's), read from the host's table (``nft
        -j list table``)."""
        self._require_up()
        rules = self._rules.get(handle)
        if rules is None:
            raise ValueError(f"no active rule {handle!r}; active: {sorted(self._rules)}")
        mine = {(r.chain, r.nft_handle) for r in rules
                if r.host == host and (chain is None or r.chain == chain)}
        listing = self._nft_list(self.host(host).netns, "table", "inet", self.table)
        return nftjson.counters_of(listing, mine)

    def remove_rule(self, host: str, handle: str) -> None:
        """Remove the rules behind a handle from :meth:`filter_rule` or :meth:`random_drop`."""
        self._require_up()
        rules = self._rules.get(handle)
        if rules is None:
            raise ValueError(f"no active rule {handle!r}; active: {sorted(self._rules)}")
        if any(rule.host != host for rule in rules):
            raise ValueError(f"rule {handle!r} does not belong to host {host!r}")
        self._delete_rules(rules)
        del self._rules[handle]

    def cut(self, group_a: Sequence[str], group_b: Sequence[str], counter: bool = False) -> str:
        """Cut every packet between the two groups (both ways, live connections too).

        Each host drops inbound packets from the other group's addresses, so senders see
        silence, not errors. Returns a handle for :meth:`heal`. ``counter``: each host's rule
        counts what it dropped (:meth:`rule_counters`).
        """
        self._require_up()
        if not self.link:
            raise ValueError("a cut needs a linked topology (several hosts or link=True)")
        a, b = list(group_a), list(group_b)
        if not a or not b:
            raise ValueError("both sides of a cut need at least one host")
        if set(a) & set(b):
            raise ValueError(f"hosts on both sides of a cut: {sorted(set(a) & set(b))}")
        for name in a + b:
            self.host(name)

        def drops(group: Sequence[str]) -> List[Tuple[str, List[nftjson.Expr]]]:
            out = []
            for family, attr in (("ip", "addr4"), ("ip6", "addr6")):
                found = [getattr(self._hosts[n], attr) for n in group]
                if all(found):
                    saddr = nftjson.match(nftjson.payload(family, "saddr"),
                                          found[0] if len(found) == 1 else found)
                    out.append(("input", [saddr, *([{"counter": None}] if counter else []),
                                          {"drop": None}]))
            return out

        rules: Dict[str, List[Tuple[str, List[nftjson.Expr]]]] = {}
        for name in a:
            rules[name] = drops(b)
        for name in b:
            rules[name] = drops(a)
        return self._add_rules("cut", rules)

    def heal(self, handle: str) -> None:
        """Remove a cut (or any other rule handle)."""
        self._require_up()
        rules = self._rules.pop(handle, None)
        if rules is None:
            raise ValueError(f"no active rule {handle!r}; active: {sorted(self._rules)}")
        self._delete_rules(rules)

    def random_drop(self, host: str, percent: float, direction: LossDirection = "both",
                    counter: bool = False) -> str:
        """Drop ``percent`` % of the packets on the host's link, at random; returns a handle.

        Uses ``numgen random mod 10000 < percent*100`` (0.01 % steps); 100 % is a plain drop.
        On a loopback-only host both directions are the same packets, so ``both`` compounds.
        ``counter``: each rule (chain ``input`` for in, ``output`` for out) counts the packets
        it dropped (:meth:`rule_counters`).
        """
        self._require_up()
        net = self.host(host)
        if isinstance(percent, bool) or not isinstance(percent, (int, float)):
            raise ValueError(f"percent must be a number, got {percent!r}")
        if not 0 <= percent <= 100:
            raise ValueError(f"percent must be within 0..100, got {percent!r}")
        if direction not in ("in", "out", "both"):
            raise ValueError(f"direction must be 'in', 'out' or 'both', got {direction!r}")
        threshold = round(percent * 100)
        verdict: List[nftjson.Expr] = [*([{"counter": None}] if counter else []),
                                       {"drop": None}]
        if threshold < 10000:
            verdict.insert(0, nftjson.match(
                {"numgen": {"mode": "random", "mod": 10000, "offset": 0}}, threshold, "<"))
        chain_rules: List[Tuple[str, List[nftjson.Expr]]] = []
        if direction in ("in", "both"):
            chain_rules.append(("input", [nftjson.match(nftjson.meta("iifname"), net.ifname),
                                          *verdict]))
        if direction in ("out", "both"):
            chain_rules.append(("output", [nftjson.match(nftjson.meta("oifname"), net.ifname),
                                           *verdict]))
        return self._add_rules("loss", {host: chain_rules})

    # ---- traffic control ------------------------------------------------------------------

    def _shaped_links(self, host: str, direction: LossDirection) -> List[Tuple[str, str]]:
        """(namespace, device) pairs whose egress carries the host's traffic that way."""
        net = self.host(host)
        if direction not in ("in", "out", "both"):
            raise ValueError(f"direction must be 'in', 'out' or 'both', got {direction!r}")
        if not self.link:
            return [(net.netns, "lo")]
        links = []
        if direction in ("out", "both"):
            links.append((net.netns, LINK_IFNAME))
        if direction in ("in", "both") and self.switch_netns:
            links.append((self.switch_netns, self._ports[host]))
        return links

    def rate_limit(
        self,
        host: str,
        rate: str,
        burst: Optional[str] = None,
        queue_bound: str = "400ms",
        direction: LossDirection = "out",
    ) -> None:
        """Limit the host's link with a ``tbf`` qdisc (replacing the root qdisc, over netlink).

        ``out`` shapes what the host sends (its ``eth0``), ``in`` what it receives (the
        bridge-side end of its veth, in the switch namespace). ``queue_bound`` (tbf's own
        keyword for it is "latency") bounds queueing; it adds no delay. ``burst`` defaults to
        16kb, or 80kb on loopback, whose 64 KiB packets tbf would otherwise drop. Values are
        written in tc's units (:func:`tc_rate`, :func:`tc_size`, :func:`tc_time`); the kernel
        gets the numbers ``tc qdisc replace ... tbf rate R burst B latency L`` would give it.
        """
        self._require_up()
        if burst is None:
            burst = "16kb" if self.link else "80kb"
        params = {"rate": tc_rate(rate), "burst": tc_size(burst),
                  "latency": tc_time(queue_bound)}
        def tbf(ipr: Any, dev: str) -> None:
            ipr.tc("replace", "tbf", _index(ipr, dev), **params)

        for netns, dev in self._shaped_links(host, direction):
            _in_netns(netns, f"limiting {dev} to {rate}", functools.partial(tbf, dev=dev))

    def rate_limit_stats(self, host: str,
                         direction: LossDirection = "out") -> List[Dict[str, Any]]:
        """The statistics of the root qdisc of each link :meth:`rate_limit` shapes that way, as
        the kernel keeps them (``tc -s qdisc``): ``{"link": "eth0", "way": "out", "kind": "tbf",
        "packets",
        "bytes", "drops", "overlimits", "requeues", "backlog", "qlen"}``; a link without a qdisc
        of the harness's has ``"kind": None`` and no numbers."""
        self._require_up()

        def read(ipr: Any, dev: str) -> Dict[str, Any]:
            q = _root_qdisc(ipr, _index(ipr, dev))
            if q is None:
                return {"link": dev, "kind": None}
            basic = dict(q.get_nested("TCA_STATS2", "TCA_STATS_BASIC") or {})
            queue = dict(q.get_nested("TCA_STATS2", "TCA_STATS_QUEUE") or {})
            old = dict(q.get_attr("TCA_STATS") or {})
            def num(d: Dict[str, Any], key: str, old_key: str) -> int:
                v = d.get(key)
                return int(v if v is not None else old.get(old_key) or 0)

            return {"link": dev, "kind": q.get_attr("TCA_KIND"),
                    "packets": num(basic, "packets", "packets"),
                    "bytes": num(basic, "bytes", "bytes"),
                    "drops": num(queue, "drops", "drop"),
                    "overlimits": num(queue, "overlimits", "overlimits"),
                    "requeues": num(queue, "requeues", "requeues"),
                    "backlog": num(queue, "backlog", "backlog"),
                    "qlen": num(queue, "qlen", "qlen")}

        return [{**(_in_netns(netns, f"reading the qdisc of {dev}",
                              functools.partial(read, dev=dev)) or {}),
                 "way": "in" if netns == self.switch_netns else "out" if self.link else "both"}
                for netns, dev in self._shaped_links(host, direction)]

    def clear_rate_limit(self, host: str, direction: LossDirection = "both") -> None:
        """Remove a limit set by :meth:`rate_limit` (no error if there is none)."""
        self._require_up()
        for netns, dev in self._shaped_links(host, direction):
            _clear_root_qdisc(netns, dev)

    def add_delay(self, host: str, delay_ms: float, jitter_ms: float = 0.0) -> None:
        """Delay what the host sends on its link with a ``netem`` qdisc (where the kernel has
        one: :func:`qdisc_missing`)."""
        self._require_up()
        net = self.host(host)
        params = {"delay": round(delay_ms * 1000), "jitter": round(jitter_ms * 1000)}  # µs
        _in_netns(net.netns, f"delaying {net.ifname} by {delay_ms:g} ms",
                  lambda ipr: ipr.tc("replace", "netem", _index(ipr, net.ifname), **params))

    def clear_delay(self, host: str) -> None:
        """Remove a delay set by :meth:`add_delay` (no error if there is none)."""
        self._require_up()
        net = self.host(host)
        _clear_root_qdisc(net.netns, net.ifname)

    # ---- extra interfaces ------------------------------------------------------------------

    def add_spare_link(self, host: str, ifname: str, up: bool = False,
                       link_local: bool = False) -> str:
        """A second interface on the host with an address of its own subnet (the harness's
        pool, routed by no link of the run: every host's is in the same subnet, and nothing
        joins them), left down unless ``up``: a NIC that is configured but has no carrier. It
        is one end of a veth pair whose other end (``<ifname>p``) stays in the same namespace
        (this kernel may lack the dummy link type), down, or with ``up`` up too (the card has
        carrier on a network where no other host is: ARP for a peer's address there is never
        answered); both go with the namespace. Returns its address. ``link_local`` (with
        ``up``): no address of the pool, only the IPv6 link-local one the kernel gives an
        interface that comes up (a card on a network with no DHCP and no router), returned once
        its duplicate address detection is over (a tentative address cannot be bound)."""
        self._require_up()
        net = self.host(host)
        index = list(self._hosts).index(host)
        addr = str(self.spare_network.network_address + 1 + index)
        def make(ipr: Any) -> None:
            ipr.link("add", ifname=ifname, kind="veth", peer={"ifname": f"{ifname}p"})
            index = _index(ipr, ifname)
            if not link_local:
                ipr.addr("add", index=index, address=addr,
                         prefixlen=self.spare_network.prefixlen)
            if up:
                ipr.link("set", index=_index(ipr, f"{ifname}p"), state="up")
                ipr.link("set", index=index, state="up")

        _in_netns(net.netns, f"adding the spare link {ifname}", make)
        if not link_local:
            return addr

        def settled(ipr: Any) -> Optional[str]:
            for a in ipr.get_addr(index=_index(ipr, ifname), family=socket.AF_INET6):
                if str(a.get_attr("IFA_ADDRESS") or "").startswith("fe80:") \
                        and not (a.get_attr("IFA_FLAGS") or a["flags"]) & IFA_F_TENTATIVE:
                    return str(a.get_attr("IFA_ADDRESS"))
            return None

        deadline = time.monotonic() + LINK_LOCAL_WAIT
        while True:
            found = _in_netns(net.netns, f"reading {ifname}'s link-local address", settled)
            if found:
                return found
            if time.monotonic() > deadline:
                raise TopologyError(f"{ifname} on host {host} had no usable IPv6 link-local "
                                    f"address {LINK_LOCAL_WAIT:g} s after it came up (is IPv6 "
                                    "disabled in the namespace?)")
            time.sleep(0.05)

    def count_link(self, host: str, ifname: str, family: str = "ipv4") -> str:
        """Count the IPv4 packets the host sends out of ``ifname`` (chain ``output``) and
        receives on it (chain ``input``), with two nft rules that only count (no verdict);
        returns a handle for :meth:`rule_counters` and :meth:`remove_rule`. IPv4 only: an
        interface that is up sends IPv6 neighbour and router messages of its own, which are not
        traffic of the run's programs. ``family="ipv6"``: IPv6 TCP packets only (a card with
        only a link-local address), for the same reason."""
        match = [nftjson.match(nftjson.meta("nfproto"), "ipv4")] if family == "ipv4" else \
            [nftjson.match(nftjson.meta("nfproto"), "ipv6"),
             nftjson.match(nftjson.meta("l4proto"), "tcp")]
        return self._add_rules("count", {host: [
            ("output", [nftjson.match(nftjson.meta("oifname"), ifname), *match,
                        {"counter": None}]),
            ("input", [nftjson.match(nftjson.meta("iifname"), ifname), *match,
                       {"counter": None}])]})

    def link_stats(self, host: str, ifname: str) -> Dict[str, Any]:
        """An interface of the host as the kernel has it: ``{"up": bool, "operstate": "UP",
        "addrs": [...], "rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "tx_dropped",
        "tx_errors"}`` (the link's own counters: every protocol, ARP included); ``{}`` when the
        host has no such interface."""
        self._require_up()

        def read(ipr: Any) -> Dict[str, Any]:
            links = ipr.link_lookup(ifname=ifname)
            if not links:
                return {}
            (link,) = ipr.get_links(links[0])
            stats = dict(link.get_attr("IFLA_STATS64") or link.get_attr("IFLA_STATS") or {})
            addrs = [a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(index=links[0])]
            out: Dict[str, Any] = {"up": bool(link["flags"] & 1),
                                   "operstate": link.get_attr("IFLA_OPERSTATE"),
                                   "addrs": [a for a in addrs if a]}
            for k in ("rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "tx_dropped",
                      "tx_errors"):
                out[k] = int(stats.get(k, 0))
            return out

        return dict(_in_netns(self.host(host).netns, f"reading the link {ifname}", read) or {})

    def snmp(self, host: str) -> Dict[str, int]:
        """Every counter of the host's ``/proc/net/snmp`` and ``netstat`` (``"Ip.OutNoRoutes"``,
        zeros included), read by a thread inside its namespace (:meth:`counters` keeps the few
        TCP ones a verdict needs)."""
        h = self.host(host)
        text = _in_netns_files(h.netns, "reading the kernel's counters", lambda: "".join(
            Path("/proc/thread-self/net", name).read_text() for name in ("snmp", "netstat")))
        return parse_counters(text, every=True)

    def remove_spare_link(self, host: str, ifname: str) -> None:
        """Remove a link made by :meth:`add_spare_link` (no error if it is gone)."""
        self._require_up()
        _delete_link(self.host(host).netns, ifname)

    # ---- name resolution ------------------------------------------------------------------

    def _etc_file(self, host: str, name: str, text: str, in_place: bool = False) -> Path:
        self._require_up()
        directory = NETNS_ETC_DIR / self.host(host).netns
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        path = directory / name
        if in_place and path.exists():
            # the same inode: processes that bind-mounted it (ip netns exec, the worker's
            # resolver view) see the new text at their next lookup; glibc rereads the file
            with open(path, "r+") as f:
                f.write(text)
                f.truncate()
        else:
            _write_text_atomically(path, text)
        return path

    def set_hosts_file(
        self,
        host: str,
        entries: Mapping[str, Union[str, Sequence[str]]],
        *,
        in_place: bool = False,
    ) -> Path:
        """Change the host's ``/etc/hosts`` in its resolver view. The file is the view's
        loopback lines, the host's own name (the machine's on 127.0.0.1 for a host without a
        name of its own, as today's machines have it), then every entry set so far on this host
        (the host's machine model, name faults): ``entries`` (name -> IP address or topology
        host name, or a list of them, one line each in that order; ``[]``: the name is
        unknown; the key ``harness.hostspec.MACHINE``: the machine's host name) replace what
        was set for those names. Addresses must be loopback or the run's own (its IPv4 /24,
        its IPv6 /64). Without ``in_place`` only processes started after this call (through
        :meth:`exec_prefix`) see it; with it, running ones see it too.
        """
        from .hostspec import MACHINE

        self.host(host)
        addrs: Dict[str, List[str]] = {}
        for name, targets in entries.items():
            if name == MACHINE:
                name = resolver.machine_hostname() or ""
                if not name:
                    raise ValueError("this machine's host name cannot go in a hosts file")
            if not isinstance(name, str) or not _HOSTNAME_RE.match(name):
                raise ValueError(f"not a host name for /etc/hosts: {name!r}")
            addrs[name] = []
            for target in [targets] if isinstance(targets, str) else list(targets):
                if target in self._hosts:
                    addrs[name].append(self._hosts[target].addr)
                    continue
                try:
                    ip = ipaddress.ip_address(target)
                except ValueError:
                    raise ValueError(
                        f"{name!r} must map to an IP address or a host of this "
                        f"topology, got {target!r}"
                    ) from None
                if not (ip.is_loopback or ip in self.network or ip in self.network6):
                    raise ValueError(
                        f"{name!r} -> {ip}: a hosts entry must be loopback or an address of "
                        f"this run ({self.network}, {self.network6})"
                    )
                addrs[name].append(str(ip))
        table = self._names.setdefault(host, {})
        for name, values in addrs.items():
            for old in [n for n in table if n.lower() == name.lower()]:
                del table[old]
            table[name] = values
        own = self._hostnames.get(host)
        return self._etc_file(
            host, "hosts",
            resolver.hosts_text(table, None if own else resolver.machine_hostname()), in_place
        )

    # ---- the host as a machine: its name, its kernel settings, its link ----------------------

    def uts_file(self, host: str) -> Path:
        """Where the host's own UTS namespace is pinned (a bind mount, as ``ip netns`` pins a
        network namespace), whether it has one or not."""
        return UTS_DIR / self.host(host).netns

    def set_hostname(self, host: str, name: str) -> None:
        """Give the host a name of its own: a UTS namespace pinned at :meth:`uts_file`, named
        ``name``; every process started through :meth:`exec_prefix` afterwards is in it (and
        sees ``name`` from gethostname()). The machine's own name does not change."""
        self._require_up()
        if not isinstance(name, str) or not _HOSTNAME_RE.match(name) or len(name) > 64:
            raise ValueError(f"not a host name: {name!r}")
        if host in self._hostnames:
            raise TopologyError(f"host {host!r} already has the name {self._hostnames[host]!r}")
        path = self.uts_file(host)
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        path.touch(mode=0o644)
        self._uts.append(path)
        _run(["unshare", f"--uts={path}", "hostname", name])
        self._hostnames[host] = name

    def hostname(self, host: str) -> Optional[str]:
        """The host's own name; None when it shares the machine's."""
        return self._hostnames.get(host)

    def set_sysctl(self, host: str, key: str, value: str) -> None:
        """Set a kernel setting of the host's own network namespace (a key of
        ``harness.hostspec.SYSCTL_KEYS``; nothing else of the machine changes)."""
        from .hostspec import sysctl_problem

        self._require_up()
        why = sysctl_problem(key, value)
        if why:
            raise ValueError(why)
        path = Path("/proc/sys", *key.split("."))
        text = f"{value}\n"

        def write() -> None:
            with open(path, "w") as f:
                f.write(text)

        # /proc/sys/net shows the namespace of the thread that opens it: written from inside
        _in_netns_files(self.host(host).netns, f"setting {key}", write)

    def sysctl(self, host: str, key: str) -> str:
        """A kernel setting as the host's namespace has it."""
        path = Path("/proc/sys", *key.split("."))
        return _in_netns_files(self.host(host).netns, f"reading {key}",
                               lambda: path.read_text().strip())

    def counters(self, host: str) -> Dict[str, int]:
        """The host's kernel TCP counters that say what happened on its network: listen queue
        overflows and drops, SYN retransmits, resets, failed connects (its namespace is new
        with the run: the counts are the run's). Only the non-zero ones. Read from
        ``/proc/thread-self/net`` by a thread inside the namespace."""
        h = self.host(host)
        text = _in_netns_files(h.netns, "reading the TCP counters", lambda: "".join(
            Path("/proc/thread-self/net", name).read_text() for name in ("snmp", "netstat")))
        return parse_counters(text)

    def set_mtu(self, host: str, mtu: int) -> None:
        """The MTU of the host's link interface (``eth0``, or ``lo`` for a host alone)."""
        self._require_up()
        if isinstance(mtu, bool) or not isinstance(mtu, int) or not 68 <= mtu <= 65535:
            raise ValueError(f"an MTU is an integer in 68..65535, got {mtu!r}")
        h = self.host(host)
        _in_netns(h.netns, f"setting the MTU of {h.ifname}",
                  lambda ipr: ipr.link("set", index=_index(ipr, h.ifname), mtu=mtu))

    def set_resolv_conf(self, host: str, lines: Sequence[str]) -> Path:
        """Change the host's ``/etc/resolv.conf`` in its resolver view (e.g.
        ``["nameserver 10.213.0.99"]``). glibc does not read it there (nsswitch says
        ``hosts: files``); programs with their own resolver do."""
        return self._etc_file(host, "resolv.conf", resolver.resolv_conf_text(lines))


    def set_nsswitch(self, host: str, text: str) -> Path:
        """Change the host's ``/etc/nsswitch.conf`` in its resolver view (e.g.
        ``resolver.nsswitch_text(dns=True)`` for a run with its own name server)."""
        return self._etc_file(host, "nsswitch.conf", text)

    def socket(self, host: str, family: int, kind: int) -> Any:
        """A socket made inside the host's network namespace (it stays there for its life):
        the supervisor's way to ask a service of the run on its own address. Made in a
        short-lived thread that enters the namespace (setns affects one thread only)."""
        import ctypes
        import socket as _socket
        import threading

        self._require_up()
        path = NETNS_RUN_DIR / self.host(host).netns
        made: List[Any] = []

        def make() -> None:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    if libc.setns(fd, 0x40000000) != 0:   # CLONE_NEWNET
                        made.append(OSError(ctypes.get_errno(), f"setns {path}"))
                        return
                finally:
                    os.close(fd)
                made.append(_socket.socket(family, kind))
            except OSError as exc:
                made.append(exc)

        t = threading.Thread(target=make, name=f"netns-socket-{host}")
        t.start()
        t.join()
        if isinstance(made[0], BaseException):
            raise TopologyError(f"cannot make a socket in {path}: {made[0]}")
        return made[0]


# --------------------------------------------------------------------------------------------
# counters

def parse_counters(text: str, every: bool = False) -> Dict[str, int]:
    """``/proc/net/snmp`` and ``/proc/net/netstat`` (header line, value line per protocol) ->
    the non-zero counters of ``harness.hostspec.COUNTERS``: ``{"TcpExt.ListenOverflows": 3}``
    (``every``: all of them, zeros included)."""
    from .hostspec import COUNTERS


    out: Dict[str, int] = {}
    lines = text.splitlines()
    for head, values in zip(lines, lines[1:]):
        h, v = head.split(), values.split()
        if not h or not v or h[0] != v[0] or not h[0].endswith(":") or h == v:
            continue
        proto = h[0][:-1]
        for name, value in zip(h[1:], v[1:]):
            key = f"{proto}.{name}"
            if not value.lstrip("-").isdigit():
                continue
            if every or (key in COUNTERS and int(value) != 0):
                out[key] = int(value)
    return out


# --------------------------------------------------------------------------------------------
# leftovers and capabilities


def sweep(prefix: str = PREFIX) -> List[str]:
    """Remove namespaces (and /etc/netns dirs, state files) of runs whose owner is dead.

    A namespace with the prefix survives only if a state file with a live owner lists it.
    Processes still inside a removed namespace are killed. Returns the removed namespaces.
    """
    if not _PREFIX_RE.match(prefix):
        raise ValueError(f"bad prefix {prefix!r}")
    # Look at what exists before reading the owners: anything made after this point has its
    # state file written first, so it is either unseen here or seen with its owner below.
    existing = [ns for ns in _list_netns() if ns.startswith(prefix)]
    try:
        etc_dirs = [p for p in NETNS_ETC_DIR.iterdir() if p.name.startswith(prefix)]
    except FileNotFoundError:
        etc_dirs = []
    try:
        uts_files = [p for p in UTS_DIR.iterdir() if p.name.startswith(prefix)]
    except FileNotFoundError:
        uts_files = []
    live: Set[str] = set()
    dead_files: List[Path] = []
    try:
        state_files = sorted(STATE_DIR.glob(f"{prefix}*.json"))
    except OSError:
        state_files = []
    for path in state_files:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            dead_files.append(path)
            continue
        if not isinstance(data, dict) or data.get("prefix") != prefix:
            continue
        if _owner_alive(data.get("owner") or {}):
            live.update(str(ns) for ns in data.get("namespaces", []))
        else:
            dead_files.append(path)
    removed: List[str] = []
    failures: List[str] = []
    for netns in existing:
        if netns not in live:
            try:
                _delete_netns(netns)
                removed.append(netns)
            except (TopologyError, OSError) as exc:
                failures.append(str(exc))
    for directory in etc_dirs:
        if directory.name not in live:
            shutil.rmtree(directory, ignore_errors=True)
    for pinned in uts_files:
        if pinned.name not in live:
            try:
                _unpin(pinned)
            except OSError as exc:
                failures.append(str(exc))
    for path in dead_files:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
    if failures:
        raise TopologyError(f"sweep removed {removed} but failed on:\n" + "\n".join(failures))
    return removed


# what a qdisc is tried with (the options its kind cannot do without)
_PROBE_PARAMS: Dict[str, Dict[str, int]] = {
    "netem": {"delay": 1000},                                      # 1 ms, in µs
    "tbf": {"rate": 125_000, "burst": 16_384, "latency": 400_000},  # 1mbit, 16kb, 400ms
}


def qdisc_missing(kind: str) -> Optional[str]:
    """Whether this kernel has the ``kind`` qdisc (tried on ``lo`` of a scratch namespace, over
    netlink); None if it does, else what the kernel answered."""
    if missing():
        return "; ".join(missing())
    netns = f"{PREFIX}probe{os.getpid()}"
    try:
        _add_netns(netns)
    except TopologyError as exc:
        return f"could not make a scratch namespace to try it: {exc}"
    params = _PROBE_PARAMS.get(kind, {})
    try:
        _in_netns(netns, f"adding a {kind} qdisc",
                  lambda ipr: ipr.tc("add", kind, _index(ipr, "lo"), **params))
        return None
    except TopologyError as exc:
        cause = exc.__cause__
        if isinstance(cause, NetlinkError):   # ENOENT: no such qdisc kind in this kernel
            said = f"{errno.errorcode.get(cause.code, cause.code)}: {os.strerror(cause.code)}"
        else:
            said = str(cause if cause is not None else exc)
        return f"the {kind} qdisc is missing (the kernel answered {said})"
    except (KeyError, ValueError, TypeError) as exc:   # a kind pyroute2 cannot encode
        return f"the {kind} qdisc cannot be asked for here: {exc!r}"
    finally:
        _delete_netns(netns)


def _effective_caps() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def capabilities() -> Dict[str, Any]:
    """What this process has for topologies: root, capabilities and the paths of the tools."""
    caps = _effective_caps()
    return {
        "root": os.geteuid() == 0,
        "cap_net_admin": bool(caps >> _CAP_NET_ADMIN & 1),
        "cap_sys_admin": bool(caps >> _CAP_SYS_ADMIN & 1),
        "ip": _tool("ip"),
        "nft": _tool("nft"),
    }


def missing() -> List[str]:
    """What stops topology scenarios from running here, one sentence each; empty if nothing."""
    caps = capabilities()
    problems = []
    if not caps["root"]:
        problems.append(f"not running as root (euid {os.geteuid()}): network namespaces need root")
    if not caps["cap_net_admin"]:
        problems.append(
            "no CAP_NET_ADMIN in the effective capabilities: cannot configure "
            "interfaces or nftables (a container needs --cap-add NET_ADMIN)"
        )
    if not caps["cap_sys_admin"]:
        problems.append(
            "no CAP_SYS_ADMIN in the effective capabilities: network namespaces cannot "
            "be pinned (mounted) (a container needs --cap-add SYS_ADMIN)"
        )
    if caps["ip"] is None:
        problems.append("ip not found: apt-get install iproute2")
    if caps["nft"] is None:
        problems.append("nft not found: apt-get install nftables")
    return problems

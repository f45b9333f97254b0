"""Topology: the hosts of one harness run, made of Linux network namespaces, and their faults.

This module and its parts own everything a run does to the network: one network namespace per
scenario host, links between them, network changes (filter rules, cuts, random drops, rate
limits, each host's resolver view in ``/etc/netns``), and the removal of all of it. It never
configures anything in the root network namespace: no interface, no bridge, no nftables table
there. Namespaces, links, addresses and qdiscs are made over netlink with pyroute2, from a
short-lived thread that entered the namespace (or unshared a new one: no fork of the
supervisor); namespaces are pinned under ``/run/netns`` as ``ip netns add`` pins them
(pyroute2's ``netns.attach``/``netns.remove``), so that commands run in a host with ``ip netns
exec`` (which also mounts its resolver view from ``/etc/netns``). Kernel files that show the
opener's namespace (``/proc/sys/net``, ``/proc/thread-self/net/snmp``) are read and written
from such a thread too. It needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN); see :func:`missing`.
nftables is driven through its JSON interface only (``nft -j``, :mod:`harness.net.nft`);
:meth:`Topology.rules` renders ``nft -j list table`` back to the text ``nft -a list table``
prints, for reports and the diagnosis. No program's human-readable output is parsed here.

Parts
-----
:class:`Topology` is composed of one part per concern, each its own module under
``harness/net/``:

* :mod:`harness.net.netns`: the plumbing: named namespaces, the threads and commands that act
  in them, the owner record (module functions);
* :mod:`harness.net.addresses`: the hosts' names and addresses (:func:`layout`, pure), and
  what every part shares (``TopologyBase``);
* :mod:`harness.net.links`: the bridge, the veths, spare links, the MTU (``Links``);
* :mod:`harness.net.firewall`: the nftables tables and every rule (``Firewall``);
* :mod:`harness.net.qdiscs`: rate limits and delays, tc's units (``Qdiscs``);
* :mod:`harness.net.hostconf`: each host as a machine: resolver files, its own name,
  sysctls, counters (``HostConf``).

This module keeps the life cycle (make, tear down, sweep) and what a run asks of the machine
(:func:`missing`, :func:`qdisc_missing`); every name imported from it before the split still is.

Layout
------
* Names: host ``h`` of run ``r`` lives in namespace ``thx-<r>-<h>``; a multi-host run also has
  a switch namespace ``thx-<r>.sw``. Run ids may not contain ``-`` or ``.`` and host names may not
  contain ``.``, so names of different runs never collide. Namespace names are not interface
  names; the interfaces are short fixed names (``eth0``, ``br0``, ``p<i>``), unique per
  namespace, so the 15-character interface limit never depends on the run id.
* Single host (``Topology(r, ["local"])``): one namespace, only ``lo`` up; the host's address is
  ``127.0.0.1`` and its ``ifname`` is ``lo``. This gives a run private ports and nothing else.
* Several hosts: a bridge in the switch namespace and a veth pair per host
  (:mod:`harness.net.links`); addresses from the run's own /24 and, with ``ip`` ``"6"`` or
  ``"dual"``, its unique local /64 (:mod:`harness.net.addresses`). ``ip`` picks the families:
  ``"4"`` (default) IPv4 only; ``"6"`` IPv6 only (no IPv4 address on the link); ``"dual"``
  both. ``lo`` is up in every namespace (``::1`` included). Faults match the families the
  hosts have (``ip``/``ip6`` in nftables).
* Each host namespace gets one nftables table ``inet thx`` (:mod:`harness.net.firewall`).

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
Filter rules, cuts and random drops: :mod:`harness.net.firewall`; rate limits and delays
(``netem``, where the kernel has it: :func:`qdisc_missing`): :mod:`harness.net.qdiscs`; a
host's names, own name, sysctls and MTU: :mod:`harness.net.hostconf` and
:mod:`harness.net.links`.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Dict, List, Optional, Sequence, Set, Type

from pyroute2 import NetlinkError

from . import resolver
from .addresses import BRIDGE_IFNAME, LINK_IFNAME, HostNet, layout
from .firewall import Firewall, Ports
from .hostconf import HostConf
from .hostconf import parse_counters as parse_counters
from .links import Links
from .netns import (
    _PREFIX_RE,
    NETNS_ETC_DIR,
    NETNS_RUN_DIR,
    PREFIX,
    STATE_DIR,
    UTS_DIR,
    TopologyError,
    _add_netns,
    _create_json_exclusively,
    _delete_link,
    _delete_netns,
    _in_netns,
    _index,
    _list_netns,
    _owner_alive,
    _owner_record,
    _tool,
    _unpin,
)
from .netns import _netns_pids as _netns_pids
from .qdiscs import Qdiscs
from .qdiscs import _root_qdisc as _root_qdisc
from .qdiscs import tc_rate as tc_rate
from .qdiscs import tc_size as tc_size
from .qdiscs import tc_time as tc_time

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

_CAP_NET_ADMIN = 12
_CAP_SYS_ADMIN = 21


# --------------------------------------------------------------------------------------------
# the topology


class Topology(Firewall, Qdiscs, Links, HostConf):
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
        placed = layout(run_id, hosts, subnet=subnet, link=link, prefix=prefix, ip=ip,
                        service_hosts=service_hosts)
        self.run_id = run_id
        self.prefix = prefix
        self.link = placed.link
        self.table = prefix.rstrip("-")
        self.state_file = STATE_DIR / f"{prefix}{run_id}.json"
        self.switch_netns = f"{prefix}{run_id}.sw" if self.link else None
        self.network = placed.network
        self.spare_network = placed.spare_network
        self.network6 = placed.network6
        self.ip = ip
        self._hosts = placed.hosts
        self._ports = placed.ports   # host -> switch-side veth name
        self._entered = False
        self._closed = False
        self._made: List[str] = []  # namespaces this object created, in order
        self._state_written = False
        self._rules = {}
        self._counter = 0
        self._names = {}       # host -> its hosts file's entries
        self._hostnames = {}   # host -> its own name
        self._uts = []         # pinned UTS namespaces

    # ---- where a host's processes run -----------------------------------------------------

    def exec_prefix(self, host: str) -> List[str]:
        """Argv prefix that runs a command inside the host's namespace (``ip`` as absolute path
        when found), and in its UTS namespace when it has a name of its own."""
        ns = [_tool("ip") or "ip", "netns", "exec", self.host(host).netns]
        if host in self._hostnames:
            return [_tool("nsenter") or "nsenter", f"--uts={self.uts_file(host)}", *ns]
        return ns

    def host_entry(self, host: str) -> Dict[str, Optional[str]]:
        """What :meth:`exec_prefix` enters, for a process that enters it by itself (a warm fork
        server forked outside every host, ``harness.ranks.forkserver.enter_host``): the network
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
        self._make_links()
        self._add_tables()
        for host in self._hosts.values():
            # every process started in the host (ip netns exec) resolves with the harness's
            # resolver view: loopback names only, no DNS
            resolver.write_view(NETNS_ETC_DIR / host.netns)

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

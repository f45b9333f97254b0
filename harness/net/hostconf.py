"""A topology's hosts as whole machines: each host's resolver view (``/etc/netns/<ns>/``), its
own name (a UTS namespace), its kernel's network settings (sysctls) and counters.

Every host namespace gets the harness's resolver view (:mod:`harness.net.resolver`) in
``/etc/netns/<ns>/``: ``hosts`` (loopback names and the machine's host name only),
``nsswitch.conf`` (``hosts: files``: no DNS) and ``resolv.conf`` (``nameserver 127.0.0.1``).
``ip netns exec`` bind-mounts them over ``/etc`` when a process starts, so change them
(:meth:`HostConf.set_hosts_file`, :meth:`HostConf.set_resolv_conf`) before starting the
processes that should see the change. A host's hosts-file entries accumulate (each change
replaces the lines of the names it gives).

:meth:`HostConf.set_hostname` gives a host a name of its own: a UTS namespace pinned at
``/run/thx/uts/<namespace>`` (a bind mount, as ``ip netns`` pins network namespaces) that
:meth:`harness.net.topology.Topology.exec_prefix` enters with ``nsenter --uts`` in front of
``ip netns exec``; teardown and the sweep unmount and remove pins. :meth:`HostConf.set_sysctl`
writes a key of the host's own network namespace (``harness.net.hostspec.SYSCTL_KEYS``),
:meth:`HostConf.counters` reads its kernel's TCP counters: files that show the opener's
namespace, read and written by a thread inside it.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Union

from . import resolver
from .addresses import TopologyBase
from .netns import (
    NETNS_ETC_DIR,
    UTS_DIR,
    TopologyError,
    _in_netns_files,
    _run,
    _write_text_atomically,
)

_HOSTNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,252}$")


class HostConf(TopologyBase):
    """The hosts-as-machines part of a Topology: resolver files, own names, sysctls, counters."""

    _names: Dict[str, Dict[str, List[str]]]   # host -> its hosts file's entries
    _hostnames: Dict[str, str]                # host -> its own name
    _uts: List[Path]                          # pinned UTS namespaces

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
        unknown; the key ``harness.net.hostspec.MACHINE``: the machine's host name) replace what
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

    def set_resolv_conf(self, host: str, lines: Sequence[str]) -> Path:
        """Change the host's ``/etc/resolv.conf`` in its resolver view (e.g.
        ``["nameserver 10.213.0.99"]``). glibc does not read it there (nsswitch says
        ``hosts: files``); programs with their own resolver do."""
        return self._etc_file(host, "resolv.conf", resolver.resolv_conf_text(lines))


    def set_nsswitch(self, host: str, text: str) -> Path:
        """Change the host's ``/etc/nsswitch.conf`` in its resolver view (e.g.
        ``resolver.nsswitch_text(dns=True)`` for a run with its own name server)."""
        return self._etc_file(host, "nsswitch.conf", text)

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
        ``harness.net.hostspec.SYSCTL_KEYS``; nothing else of the machine changes)."""
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

    def snmp(self, host: str) -> Dict[str, int]:
        """Every counter of the host's ``/proc/net/snmp`` and ``netstat`` (``"Ip.OutNoRoutes"``,
        zeros included), read by a thread inside its namespace (:meth:`counters` keeps the few
        TCP ones a verdict needs)."""
        h = self.host(host)
        text = _in_netns_files(h.netns, "reading the kernel's counters", lambda: "".join(
            Path("/proc/thread-self/net", name).read_text() for name in ("snmp", "netstat")))
        return parse_counters(text, every=True)


# --------------------------------------------------------------------------------------------
# counters

def parse_counters(text: str, every: bool = False) -> Dict[str, int]:
    """``/proc/net/snmp`` and ``/proc/net/netstat`` (header line, value line per protocol) ->
    the non-zero counters of ``harness.net.hostspec.COUNTERS``: ``{"TcpExt.ListenOverflows": 3}``
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



"""The hosts of a run's network and their addresses (pure: nothing is made here).

:func:`layout` checks what a :class:`harness.net.topology.Topology` is asked for (the run id,
the hosts, the subnet, the address families) and places each host: its namespace's name, its
link interface and its addresses. Several hosts get ``.1``, ``.2``, ... of one /24 picked from
``subnet`` by a hash of the run id, and with ``ip`` 6 or dual ``::1``, ``::2``... of a unique
local /64 of the run (``fd74:6878:<crc of the run id>::/64``, RFC 4193: never routed); the
hosts of the run's services get the last addresses (.254, ::fe downwards). A host alone has
``127.0.0.1`` (``::1``) on ``lo``. :class:`TopologyBase` is what every part of a Topology
shares: its hosts, their namespaces and addresses, and whether it is up.
"""

from __future__ import annotations

import ipaddress
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .netns import _PREFIX_RE

LOOPBACK_ADDR = "127.0.0.1"
IP_FAMILIES = ("4", "6", "dual")
ULA_PREFIX = "fd74:6878"    # "thx": the harness's unique local addresses, fd74:6878:<run>::/64
LINK_IFNAME = "eth0"
BRIDGE_IFNAME = "br0"
# the variables that name the interface gloo and NCCL bind to: the harness sets them to a host's
# link (harness.run.plan.Plan.link_env), faults unset or bend them, the reports name them
IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
MAX_HOSTS = 253

_RUN_ID_RE = re.compile(r"^[A-Za-z0-9_]{1,24}$")
_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,15}$")


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
class Layout:
    """Where the hosts of one topology are: whether they are linked, the run's networks, each
    host's :class:`HostNet` (in the order given, the services' last) and the name of its
    switch-side veth (linked hosts only)."""

    link: bool
    network: ipaddress.IPv4Network
    spare_network: ipaddress.IPv4Network   # the pool's next block: spare links' addresses
    network6: ipaddress.IPv6Network
    hosts: Dict[str, HostNet]
    ports: Dict[str, str]


def _check_names(run_id: str, hosts: Sequence[str], prefix: str, ip: str) -> List[str]:
    """The host names, once the run id, the prefix and the families are checked."""
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
    return names


def _subnet(subnet: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.ip_network(subnet, strict=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"subnet {subnet!r} is not a network: {exc}") from exc
    if not isinstance(net, ipaddress.IPv4Network) or net.prefixlen > 24:
        raise ValueError(f"subnet must be an IPv4 network of /24 or larger, got {subnet!r}")
    if net.is_loopback or net.is_multicast or net.is_unspecified or net.is_reserved:
        raise ValueError(f"subnet {subnet!r} is loopback, multicast or reserved")
    return net


def layout(run_id: str, hosts: Sequence[str], *, subnet: str, link: Optional[bool],
           prefix: str, ip: str, service_hosts: Sequence[str]) -> Layout:
    """Check a topology's arguments (ValueError naming the first thing wrong) and place its
    hosts. ``link`` None: linked when there are several hosts."""
    names = _check_names(run_id, hosts, prefix, ip)
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
    net = _subnet(subnet)

    linked = len(names) > 1 if link is None else bool(link)
    blocks = list(net.subnets(new_prefix=24)) if net.prefixlen < 24 else [net]
    pick = zlib.crc32(run_id.encode()) % len(blocks)
    network: ipaddress.IPv4Network = blocks[pick]
    # the pool's next block: addresses of spare links, a subnet no link of the run routes
    spare_network: ipaddress.IPv4Network = blocks[(pick + 1) % len(blocks)]
    # a unique local /64 (RFC 4193, fd00::/8) of the run: never routed, never outside
    crc = zlib.crc32(run_id.encode())
    network6 = ipaddress.IPv6Network(f"{ULA_PREFIX}:{crc >> 16:04x}:{crc & 0xFFFF:04x}::/64")
    placed: Dict[str, HostNet] = {}
    ports: Dict[str, str] = {}  # host -> switch-side veth name
    first_service = len(names) - len(services)
    for index, name in enumerate(names):
        if linked:
            n = index + 1 if index < first_service else 254 - (index - first_service)
            addr4 = str(network.network_address + n)
            addr6 = str(network6.network_address + n)
            ifname = LINK_IFNAME
            ports[name] = f"p{index}"
        else:
            addr4, addr6, ifname = LOOPBACK_ADDR, "::1", "lo"
        addr4 = "" if ip == "6" else addr4
        addr6 = "" if ip == "4" else addr6
        placed[name] = HostNet(
            name=name, netns=f"{prefix}{run_id}-{name}", ifname=ifname,
            addr=addr6 if ip == "6" else addr4, addr4=addr4, addr6=addr6,
        )
    return Layout(link=linked, network=network, spare_network=spare_network,
                  network6=network6, hosts=placed, ports=ports)


class TopologyBase:
    """What every part of a Topology (its firewall, qdiscs, links, the hosts as machines)
    shares: the run's names and networks, the hosts, and whether it is up. Set by
    :class:`harness.net.topology.Topology`'s constructor."""

    run_id: str
    prefix: str
    link: bool
    table: str                      # the nftables table of every host: the prefix, no dash
    state_file: Path
    switch_netns: Optional[str]
    network: ipaddress.IPv4Network
    spare_network: ipaddress.IPv4Network
    network6: ipaddress.IPv6Network
    ip: str
    _hosts: Dict[str, HostNet]
    _ports: Dict[str, str]          # host -> switch-side veth name
    _entered: bool
    _closed: bool

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

    def _require_up(self) -> None:
        if not self._entered or self._closed:
            raise RuntimeError("the topology is not up: use it inside its `with` block")

"""A topology's links: the bridge that joins several hosts, each host's veth pair, spare
interfaces a fault adds, the MTU, and the links' state as the kernel has it; all over netlink
(pyroute2, from a thread inside the namespace).

Several hosts: the switch namespace holds a Linux bridge ``br0``; each host gets a veth pair,
``eth0`` inside its own namespace and ``p<i>`` in the switch namespace, enslaved to the bridge.
IPv6 address generation is off on every link (``addrgenmode none``), so gloo cannot pick a
link-local v6 address; the hosts' IPv6 addresses skip duplicate address detection (usable at
once).
"""

from __future__ import annotations

import functools
import os
import socket
import time
from typing import Any, Dict, Optional

from .addresses import BRIDGE_IFNAME, LINK_IFNAME, HostNet, TopologyBase
from .netns import NETNS_RUN_DIR, TopologyError, _delete_link, _in_netns, _index

IFA_F_TENTATIVE = 0x40      # an IPv6 address still in duplicate address detection
LINK_LOCAL_WAIT = 5.0       # s for a link-local address to settle (DAD: ~1 s on this kernel)
# IFLA_AF_SPEC for ``addrgenmode none``: no IPv6 link-local address on the link
_NO_ADDRGEN = {"attrs": [("AF_INET6", {"attrs": [("IFLA_INET6_ADDR_GEN_MODE", 1)]})]}
_IFA_F_NODAD = 0x02


class Links(TopologyBase):
    """The link part of a Topology: the bridge and the hosts' veths, spare links, the MTU."""

    def _make_links(self) -> None:
        """The bridge in the switch namespace and each host's veth pair on it (linked
        topologies; nothing for a host alone)."""
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

    def remove_spare_link(self, host: str, ifname: str) -> None:
        """Remove a link made by :meth:`add_spare_link` (no error if it is gone)."""
        self._require_up()
        _delete_link(self.host(host).netns, ifname)

    def set_mtu(self, host: str, mtu: int) -> None:
        """The MTU of the host's link interface (``eth0``, or ``lo`` for a host alone)."""
        self._require_up()
        if isinstance(mtu, bool) or not isinstance(mtu, int) or not 68 <= mtu <= 65535:
            raise ValueError(f"an MTU is an integer in 68..65535, got {mtu!r}")
        h = self.host(host)
        _in_netns(h.netns, f"setting the MTU of {h.ifname}",
                  lambda ipr: ipr.link("set", index=_index(ipr, h.ifname), mtu=mtu))


"""second_nic: a second network card on hosts, on a network the other hosts are not on.

A node with two cards, the second one on a management or storage network its peers do not
share: each chosen host gets ``name`` (eth1) with an address of a subnet of the run's that no
link joins (the same subnet on every host, so a peer's address there looks on-link, and its
ARP is never answered). ``up`` (the default): the card has carrier; else it is configured and
down. ``address: link_local``: no address given at all, only the IPv6 link-local one the
kernel makes when the card comes up (a card on a network with no DHCP and no router). What
points gloo or NCCL at it is the scenario's own: ``GLOO_SOCKET_IFNAME: eth1`` in
``env:``, the Slurm launcher's ``interface: eth1`` (its task script exports it), or a list in
``wrong_interface``'s list modes."""

from typing import List, Literal, Optional

from pydantic import Field

from ..core.limits import MAX_HOSTS, MAX_NAME
from ..core.triggers import Trigger
from ..machine.requirement import NAMESPACES
from . import Fault
from .wrong_interface import SpareLink


class SecondNic(Fault):
    kind: Literal["second_nic"] = "second_nic"
    summary = "a second network card on hosts, on a network where no other host is"
    HINTS = ("a node with two network cards",)
    needs_netns = True
    REQUIRES = (NAMESPACES,)
    hosts: Optional[List[str]] = Field(None, max_length=MAX_HOSTS,
                                       description="the hosts that get it (default: every host)")
    name: str = Field("eth1", pattern=r"^[A-Za-z0-9_.:-]{1,14}$",
                      description="its interface name (1-14 of [A-Za-z0-9_.:-]: the veth's other "
                      "end is this name + 'p'); not eth0 (the host's link) nor lo")
    up: bool = Field(True, description="true: up, with carrier; false: configured and down")
    address: Literal["subnet", "link_local"] = Field(
        "subnet", description="subnet: an IPv4 address of a subnet no other host is on; "
        "link_local: no address given, only the IPv6 link-local one the kernel makes when the "
        "card comes up (a network with no DHCP and no router; needs up)")

    def check(self, scn):
        problems = super().check(scn)
        for i, h in enumerate(self.hosts or []):
            if len(h) > MAX_NAME or h not in scn.host_names():
                problems.append((("hosts", i), f"no host {h[:40]!r} (hosts: "
                                               f"{', '.join(scn.host_names())})"))
        if self.address == "link_local" and not self.up:
            problems.append((("address",), "link_local: the kernel gives a card its "
                                           "link-local address only when it comes up: "
                                           "leave up true"))
        if self.name in ("eth0", "lo"):
            problems.append((("name",), f"{self.name} is the host's own "
                                        f"{'link' if self.name == 'eth0' else 'loopback'}: "
                                        "give the second card another name (eth1)"))
        return problems

    def apply(self, plan, scn):
        hosts = self.hosts or [h.name for h in plan.hosts]
        for host in hosts:
            plan.add_step(self, SpareLink(host=host, ifname=self.name, up=self.up,
                                          link_local=self.address == "link_local",
                                          trigger=Trigger.setup(), target=f"host {host}"))
        where = "with only an IPv6 link-local address" if self.address == "link_local" \
            else "on a network no other host is on"
        plan.notes.append(f"second_nic: {self.name} ({'up' if self.up else 'down'}) on "
                          f"{', '.join(hosts)}, {where}")

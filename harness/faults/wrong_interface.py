"""wrong_interface: GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME unset, missing, wrong, or a list
with one bad entry (a missing interface, a wrong one, or a NIC that is configured but down)."""

from dataclasses import dataclass, field
from typing import List, Literal, Optional

from pydantic import Field

from ..core.limits import MAX_WORLD
from ..core.triggers import Trigger
from ..net.addresses import IFNAME_VARS
from . import Fault
from ._net import NetStep
from .steps import Effect

SPARE_IFNAME = "eth1"


@dataclass
class SpareLink(NetStep):
    """A second interface on a host, with an address of a subnet of the run's that no link
    joins, left down (or ``up``, with carrier); it goes with the host's namespace.

    Its effect, read at the end of the run: the interface as the kernel has it (up or down,
    its address, its own packet counters) and whether the run's traffic took it. Up: the IPv4
    packets the host sent out of it or received on it (nft counters that only count; the
    connects of a rank that dials a peer's address there leave by it, and are never answered).
    Down: no packet can take it; a connect towards its subnet finds no route, so the evidence is
    the host's ``Ip OutNoRoutes`` counter since the card was added (the namespace's own, whose
    only other unrouted destinations would be addresses outside the run's networks)."""

    host: str = ""
    ifname: str = SPARE_IFNAME
    up: bool = False
    link_local: bool = False     # only the kernel's IPv6 link-local address (with up)
    _handle: Optional[str] = field(default=None, init=False, repr=False, compare=False)
    _noroutes: Optional[int] = field(default=None, init=False, repr=False, compare=False)

    def do(self, rt):
        addr = rt.net.add_spare_link(self.host, self.ifname, up=self.up,
                                     link_local=self.link_local)
        self._handle = rt.net.count_link(self.host, self.ifname,
                                         "ipv6" if self.link_local else "ipv4")
        self._noroutes = rt.net.snmp(self.host).get("Ip.OutNoRoutes")
        return {"addr": addr}

    def undo(self, rt):
        if self._handle is not None:
            rt.net.remove_rule(self.host, self._handle)
            self._handle = None
        rt.net.remove_spare_link(self.host, self.ifname)

    def effect(self, rt):
        link = rt.net.link_stats(self.host, self.ifname)
        if not link:
            raise RuntimeError(f"host {self.host} has no {self.ifname} any more")
        if self._handle is None:
            raise RuntimeError(f"the counters of {self.ifname} were removed with it")
        out = rt.net.rule_counters(self.host, self._handle, chain="output")["packets"]
        inn = rt.net.rule_counters(self.host, self._handle, chain="input")["packets"]
        noroutes = rt.net.snmp(self.host).get("Ip.OutNoRoutes")
        missed = None if noroutes is None or self._noroutes is None \
            else noroutes - self._noroutes
        state = "up" if link["up"] else "down"
        fam = "IPv6 TCP" if self.link_local else "IPv4"
        addr = ", ".join(a for a in link["addrs"] if self.link_local
                         or not a.startswith("fe80:")) or "no address"
        if self.link_local:
            addr = f"only the link-local {addr}"
        key = "ipv6_tcp" if self.link_local else "ipv4"
        numbers = {f"{key}_out": out, f"{key}_in": inn, "tx_packets": link["tx_packets"],
                   "rx_packets": link["rx_packets"]}
        if missed is not None:
            numbers["no_route"] = missed
        took = f"{out} {fam} packet{'s' * (out != 1)} sent out of it, {inn} received"
        if link["up"]:
            acted = out + inn > 0
            summary = f"{self.ifname} ({addr}) up on host {self.host}: {took}"
        else:
            acted = bool(missed)
            summary = (f"{self.ifname} ({addr}) down on host {self.host}: {took}; "
                       f"{'?' if missed is None else missed} send{'s' * (missed != 1)} on the "
                       "host found no route "
                       "(Ip OutNoRoutes since it was added)")
        return Effect(acted=acted, summary=summary, numbers=numbers,
                      events=[{"t": round(rt.now(), 3),
                               "what": f"{self.ifname} read at the end of the run: {state}, "
                                       f"{addr}, link counters tx {link['tx_packets']} rx "
                                       f"{link['rx_packets']} packets; {took}"}])

    def describe(self):
        return f"add {self.ifname} ({'up' if self.up else 'down'}" + (
            ", link-local only" if self.link_local else "") + f") on {self.host}"


class WrongInterface(Fault):
    kind: Literal["wrong_interface"] = "wrong_interface"
    summary = "the socket interface variables unset, naming a missing or a wrong interface, " \
        "or a list with one bad entry"
    needs_netns = True
    mode: Literal["unset", "missing", "other", "list", "list_down"] = Field(
        "unset", description="unset: gloo picks by the hostname (the classic multi-NIC hang); "
        "missing: an interface that does not exist; other: an existing wrong one (lo); list: "
        "the host's link and a bad one, comma-separated (name: eth9, missing, by default); "
        "list_down: the host's link and eth1, a second NIC with an address but down")
    ranks: Optional[List[int]] = Field(None, max_length=MAX_WORLD,
                                       description="default: every rank")
    name: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9_.:-]{1,15}$",
                                description="interface for missing (eth9), other (lo) or "
                                "list's bad entry (eth9): 1-15 of [A-Za-z0-9_.:-], the "
                                "kernel's limit")
    first: bool = Field(False, description="list, list_down: the bad entry comes first")

    def check(self, scn):
        problems = super().check(scn)
        if self.mode == "list_down" and self.name is not None:
            problems.append((("name",), f"list_down adds its own interface ({SPARE_IFNAME}); "
                                        "name is for missing, other and list"))
        if self.first and self.mode not in ("list", "list_down"):
            problems.append((("first",), "first is for the list modes"))
        return problems

    def apply(self, plan, scn):
        ranks = plan.main_ranks(self.ranks)
        if self.mode == "list_down":
            for host in dict.fromkeys(r.host for r in ranks):
                plan.add_step(self, SpareLink(host=host, trigger=Trigger.setup(),
                                              target=f"host {host}"))
        bad = SPARE_IFNAME if self.mode == "list_down" else \
            self.name or {"missing": "eth9", "other": "lo", "list": "eth9"}.get(self.mode)
        for r in ranks:
            for v in IFNAME_VARS:
                link = plan.host(r.host).ifname
                r.env.pop(v, None)
                if self.mode == "unset":
                    if v not in r.unset:
                        r.unset.append(v)
                elif self.mode in ("list", "list_down"):
                    r.env[v] = f"{bad},{link}" if self.first else f"{link},{bad}"
                else:
                    r.env[v] = str(bad)
        if self.mode == "unset":
            what = "unset"
        elif self.mode in ("list", "list_down"):
            what = f"= a list with {bad}" + (" (down)" if self.mode == "list_down" else "") + \
                (" first" if self.first else " last")
        else:
            what = f"= {bad}"
        plan.notes.append(f"wrong_interface: GLOO/NCCL_SOCKET_IFNAME {what}")

"""dns_name: one name of the run's name server (a ``dns:`` block) answers wrong for a while:
``nxdomain`` (its record is gone: dnsmasq's own NXDOMAIN; healed, the record appears: a name
that exists only N s after the start line is ``answer: nxdomain, heal_after: N``),
``servfail`` (SERVFAIL), ``silent`` (no answer at all: each lookup costs glibc's timeout x
attempts), ``dead_first`` (an address of the run where no host is, before the live ones).
``hosts``: only the queries asked from these hosts (dnsmasq adds the asker's address to each
forwarded query, ``add-subnet``; the responder answers everyone else the live way): a name one
host resolves and another does not.
The last three go through the harness's responder (dnsmasq forwards the name to it, on the
server's own loopback), and so does ``nxdomain`` with ``ptr: false`` (every name is the
responder's there). dns_server: the whole server frozen (SIGSTOP) or its port dropped.

Evidence (harness.faults._dns): a name through the responder, the queries it answered the
faulted way (its log); a removed dnsmasq record, the queries dnsmasq answered NXDOMAIN while the
file was gone, per client (dnsmasq's query log); dns_server frozen, dnsmasq seen stopped and the
queries left unread in its port-53 sockets; dropped, the packets its rules dropped.
"""

from __future__ import annotations

from typing import Any, ClassVar, List, Literal, Sequence

from pydantic import Field

from ..core.limits import MAX_ADDR
from ..core.triggers import When
from ..machine.requirement import NAMESPACES, Requirement
from ..services.dns import DNSMASQ
from . import Fault
from ._dns import RecordFile, ResponderMode, ServerFault


def _needs_dns(scn: Any, kind: str) -> List[Any]:
    if getattr(scn, "dns", None) is None:
        return [(("kind",), f"{kind} needs the scenario's dns: block (the run's name server)")]
    return []


class DnsName(Fault, When):
    kind: Literal["dns_name"] = "dns_name"
    summary = "one name of the run's DNS server: NXDOMAIN (late), SERVFAIL, no answer, dead first"
    HINTS = ("a name that appears late in DNS", "SERVFAIL", "NXDOMAIN")
    REQUIRES: ClassVar[Sequence[Requirement]] = (NAMESPACES, DNSMASQ)
    needs_netns = True
    needs_link = True
    name: str = Field(max_length=MAX_ADDR, description="a record of the dns: block (a short "
                      "name goes under its domain)")
    answer: Literal["nxdomain", "servfail", "silent", "dead_first"] = Field(
        description="what the server answers for it while the fault holds")
    hosts: List[str] = Field(
        default_factory=list, max_length=16, description="only the queries asked from these "
        "scenario hosts are answered the faulted way; every other host gets the live answer "
        "(default: every host)")

    def check(self, scn: Any) -> List[Any]:
        problems = super().check(scn) + _needs_dns(scn, self.kind)
        if not problems:
            known = {scn.dns.fqdn(n) for n in scn.dns.records}
            if scn.dns.fqdn(self.name) not in known:
                problems.append((("name",), f"{self.name!r} is not a record of the dns: block "
                                 f"({', '.join(sorted(known)) or 'none'})"))
        names = scn.host_names()
        for i, h in enumerate(self.hosts):
            if getattr(scn, "dns", None) is not None and h == scn.dns.host:
                problems.append((("hosts", i), f"{h!r} is the name server's own host: it asks "
                                 "no one"))
            elif h not in names:
                problems.append((("hosts", i), f"no host {h!r} in this scenario (hosts: "
                                 f"{', '.join(names)})"))
        return problems

    def apply(self, plan: Any, scn: Any) -> None:
        dns = plan.dns
        fqdn = scn.dns.fqdn(self.name)
        live = dns.records.get(fqdn) or dns.forwarded[fqdn]
        if self.answer == "nxdomain" and fqdn in dns.records and not self.hosts:
            step: Any = RecordFile(dns=dns, name=fqdn, trigger=self.trigger(),
                                   target=f"host {dns.host}")
        else:
            if fqdn not in dns.forwarded:
                dns.forwarded[fqdn] = dns.records.pop(fqdn)
                dns.responder_port = dns.responder_port or plan.new_port()
            mode = "answer" if self.answer == "dead_first" else self.answer
            dead = dns.dead6 if plan.ip == "6" else dns.dead4
            only = None
            if self.hosts:   # dnsmasq tells the responder who asked (EDNS Client Subnet)
                dns.add_subnet = True
                only = [a for h in self.hosts for a in dns.host_addrs.get(h, [])]
            step = ResponderMode(name=fqdn, mode=mode,
                                 addrs=[dead] + live if self.answer == "dead_first" else [],
                                 live=live, hosts=list(self.hosts), only=only,
                                 trigger=self.trigger(), target=f"host {dns.host}")
        plan.add_step(self, step)
        step.undo_trigger = self.heal(step.id)
        plan.notes.append(f"dns_name: {fqdn} {self.answer}"
                          + (f" (asked from {', '.join(self.hosts)})" if self.hosts else "")
                          + f", {self.when()}")


class DnsServer(Fault, When):
    kind: Literal["dns_server"] = "dns_server"
    summary = "the run's DNS server stops answering: frozen (SIGSTOP), its port dropped, or " \
        "refused at once (rejected)"
    HINTS = ("a resolver that never answers",)
    REQUIRES: ClassVar[Sequence[Requirement]] = (NAMESPACES, DNSMASQ)
    needs_netns = True
    needs_link = True
    mode: Literal["frozen", "dropped", "rejected"] = Field(
        "frozen", description="frozen: SIGSTOP to dnsmasq (SIGCONT heals); dropped: an nftables "
        "drop of port 53 on its host; rejected: an nftables reject of port 53 (ICMP port "
        "unreachable for UDP, a reset for TCP: a resolver host with no server running, each "
        "query refused at once)")

    def check(self, scn: Any) -> List[Any]:
        return super().check(scn) + _needs_dns(scn, self.kind)

    def apply(self, plan: Any, scn: Any) -> None:
        dns = plan.dns
        step = ServerFault(mode=self.mode, host=dns.host, trigger=self.trigger(),
                           target=f"host {dns.host}")
        plan.add_step(self, step)
        step.undo_trigger = self.heal(step.id)
        plan.notes.append(f"dns_server: {self.mode}, {self.when()}")

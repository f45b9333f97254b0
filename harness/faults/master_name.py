"""master_name: MASTER_ADDR is a host name, and each host's hosts file says what it resolves
to: only an A record, only an AAAA record (the family-mismatch cases), both, a live address and
a dead one in either order, or nothing until ``resolves_after`` seconds after the start line (a
Kubernetes headless service before its pod is ready).

Addresses are the master host's own (its IPv4 and, even on an ``ip: 4`` run, the IPv6 address
the run's /64 gives it: on an IPv4-only run that one exists nowhere) and, for ``dead``, an
address of the run's own networks where no host is: for ``first`` the number after the
last host's, which glibc's address sorting (RFC 6724 rule 9) puts before the master's address
on the last host; for ``last`` one far off (``.250`` / ``::fa``), sorted after it. The name
must end in ``.test`` (RFC 6761: never a real name); no DNS is asked in any case.

Evidence (harness.faults._names.WriteHosts): each host's hosts file read back as written, and
glibc's answer for the name inside a host's namespace at the end of the run.
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import Field

from ..core.limits import MAX_ADDR, MAX_WORLD, PositiveSeconds
from ..core.protocol import url_host
from ..core.triggers import Trigger
from . import Fault
from ._names import WriteHosts


class MasterName(Fault):
    kind: Literal["master_name"] = "master_name"
    summary = "MASTER_ADDR is a name: A or AAAA only, a dead address first or last, or late"
    HINTS = ("a master name with only an AAAA record", "a name that resolves late")
    needs_netns = True
    needs_link = True
    name: str = Field("master.harness.test", pattern=r"^[a-z0-9][a-z0-9.-]*\.test$",
                      max_length=MAX_ADDR, description="the name; must end in .test (RFC 6761)")
    family: Optional[Literal["4", "6", "both"]] = Field(
        None, description="which of the master host's addresses the name has: 4 (A only), 6 "
        "(AAAA only), both; default: the run's ip (dual: both)")
    dead: Literal["none", "first", "last"] = Field(
        "none", description="also a dead address of the run's network, before or after")
    resolves_after: Optional[Union[PositiveSeconds,
                                   Dict[str, Union[PositiveSeconds, Literal["never"]]]]] = Field(
        None, description="the name is unknown until so many seconds after the start line; "
        "per host ({HOST: SECONDS or never}): a name that one host resolves late or never "
        "while the hosts not named know it from the start")
    ranks: Optional[List[int]] = Field(None, max_length=MAX_WORLD,
                                       description="ranks told the name (default: every rank)")

    def check(self, scn: Any) -> List[Any]:
        problems = super().check(scn)
        if isinstance(self.resolves_after, dict):
            names = scn.host_names()
            for h in self.resolves_after:
                if h not in names:
                    problems.append((("resolves_after", h), f"no host {h!r} (hosts: "
                                     f"{', '.join(names)})"))
        return problems

    def late(self, hosts: List[str]) -> Dict[str, Any]:
        """Each host whose hosts file lacks the name at first: when it learns it (seconds after
        the start line, or "never")."""
        if self.resolves_after is None:
            return {}
        if isinstance(self.resolves_after, dict):
            return dict(self.resolves_after)
        return {h: self.resolves_after for h in hosts}

    def _family(self, plan: Any) -> str:
        if self.family is not None:
            return self.family
        return {"4": "4", "6": "6"}.get(getattr(plan, "ip", "4"), "both")

    def addresses(self, plan: Any, scn: Any) -> List[str]:
        """The name's addresses, in the order the hosts file lists them."""
        import ipaddress

        from ..net.topology import Topology

        # the pure constructor: the addresses this run's topology gives (both families)
        topo = Topology(plan.run_id, [h.name for h in plan.hosts], link=True, ip="dual")
        master = topo.hosts[scn.master_host or plan.hosts[0].name]
        family = self._family(plan)
        live = ([master.addr4] if family in ("4", "both") else []) + \
            ([master.addr6] if family in ("6", "both") else [])
        version = 6 if family == "6" else 4
        # glibc sorts a name's addresses (RFC 6724 rule 9: longest prefix shared with the
        # source address first), so the file's order does not decide what is tried first.
        # "first": the number right after the hosts' (from the last host it shares a longer
        # prefix than the master's address); "last": one far off (.250, ::fa), sorted after
        n = len(plan.hosts) + 1 if self.dead == "first" else 0xFA
        if version == 4 and n == 0xFA:
            n = 250
        dead = str(topo.network.network_address + n) if version == 4 else \
            str(topo.network6.network_address + n)
        assert ipaddress.ip_address(dead).version == version
        if self.dead == "first":
            return [dead] + live
        if self.dead == "last":
            return live + [dead]
        return live

    def apply(self, plan: Any, scn: Any) -> None:
        addrs = self.addresses(plan, scn)
        hosts = [h.name for h in plan.hosts]
        for r in plan.main_ranks(self.ranks):
            r.env["MASTER_ADDR"] = self.name
            if r.init.method == "tcp":
                r.init = r.init.with_url(f"tcp://{url_host(self.name)}:{r.env['MASTER_PORT']}")
        late = self.late(hosts)

        def where(hs: List[str]) -> str:
            return "hosts files" if hs == hosts else \
                "hosts file" + "s" * (len(hs) > 1) + " of " + ", ".join(hs)

        known = [h for h in hosts if h not in late]
        if known:
            plan.add_step(self, WriteHosts(hosts=known, entries={self.name: addrs},
                                           target=where(known)))
        unknown = [h for h in hosts if h in late]
        if unknown:
            plan.add_step(self, WriteHosts(hosts=unknown, entries={self.name: []},
                                           target=where(unknown),
                                           shown=f"hosts file: {self.name} unknown"))
        for t in sorted({v for v in late.values() if v != "never"}):
            at = [h for h in unknown if late[h] == t]
            plan.add_step(self, WriteHosts(hosts=at, entries={self.name: addrs},
                                           in_place=True, target=where(at),
                                           trigger=Trigger.at_time(t)))
        if not late:
            late_s = ""
        elif not isinstance(self.resolves_after, dict):
            late_s = f", known only {self.resolves_after:g} s after the start line"
        else:
            late_s = "".join(f", on {h} " + ("never known" if v == "never" else
                                             f"known only {v:g} s after the start line")
                             for h, v in late.items())
        plan.notes.append(f"master_name: MASTER_ADDR={self.name} -> {', '.join(addrs)}{late_s}")

"""firewall: nftables drop or reject on a host, for the master port, data ports, a range or all."""

from dataclasses import dataclass, field
from typing import Annotated, Any, Dict, List, Literal, Optional, Union

from pydantic import Discriminator, Field, Tag

from ..core.jobstore import known_port
from ..core.limits import MAX_NAME, Port
from ._net import HostNetFault, NetStep
from .steps import Effect

# one branch checked, chosen by the value's type: a bad port is one error, not one per branch
PortSel = Annotated[
    Union[Annotated[Literal["master", "data", "all"], Tag("name")],
          Annotated[List[Port], Field(max_length=64), Tag("list")]],
    Discriminator(lambda v: "list" if isinstance(v, list) else "name")]


@dataclass
class FirewallRule(NetStep):
    """An nftables rule in a host's namespace, with a counter; undone by removing it. Its
    effect: the packets and bytes the rule matched (read before a heal removes it, else at the
    end of the run)."""

    host: str = ""
    action: str = "drop"
    direction: str = "in"
    ports: Any = "all"           # as Topology.firewall takes them
    peer: Optional[str] = None   # only packets from (in) / to (out) this host
    shown: str = ""
    _handle: Optional[str] = field(default=None, init=False, repr=False, compare=False)
    _seen: Optional[Dict[str, Any]] = field(default=None, init=False, repr=False, compare=False)

    def do(self, rt):
        self._handle = rt.net.filter_rule(self.host, action=self.action, direction=self.direction,
                                       ports=self.ports, peer=self.peer, counter=True)

    def undo(self, rt):
        if self._handle is not None:
            self._seen = self._read(rt)   # the counters go with the rule
            rt.net.remove_rule(self.host, self._handle)

    def _read(self, rt) -> Dict[str, Any]:
        c = rt.net.rule_counters(self.host, self._handle)
        return {"packets": c["packets"], "bytes": c["bytes"], "t": round(rt.now(), 3)}

    def effect(self, rt):
        seen = self._seen if self._seen is not None else self._read(rt)
        n, b = seen["packets"], seen["bytes"]
        when = "when healed" if self._seen is not None else "at the end of the run"
        return Effect(acted=n > 0,
                      summary=f"{n} packet{'s' * (n != 1)} ({b} bytes) matched",
                      numbers={"packets": n, "bytes": b},
                      events=[{"t": seen["t"], "what": f"rule counter read {when}: {n} packets, "
                                                       f"{b} bytes"}])

    def describe(self):
        return f"{self.action} {self.direction}bound {self.shown}"


class Firewall(HostNetFault):
    kind: Literal["firewall"] = "firewall"
    summary = "nftables drop/reject on a host (inbound or outbound; master port, data ports...)"
    action: Literal["drop", "reject"] = Field(
        "drop", description="drop (the peer waits out its connect) or reject (refused at once)")
    direction: Literal["in", "out"] = Field(
        "in", description="packets the host receives (in) or sends (out)")
    ports: PortSel = Field("master", description="master (the job's store port: the lease, "
                           "init_url's, the launcher's rdzv_endpoint or master_port), data (every "
                           "new connection but to the store port: gloo's mesh), all, or a list "
                           "of ports")
    port_range: Optional[List[Port]] = Field(None, min_length=2, max_length=2,
                                            description="[low, high] instead of ports")
    peer: Optional[str] = Field(None, max_length=MAX_NAME,
                                description="only packets from this host of the scenario "
                                "(direction in) or to it (out): 'host a drops SYNs from host b' "
                                "while a's own ranks and the other hosts pass (default: every "
                                "peer)")

    def check(self, scn):
        problems = super().check(scn)
        if self.peer is not None and self.peer not in scn.host_names():
            problems.append((("peer",), f"no host {self.peer!r} (hosts: "
                             f"{', '.join(scn.host_names())})"))
        return problems

    def apply(self, plan, scn):
        host = self.target_host(plan, scn)
        ports: Any
        if self.port_range:
            ports = tuple(self.port_range)
            shown = f"ports {self.port_range[0]}-{self.port_range[1]}"
        elif self.ports == "master":   # the job's store, wherever the launch puts it
            port = known_port(plan, "ports: master")
            ports, shown = [port], f"master port {port}"
        elif self.ports == "data":
            port = known_port(plan, "ports: data")
            keep = [port] + [p for p in plan.store_ports() if p != port]
            ports, shown = {"except": keep}, "new connections to every port " \
                f"but {', '.join(map(str, keep))}"
        elif self.ports == "all":
            ports, shown = "all", "all ports"
        else:
            ports, shown = list(self.ports), f"ports {self.ports}"
        if self.peer is not None:
            shown += f" {'from' if self.direction == 'in' else 'to'} host {self.peer}"
        self.add_step(plan, FirewallRule(host=host, action=self.action, direction=self.direction,
                                         ports=ports, peer=self.peer, shown=shown,
                                         target=f"host {host}"))
        unverified = self.ports in ("master", "data") and not self.port_range and \
            not plan.store().verified
        plan.notes.append(f"firewall: {self.action} {self.direction}bound {shown} on host "
                          f"{host}, {self.when()}" + (f" (the store's port {plan.store().status}"
                                                      ")" if unverified else ""))

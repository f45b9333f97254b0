"""firewall: nftables drop or reject on a host, for the master port, data ports, a range or all."""

from dataclasses import dataclass, field
from typing import Annotated, Any, List, Literal, Optional, Union

from pydantic import Discriminator, Field, Tag

from ..jobstore import known_port
from ..limits import Port
from ._net import HostNetFault, NetStep

# one branch checked, chosen by the value's type: a bad port is one error, not one per branch
PortSel = Annotated[
    Union[Annotated[Literal["master", "data", "all"], Tag("name")],
          Annotated[List[Port], Field(max_length=64), Tag("list")]],
    Discriminator(lambda v: "list" if isinstance(v, list) else "name")]


@dataclass
class FirewallRule(NetStep):
    """An nftables rule in a host's namespace; undone by removing it."""

    host: str = ""
    action: str = "drop"
    direction: str = "in"
    ports: Any = "all"           # as Topology.firewall takes them
    shown: str = ""
    _handle: Optional[str] = field(default=None, init=False, repr=False, compare=False)

    def do(self, rt):
        self._handle = rt.net.filter_rule(self.host, action=self.action, direction=self.direction,
                                       ports=self.ports)

    def undo(self, rt):
        if self._handle is not None:
            rt.net.remove_rule(self.host, self._handle)

    def describe(self):
        return f"{self.action} {self.direction}bound {self.shown}"


class Firewall(HostNetFault):
    kind: Literal["firewall"] = "firewall"
    summary = "nftables drop/reject on a host (inbound or outbound; master port, data ports...)"
    action: Literal["drop", "reject"] = "drop"
    direction: Literal["in", "out"] = "in"
    ports: PortSel = Field("master", description="master (the job's store port: the lease, "
                           "init_url's, the launcher's rdzv_endpoint or master_port), data (every "
                           "new connection but to the store port: gloo's mesh), all, or a list "
                           "of ports")
    port_range: Optional[List[Port]] = Field(None, min_length=2, max_length=2,
                                            description="[low, high] instead of ports")

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
        self.add_step(plan, FirewallRule(host=host, action=self.action, direction=self.direction,
                                         ports=ports, shown=shown, target=f"host {host}"))
        unverified = self.ports in ("master", "data") and not self.port_range and \
            not plan.store().verified
        plan.notes.append(f"firewall: {self.action} {self.direction}bound {shown} on host "
                          f"{host}, {self.when()}" + (f" (the store's port {plan.store().status}"
                                                      ")" if unverified else ""))

"""bandwidth: a tc tbf rate limit on a host's link."""

from typing import Literal, Optional

from pydantic import Field

from . import register
from ._net import NetFault


@register
class Bandwidth(NetFault):
    kind: Literal["bandwidth"] = "bandwidth"
    summary = "a tbf rate limit on a host's link"
    host: Optional[str] = Field(None, description="default: the master host")
    rate: str = Field("1mbit", pattern=r"^\d+(\.\d+)?(bit|kbit|mbit|gbit|bps|kbps|mbps)$")
    direction: Literal["in", "out", "both"] = "out"

    def check(self, scn):
        return self.check_hosts(scn, [self.host] if self.host else [], "host")

    def apply(self, plan, scn):
        host = self.host or scn.master_host or plan.hosts[0].name
        plan.net_actions.append(self.net_action("bandwidth", host=host, rate=self.rate,
                                            direction=self.direction))
        plan.notes.append(f"bandwidth: {self.rate} {self.direction} on host {host}, "
                          f"{self.when()}")

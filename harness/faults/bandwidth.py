"""bandwidth: a tc tbf rate limit on a host's link."""

from typing import Literal

from pydantic import Field

from . import register
from ._net import HostNetFault


@register
class Bandwidth(HostNetFault):
    kind: Literal["bandwidth"] = "bandwidth"
    summary = "a tbf rate limit on a host's link"
    rate: str = Field("1mbit",
                      pattern=r"^[0-9]{1,9}(\.[0-9]{1,6})?(bit|kbit|mbit|gbit|bps|kbps|mbps)$")
    direction: Literal["in", "out", "both"] = "out"

    def apply(self, plan, scn):
        host = self.target_host(plan, scn)
        plan.net_actions.append(self.net_action("bandwidth", host=host, rate=self.rate,
                                            direction=self.direction))
        plan.notes.append(f"bandwidth: {self.rate} {self.direction} on host {host}, "
                          f"{self.when()}")

"""bandwidth: a tc tbf rate limit on a host's link."""

from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from ._net import HostNetFault, NetStep


@dataclass
class RateLimit(NetStep):
    host: str = ""
    rate: str = "1mbit"
    direction: str = "out"

    def do(self, rt):
        rt.net.rate_limit(self.host, self.rate, direction=self.direction)

    def undo(self, rt):
        rt.net.clear_rate_limit(self.host, self.direction)

    def describe(self):
        return f"limit to {self.rate} ({self.direction})"


class Bandwidth(HostNetFault):
    kind: Literal["bandwidth"] = "bandwidth"
    summary = "a tbf rate limit on a host's link"
    rate: str = Field("1mbit",
                      pattern=r"^[0-9]{1,9}(\.[0-9]{1,6})?(bit|kbit|mbit|gbit|bps|kbps|mbps)$")
    direction: Literal["in", "out", "both"] = "out"

    def apply(self, plan, scn):
        host = self.target_host(plan, scn)
        self.add_step(plan, RateLimit(host=host, rate=self.rate, direction=self.direction,
                                      target=f"host {host}"))
        plan.notes.append(f"bandwidth: {self.rate} {self.direction} on host {host}, "
                          f"{self.when()}")

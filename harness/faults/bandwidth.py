"""bandwidth: a rate limit on a host's traffic: a tc tbf qdisc on its link (``engine: tc``,
default), or the fault proxy's pacing of chosen connections (``engine: proxy``: per
connection, with traffic/direction/probability like every proxy fault)."""

from dataclasses import dataclass
from typing import Any, Dict, List, Literal

from pydantic import Field

from ._net import NetStep
from ._proxy import ProxyFault, rate_bytes


@dataclass
class RateLimit(NetStep):
    host: str = ""
    rate: str = "1mbit"
    direction: str = "out"

    def do(self, rt: Any) -> None:
        rt.net.rate_limit(self.host, self.rate, direction=self.direction)

    def undo(self, rt: Any) -> None:
        rt.net.clear_rate_limit(self.host, self.direction)

    def describe(self) -> str:
        return f"limit to {self.rate} ({self.direction})"


class Bandwidth(ProxyFault):
    kind: Literal["bandwidth"] = "bandwidth"
    summary = "a rate limit on a host's link (tc tbf), or per connection (the fault proxy)"
    TOXIC = "bandwidth"
    rate: str = Field("1mbit",
                      pattern=r"^[0-9]{1,9}(\.[0-9]{1,6})?(bit|kbit|mbit|gbit|bps|kbps|mbps)$")
    direction: Literal["in", "out", "both"] = "out"
    engine: Literal["tc", "proxy"] = Field("tc", description="tc (tbf on the link) or proxy")

    def check(self, scn: Any) -> List[Any]:
        problems = super().check(scn)
        if self.engine == "tc" and (self.traffic != "all" or self.probability < 1
                                    or self.placement != "transparent"):
            problems.append((("engine",), "tc limits the whole link: traffic, probability and "
                             "placement need engine: proxy"))
        return problems

    def params(self) -> Dict[str, Any]:
        return {"bytes_per_s": rate_bytes(self.rate)}

    def shown(self) -> str:
        return f"rate {self.rate}"

    def apply(self, plan: Any, scn: Any) -> None:
        if self.engine == "proxy":
            self.apply_toxic(plan, scn)
            return
        host = self.target_host(plan, scn)
        step = RateLimit(host=host, rate=self.rate, direction=self.direction,
                         target=f"host {host}", trigger=self.trigger())
        plan.add_step(self, step)
        step.undo_trigger = self.heal(step.id)
        plan.notes.append(f"bandwidth: {self.rate} {self.direction} on host {host}, "
                          f"{self.when()}")

"""packet_loss: nftables `numgen random` drops a share of a host's packets."""

from typing import Literal, Optional

from pydantic import Field

from . import register
from ._net import NetFault


@register
class PacketLoss(NetFault):
    kind: Literal["packet_loss"] = "packet_loss"
    summary = "a share of a host's packets is dropped (nftables numgen random)"
    host: Optional[str] = Field(None, description="default: the master host")
    percent: float = Field(gt=0, le=100)
    direction: Literal["in", "out", "both"] = "both"

    def check(self, scn):
        return self.check_hosts(scn, [self.host] if self.host else [], "host")

    def apply(self, plan, scn):
        host = self.host or scn.master_host or plan.hosts[0].name
        plan.net_actions.append(self.net_action("packet_loss", host=host, percent=self.percent,
                                            direction=self.direction))
        plan.notes.append(f"packet_loss: {self.percent:g}% {self.direction} on host {host}, "
                          f"{self.when()}")

"""packet_loss: nftables `numgen random` drops a share of a host's packets."""

from typing import Literal

from pydantic import Field

from . import register
from ._net import HostNetFault


@register
class PacketLoss(HostNetFault):
    kind: Literal["packet_loss"] = "packet_loss"
    summary = "a share of a host's packets is dropped (nftables numgen random)"
    percent: float = Field(gt=0, le=100)
    direction: Literal["in", "out", "both"] = "both"

    def apply(self, plan, scn):
        host = self.target_host(plan, scn)
        plan.net_actions.append(self.net_action("packet_loss", host=host, percent=self.percent,
                                            direction=self.direction))
        plan.notes.append(f"packet_loss: {self.percent:g}% {self.direction} on host {host}, "
                          f"{self.when()}")

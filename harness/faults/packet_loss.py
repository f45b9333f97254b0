"""packet_loss: nftables `numgen random` drops a share of a host's packets."""

from dataclasses import dataclass, field
from typing import Literal, Optional

from pydantic import Field

from ._net import HostNetFault, NetStep


@dataclass
class Loss(NetStep):
    host: str = ""
    percent: float = 0.0
    direction: str = "both"
    _handle: Optional[str] = field(default=None, init=False, repr=False, compare=False)

    def do(self, rt):
        self._handle = rt.net.random_drop(self.host, self.percent, self.direction)

    def undo(self, rt):
        if self._handle is not None:
            rt.net.remove_rule(self.host, self._handle)

    def describe(self):
        return f"drop {self.percent:g}% of packets ({self.direction})"


class PacketLoss(HostNetFault):
    kind: Literal["packet_loss"] = "packet_loss"
    summary = "a share of a host's packets is dropped (nftables numgen random)"
    percent: float = Field(gt=0, le=100)
    direction: Literal["in", "out", "both"] = "both"

    def is_random(self):
        return self.percent < 100

    def apply(self, plan, scn):
        host = self.target_host(plan, scn)
        self.add_step(plan, Loss(host=host, percent=self.percent, direction=self.direction,
                                 target=f"host {host}"))
        plan.notes.append(f"packet_loss: {self.percent:g}% {self.direction} on host {host}, "
                          f"{self.when()}")

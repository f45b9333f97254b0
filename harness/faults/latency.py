"""latency: added delay on a host's link, with tc netem where the kernel has it.

This machine's kernel has no ``netem`` qdisc; there the scenario is skipped with that reason
(a user-space delaying proxy is not built yet). ``harness doctor`` says which applies.
"""

from typing import Literal

from pydantic import Field

from . import register
from ._net import HostNetFault


@register
class Latency(HostNetFault):
    kind: Literal["latency"] = "latency"
    summary = "added delay on a host's link (needs the netem qdisc; skipped without it)"
    delay_ms: float = Field(gt=0, le=60000)
    jitter_ms: float = Field(0, ge=0, le=60000)

    def apply(self, plan, scn):
        host = self.target_host(plan, scn)
        plan.net_actions.append(self.net_action("latency", host=host, delay_ms=self.delay_ms,
                                            jitter_ms=self.jitter_ms))
        plan.notes.append(f"latency: {self.delay_ms:g} ms on host {host}, {self.when()}")

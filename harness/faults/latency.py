"""latency: added delay on a host's link, with tc netem where the kernel has it.

This machine's kernel has no ``netem`` qdisc; there the scenario is skipped with that reason.
``harness doctor`` says which applies (the ``netem`` requirement).
"""

from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from ..machine import NAMESPACES, Probe
from ._net import HostNetFault, NetStep


def _netem_missing():
    from ..topology import qdisc_missing

    why = qdisc_missing("netem")
    return None if why is None else (f"not supported on this kernel: {why}; the harness has "
                                     "no user-space delay proxy yet")


NETEM = Probe("netem", ok="tc netem works: latency scenarios run", check=_netem_missing)


@dataclass
class Delay(NetStep):
    host: str = ""
    delay_ms: float = 0.0
    jitter_ms: float = 0.0

    def do(self, rt):
        rt.net.add_delay(self.host, self.delay_ms, self.jitter_ms)

    def undo(self, rt):
        rt.net.clear_delay(self.host)

    def describe(self):
        return f"delay {self.delay_ms:g} ms" + (f" ± {self.jitter_ms:g} ms" if self.jitter_ms
                                                else "")


class Latency(HostNetFault):
    kind: Literal["latency"] = "latency"
    summary = "added delay on a host's link (needs the netem qdisc; skipped without it)"
    REQUIRES = (NAMESPACES, NETEM)
    delay_ms: float = Field(gt=0, le=60000)
    jitter_ms: float = Field(0, ge=0, le=60000)

    def apply(self, plan, scn):
        host = self.target_host(plan, scn)
        self.add_step(plan, Delay(host=host, delay_ms=self.delay_ms, jitter_ms=self.jitter_ms,
                                  target=f"host {host}"))
        plan.notes.append(f"latency: {self.delay_ms:g} ms on host {host}, {self.when()}")

"""latency: added delay (and jitter) on a host's traffic: with tc netem where the kernel has it,
else with the harness's fault proxy (harness.faults._proxy), and the plan says which ran.

``engine: auto`` (default) takes netem when this machine has it and the fault asks for nothing
netem cannot do (only what the host sends, every packet, every connection); otherwise the
proxy. ``engine: netem`` or ``engine: proxy`` force one (netem is then a requirement: without
it the scenario is skipped, with the reason). ``harness doctor`` says whether netem works here.

The two are not the same delay: netem delays each packet the host sends on its link; the proxy
delays the bytes of each proxied connection in ``direction`` (once per request/reply exchange
for ``out``), and connections the host makes to itself go through it too.
"""

from dataclasses import dataclass
from typing import Any, ClassVar, List, Literal, Optional, Sequence

from pydantic import Field

from ..machine.requirement import NAMESPACES, Probe, Requirement
from ._net import NetStep
from ._proxy import NFT, ProxyFault


def _netem_missing() -> Optional[str]:
    from ..net.topology import qdisc_missing

    why = qdisc_missing("netem")
    return None if why is None else f"not supported on this kernel: {why}"


NETEM = Probe("netem", ok="tc netem works: latency with engine auto uses it",
              check=_netem_missing)


@dataclass
class Delay(NetStep):
    host: str = ""
    delay_ms: float = 0.0
    jitter_ms: float = 0.0

    def do(self, rt: Any) -> None:
        rt.net.add_delay(self.host, self.delay_ms, self.jitter_ms)

    def undo(self, rt: Any) -> None:
        rt.net.clear_delay(self.host)

    def describe(self) -> str:
        return f"netem: delay {self.delay_ms:g} ms" + (f" ± {self.jitter_ms:g} ms"
                                                       if self.jitter_ms else "")


class Latency(ProxyFault):
    kind: Literal["latency"] = "latency"
    summary = "added delay and jitter on a host's traffic (tc netem, else the fault proxy)"
    REQUIRES: ClassVar[Sequence[Requirement]] = (NAMESPACES, NFT, NETEM)
    TOXIC = "latency"
    delay_ms: float = Field(gt=0, le=60000, description="the delay added, milliseconds")
    jitter_ms: float = Field(0, ge=0, le=60000,
                             description="random variation of the delay, milliseconds")
    engine: Literal["auto", "netem", "proxy"] = Field(
        "auto", description="netem where present (auto), or force netem or the proxy")
    direction: Literal["in", "out", "both"] = Field(
        "out", description="bytes the host sends (out, as netem), receives (in), or both")

    def netem_can(self) -> bool:
        return (self.direction == "out" and self.traffic == "all" and self.probability >= 1
                and self.placement == "transparent")

    def check(self, scn: Any) -> List[Any]:
        problems = super().check(scn)
        if self.engine == "netem" and not self.netem_can():
            problems.append((("engine",), "netem delays every packet the host sends: with "
                             "engine netem give no traffic, direction, probability or "
                             "placement (or use engine: proxy)"))
        return problems

    def requirements(self, scn: Any) -> Sequence[Requirement]:
        if self.engine == "netem":
            return (NAMESPACES, NETEM)
        return super().requirements(scn)

    def engine_for(self) -> str:
        """The engine that runs: asks the machine (once per process) only for ``auto``."""
        if self.engine != "auto":
            return self.engine
        return "netem" if self.netem_can() and NETEM.missing() is None else "proxy"

    def is_random(self) -> bool:
        return super().is_random() or self.jitter_ms > 0

    def proxied(self) -> bool:
        return self.engine == "proxy" or (self.engine == "auto" and not self.netem_can())

    def shown(self) -> str:
        return f"delay {self.delay_ms:g} ms" + (f" ± {self.jitter_ms:g} ms" if self.jitter_ms
                                                else "")

    def apply(self, plan: Any, scn: Any) -> None:
        engine = self.engine_for()
        why = "" if self.engine != "auto" else (
            " (auto: netem works here)" if engine == "netem" else
            " (auto: " + (f"netem {NETEM.missing()}" if self.netem_can() else
                          "netem cannot do this fault's traffic/direction/probability") + ")")
        if engine == "proxy":
            self.apply_toxic(plan, scn)
            plan.notes.append(f"latency: engine proxy{why}")
            return
        host = self.target_host(plan, scn)
        step = Delay(host=host, delay_ms=self.delay_ms, jitter_ms=self.jitter_ms,
                     target=f"host {host}", trigger=self.trigger())
        plan.add_step(self, step)
        step.undo_trigger = self.heal(step.id)
        plan.notes.append(f"latency: {self.shown()} on host {host}'s link, engine netem{why}, "
                          f"{self.when()}")

"""packet_loss: nftables `numgen random` drops a share of a host's packets.

Its evidence: each drop rule counts what it dropped (an nft counter after the random draw), so
the effect is the packets and bytes really dropped, per direction (read when healed, else at
the end of the run); 0 dropped is "no effect" (no packet crossed the link while it held, or
the draw spared every one)."""

from dataclasses import dataclass, field
from typing import Any, Dict, Literal, Optional

from pydantic import Field

from ._net import HostNetFault, NetStep
from .steps import Effect


@dataclass
class Loss(NetStep):
    host: str = ""
    percent: float = 0.0
    direction: str = "both"
    _handle: Optional[str] = field(default=None, init=False, repr=False, compare=False)
    _seen: Optional[Dict[str, Any]] = field(default=None, init=False, repr=False, compare=False)

    def do(self, rt):
        self._handle = rt.net.random_drop(self.host, self.percent, self.direction, counter=True)

    def undo(self, rt):
        if self._handle is not None:
            self._seen = self._read(rt)   # the counters go with the rules
            rt.net.remove_rule(self.host, self._handle)

    def _read(self, rt) -> Dict[str, Any]:
        ways = [w for w, on in (("in", self.direction in ("in", "both")),
                                ("out", self.direction in ("out", "both"))) if on]
        per = {w: rt.net.rule_counters(self.host, self._handle,
                                       chain="input" if w == "in" else "output") for w in ways}
        return {"per": {w: (c["packets"], c["bytes"]) for w, c in per.items()},
                "t": round(rt.now(), 3)}

    def effect(self, rt):
        """The packets the drop rules dropped, per direction (read when healed, else at the
        end of the run)."""
        seen = self._seen if self._seen is not None else self._read(rt)
        n = sum(p for p, _ in seen["per"].values())
        b = sum(x for _, x in seen["per"].values())
        each = ", ".join(f"{w} {p}" for w, (p, _) in seen["per"].items())
        when = "when healed" if self._seen is not None else "at the end of the run"
        return Effect(acted=n > 0,
                      summary=f"{n} packet{'s' * (n != 1)} ({b} bytes) dropped on host "
                              f"{self.host} ({each})",
                      numbers={"packets": n, "bytes": b,
                               **{f"packets_{w}": p for w, (p, _) in seen["per"].items()}},
                      events=[{"t": seen["t"], "what": f"drop counters read {when}: {each}"}])

    def describe(self):
        return f"drop {self.percent:g}% of packets ({self.direction})"


class PacketLoss(HostNetFault):
    kind: Literal["packet_loss"] = "packet_loss"
    summary = "a share of a host's packets is dropped (nftables numgen random)"
    percent: float = Field(gt=0, le=100, description="the share of packets dropped, % "
                           "(0 < percent <= 100)")
    direction: Literal["in", "out", "both"] = Field(
        "both", description="packets the host receives (in), sends (out), or both (dropped "
        "on the way in and on the way out: a round trip fails far more often than percent)")

    def is_random(self):
        return self.percent < 100

    def apply(self, plan, scn):
        host = self.target_host(plan, scn)
        self.add_step(plan, Loss(host=host, percent=self.percent, direction=self.direction,
                                 target=f"host {host}"))
        plan.notes.append(f"packet_loss: {self.percent:g}% {self.direction} on host {host}, "
                          f"{self.when()}")

"""bandwidth: a rate limit on a host's traffic: a tc tbf qdisc on its link (``engine: tc``,
default), or the fault proxy's pacing of chosen connections (``engine: proxy``: per
connection, with traffic/direction/probability like every proxy fault)."""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional

from pydantic import Field

from ._net import NetStep
from ._proxy import ProxyFault, rate_bytes
from .steps import Effect


@dataclass
class RateLimit(NetStep):
    """A tbf qdisc on the host's link (each way asked). Its effect: the qdisc's own statistics
    (``tc -s qdisc``: packets and bytes through it, ``overlimits``, the times tbf held a packet
    back for want of tokens, and drops), read when healed, else at the end of the run. It acted
    when tbf held back or dropped a packet; traffic that all fit in its burst went through
    unshaped: "no effect"."""

    host: str = ""
    rate: str = "1mbit"
    direction: str = "out"
    _seen: Optional[Dict[str, Any]] = field(default=None, init=False, repr=False, compare=False)

    def do(self, rt: Any) -> None:
        rt.net.rate_limit(self.host, self.rate, direction=self.direction)

    def undo(self, rt: Any) -> None:
        self._seen = self._read(rt)   # the statistics go with the qdisc
        rt.net.clear_rate_limit(self.host, self.direction)

    def _read(self, rt: Any) -> Dict[str, Any]:
        return {"links": rt.net.rate_limit_stats(self.host, self.direction),
                "t": round(rt.now(), 3)}

    def effect(self, rt: Any) -> Effect:
        seen = self._seen if self._seen is not None else self._read(rt)
        links = seen["links"]
        gone = [q["link"] for q in links if q.get("kind") != "tbf"]
        if gone:   # the limit is not where it was put: nothing to read, nothing to claim
            raise RuntimeError(f"no tbf qdisc on {', '.join(gone)} any more")
        tot = {k: sum(int(q[k]) for q in links)
               for k in ("packets", "bytes", "overlimits", "drops")}
        each = "; ".join(f"{q['link']} ({q.get('way')}): {q['packets']} packets, "
                         f"{q['overlimits']} overlimits, {q['drops']} drops" for q in links)
        when = "when healed" if self._seen is not None else "at the end of the run"
        held = tot["overlimits"] + tot["drops"]
        summary = (f"tbf held traffic back {tot['overlimits']} time"
                   f"{'s' * (tot['overlimits'] != 1)} and dropped {tot['drops']} of "
                   f"{tot['packets']} packets ({tot['bytes']} bytes)" if held else
                   f"0 packets held back or dropped: all {tot['packets']} packets "
                   f"({tot['bytes']} bytes) fit in tbf's burst")
        return Effect(acted=held > 0, summary=summary, numbers=tot,
                      events=[{"t": seen["t"], "what": f"qdisc statistics read {when}: {each}"}])

    def describe(self) -> str:
        return f"limit to {self.rate} ({self.direction})"


class Bandwidth(ProxyFault):
    kind: Literal["bandwidth"] = "bandwidth"
    summary = "a rate limit on a host's link (tc tbf), or per connection (the fault proxy)"
    TOXIC = "bandwidth"
    rate: str = Field("1mbit",
                      pattern=r"^[0-9]{1,9}(\.[0-9]{1,6})?(bit|kbit|mbit|gbit|bps|kbps|mbps)$",
                      description="the rate, as tc writes it: 1mbit, 512kbit, 10mbps...")
    direction: Literal["in", "out", "both"] = Field(
        "out", description="bytes the host sends (out), receives (in), or both")
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

    def proxied(self) -> bool:
        return self.engine == "proxy"

    def apply(self, plan: Any, scn: Any) -> None:
        if self.proxied():
            self.apply_toxic(plan, scn)
            return
        host = self.target_host(plan, scn)
        step = RateLimit(host=host, rate=self.rate, direction=self.direction,
                         target=f"host {host}", trigger=self.trigger())
        plan.add_step(self, step)
        step.undo_trigger = self.heal(step.id)
        plan.notes.append(f"bandwidth: {self.rate} {self.direction} on host {host}, "
                          f"{self.when()}")

"""partition: two groups of hosts cannot reach each other (optionally healed later).

Its evidence: each host's drop rules count what they dropped (nft counters), so the effect is
the packets each side dropped from the other (read when healed, else at the end of the run);
0 on every host is "no effect" (no packet crossed while it held)."""

from dataclasses import dataclass, field
from typing import Annotated, Any, Dict, List, Literal, Optional

from pydantic import Field

from ..core.limits import MAX_HOSTS, MAX_NAME
from ._net import NetFault, NetStep
from .steps import Effect


@dataclass
class Cut(NetStep):
    """Each side drops what comes from the other; undone by healing."""

    a: List[str] = field(default_factory=list)
    b: List[str] = field(default_factory=list)
    _handle: Optional[str] = field(default=None, init=False, repr=False, compare=False)
    _seen: Optional[Dict[str, Any]] = field(default=None, init=False, repr=False, compare=False)

    def do(self, rt):
        self._handle = rt.net.cut(self.a, self.b, counter=True)

    def undo(self, rt):
        if self._handle is not None:
            self._seen = self._read(rt)   # the counters go with the rules
            rt.net.heal(self._handle)

    def _read(self, rt) -> Dict[str, Any]:
        per = {h: rt.net.rule_counters(h, self._handle) for h in self.a + self.b}
        return {"per": {h: (c["packets"], c["bytes"]) for h, c in per.items()},
                "t": round(rt.now(), 3)}

    def effect(self, rt):
        """The packets each side's rules dropped (read when healed, else at the end)."""
        seen = self._seen if self._seen is not None else self._read(rt)
        n = sum(p for p, _ in seen["per"].values())
        b = sum(x for _, x in seen["per"].values())
        each = ", ".join(f"{h} {p}" for h, (p, _) in seen["per"].items())
        when = "when healed" if self._seen is not None else "at the end of the run"
        return Effect(acted=n > 0, summary=f"{n} packet{'s' * (n != 1)} ({b} bytes) dropped "
                                           f"({each})",
                      numbers={"packets": n, "bytes": b},
                      events=[{"t": seen["t"], "what": f"rule counters read {when}: {each}"}])

    def describe(self):
        return f"partition {self.a} | {self.b}"


class Partition(NetFault):
    kind: Literal["partition"] = "partition"
    summary = "two groups of hosts cannot reach each other"
    groups: List[Annotated[List[Annotated[str, Field(max_length=MAX_NAME)]],
                           Field(max_length=MAX_HOSTS)]] = Field(
        min_length=2, max_length=2, description="[[hosts...], [hosts...]]")

    def check(self, scn):
        problems = super().check(scn)   # rank (with phase: whose phase) in the world
        for g, group in enumerate(self.groups):
            for i, n in enumerate(group):
                if n not in scn.host_names():
                    problems.append((("groups", g, i), f"no host {n!r} (hosts: "
                                                       f"{', '.join(scn.host_names())})"))
        if set(self.groups[0]) & set(self.groups[1]):
            problems.append((("groups",), "a host cannot be on both sides"))
        return problems

    def apply(self, plan, scn):
        self.add_step(plan, Cut(a=list(self.groups[0]), b=list(self.groups[1]),
                                target="network"))
        plan.notes.append(f"partition: {self.groups[0]} | {self.groups[1]}, {self.when()}")

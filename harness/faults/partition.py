"""partition: two groups of hosts cannot reach each other (optionally healed later)."""

from dataclasses import dataclass, field
from typing import Annotated, List, Literal, Optional

from pydantic import Field

from ..limits import MAX_HOSTS, MAX_NAME
from ._net import NetFault, NetStep


@dataclass
class Cut(NetStep):
    """Each side drops what comes from the other; undone by healing."""

    a: List[str] = field(default_factory=list)
    b: List[str] = field(default_factory=list)
    _handle: Optional[str] = field(default=None, init=False, repr=False, compare=False)

    def do(self, rt):
        self._handle = rt.net.cut(self.a, self.b)

    def undo(self, rt):
        if self._handle is not None:
            rt.net.heal(self._handle)

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

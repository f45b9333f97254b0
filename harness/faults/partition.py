"""partition: two groups of hosts cannot reach each other (optionally healed later)."""

from typing import Annotated, List, Literal

from pydantic import Field

from ..schema import MAX_HOSTS, MAX_NAME
from . import register
from ._net import NetFault


@register
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
        plan.net_actions.append(self.net_action("partition", a=self.groups[0], b=self.groups[1]))
        plan.notes.append(f"partition: {self.groups[0]} | {self.groups[1]}, {self.when()}")

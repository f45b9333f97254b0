"""Shared parts of the network faults (they need the run's network namespaces)."""

import re
from typing import List, Optional

from pydantic import Field, model_validator

from ..plan import NetActionPlan
from ..schema import MAX_NAME, PositiveSeconds, Seconds
from . import Fault

PHASE_RE = re.compile(r"^(init|workload step [0-9]{1,4}|destroy)\Z", re.ASCII)


class NetFault(Fault):
    needs_netns = True
    at: Optional[Seconds] = Field(None, description="switch it on at this many seconds "
                                "after the start line (default: before the ranks start)")
    phase: Optional[str] = Field(None, description="or: when rank `rank` enters this phase "
                                 "(init, workload step N, destroy)")
    rank: int = Field(0, description="with phase: whose phase")
    after: Seconds = Field(0.0, description="with phase: extra seconds")
    heal_after: Optional[PositiveSeconds] = Field(
        None, description="switch it off this many seconds after it was switched on")

    @model_validator(mode="after")
    def _when(self):
        if self.at is not None and self.phase is not None:
            raise ValueError("give at most one of 'at' and 'phase'")
        if self.phase is not None and not PHASE_RE.match(self.phase):
            raise ValueError(f"phase {self.phase[:40]!r}: use init, 'workload step N' or destroy")
        return self

    def check_hosts(self, scn, names: List[str], field: str):
        problems = super().check(scn)
        for i, n in enumerate(names):
            if n not in scn.host_names():
                problems.append(((field,) if len(names) == 1 else (field, i),
                                 f"no host {n!r} (hosts: {', '.join(scn.host_names())})"))
        return problems

    def net_action(self, op: str, **args) -> NetActionPlan:
        return NetActionPlan(op=op, args=args, at=self.at, at_phase=self.phase,
                             target=str(self.rank), after=self.after,
                             undo_after=self.heal_after, why=self.kind)

    def when(self) -> str:
        if self.at is not None:
            w = f"at {self.at:g} s"
        elif self.phase is not None:
            w = f"when rank {self.rank} enters {self.phase}" + (
                f" + {self.after:g} s" if self.after else "")
        else:
            w = "from the start"
        return w + (f", healed {self.heal_after:g} s later" if self.heal_after else "")


class HostNetFault(NetFault):
    """A network fault on one host (default: the master host)."""

    host: Optional[str] = Field(None, max_length=MAX_NAME,
                                description="the host (default: the master host)")

    def check(self, scn):
        return self.check_hosts(scn, [self.host] if self.host else [], "host")

    def target_host(self, plan, scn) -> str:
        return self.host or scn.master_host or plan.hosts[0].name

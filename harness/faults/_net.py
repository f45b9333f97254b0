"""Shared parts of the network faults: they need the run's network namespaces, and they are
timed (``at`` | ``phase``, ``heal_after``) like every trigger of the harness."""

from typing import ClassVar, List, Optional, Sequence

from pydantic import Field

from ..core.limits import MAX_NAME
from ..core.triggers import When
from ..machine.requirement import NAMESPACES, Requirement
from . import Fault
from .steps import Step


class NetStep(Step):
    """A change to the run's own network: it goes with the namespaces, so nothing is undone
    at teardown (a heal, ``heal_after``, still undoes it during the run)."""

    UNDO_AT_TEARDOWN = False


class NetFault(Fault, When):
    needs_netns = True
    REQUIRES: ClassVar[Sequence[Requirement]] = (NAMESPACES,)

    def check_hosts(self, scn, names: List[str], field: str):
        problems = super().check(scn)
        for i, n in enumerate(names):
            if n not in scn.host_names():
                problems.append(((field,) if len(names) == 1 else (field, i),
                                 f"no host {n!r} (hosts: {', '.join(scn.host_names())})"))
        return problems

    def add_step(self, plan, step) -> None:
        """Add the fault's one step, timed by the fault's own fields (its heal included)."""
        step.trigger = self.trigger()
        plan.add_step(self, step)
        step.undo_trigger = self.heal(step.id)


class HostNetFault(NetFault):
    """A network fault on one host (default: the master host)."""

    host: Optional[str] = Field(None, max_length=MAX_NAME,
                                description="the host (default: the master host)")

    def check(self, scn):
        return self.check_hosts(scn, [self.host] if self.host else [], "host")

    def target_host(self, plan, scn) -> str:
        return self.host or scn.master_host or plan.hosts[0].name

"""busy_port: a process of the harness holds MASTER_PORT before the ranks start."""

from typing import Literal, Optional

from pydantic import Field

from ..plan import PortHolderPlan
from ..schema import Seconds
from . import Fault, register


@register
class BusyPort(Fault):
    kind: Literal["busy_port"] = "busy_port"
    summary = "MASTER_PORT is held by another process (bound, listening, or accepting silently)"
    mode: Literal["bound", "listening", "accepting"] = Field(
        "listening", description="bound: bind() only; listening: listen() and never accept(); "
        "accepting: accept() and never answer (a foreign server)")
    release_after: Optional[Seconds] = Field(
        None, description="the holder exits this many seconds after the start line")

    def check(self, scn):
        problems = super().check(scn)
        if scn.init == "file":
            problems.append((("kind",), "busy_port holds MASTER_PORT, which 'init: file' never "
                                        "uses: this fault would change nothing"))
        return problems

    def apply(self, plan, scn):
        plan.holders.append(PortHolderPlan(plan.master_port, self.mode, self.release_after))
        rel = ("" if self.release_after is None
               else f", released {self.release_after:g} s after the start line")
        plan.notes.append(f"busy_port: port {plan.master_port} held ({self.mode}){rel}")

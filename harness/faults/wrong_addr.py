"""wrong_addr: chosen ranks get another MASTER_ADDR (loopback only: 127.0.0.0/8 is all local).

Its evidence (harness.judge.edits, read back from what the processes said): the MASTER_ADDR each
target started with (its start record) and the init_method it passed to init_process_group (its
init phase).
"""

from typing import List, Literal

from pydantic import Field

from ..core.limits import MAX_ADDR, MAX_WORLD
from ..core.protocol import url_host
from ..net.safety import refuse_address
from . import REGISTRY, Fault


class WrongAddr(Fault):
    kind: Literal["wrong_addr"] = "wrong_addr"
    ON_ALLOCATION = None   # works on an allocation's nodes
    HINTS = ("another master address",)
    summary = "chosen ranks get another MASTER_ADDR"
    ranks: List[int] = Field(default_factory=lambda: [1], max_length=MAX_WORLD,
                             description="the ranks given another MASTER_ADDR")
    addr: str = Field(max_length=MAX_ADDR, description="the address they get; must be loopback "
                      "(127.0.0.0/8, ::1, localhost): on Linux every 127.x address is local, so "
                      "this is no fault")

    def check(self, scn):
        problems = super().check(scn)
        why = refuse_address(
            self.addr, unresolvable=REGISTRY.kind_for("a name that does not resolve"))
        if why:
            problems.append((("addr",), why))
        return problems

    def apply(self, plan, scn):
        for r in plan.main_ranks(self.ranks):
            r.env["MASTER_ADDR"] = self.addr
            if r.init.method == "tcp":
                r.init = r.init.with_url(f"tcp://{url_host(self.addr)}:{r.env['MASTER_PORT']}")
        plan.notes.append(f"wrong_addr: ranks {self.ranks} get MASTER_ADDR={self.addr}")

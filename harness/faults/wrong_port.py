"""wrong_port: chosen ranks dial a MASTER_PORT where no store listens.

Its evidence (harness.judge.edits, read back from what the processes said): the MASTER_PORT each
target started with (its start record) and the init_method it passed to init_process_group.
"""

from typing import List, Literal, Optional

from pydantic import Field

from ..core.limits import MAX_WORLD
from ..core.protocol import url_host
from . import Fault


class WrongPort(Fault):
    kind: Literal["wrong_port"] = "wrong_port"
    ON_ALLOCATION = None   # works on an allocation's nodes
    summary = "chosen ranks dial another MASTER_PORT than the master listens on"
    ranks: List[int] = Field(default_factory=lambda: [1], max_length=MAX_WORLD,
                             description="ranks that get the port")
    port: Optional[int] = Field(None, ge=1, le=65535, description="the wrong port; default: a "
                                "port reserved for this run where nothing listens")

    def apply(self, plan, scn):
        port = self.port if self.port is not None else plan.new_port()
        for r in plan.main_ranks(self.ranks):
            r.env["MASTER_PORT"] = str(port)
            if r.init.method == "tcp":
                r.init = r.init.with_url(f"tcp://{url_host(r.env['MASTER_ADDR'])}:{port}")
        plan.notes.append(f"wrong_port: ranks {self.ranks} dial port {port}, the master listens "
                          f"on {plan.store().endpoint()}")

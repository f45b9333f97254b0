"""unreachable_master: MASTER_ADDR is an address on the run's own link where no host answers.

Its evidence (harness.judge.edits, read back from what the processes said): the MASTER_ADDR each
target started with (its start record) and the init_method it passed to init_process_group.
"""

import ipaddress
from typing import List, Literal, Optional

from pydantic import Field

from ..core.limits import MAX_WORLD
from . import Fault


class UnreachableMaster(Fault):
    kind: Literal["unreachable_master"] = "unreachable_master"
    summary = "MASTER_ADDR points at an address where no host answers"
    needs_netns = True
    needs_link = True
    ranks: Optional[List[int]] = Field(None, max_length=MAX_WORLD,
                                       description="default: every rank")
    host_number: int = Field(250, ge=100, le=254, description="the last octet (100-254) of "
                             "the silent address in the run's private /24")

    def apply(self, plan, scn):
        first = plan.hosts[0].addr   # the run's /24, or its /64 with ip: 6
        net = ipaddress.ip_interface(f"{first}/{64 if ':' in first else 24}").network
        addr = str(net.network_address + self.host_number)
        for r in plan.main_ranks(self.ranks):
            r.env["MASTER_ADDR"] = addr
            if r.init.method == "tcp":
                r.init = r.init.with_url(f"tcp://{addr}:{r.env['MASTER_PORT']}")
        plan.notes.append(f"unreachable_master: MASTER_ADDR={addr}, where no host is")

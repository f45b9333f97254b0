"""unresolvable_host: MASTER_ADDR is a name that does not resolve, with no query leaving the run.

Every rank resolves names with the harness's resolver view (``harness.net.resolver``): a hosts
file of loopback names and ``hosts: files`` in nsswitch.conf, so a name ending in ``.invalid``
fails at once and locally, in the run's namespaces and in the machine's own alike.

Its evidence (harness.judge.edits, read back from what the processes said): the MASTER_ADDR each
target started with (its start record) and the init_method it passed to init_process_group.
"""

from typing import List, Literal, Optional

from pydantic import Field

from ..core.limits import MAX_ADDR, MAX_WORLD
from . import Fault


class UnresolvableHost(Fault):
    kind: Literal["unresolvable_host"] = "unresolvable_host"
    ON_ALLOCATION = (
        "the name must fail inside the harness's resolver view, so that no DNS query leaves; on"
        " an allocation's nodes that view needs a mount namespace (root)")
    summary = "MASTER_ADDR is a host name that does not resolve (looked up without DNS)"
    HINTS = ("a name that does not resolve",)
    ranks: Optional[List[int]] = Field(None, max_length=MAX_WORLD,
                                       description="default: every rank")
    name: str = Field("master.harness.invalid", pattern=r"^[a-z0-9.-]+\.invalid$",
                      max_length=MAX_ADDR,
                      description="the name; must end in .invalid (RFC 6761: never resolves)")

    def apply(self, plan, scn):
        for r in plan.main_ranks(self.ranks):
            r.env["MASTER_ADDR"] = self.name
            if r.init.method == "tcp":
                r.init = r.init.with_url(f"tcp://{self.name}:{r.env['MASTER_PORT']}")
        plan.notes.append(f"unresolvable_host: MASTER_ADDR={self.name}; the ranks' resolver "
                          "view has no DNS, so the lookup fails locally (no query leaves)")

"""unresolvable_host: MASTER_ADDR is a name that does not resolve, with no query leaving the run.

Every host namespace gets its own /etc/hosts (localhost only) and /etc/resolv.conf pointing at
127.0.0.1 inside the namespace, where nothing answers: the lookup fails at once and locally.
"""

from typing import List, Literal, Optional

from pydantic import Field

from ..schema import MAX_ADDR, MAX_WORLD
from . import Fault, register


@register
class UnresolvableHost(Fault):
    kind: Literal["unresolvable_host"] = "unresolvable_host"
    summary = "MASTER_ADDR is a host name that does not resolve (resolved inside the namespace)"
    needs_netns = True
    ranks: Optional[List[int]] = Field(None, max_length=MAX_WORLD,
                                       description="default: every rank")
    name: str = Field("master.harness.invalid", pattern=r"^[a-z0-9.-]+\.invalid$",
                      max_length=MAX_ADDR,
                      description="the name; must end in .invalid (RFC 6761: never resolves)")

    def apply(self, plan, scn):
        from ..plan import NetActionPlan

        for h in plan.hosts:
            plan.net_actions.append(NetActionPlan("hosts_file", {"host": h.name, "entries": {}},
                                                  why=self.kind))
            plan.net_actions.append(NetActionPlan(
                "resolv_conf", {"host": h.name, "lines": ["nameserver 127.0.0.1",
                                                          "options timeout:1 attempts:1"]},
                why=self.kind))
        for r in plan.main_ranks(self.ranks):
            r.env["MASTER_ADDR"] = self.name
            if r.init.method == "tcp":
                r.init.url = f"tcp://{self.name}:{r.env['MASTER_PORT']}"
        plan.notes.append(f"unresolvable_host: MASTER_ADDR={self.name}; DNS inside the run's "
                          "namespaces goes to 127.0.0.1 there (no query leaves)")

"""wrong_interface: GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME unset, missing or wrong."""

from typing import List, Literal, Optional

from pydantic import Field

from ..limits import MAX_WORLD
from . import Fault

VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


class WrongInterface(Fault):
    kind: Literal["wrong_interface"] = "wrong_interface"
    summary = "the socket interface variables unset, naming a missing or a wrong interface"
    needs_netns = True
    mode: Literal["unset", "missing", "other"] = Field(
        "unset", description="unset: gloo picks by the hostname (the classic multi-NIC hang); "
        "missing: an interface that does not exist; other: an existing wrong one (lo)")
    ranks: Optional[List[int]] = Field(None, max_length=MAX_WORLD,
                                       description="default: every rank")
    name: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9_.:-]{1,15}$",
                                description="interface for missing (eth9) or other (lo): 1-15 of "
                                "[A-Za-z0-9_.:-], the kernel's limit")

    def apply(self, plan, scn):
        value = self.name or {"missing": "eth9", "other": "lo"}.get(self.mode)
        for r in plan.main_ranks(self.ranks):
            for v in VARS:
                r.env.pop(v, None)
                if self.mode == "unset":
                    if v not in r.unset:
                        r.unset.append(v)
                else:
                    r.env[v] = str(value)
        what = "unset" if self.mode == "unset" else f"= {value}"
        plan.notes.append(f"wrong_interface: GLOO/NCCL_SOCKET_IFNAME {what}")

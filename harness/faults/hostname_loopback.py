"""hostname_loopback: the Debian default that maps a machine's own host name to 127.0.1.1.

Without GLOO_SOCKET_IFNAME gloo picks the address it advertises to its peers by resolving the
host name; with this mapping it advertises a loopback address, and a peer on another host that
dials it reaches itself (127.0.0.0/8 is local everywhere). Each host's hosts file maps the
machine's host name to ``addr``; the chosen ranks have GLOO_SOCKET_IFNAME and
NCCL_SOCKET_IFNAME removed (a user who never set them). It is the host model's
``resolves_self: 127.0.1.1`` on every host (harness.net.hostspec), for hosts with names of their own
and for hosts that share the machine's.

Its evidence (harness.judge.edits, read back from what the processes said): each target started with
GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME unset (its start record); the hosts files are the run's
own set-up (ShapeHosts).
"""

from __future__ import annotations

import ipaddress
from typing import Any, List, Literal, Optional

from pydantic import Field, field_validator

from ..core.limits import MAX_WORLD
from ..net.addresses import IFNAME_VARS
from . import Fault


class HostnameLoopback(Fault):
    kind: Literal["hostname_loopback"] = "hostname_loopback"
    summary = "each host's own name resolves to 127.0.1.1 (Debian), GLOO_SOCKET_IFNAME unset"
    HINTS = ("the host name on 127.0.1.1",)
    needs_netns = True
    addr: str = Field("127.0.1.1", description="a loopback address (Debian's 127.0.1.1)")
    ranks: Optional[List[int]] = Field(None, max_length=MAX_WORLD,
                                       description="ranks without GLOO_SOCKET_IFNAME (all)")

    @field_validator("addr")
    @classmethod
    def _loopback(cls, v: str) -> str:
        try:
            ip = ipaddress.ip_address(v)
        except ValueError:
            raise ValueError(f"{v!r} is not an IP address") from None
        if not ip.is_loopback:
            raise ValueError(f"{v} is not a loopback address (127.0.0.0/8 or ::1)")
        return str(ip)

    def apply(self, plan: Any, scn: Any) -> None:
        # one case of the host model (harness.net.hostspec): every host's own name (or the
        # machine's, which plain hosts share) resolves to addr on that host
        from ..net.hostspec import MACHINE

        for r in plan.main_ranks(self.ranks):
            for var in IFNAME_VARS:
                r.env.pop(var, None)
                if var not in r.unset:
                    r.unset.append(var)
        shown = []
        for h in plan.hosts:
            name = h.machine.hostname or MACHINE
            h.machine.entries[name] = [self.addr]
            shown.append(h.machine.hostname or "the machine's name")
        plan.notes.append(f"hostname_loopback: {', '.join(dict.fromkeys(shown))} -> "
                          f"{self.addr} in each host's hosts file; GLOO_SOCKET_IFNAME unset")

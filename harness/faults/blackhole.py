"""blackhole: the fault proxy accepts connections and forwards nothing (a middlebox that
swallows a flow, a half-open connection after a peer vanished). The client's connect succeeds;
what it sends is never delivered while the fault is on (TCP flow control stops the sender)."""

from typing import Literal

from ._proxy import ProxyFault


class Blackhole(ProxyFault):
    kind: Literal["blackhole"] = "blackhole"
    summary = "the fault proxy accepts a host's connections and never forwards (until healed)"
    HINTS = ("a connection that is accepted and never answered",)
    TOXIC = "blackhole"

    def shown(self) -> str:
        return "black hole"

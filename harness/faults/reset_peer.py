"""reset_peer: the fault proxy resets connections (TCP RST to both sides) after N bytes or t
seconds, or at once: a peer that vanished, a middlebox that kills flows."""

from typing import Literal, Optional

from pydantic import Field

from ._proxy import ProxyFault


class ResetPeer(ProxyFault):
    kind: Literal["reset_peer"] = "reset_peer"
    summary = "the fault proxy resets a host's connections (after N bytes, t seconds, or at once)"
    HINTS = ("a connection reset by peer",)
    TOXIC = "reset_peer"
    after_bytes: Optional[int] = Field(None, ge=0, le=2**40, description="reset once so many "
                                       "bytes went through in `direction`")
    after_s: Optional[float] = Field(None, ge=0, le=3600, description="reset so many seconds "
                                     "after the fault met the connection (opened, or on)")

    def shown(self) -> str:
        parts = ([f"after {self.after_bytes} bytes"] if self.after_bytes is not None else []) + \
            ([f"after {self.after_s:g} s"] if self.after_s is not None else [])
        return "reset " + (" or ".join(parts) if parts else "at once")

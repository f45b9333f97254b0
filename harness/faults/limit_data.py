"""limit_data: the fault proxy closes a connection once so many bytes went through it (a
proxy or NAT that cuts flows, an MTU-sized stall ending in a close). The close is a clean
end of stream (FIN) to both sides, whatever they send afterwards; ``reset_peer`` is the reset."""

from typing import Literal

from pydantic import Field

from ._proxy import ProxyFault


class LimitData(ProxyFault):
    kind: Literal["limit_data"] = "limit_data"
    summary = "the fault proxy closes a host's connections after so many bytes"
    TOXIC = "limit_data"
    bytes: int = Field(ge=0, le=2**40, description="bytes in `direction` before the close")

    def shown(self) -> str:
        return f"close after {self.bytes} bytes"

"""slow_close: the fault proxy holds a connection's close (its FIN) for a while."""

from typing import Literal

from pydantic import Field

from ._proxy import ProxyFault


class SlowClose(ProxyFault):
    kind: Literal["slow_close"] = "slow_close"
    summary = "the fault proxy delays the close (FIN) of a host's connections"
    TOXIC = "slow_close"
    delay_ms: float = Field(gt=0, le=3_600_000,
                            description="how long the close (FIN) is held back, milliseconds")

    def shown(self) -> str:
        return f"close held {self.delay_ms:g} ms"

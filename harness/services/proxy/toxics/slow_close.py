"""slow_close: a stream's end (its FIN) reaches the other side ``delay_ms`` late."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import Toxic

if TYPE_CHECKING:
    from ..conn import Conn


class SlowClose(Toxic):
    NAME = "slow_close"
    SUMMARY = "a stream's end (FIN) is held back delay_ms"
    REQUIRED = ("delay_ms",)

    def close_delay(self, conn: Conn) -> float:
        return self.p("delay_ms") / 1000.0

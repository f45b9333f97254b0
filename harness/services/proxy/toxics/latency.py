"""latency: each chunk read is delayed (``delay_ms`` ± ``jitter_ms``); the bytes keep their order
whatever the jitter."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import Toxic

if TYPE_CHECKING:
    from ..conn import Conn


class Latency(Toxic):
    NAME = "latency"
    SUMMARY = "each chunk read is delayed by delay_ms ± jitter_ms (the order is kept)"
    REQUIRED = ("delay_ms",)
    OPTIONAL = ("jitter_ms",)

    def read_delay(self, conn: Conn) -> float:
        jitter = self.p("jitter_ms")
        drawn = conn.proxy.rng.uniform(-jitter, jitter) if jitter else 0.0
        return max(0.0, self.p("delay_ms") + drawn) / 1000.0

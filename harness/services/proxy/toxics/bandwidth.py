"""bandwidth: a connection's bytes are paced at ``bytes_per_s`` (a twentieth of a second's worth
at a time, then its time); with several on, the slowest rate holds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

from . import Toxic

if TYPE_CHECKING:
    from ..conn import Conn


class Bandwidth(Toxic):
    NAME = "bandwidth"
    SUMMARY = "the bytes are paced at bytes_per_s"
    REQUIRED = ("bytes_per_s",)
    MINIMUM = {"bytes_per_s": 1.0}
    STAGE = 40                      # last: it paces what the others let through

    def shape(self, conn: Conn, stream: str, piece: bytes, pause: float
              ) -> Tuple[bytes, float]:
        rate = self.p("bytes_per_s")
        piece = piece[:max(1, int(rate / 20))]
        return piece, max(pause, len(piece) / rate)

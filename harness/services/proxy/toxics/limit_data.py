"""limit_data: a connection ends once ``bytes`` went through in the toxic's direction: a clean end
of stream on both sides (FIN; what a side sends afterwards is read and dropped until it
closes), never a reset (a reset is ``reset_peer``'s)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

from . import Toxic

if TYPE_CHECKING:
    from ..conn import Conn


class LimitData(Toxic):
    NAME = "limit_data"
    SUMMARY = "the connection ends cleanly (FIN both ways) after so many bytes"
    REQUIRED = ("bytes",)
    STAGE = 20

    def shape(self, conn: Conn, stream: str, piece: bytes, pause: float
              ) -> Tuple[bytes, float]:
        room = int(self.p("bytes")) - conn.sent[stream]
        if room <= 0:
            conn.finish(f"limit_data {self.id}: {conn.sent[stream]} bytes", reset=False,
                        drain=True)
            return b"", pause
        return piece[:room], pause

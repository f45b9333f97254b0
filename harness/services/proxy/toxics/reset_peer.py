"""reset_peer: a connection is reset (TCP RST to both sides) after ``after_bytes`` in the toxic's
direction, ``after_s`` seconds after the toxic met it (opened, or switched on), or at once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Tuple

from . import Toxic

if TYPE_CHECKING:
    from ..conn import Conn


class ResetPeer(Toxic):
    NAME = "reset_peer"
    SUMMARY = "the connection is reset after after_bytes, after after_s seconds, or at once"
    OPTIONAL = ("after_bytes", "after_s")
    STAGE = 30

    def shape(self, conn: Conn, stream: str, piece: bytes, pause: float
              ) -> Tuple[bytes, float]:
        if self.params.get("after_bytes") is None:
            return piece, pause
        room = int(self.p("after_bytes")) - conn.sent[stream]
        if room <= 0:
            conn.finish(f"reset_peer {self.id}: after {conn.sent[stream]} bytes", reset=True)
            return b"", pause
        return piece[:room], pause

    def reset_at(self, conn: Conn) -> Optional[float]:
        if self.params.get("after_bytes") is None or self.params.get("after_s") is not None:
            return max(conn.start, self.since) + self.p("after_s")
        return None

"""slicer: a connection's bytes are sent in pieces of ``size`` (± ``variation``) bytes with a
pause of ``delay_ms`` after each."""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

from . import Toxic, ToxicError

if TYPE_CHECKING:
    from ..conn import Conn


class Slicer(Toxic):
    NAME = "slicer"
    SUMMARY = "the bytes go in pieces of size ± variation bytes, delay_ms apart"
    REQUIRED = ("size",)
    OPTIONAL = ("variation", "delay_ms")
    STAGE = 10                      # first: the others cut and pace its pieces

    def validate(self) -> None:
        if self.params["size"] < 1:
            raise ToxicError("slicer size must be at least 1 byte")

    def shape(self, conn: Conn, stream: str, piece: bytes, pause: float
              ) -> Tuple[bytes, float]:
        size = max(1, int(self.p("size") + conn.proxy.rng.uniform(
            -self.p("variation"), self.p("variation"))))
        return piece[:size], max(pause, self.p("delay_ms") / 1000.0)

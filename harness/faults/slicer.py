"""slicer: the fault proxy forwards a host's data in small pieces with a pause after each
(a link that fragments, stalls between segments)."""

from typing import Literal

from pydantic import Field

from ._proxy import ProxyFault


class Slicer(ProxyFault):
    kind: Literal["slicer"] = "slicer"
    summary = "the fault proxy forwards a host's data in small pieces with pauses"
    TOXIC = "slicer"
    size: int = Field(gt=0, le=1 << 20, description="bytes per piece")
    variation: int = Field(0, ge=0, le=1 << 20, description="± bytes, at random")
    delay_ms: float = Field(0, ge=0, le=60_000, description="pause after each piece")

    def shown(self) -> str:
        return f"pieces of {self.size} bytes" + (f" ± {self.variation}" if self.variation
                                                  else "") + f", {self.delay_ms:g} ms apart"

    def is_random(self) -> bool:
        return super().is_random() or self.variation > 0

"""blackhole: nothing is read in the toxic's direction while it is on (TCP's own flow control
then stops the sender), and a new connection whose client-to-server stream it holds is accepted
and never dialed on; switched off, the held data flows again (TCP cannot lose bytes in the
middle of a stream)."""

from __future__ import annotations

from . import Toxic


class Blackhole(Toxic):
    NAME = "blackhole"
    SUMMARY = "nothing is forwarded in its direction while it is on (held, not lost)"
    HOLDS = True

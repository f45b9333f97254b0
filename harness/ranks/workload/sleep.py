"""sleep S: the rank sleeps S seconds (its peers wait in their next collective)."""

from __future__ import annotations

import time

from . import Running, StepKind


class Sleep(StepKind):
    NAME = "sleep"
    GRAMMAR = r"sleep [0-9]+(\.[0-9]+)?"
    HELP = "'sleep SECONDS'"
    ABOUT = "time.sleep(SECONDS)"
    EXAMPLES = ("sleep 1", "sleep 0.5")
    ORDER = 50

    def act(self, w: Running, entry: str) -> None:
        time.sleep(float(entry.split()[1]))

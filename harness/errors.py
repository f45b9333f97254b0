"""The one error type of the harness itself: neither pass nor fail, said in one line."""

from __future__ import annotations


class HarnessError(RuntimeError):
    """The harness itself failed (not the scenario): neither pass nor fail."""

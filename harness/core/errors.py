"""The harness's own error types: its failure (neither pass nor fail), bad use of a command, a
plan that cannot be made as asked. Each said in one line; this room imports nothing."""

from __future__ import annotations

from typing import Any, Tuple


class HarnessError(RuntimeError):
    """The harness itself failed (not the scenario): neither pass nor fail."""


class UsageError(Exception):
    """Bad input to a command: exit code 2."""


class PlanRefusal(ValueError):
    """The plan cannot be made as asked (a fault that edits each rank's environment under a
    launcher that starts its ranks itself); ``loc`` locates it in the scenario."""

    def __init__(self, message: str, loc: Tuple[Any, ...] = ()):
        super().__init__(message)
        self.loc = loc

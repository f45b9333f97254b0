"""Message patterns of expectations: one engine and one set of flags for validating them (the
schema) and for matching them (expect), with a time limit (pure).

Patterns are matched with the ``regex`` library (re-compatible) case-insensitively, ``.``
matching newlines, for at most ``PATTERN_TIMEOUT`` seconds: a pattern that backtracks without
end on a message gives up (TimeoutError) instead of spinning until the session's timeout.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

import regex

PATTERN_TIMEOUT = 1.0
PATTERN_FLAGS = regex.IGNORECASE | regex.DOTALL


@lru_cache(maxsize=512)
def compile_message_pattern(pattern: str) -> regex.Pattern:
    """A ``message:`` pattern as it is matched. Raises ``regex.error`` for an invalid one."""
    return regex.compile(pattern, PATTERN_FLAGS)


def search(pattern: str, text: str) -> Optional[regex.Match]:
    """The first match of ``pattern`` in ``text``; TimeoutError past PATTERN_TIMEOUT."""
    return compile_message_pattern(pattern).search(text, timeout=PATTERN_TIMEOUT)

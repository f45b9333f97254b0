"""A rank's stderr, read for the diagnosis: torch's warning and error lines and the errno lines,
kept apart from the tail (pure; reads one file).

The tail (the last few thousand characters) is what a person looks at first, but it is the
wrong place for the evidence: a C++ exception's stack frames (``frame #12: ...`` lines, tens of
them), a repeated retry line or a program's own logging push torch's one line that said why
(``[W socket.cpp:...] ... (errno: 98 - Address already in use)``, ``gai error: -2``) out of it.
:func:`key_lines` reads the whole file (up to :data:`READ_MAX` bytes) and keeps the lines that
carry a level or an error (torch's ``[W``/``[E``/``[F`` log lines, ``errno``, ``err=``, ``gai
error``, ``EADDRINUSE``-style names, ``Error:``/``Warning:``), never a stack frame, each distinct
line once with how many times it came, the first :data:`KEEP_FIRST` and the last
:data:`KEEP_LAST` of them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Union

READ_MAX = 64 << 20       # a runaway log is read this far (its key lines are near its start)
KEEP_FIRST = 60
KEEP_LAST = 40
LINE_MAX = 600            # characters kept of one line

KEY = re.compile(
    r"^\[[WEF](?:\d{4} | )|"                              # torch's C++ log: warning, error, fatal
    r"\bE[A-Z]{3,}\b|"                                    # EADDRINUSE, ECONNREFUSED...
    r"\b\w*(?:Error|Exception|Warning):")                  # RuntimeError: ..., UserWarning: ...
KEY_ANY_CASE = re.compile(r"\berrno\b|\berr=-?\d|gai error|\brefused\b|reset by peer|"
                          r"\btimed out\b|broken pipe|no route to host", re.IGNORECASE)
FRAME = re.compile(r"^\s*(?:frame #\d+:|#\d+ 0x[0-9a-f]+|Exception raised from )")
# what differs between two copies of one line: its glog prefix's time and thread
STAMP = re.compile(r"^\[([IWEF])\d{4} [\d:.]+(?: \d+)? ")


def _same(line: str) -> str:
    return STAMP.sub(r"[\1 ", line)


def key_lines(path: Union[str, Path]) -> str:
    """The key lines of the file at ``path`` (text; ``""`` when it cannot be read), in the order
    they first came, a repeated one as ``<line>  [x N]``."""
    seen: Dict[str, List[Union[str, int]]] = {}
    try:
        with open(path, "rb") as f:
            data = f.read(READ_MAX)
    except OSError:
        return ""
    for raw in data.decode(errors="replace").splitlines():
        line = raw.rstrip()
        if not line or FRAME.search(line) or not (KEY.search(line)
                                                        or KEY_ANY_CASE.search(line)):
            continue
        k = _same(line)[:LINE_MAX]
        if k in seen:
            seen[k][1] = int(seen[k][1]) + 1
        else:
            seen[k] = [line[:LINE_MAX], 1]
    kept = list(seen.values())
    if len(kept) > KEEP_FIRST + KEEP_LAST:
        cut = len(kept) - KEEP_FIRST - KEEP_LAST
        kept = kept[:KEEP_FIRST] + [[f"... {cut} more distinct lines", 1]] + kept[-KEEP_LAST:]
    return "\n".join(f"{text}  [x {n}]" if int(n) > 1 else str(text) for text, n in kept)

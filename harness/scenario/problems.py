"""What the loader says about a scenario file: one located ``Problem`` per thing wrong
(``file:line: field: message``, one line each), and ``ScenarioFileError``, which carries them,
first one first, at most ``MAX_PROBLEMS`` per file (:mod:`harness.scenario.loader`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

Path_ = Tuple[str, ...]

MAX_PROBLEMS = 50          # problems listed per file (then: "stopped after ...")


@dataclass
class Problem:
    file: str
    line: Optional[int]
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        field = f"{self.field}: " if self.field else ""
        return one_line(f"{where}: {field}{self.message}")


def one_line(s: str) -> str:
    """Control characters (a newline in a key, a NUL in a file name) shown escaped: one line."""
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)


class ScenarioFileError(Exception):
    """A scenario file that cannot be used; ``problems`` are located, first one first."""

    def __init__(self, problems: List[Problem]):
        self.problems = problems
        super().__init__(self.short())

    def short(self) -> str:
        first = str(self.problems[0])
        more = len(self.problems) - 1
        return first + (f"\n  (+{more} more problem{'s' * (more > 1)} in this file; "
                        "`harness validate FILE` lists them all)" if more else "")


def _capped(file: str, problems: List[Problem]) -> List[Problem]:
    if len(problems) <= MAX_PROBLEMS:
        return problems
    return problems[:MAX_PROBLEMS] + [Problem(file, None, "", f"stopped after {MAX_PROBLEMS} "
                                              "problems: fix these first")]


def _field(loc: Sequence[Any]) -> str:
    out = ""
    for x in loc:
        if isinstance(x, int):
            out += f"[{x}]"
        else:
            s = str(x)
            s = s if s.isprintable() and s.strip() == s or s == "" else repr(s)
            out += f".{s}" if out else s
    return out



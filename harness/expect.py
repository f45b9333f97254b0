"""Expectations: verdicts vs the scenario's Expect block -> mismatches and a readable table (pure).

``message:`` patterns are matched with the ``regex`` library (re-compatible, the same engine
validates them in harness.schema) with a time limit, ``PATTERN_TIMEOUT`` seconds: a pattern that
backtracks without end on a message is a mismatch saying so, never a session spinning until the
outer timeout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Sequence

from .classify import Verdict, job_outcome, mro_names
from .patterns import PATTERN_TIMEOUT, compile_message_pattern, search  # noqa: F401
from .rows import key_for
from .schema import Expect, RankExpect


@dataclass
class Mismatch:
    label: str            # rank label, or "job"
    field: str            # outcome | exception | message | within | phase | rank
    expected: str
    observed: str
    line: Optional[int] = None   # the line of the scenario file the expectation is written on

    def where(self, source: Optional[str]) -> str:
        """``file.yaml:LINE`` of the expectation, when known."""
        if self.line is None:
            return ""
        return f"{source}:{self.line}" if source else f"line {self.line}"


def _rank_expect(exp: Expect, label: str) -> Optional[RankExpect]:
    """The expectation that speaks of the row ``label``: its own key, else the most specific
    wildcard (``R@*``, ``*@A``, ``*``; ``agent:*``, ``parent:*``: harness.rows)."""
    key = key_for(exp.ranks, label)
    return exp.ranks[key] if key is not None else None


def check_rank(e: RankExpect, v: Verdict) -> List[Mismatch]:
    out = _check_rank(e, v)
    for m in out:
        m.line = e.line
    return out


def _check_rank(e: RankExpect, v: Verdict) -> List[Mismatch]:
    out: List[Mismatch] = []
    if e.outcome is not None and v.outcome not in e.outcome:
        out.append(Mismatch(v.label, "outcome", " or ".join(e.outcome), v.outcome))
    if e.exception is not None:
        names = mro_names(v.exception_mro)
        if e.exception not in names:
            out.append(Mismatch(v.label, "exception", e.exception, v.exception or "(none)"))
    if e.message is not None:
        try:
            found = search(e.message, v.message or "")
        except TimeoutError:
            out.append(Mismatch(v.label, "message", f"/{e.message}/",
                                f"(pattern gave up after {PATTERN_TIMEOUT:g} s of backtracking "
                                f"on the message: simplify it) {v.message or '(none)'}"))
        else:
            if not found:
                out.append(Mismatch(v.label, "message", f"/{e.message}/",
                                    v.message or "(none)"))
    if e.within is not None:
        lo, hi = e.within
        if v.duration is None or not lo <= v.duration <= hi:
            got = "unknown" if v.duration is None else f"{v.duration:.1f} s"
            out.append(Mismatch(v.label, "within", f"{lo:g}..{hi:g} s", got))
    if e.phase is not None and v.phase not in e.phase:
        out.append(Mismatch(v.label, "phase", " or ".join(e.phase), v.phase))
    return out


def check(exp: Expect, verdicts: Sequence[Verdict]) -> List[Mismatch]:
    out: List[Mismatch] = []
    if exp.job is not None:
        got = job_outcome(verdicts)
        if got not in exp.job:
            out.append(Mismatch("job", "outcome", " or ".join(exp.job), got, exp.job_line))
    labels = {v.label for v in verdicts}
    for key, e in exp.ranks.items():
        if "*" not in key and key not in labels:
            what = "rank" if key.split(":")[-1].split("@")[0].isdigit() else "process"
            out.append(Mismatch(key, "rank", f"a {what} with this label", f"no such {what} ran",
                                e.line))
    for v in verdicts:
        re_ = _rank_expect(exp, v.label)
        if re_ is not None:
            out += check_rank(re_, v)
    return out


def innermost_frames(stacks: str, n: int = 4) -> str:
    """The innermost ``n`` frames of the main thread from a faulthandler dump."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", stacks.strip())
    main = next((b for b in blocks if "most recent call first" in b and "<module>" in b),
                blocks[0] if blocks else "")
    frames = [ln.strip() for ln in main.splitlines() if ln.strip().startswith("File ")]
    return "\n".join(frames[:n])


def failure_table(verdicts: Sequence[Verdict], exp: Optional[Expect],
                  mismatches: Sequence[Mismatch], width: int = 160,
                  source: Optional[str] = None) -> str:
    """Rank | expected | observed | duration | phase | host | exception: message (+ stacks);
    then one line per mismatch, naming ``source:LINE`` of the expectation it checks."""
    from io import StringIO

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    bad = {m.label for m in mismatches}
    t = Table(show_lines=True, expand=False)
    for col in ("rank", "expected", "observed", "duration", "phase", "host", "exception: message"):
        t.add_column(col, overflow="fold")
    for v in verdicts:
        e = _rank_expect(exp, v.label) if exp else None
        want = e.words() if e is not None else []
        if e is not None and e.line is not None and v.label in bad:
            want.append(f"({_base(source)}:{e.line})" if source else f"(line {e.line})")
        exc = f"{v.exception}: {v.message}" if v.exception else v.reason
        if v.outcome == "hang" and v.stacks:
            exc += "\ninnermost frames:\n" + innermost_frames(v.stacks)
        mark = "✗ " if v.label in bad else ""
        dur = "?" if v.duration is None else f"{v.duration:.1f} s"
        host = v.host + (f" {v.addr}" if v.addr else "")
        cells = [mark + v.label, "\n".join(want) or "-", v.outcome, dur, v.phase, host,
                 _shorten(exc, 600)]
        t.add_row(*(Text(c) for c in cells))   # Text: gloo's "[file.cc:78]" is not markup
    buf = StringIO()
    Console(file=buf, width=width, no_color=True, highlight=False).print(t)
    lines = [f"  {m.label}: {m.field}: expected {m.expected}, observed "
             f"{_shorten(m.observed, 200)}" + (f"  [{m.where(source)}]" if m.line else "")
             for m in mismatches if m.label != "job"]
    job = job_outcome(verdicts)
    if exp is not None and exp.job:
        where = f"  [{source}:{exp.job_line}]" if source and exp.job_line else ""
        lines.insert(0, f"  job: expected {' or '.join(exp.job)}, observed {job}"
                        + (where if job not in exp.job else ""))
    return buf.getvalue() + "\n".join(lines)


def _base(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _shorten(s: str, n: int) -> str:
    s = s.strip()
    return s if len(s) <= n else s[: n - 3] + "..."

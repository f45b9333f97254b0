"""Expectations: verdicts vs the scenario's Expect block -> mismatches and a readable table (pure).

``message:`` patterns are matched with the ``regex`` library (re-compatible, the same engine
validates them in harness.scenario.schema) with a time limit, ``PATTERN_TIMEOUT`` seconds: a pattern
that backtracks without end on a message is a mismatch saying so, never a session spinning until the
outer timeout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..core.rows import key_for
from ..judge.classify import Verdict, job_outcome, mro_names
from .patterns import PATTERN_TIMEOUT, compile_message_pattern, search  # noqa: F401
from .schema import Expect, RankExpect, bound_holds


@dataclass
class Mismatch:
    label: str            # rank label, or "job"
    field: str            # outcome | exception | message | cause | within | phase | rank
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
    wildcard (``R@*``, ``*@A``, ``*``; ``agent:*``, ``parent:*``: harness.core.rows)."""
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
    pattern = e.cause_for(v.outcome)
    if pattern is not None and v.outcome not in ("ok", "absent"):   # an ok row has no cause
        try:
            found = search(pattern, v.cause or "")
        except TimeoutError:
            found = False
        if not found:
            out.append(Mismatch(v.label, "cause", f"/{pattern}/", v.cause or "(none)"))
    if e.within is not None:
        lo, hi = e.within
        if v.duration is None or not lo <= v.duration <= hi:
            got = "unknown" if v.duration is None else f"{v.duration:.1f} s"
            out.append(Mismatch(v.label, "within", f"{lo:g}..{hi:g} s", got))
    if e.phase is not None and v.phase not in e.phase:
        out.append(Mismatch(v.label, "phase", " or ".join(e.phase), v.phase))
    return out


def check(exp: Expect, verdicts: Sequence[Verdict],
          counters: Optional[Mapping[str, Mapping[str, int]]] = None,
          effects: Optional[Sequence[Mapping[str, Any]]] = None) -> List[Mismatch]:
    """The mismatches of one run; ``counters``: the run's kernel TCP counters per host (the
    observation's), checked against ``exp.counters`` (None: not known, not checked);
    ``effects``: what each fault did (the observation's, harness.judge.effects), checked against
    ``exp.effects``, and a fault that had no effect without ``effect: optional`` is one."""
    out: List[Mismatch] = check_counters(exp, counters) if counters is not None else []
    if effects is not None:
        out += check_effects(exp, effects)
    if exp.job is not None:
        got = job_outcome(verdicts)
        if got not in exp.job:
            out.append(Mismatch("job", "outcome", " or ".join(exp.job), got, exp.job_line))
    out += check_tally(exp, verdicts)
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


def _counted(counts: Mapping[Any, int]) -> str:
    return ", ".join(f"{o} {n}" for o, n in sorted(counts.items()) if n) or "no row"


def check_tally(exp: Expect, verdicts: Sequence[Verdict]) -> List[Mismatch]:
    """``tally:``: how many of the rows each key covers ended with each outcome, exactly."""
    from collections import Counter

    from ..core.rows import covers

    out = []
    for key, want in exp.tally.items():
        got = Counter(v.outcome for v in verdicts if covers(key, v.label))
        if {o: n for o, n in got.items() if n} != {o: n for o, n in want.items() if n}:
            out.append(Mismatch(key, "tally", _counted(want), _counted(got), exp.tally_line))
    return out


NO_EFFECT_FIELD = "effect"
REQUIRED = "an effect (effect: required)"


def check_effects(exp: Expect, effects: Sequence[Mapping[str, Any]]) -> List[Mismatch]:
    """A fault whose probe saw no effect fails the case unless it says ``effect: optional``;
    ``exp.effects`` (fault number -> acted | no effect) must match what was seen."""
    from ..judge import effects as fx

    out = [Mismatch(fx.label(e), NO_EFFECT_FIELD, REQUIRED, f"no effect: {e['summary']}")
           for e in fx.unproven(effects)]
    for n, want in exp.effects.items():
        e = fx.find(effects, int(n))
        if e is None:
            out.append(Mismatch(f"fault {n}", NO_EFFECT_FIELD, want, "no such fault in the run",
                                exp.line))
        elif e.get("status") != want:
            out.append(Mismatch(fx.label(e), NO_EFFECT_FIELD, want,
                                f"{e.get('status')}: {e.get('summary')}", exp.line))
    return out


def check_counters(exp: Expect, counters: Mapping[str, Mapping[str, int]]) -> List[Mismatch]:
    from ..net.hostspec import count_holds

    out = []
    for host, bounds in exp.counters.items():
        for name, bound in bounds.items():
            got = counters.get(host, {}).get(name, 0)
            if not count_holds(bound, got):
                seen = "none" if host not in counters else str(got)
                out.append(Mismatch(f"host {host}", f"counter {name}", bound, seen,
                                    exp.counters_line))
    return out


@dataclass
class RepeatedCheck:
    """What N runs of one case say together: every run's mismatches (with its number), each
    rank's outcome counts, the frequency bounds that failed, and the ranks that varied where
    their expectation allows one outcome (the case is flaky)."""

    runs: int
    mismatches: List[Tuple[int, Mismatch]] = field(default_factory=list)   # (run, mismatch)
    counts: Dict[str, Dict[str, int]] = field(default_factory=dict)        # label -> outcome -> n
    bounds: List[Mismatch] = field(default_factory=list)
    flaky: List[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.mismatches or self.bounds or self.flaky)

    def failed_runs(self) -> List[int]:
        return sorted({i for i, _ in self.mismatches})

    def frequencies(self, label: str) -> str:
        """'timeout 7/10, error 3/10' (most frequent first)."""
        c = self.counts.get(label, {})
        return ", ".join(f"{o} {n}/{self.runs}" for o, n in
                         sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def check_repeated(exp: Expect, runs: Sequence[Sequence[Verdict]],
                   counters: Optional[Sequence[Mapping[str, Mapping[str, int]]]] = None,
                   effects: Optional[Sequence[Sequence[Mapping[str, Any]]]] = None
                   ) -> RepeatedCheck:
    """Check N runs of a case: each run against the expectation (frequency bounds aside), then
    the outcome frequencies against the bounds, then whether a rank varied where its
    expectation allows a single outcome (flaky)."""
    res = RepeatedCheck(runs=len(runs))
    for i, verdicts in enumerate(runs, start=1):
        seen = counters[i - 1] if counters is not None and i <= len(counters) else None
        did = effects[i - 1] if effects is not None and i <= len(effects) else None
        res.mismatches += [(i, m) for m in check(exp, verdicts, seen, did)]
        for v in verdicts:
            c = res.counts.setdefault(v.label, {})
            c[v.outcome] = c.get(v.outcome, 0) + 1
    if len(runs) < 2:
        return res
    for label, counts in res.counts.items():
        e = _rank_expect(exp, label)
        if e is None:
            continue
        for outcome, bound in (e.frequency or {}).items():
            freq = counts.get(outcome, 0) / len(runs)
            if not bound_holds(bound, freq):
                res.bounds.append(Mismatch(label, "frequency", f"{outcome} {bound}",
                                           f"{outcome} {counts.get(outcome, 0)}/{len(runs)} "
                                           f"({freq:.2f})", e.line))
        single = e.outcome is not None and len(e.outcome) == 1
        if len(counts) > 1 and single:
            res.flaky.append(label)
    return res


def repeated_table(verdict_runs: Sequence[Sequence[Verdict]], exp: Expect, res: RepeatedCheck,
                   width: int = 160, source: Optional[str] = None) -> str:
    """The failure text of a repeated case: the frequencies, what failed, then the table of
    the first run that failed (or of the first run)."""
    lines = [f"  {res.runs} runs; each rank's outcomes: " + "; ".join(
        f"{label}: {res.frequencies(label)}" for label in res.counts)]
    if res.flaky:
        lines.append("  flaky: " + "; ".join(
            f"rank {label} varied ({res.frequencies(label)}) where its expectation allows "
            f"only {' or '.join(_rank_expect(exp, label).outcome or [])}"   # type: ignore
            for label in res.flaky))
    for m in res.bounds:
        where = f"  [{m.where(source)}]" if m.line else ""
        lines.append(f"  {m.label}: frequency: expected {m.expected}, observed {m.observed}"
                     f"{where}")
    bad = res.failed_runs()
    first = bad[0] if bad else 1
    if bad:
        lines.append(f"  runs that did not end as expected: {', '.join(map(str, bad))}")
    table = failure_table(verdict_runs[first - 1], exp,
                          [m for i, m in res.mismatches if i == first], width=width,
                          source=source)
    return "\n".join(lines) + f"\n  run {first}:\n" + table


def innermost_frames(stacks: str, n: int = 4) -> str:
    """The innermost ``n`` frames of the main thread from a faulthandler dump."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", stacks.strip())
    main = next((b for b in blocks if "most recent call first" in b and "<module>" in b),
                blocks[0] if blocks else "")
    frames = [ln.strip() for ln in main.splitlines() if ln.strip().startswith("File ")]
    return "\n".join(frames[:n])


def label_ranges(labels: Sequence[str]) -> str:
    """'1-7', '0, 2-3', 'agent:a, agent:b': runs of consecutive numeric labels joined."""
    nums = sorted(int(x) for x in labels if x.isdigit())
    parts: List[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        parts.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ", ".join(parts + [x for x in labels if not x.isdigit()])


def stack_groups(stacks: Mapping[str, str]) -> Dict[str, List[str]]:
    """Rows whose main thread has the same frames, grouped: label -> the labels sharing its
    stack, in order (the first of them shows it); a row without stacks is left out). An
    8-rank hang behind one fault prints one stack, not seven."""
    by_key: Dict[str, List[str]] = {}
    for label, text in stacks.items():
        if text.strip():
            by_key.setdefault(innermost_frames(text, n=10 ** 6) or text, []).append(label)
    return {x: labels for labels in by_key.values() for x in labels}


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
    groups = stack_groups({v.label: v.stacks for v in verdicts if v.outcome == "hang"})
    said: Dict[str, str] = {}   # a cause already written in full -> the rank it was written for
    t = Table(show_lines=True, expand=False)
    for col in ("rank", "expected", "observed", "duration", "phase", "host", "exception: message"):
        t.add_column(col, overflow="fold")
    for v in verdicts:
        e = _rank_expect(exp, v.label) if exp else None
        want = e.words() if e is not None else []
        if e is not None and e.line is not None and v.label in bad:
            want.append(f"({_base(source)}:{e.line})" if source else f"(line {e.line})")
        exc = f"{v.exception}: {v.message}" if v.exception else v.reason
        exc = _shorten(exc, 400)
        if v.cause and v.cause in said:
            exc += f"\ncause: the same as rank {said[v.cause]}"
        elif v.cause:
            exc += f"\ncause: {v.cause}"
            said[v.cause] = v.label
        group = groups.get(v.label, [])
        if v.outcome == "hang" and v.stacks and group and group[0] != v.label:
            exc += f"\nsame stack as rank {group[0]}"
        elif v.outcome == "hang" and v.stacks:
            same = f" (ranks {label_ranges(group)}, same stack)" if len(group) > 1 else ""
            exc += f"\ninnermost frames{same}:\n" + innermost_frames(v.stacks)
        mark = "✗ " if v.label in bad else ""
        dur = "?" if v.duration is None else f"{v.duration:.1f} s"
        host = v.host + (f" {v.addr}" if v.addr else "")
        cells = [mark + v.label, "\n".join(want) or "-", v.outcome, dur, v.phase, host,
                 _shorten(exc, 1200)]
        t.add_row(*(Text(c) for c in cells))   # Text: gloo's "[file.cc:78]" is not markup
    buf = StringIO()
    Console(file=buf, width=width, no_color=True, highlight=False).print(t)
    lines = [(f"  {m.label} had {_shorten(m.observed, 300)}"
              if m.field == NO_EFFECT_FIELD and m.expected == REQUIRED else
              f"  {m.label}: {m.field}: expected {m.expected}, observed "
              f"{_shorten(m.observed, 200)}") + (f"  [{m.where(source)}]" if m.line else "")
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

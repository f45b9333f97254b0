"""A scenario's expectations (pure): ``expect:`` blocks (``Expect``: the job's outcome, each
rank's ``RankExpect``, the hosts' TCP counters, each fault's effect), scoped to a torch range and
build, and the frequency bounds of a race case's outcomes. The loader leaves, on each
expectation, the line it came from (``RankExpect.line``), so that a failed expectation names
``file.yaml:LINE``; :mod:`harness.scenario.expect` checks verdicts against them.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Dict, List, Literal, Optional, Tuple, Union

import regex
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import AfterValidator, Field, PrivateAttr, field_validator, model_validator

from ..core.limits import MAX_HOSTS, MAX_SECONDS, MAX_SHORT, MAX_WORLD, Number
from .parts import Strict

OUTCOMES = ("ok", "error", "timeout", "hang", "crash", "absent")
Outcome = Literal["ok", "error", "timeout", "hang", "crash", "absent"]


def _phase_name(v: str) -> str:
    from ..core.protocol import PHASE_RE

    if len(v) > MAX_SHORT or not PHASE_RE.match(v):
        raise ValueError(f"phase {v[:40]!r}: use start, import, init, 'workload step N', "
                         "model, ddp, 'train step K', destroy or exit")
    return v


def _as_list(v: Any) -> Any:
    return [v] if isinstance(v, str) else v


def _as_outcome_set(v: Any) -> Any:
    if isinstance(v, str):
        return [v]
    if isinstance(v, dict):   # outcome: {timeout: ">= 0.6", error: any}: the allowed set
        for b in v.values():  # (said here, where it is written: not at 'frequency')
            if b is not None and not (isinstance(b, (int, float)) and not isinstance(b, bool)):
                parse_bound(str(b))
        return list(v)
    return v


_BOUND = re.compile(r"^\s*(?:(>=|<=|>|<|==)\s*([0-9.]+)|([0-9.]+)\s*\.\.\s*([0-9.]+)|(any))\s*\Z")


def parse_bound(text: str) -> Tuple[float, float, bool, bool]:
    """A frequency bound -> (low, high, low included, high included), frequencies in 0..1:
    ">= 0.6", "<= 0.2", "> 0", "< 1", "== 1", "0.3..0.7" (both ends included), "any"."""
    m = _BOUND.match(str(text))
    if not m:
        raise ValueError(f"frequency bound {str(text)[:40]!r}: write '>= 0.6', '<= 0.2', "
                         "'0.3..0.7' or 'any' (frequencies are 0..1)")
    op, x, a, b, anything = m.groups()
    if anything:
        return 0.0, 1.0, True, True
    try:
        if op is not None:
            v = float(x)
            lo, hi, lo_in, hi_in = {">=": (v, 1.0, True, True), ">": (v, 1.0, False, True),
                                    "<=": (0.0, v, True, True), "<": (0.0, v, True, False),
                                    "==": (v, v, True, True)}[op]
        else:
            lo, hi, lo_in, hi_in = float(a), float(b), True, True
    except ValueError:
        raise ValueError(f"frequency bound {str(text)[:40]!r}: not a number") from None
    if not (0.0 <= lo <= hi <= 1.0):
        raise ValueError(f"frequency bound {str(text)[:40]!r}: frequencies are 0..1")
    return lo, hi, lo_in, hi_in


def bound_holds(text: str, freq: float) -> bool:
    lo, hi, lo_in, hi_in = parse_bound(text)
    return (freq > lo or (lo_in and freq == lo)) and (freq < hi or (hi_in and freq == hi))


class RankExpect(Strict):
    """What one rank must do. Every field is optional; a rank with no field is not checked."""

    _line: Optional[int] = PrivateAttr(None)    # where it is written (set by the loader)

    @property
    def line(self) -> Optional[int]:
        return self._line

    outcome: Optional[List[Outcome]] = Field(
        None, description="allowed outcome(s): ok | error | timeout | hang | crash | absent; "
        "a mapping outcome -> frequency bound ('>= 0.6', '0.3..0.7', 'any') states how often "
        "each may happen when the case is repeated")
    frequency: Optional[Dict[Outcome, str]] = Field(
        None, description="set from the mapping form of outcome: outcome -> frequency bound, "
        "checked over repeated runs (repeat: / --harness-repeat)")
    exception: Optional[str] = Field(
        None, max_length=MAX_SHORT, description="exception class name; matches any class in the "
        "raised exception's MRO (so RuntimeError accepts DistStoreError); 'module.Class' matches "
        "qualified names")
    message: Optional[str] = Field(
        None, max_length=MAX_SHORT,
        description="regular expression searched (case-insensitive) in the exception message: "
        "'.' matches newlines; the regex engine (re-compatible) with a 1 s limit, a pattern that "
        "backtracks longer is a mismatch saying so")
    cause: Optional[Union[Annotated[str, Field(max_length=MAX_SHORT)],
                          Dict[Literal["error", "timeout", "hang", "crash"],
                               Annotated[str, Field(max_length=MAX_SHORT)]]]] = Field(
        None,
        description="regular expression searched (case-insensitive) in the rank's diagnosis "
        "(harness.judge.diagnose: one line of cause, 'unknown: ...' when no rule explains it); "
        "checked "
        "when the rank did not end ok or absent (those have no cause), so a race between ok and "
        "a failure can pin the failure's cause. A mapping from outcome to pattern pins each "
        "path of a race by itself ({timeout: '...', error: '...'}); an outcome it does not "
        "name is not checked")
    within: Optional[Tuple[Number, Number]] = Field(
        None, description="[min, max] seconds from the start line to the rank's end")
    phase: Optional[List[Annotated[str, AfterValidator(_phase_name)]]] = Field(
        None, max_length=16, description="phase(s) the rank may end in: start, import, init, "
        "workload step N, model, ddp, train step K, destroy, exit; a list when torch races "
        "between paths")

    # json_schema_input_type: the exported JSON Schema must accept the shorthands too
    _outcome = field_validator("outcome", mode="before", json_schema_input_type=Optional[
        Union[Outcome, List[Outcome], Dict[Outcome, str]]])(_as_outcome_set)

    @model_validator(mode="before")
    @classmethod
    def _frequencies(cls, v: Any) -> Any:
        """``outcome: {timeout: ">= 0.6", error: "<= 0.4"}``: the set and the bounds."""
        if isinstance(v, dict) and isinstance(v.get("outcome"), dict):
            if "frequency" in v:
                raise ValueError("give frequencies either in outcome: {...} or in frequency:")
            v = dict(v)
            freq = {k: ("any" if b is None else b) for k, b in v["outcome"].items()}
            try:
                for b in freq.values():
                    if isinstance(b, str):
                        parse_bound(b)
            except ValueError:
                return v      # the outcome field says what is wrong, where it is written
            v["frequency"] = freq
        return v

    @field_validator("frequency")
    @classmethod
    def _bounds(cls, v: Optional[Dict[str, Any]]) -> Optional[Dict[str, str]]:
        if v is None:
            return v
        out = {}
        for k, b in v.items():
            text = str(b) if not isinstance(b, (int, float)) or isinstance(b, bool) \
                else f"== {b}"
            parse_bound(text)
            out[k] = text
        return out
    _phase = field_validator("phase", mode="before", json_schema_input_type=Optional[
        Union[str, List[str]]])(_as_list)

    varies: Optional[List[Literal["exception", "message", "duration"]]] = Field(
        None, max_length=3, description="what differs from run to run of this very scenario "
        "because torch itself races (with the same outcome and phase): harness diff does not "
        "count a change of these between two single runs; say how often in about:")

    def racy(self) -> bool:
        """Declares a race: several outcomes or phases, or fields that vary between runs."""
        return len(self.outcome or ()) > 1 or len(self.phase or ()) > 1 or bool(self.varies)

    @field_validator("message", "cause")
    @classmethod
    def _regex(cls, v: Any) -> Any:
        # the engine and flags harness.scenario.expect matches with (the `regex` library)
        for pat in (v.values() if isinstance(v, dict) else [v] if v is not None else []):
            from .patterns import compile_message_pattern

            try:
                compile_message_pattern(pat)
            except (regex.error, RecursionError, OverflowError) as e:
                raise ValueError(f"not a valid regular expression: {e}") from None
        return v

    def cause_for(self, outcome: str) -> Optional[str]:
        """The cause pattern that applies to a row that ended ``outcome`` (None: unchecked)."""
        if isinstance(self.cause, dict):
            return self.cause.get(outcome)   # type: ignore[call-overload]
        return self.cause

    def words(self) -> List[str]:
        """This expectation in short words: 'timeout', 'DistStoreError', '/pat/', 'in 3..30 s'."""
        if self.frequency:
            out = [", ".join(f"{o} {b}" if b != "any" else o for o, b in self.frequency.items())]
        else:
            out = ["|".join(self.outcome)] if self.outcome else []
        if self.exception:
            out.append(self.exception)
        if self.message:
            out.append(f"/{self.message}/")
        if isinstance(self.cause, dict):
            out.extend(f"cause if {o} /{p}/" for o, p in self.cause.items())
        elif self.cause:
            out.append(f"cause /{self.cause}/")
        if self.within:
            out.append(f"in {self.within[0]:g}..{self.within[1]:g} s")
        if self.phase:
            out.append(f"phase {'|'.join(self.phase)}")
        if self.varies:
            out.append(f"varies: {', '.join(self.varies)}")
        return out

    @field_validator("within")
    @classmethod
    def _window(cls, v: Optional[Tuple[float, float]]) -> Optional[Tuple[float, float]]:
        if v is not None and not (0 <= v[0] <= v[1] <= MAX_SECONDS):
            raise ValueError(f"must be [min, max] with 0 <= min <= max <= {MAX_SECONDS:g}")
        return v


class Expect(Strict):
    """Expectations for the job and its ranks, optionally scoped to a torch version range."""

    _line: Optional[int] = PrivateAttr(None)       # where the block starts (set by the loader)
    _job_line: Optional[int] = PrivateAttr(None)   # where its job: is
    _counters_line: Optional[int] = PrivateAttr(None)   # where its counters: is
    _tally_line: Optional[int] = PrivateAttr(None)   # where its tally: is

    @property
    def line(self) -> Optional[int]:
        return self._line

    @property
    def tally_line(self) -> Optional[int]:
        return self._tally_line or self._line

    @property
    def job_line(self) -> Optional[int]:
        return self._job_line

    @property
    def counters_line(self) -> Optional[int]:
        return self._counters_line or self._line

    torch: Optional[str] = Field(
        None, max_length=MAX_SHORT,
        description="torch version range this block holds for, e.g. '>=2.4' or '>=2.2,<2.5'")
    build: Optional[Literal["cpu", "cuda"]] = Field(
        None, description="the build of torch this block holds for: cpu (torch.version.cuda "
        "is None) or cuda; what torch does without a GPU differs between the two builds")
    job: Optional[List[Outcome]] = Field(
        None, description="allowed job outcome(s); the job's outcome is the most severe of its "
        "ranks' (hang > crash > timeout > error > ok; an absent rank does not count)")
    ranks: Dict[str, RankExpect] = Field(
        default_factory=dict, max_length=MAX_WORLD + 1,
        description="per rank (key: rank number, a label such as 'job2:0', or '*' for every rank "
        "not listed); a value may be an outcome or a list of outcomes as shorthand")

    tally: Dict[str, Dict[Outcome, Annotated[int, Field(ge=0, le=MAX_WORLD)]]] = Field(
        default_factory=dict, max_length=16,
        description="per row key (a label or a wildcard such as 'agent:*', as in ranks:): how "
        "many of the rows it covers end with each outcome, exactly (e.g. {'agent:*': {ok: 2, "
        "error: 2}}: which agents a rendezvous admits is the order they join, how many it "
        "admits is not); its rows may then allow those outcomes in ranks: and stay "
        "deterministic")

    counters: Dict[str, Dict[str, str]] = Field(
        default_factory=dict, max_length=MAX_HOSTS,
        description="per host: bounds on its kernel's TCP counters at the end of the run "
        "(what happened on the wire: e.g. node0: {TcpExt.ListenOverflows: '>= 1'}); the "
        "counters are those of harness.net.hostspec.COUNTERS")

    effects: Dict[int, Literal["acted", "no effect"]] = Field(
        default_factory=dict, max_length=64,
        description="per fault (its number in the case's faults, from 1): what its probe must "
        "have seen: acted, or no effect (a fault that may have none says effect: optional); a "
        "fault whose kind has no probe reads 'not observable' and matches neither")

    _job = field_validator("job", mode="before", json_schema_input_type=Optional[
        Union[Outcome, List[Outcome]]])(_as_outcome_set)

    @field_validator("counters")
    @classmethod
    def _counters(cls, v: Dict[str, Dict[str, str]]) -> Dict[str, Dict[str, str]]:
        from ..net.hostspec import COUNTERS, count_bound_problem

        for host, bounds in v.items():
            for name, bound in bounds.items():
                if name not in COUNTERS:
                    raise ValueError(f"{host}: {name[:60]!r} is not a counter the harness keeps;"
                                     f" one of: {', '.join(COUNTERS)}")
                why = count_bound_problem(bound)
                if why:
                    raise ValueError(f"{host}: {name}: {why}")
        return v

    @field_validator("torch")
    @classmethod
    def _spec(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            try:
                SpecifierSet(v)
            except InvalidSpecifier:
                raise ValueError(f"not a version range: {v!r} (write e.g. '>=2.4,<2.6')") from None
        return v

    @field_validator("ranks", mode="before", json_schema_input_type=Dict[
        str, Union[RankExpect, Outcome, List[Outcome]]])
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        if isinstance(v, dict):
            if len(v) > MAX_WORLD + 1:   # one error, not one per key
                raise ValueError(f"{len(v)} entries: at most {MAX_WORLD + 1} (every rank and "
                                 "'*')")
            out = {}
            for k, r in v.items():
                out[str(k)] = {"outcome": r} if isinstance(r, (str, list)) else r
            return out
        return v

    def summary(self) -> str:
        """One line: '[torch >=2.4] job timeout; 0: timeout DistStoreError; 1: ...'."""
        parts = [f"[torch {self.torch}]"] if self.torch else []
        if self.build:
            parts.append(f"[{self.build} build]")
        if self.job:
            parts.append("job " + "|".join(self.job))
        parts += [f"{label}: {' '.join(e.words()) or 'any'}" for label, e in self.ranks.items()]
        parts += [f"tally {key}: " + ", ".join(f"{o} {n}" for o, n in counts.items())
                  for key, counts in self.tally.items()]
        return "; ".join(parts) or "(nothing checked)"

    def applies_to(self, torch_version: str, cuda: Optional[str] = None) -> bool:
        """This block holds for torch ``torch_version`` built with CUDA ``cuda`` (None: a CPU
        build)."""
        if self.build is not None and self.build != ("cpu" if cuda is None else "cuda"):
            return False
        if self.torch is None:
            return True
        return SpecifierSet(self.torch).contains(base_version(torch_version), prereleases=True)


def base_version(v: str) -> str:
    """'2.13.0+cpu' -> '2.13.0'; '2.6.0a0+git1234' -> '2.6.0a0'."""
    return v.split("+", 1)[0]


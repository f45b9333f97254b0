"""The scenario format: typed models for one scenario case (pure, no I/O).

A scenario file is YAML; ``harness.loader`` turns it into ``Scenario`` objects (one per case) and
reports every error as ``file:line: field.path: message``. Faults are typed by their own
plugin models (``harness.faults``, looked up by ``kind`` in the registry), validated once and
kept typed on the scenario. The loader also leaves, on each expectation, the line it came from
(``RankExpect.line``), so that a failed expectation names ``file.yaml:LINE``.

Every value a file can give has a stated bound (docs/reference/scenario-files.md, "Limits"):
what passes here must also start, run and be written down (spawned env, torch's timedelta,
test ids, evidence paths).
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Any, Dict, List, Literal, Optional, Tuple, Union
from urllib.parse import urlsplit

import regex
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from ..core.limits import (  # noqa: F401 - the limits are part of the format's vocabulary
    ENV_NAME_RE,
    MAX_ADDR,
    MAX_ENV_TOTAL,
    MAX_ENV_VALUE,
    MAX_ENV_VARS,
    MAX_EXPECT_BLOCKS,
    MAX_FAULTS,
    MAX_HOSTS,
    MAX_MARKS,
    MAX_MODEL_MB,
    MAX_NAME,
    MAX_REPEAT,
    MAX_SECONDS,
    MAX_SHORT,
    MAX_STEPS,
    MAX_TEXT,
    MAX_TRAIN_STEPS,
    MAX_WORLD,
    MIN_RACE_REPEAT,
    MIN_TIMEOUT,
    EnvName,
    EnvValue,
    Number,
    Port,
    PositiveSeconds,
    Seconds,
    env_as_text,
    located,
    no_bool,
)
from ..faults import Fault
from ..launchers import LauncherSpec, launcher_kinds, launcher_of
from ..ranks.workload import WORKLOAD_HELP, WORKLOAD_RE, model_mb, workload_phases
from .programs import Program, program_of

OUTCOMES = ("ok", "error", "timeout", "hang", "crash", "absent")
Outcome = Literal["ok", "error", "timeout", "hang", "crash", "absent"]

STEP_RE = WORKLOAD_RE   # the worker's grammar (harness.protocol)

# markers that pytest or a common plugin gives a meaning to: as a label they would skip, time out,
# parametrize or abort the session (pytest-timeout's needs an argument: INTERNALERROR)
RESERVED_MARKS = {
    **{m: "pytest" for m in ("skip", "skipif", "xfail", "parametrize", "usefixtures",
                             "filterwarnings", "tryfirst", "trylast")},
    "timeout": "pytest-timeout", "xdist_group": "pytest-xdist",
    "scenario": "torchdist-harness (it marks every case)", "asyncio": "pytest-asyncio",
    "anyio": "anyio", "flaky": "flaky and pytest-rerunfailures", "order": "pytest-order",
    "run": "pytest-ordering", "forked": "pytest-forked", "django_db": "pytest-django",
    "benchmark": "pytest-benchmark", "dependency": "pytest-dependency",
    "repeat": "pytest-repeat", "no_cover": "pytest-cov", "hypothesis": "hypothesis",
}
MARK_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*", re.ASCII)
NAME_RE = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"   # a scenario's name (a pattern for pydantic)
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"       # one label of a host name
HOSTNAME_RE = rf"^{_LABEL}(\.{_LABEL})*$"
CASE_ID_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.=-]*", re.ASCII)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


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
        description="regular expression searched (case-insensitive) in the exception message")
    cause: Optional[Union[Annotated[str, Field(max_length=MAX_SHORT)],
                          Dict[Literal["error", "timeout", "hang", "crash"],
                               Annotated[str, Field(max_length=MAX_SHORT)]]]] = Field(
        None,
        description="regular expression searched (case-insensitive) in the rank's diagnosis "
        "(harness.diagnose: one line of cause, 'unknown: ...' when no rule explains it); checked "
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
        # the engine and flags harness.expect matches with (the `regex` library)
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
        "counters are those of harness.hostspec.COUNTERS")

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


def _step(s: str) -> str:
    if len(s) > 600 or not STEP_RE.match(s):
        raise ValueError(f"unknown step {s[:80]!r}: use {WORKLOAD_HELP}")
    if s.startswith("sleep ") and float(s.split()[1]) > MAX_SECONDS:
        raise ValueError(f"sleep {s.split()[1]}: at most {MAX_SECONDS:g} seconds")
    if s.startswith("ddp") and not 0 < model_mb(s) <= MAX_MODEL_MB:
        raise ValueError(f"{s}: the model's size must be more than 0 and at most "
                         f"{MAX_MODEL_MB} MB")
    if s.startswith("train ") and not 1 <= int(s.split()[1]) <= MAX_TRAIN_STEPS:
        raise ValueError(f"{s}: 1 to {MAX_TRAIN_STEPS} training steps")
    return s


def _workload_shorthand(v: Any) -> Any:
    if isinstance(v, str):
        return {"steps": [] if v == "init" else [v]}
    if isinstance(v, list):
        return {"steps": v}
    return v


def _marker(m: str) -> str:
    if not MARK_RE.fullmatch(m) or len(m) > MAX_NAME:
        raise ValueError(f"{m[:80]!r} is not a valid pytest marker name (ASCII letters, digits "
                         f"and _, starting with a letter, at most {MAX_NAME})")
    if m in RESERVED_MARKS:
        raise ValueError(f"{m!r} is a marker {RESERVED_MARKS[m]} gives a meaning to (it would "
                         "skip, time out or abort the test, not label it): marks: are plain "
                         "labels for -m, pick another name")
    if m == "race":
        raise ValueError("'race' is the marker of race cases: declare one with race: (what "
                         "races, the frequencies measured), not with marks:")
    if m in ("and", "or", "not"):
        raise ValueError(f"{m!r} is a word of pytest's -m expressions: -m could never select "
                         "it; pick another name")
    return m


class Workload(Strict):
    steps: List[Annotated[str, AfterValidator(_step)]] = Field(
        default_factory=lambda: ["all_reduce"], max_length=MAX_STEPS,
        description="after init: barrier | all_reduce (sum checked) | broadcast (value checked) | "
        "monitored_barrier (gloo; names the ranks that did not arrive) | 'sleep S' | 'ddp SIZE' "
        "(a model of SIZE, e.g. 64MB or 1GB, wrapped in DistributedDataParallel: phases model "
        "and ddp) | 'train N' (N training steps through it: phases 'train step K'); [] means "
        "init only")
    destroy: bool = Field(True, description="call destroy_process_group at the end")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        return _workload_shorthand(v)

    @model_validator(mode="after")
    def _ddp_then_train(self) -> Workload:
        ddp = [i for i, s in enumerate(self.steps) if s.startswith("ddp")]
        if len(ddp) > 1:
            raise located("steps", f"{len(ddp)} ddp entries: at most one (the phases model and "
                          "ddp would repeat)")
        train = [i for i, s in enumerate(self.steps) if s.startswith("train ")]
        if train and (not ddp or train[0] < ddp[0]):
            raise located("steps", f"{self.steps[train[0]]!r} needs a 'ddp SIZE' entry before "
                          "it (the model it trains)")
        total = sum(int(self.steps[i].split()[1]) for i in train)
        if total > MAX_TRAIN_STEPS:
            raise located("steps", f"{total} training steps in all: at most {MAX_TRAIN_STEPS}")
        return self

    def phases(self) -> List[str]:
        """The phases a rank running this workload enters after init (protocol's names)."""
        return [p for p, _ in workload_phases(self.steps)]


def launcher_spec_of(v: Any) -> Any:
    """A launcher as the scenario keeps it: its kind's model. The loader validates it itself
    (to locate every problem) and passes it typed; this is for a scenario built in code."""
    if isinstance(v, LauncherSpec):
        return v
    v = launcher_of(v)
    if not isinstance(v, dict):
        return v
    kinds = launcher_kinds()
    kind = v.get("kind", "direct")
    cls = kinds.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown launcher {str(kind)[:60]!r} (known: {', '.join(kinds)})")
    return cls.model_validate(v)


def fault_of(v: Any) -> Any:
    """A fault as the scenario keeps it: its plugin's model, found by ``kind`` in the registry.
    The loader validates faults itself (to locate every problem) and passes them typed; this
    is for a scenario built in code (tests), where an unknown kind is a plain error."""
    if isinstance(v, Fault) or not isinstance(v, dict):
        return v
    from ..faults import REGISTRY

    kind = v.get("kind")
    cls = REGISTRY.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown fault kind {str(kind)[:60]!r} (known: "
                         f"{', '.join(REGISTRY.kinds())})")
    return cls.model_validate(v)


INIT_URL_FIELDS = ("addr", "port", "port2", "rank", "world_size", "run_dir")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


def fill_init_url(template: str, **values: Any) -> str:
    """The URL with its {placeholders} filled in (only the known ones exist)."""
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), template)


def init_url_parts(template: str) -> Tuple[str, Optional[str], str]:
    """(scheme, host or None, path) of an init_url template, checked: known placeholders,
    a file path only inside the run's folder. ValueError says what is wrong."""
    for name in _PLACEHOLDER.findall(template):
        if name not in INIT_URL_FIELDS:
            raise ValueError(f"unknown placeholder {{{name[:20]}}} (known: "
                             f"{', '.join('{' + f + '}' for f in INIT_URL_FIELDS)})")
    sample = fill_init_url(template, addr="127.0.0.1", port=29500, port2=29501, rank=0,
                           world_size=2, run_dir="/RUN_DIR")
    if "{" in sample or "}" in sample:
        raise ValueError("a lone { or } (placeholders are {addr}, {port}, ...)")
    parts = urlsplit(sample)
    scheme = parts.scheme.lower()
    if not scheme:
        raise ValueError(f"{template[:60]!r} has no scheme (tcp://, env://, file://)")
    try:
        host = parts.hostname
    except ValueError as e:
        raise ValueError(f"{template[:60]!r}: {e}") from None
    if scheme == "file":
        path = posixpath.normpath(parts.path) if parts.path else ""
        if host:
            raise ValueError("a file:// URL names no host: file:///path or file://{run_dir}/..")
        if path and not (path == "/RUN_DIR" or path.startswith("/RUN_DIR/")):
            raise ValueError(f"the file store's path {path[:60]!r} is outside the run's folder: "
                             "write file://{run_dir}/NAME (the harness writes and removes "
                             "only what it made)")
    return scheme, host, parts.path


class Host(Strict):
    # the topology's own rule: starts with a letter or digit, at most 16 characters
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,15}$",
                      description="host name (a namespace): 1-16 of [A-Za-z0-9_-], starting with "
                      "a letter or digit")
    ranks: int = Field(1, ge=1, le=MAX_WORLD, description="ranks on this host")
    python: Optional[str] = Field(None, min_length=1, max_length=MAX_TEXT,
                                  description="the interpreter of this host's ranks (another "
                                  "venv, another torch); default: the harness's own")
    # -- the host as a whole machine (a UTS namespace, its own files, its kernel settings) --
    hostname: Optional[str] = Field(
        None, pattern=HOSTNAME_RE, max_length=63,
        description="the host's own name (gethostname(), socket.getfqdn(), torchrun's "
        "rendezvous): a UTS namespace of its own; default: the machine's name, shared by every "
        "host (or the host's own name with hostnames: own)")
    resolves_self: Optional[str] = Field(
        None, max_length=MAX_ADDR,
        description="what the host's own name resolves to in its own hosts file: 'link' (its "
        "address on the run's link; the default), 'none' (not at all) or a loopback address "
        "(Debian's 127.0.1.1 line)")
    knows: Union[Literal["all", "none"], List[str]] = Field(
        "all", max_length=MAX_HOSTS, description="which other hosts' names its hosts file "
        "lists: all, none, or a list of host names (only hosts with their own name count)")
    names: Dict[Annotated[str, Field(pattern=HOSTNAME_RE, max_length=MAX_ADDR)],
                Union[str, List[str]]] = Field(
        default_factory=dict, max_length=64,
        description="more lines of its hosts file: a name -> a host of the scenario (its "
        "address), an address of the run or a loopback address, or a list of them in order; "
        "[] makes the name unknown on this host")
    sysctl: Dict[str, Union[int, str]] = Field(
        default_factory=dict, max_length=32,
        description="kernel settings of the host's own network namespace, e.g. "
        "net.core.somaxconn: 8, net.ipv4.tcp_syn_retries: 1 (only keys a network namespace "
        "owns; harness.hostspec.SYSCTL_KEYS lists them)")
    mtu: Optional[int] = Field(None, ge=68, le=65535,
                               description="the MTU of the host's link interface")

    @field_validator("sysctl")
    @classmethod
    def _sysctl(cls, v: Dict[str, Any]) -> Dict[str, str]:
        from ..net.hostspec import sysctl_problem

        out = {}
        for key, value in v.items():
            why = sysctl_problem(key, value)
            if why:
                raise ValueError(why)
            out[key] = str(value)
        return out

    @field_validator("resolves_self")
    @classmethod
    def _self(cls, v: Optional[str]) -> Optional[str]:
        from ..net.hostspec import resolves_self_problem

        why = None if v is None else resolves_self_problem(v)
        if why:
            raise ValueError(why)
        return v

    def is_whole_machine(self) -> bool:
        """It asks for more than a network namespace's link: a name, files or settings."""
        return bool(self.hostname or self.resolves_self or self.names or self.sysctl
                    or self.mtu is not None or self.knows != "all")


DNS_NAME_RE = r"^[a-z0-9]([a-z0-9-]{0,62})(\.[a-z0-9]([a-z0-9-]{0,62}))*$"


class Etcd(Strict):
    """The run's own etcd (``etcd:``), for torchrun's ``etcd`` / ``etcd-v2`` rendezvous: one
    member with ``--enable-v2``, its data directory and leased ports in the run directory
    (harness.services.etcd, harness.faults._etcd)."""

    host: str = Field(
        "etcd", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,15}$",
        description="where it runs: a host of its own of this name (the default 'etcd': no "
        "ranks on it, on the run's link), a host of the scenario (beside that agent), or "
        "'loopback' (127.0.0.1 of a single-host run: no namespaces needed)")
    binary: Optional[str] = Field(
        None, max_length=MAX_SHORT, description="the etcd program (default: etcd on PATH, "
        "Debian's etcd-server)")

    def own_host(self, scenario_hosts: List[str]) -> bool:
        """It runs on a host of its own (not a scenario host, not loopback)."""
        return self.host != "loopback" and self.host not in scenario_hosts


class Dns(Strict):
    """The run's own name server (``dns:``): dnsmasq on a host of its own, with no upstream;
    every scenario host resolves through it (harness.services.dns)."""

    domain: Optional[str] = Field(
        None, pattern=DNS_NAME_RE, max_length=MAX_ADDR,
        description="search domain written into every host's resolv.conf; a record without a "
        "dot is this name under it")
    records: Dict[Annotated[str, Field(pattern=DNS_NAME_RE, max_length=MAX_ADDR)],
                  Union[Annotated[str, Field(max_length=MAX_ADDR)],
                        Annotated[List[Annotated[str, Field(max_length=MAX_ADDR)]],
                                  Field(min_length=1, max_length=8)]]] = Field(
        default_factory=dict, max_length=MAX_HOSTS,
        description="name -> a host of the scenario (its addresses: A and/or AAAA by ip; "
        "HOST/4 only its A, HOST/6 only its AAAA), 'dead' (an address of the run where no "
        "host is), a loopback address, or a list of them in order")
    master: Optional[str] = Field(
        None, pattern=DNS_NAME_RE, max_length=MAX_ADDR,
        description="MASTER_ADDR of every rank: a name the ranks ask the server (a short name "
        "goes through the search domain); null (the default): the master host's address, also "
        "in a case that overrides a file's dns: with master: null")
    ptr: bool = Field(True, description="PTR records for every record's addresses; false: "
                      "none (every reverse lookup of the run is NXDOMAIN; the names are then "
                      "answered by the harness's responder behind dnsmasq)")
    timeout: int = Field(5, ge=1, le=30, description="resolv.conf options timeout: (glibc's "
                         "default 5)")
    attempts: int = Field(2, ge=1, le=5, description="resolv.conf options attempts: (glibc's "
                          "default 2)")
    host: str = Field("dns", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,15}$",
                      description="the name of the server's own host (no ranks on it)")

    def fqdn(self, name: str) -> str:
        """A record's full name (a short one under the domain)."""
        return name if "." in name or not self.domain else f"{name}.{self.domain}"

    @model_validator(mode="after")
    def _short_names(self) -> Dns:
        short = [n for n in self.records if "." not in n]
        if short and not self.domain:
            raise located("records", f"{short[0]!r} is a short name: give domain: (the search "
                          "domain it lives under) or write the full name")
        return self


class Scenario(Strict):
    _source: Optional[str] = PrivateAttr(None)     # the file it was loaded from (the loader)

    name: str = Field(pattern=NAME_RE, max_length=MAX_NAME,
                      description="short id, used in test ids: letters, digits, . _ - (not "
                      "starting with . or -)")
    about: str = Field(min_length=1, max_length=MAX_TEXT,
                       description="why this scenario exists, where it comes from, and what was "
                       "watched happening")
    backend: Optional[str] = Field(
        "gloo", pattern=r"^[A-Za-z0-9:,]{0,48}$",
        description="torch's backend argument as users write it: gloo, nccl, "
        "'cpu:gloo,cuda:nccl' (a malformed one, a duplicate device or a trailing comma, is "
        "passed as written, for torch's own error); null: omitted (torch picks by device)")
    backend_available: Optional[bool] = Field(
        None, description="null (default): skipped, with the reason, where this machine "
        "cannot give the backend; false: the case is ABOUT a machine without it (torch's "
        "error is the expectation): it runs where the backend is missing and is skipped "
        "where it is there; true: as null")
    gpus: Optional[int] = Field(
        None, ge=0, le=MAX_WORLD, description="with NCCL: how many CUDA GPUs the case needs "
        "(skipped, with the count, where the machine has fewer); null: one per rank. Fewer "
        "than the ranks puts several ranks on one GPU (with LOCAL_RANK set in env)")
    world_size: int = Field(2, ge=1, le=MAX_WORLD, description="number of ranks (with "
                            "hosts: the hosts' ranks)")
    init: Literal["env", "tcp", "file"] = Field(
        "env", description="init method: env (env://, MASTER_ADDR/PORT), tcp (tcp://addr:port) or "
        "file (file:///shared/path)")
    init_url: Optional[str] = Field(
        None, max_length=MAX_ADDR, description="init_method exactly as a user writes it, "
        "instead of the one init builds: a template with {addr}, {port} (MASTER_PORT), "
        "{port2} (a second port of the run's, not MASTER_PORT), {rank}, {world_size} and "
        "{run_dir} (e.g. 'tcp://{addr}', 'tcp://{addr}:{port}?rank={rank}', "
        "'env://?use_libuv=0', 'file://', 'foo://x'); a host in it must be one the harness may "
        "send traffic to, a file path must lie in {run_dir}")
    init_args: Optional[List[Literal["rank", "world_size"]]] = Field(
        None, max_length=2, description="with init_url: which of rank and world_size are also "
        "passed as arguments (default: both for tcp:// and file://, none otherwise)")
    timeout: Annotated[float, BeforeValidator(no_bool), Field(
        ge=MIN_TIMEOUT, le=MAX_SECONDS, allow_inf_nan=False)] = Field(
        30.0, description="torch's own timeout for init_process_group, s")
    rank_timeouts: Dict[Annotated[int, Field(ge=0, lt=MAX_WORLD)], Annotated[
        float, BeforeValidator(no_bool), Field(ge=MIN_TIMEOUT, le=MAX_SECONDS,
                                               allow_inf_nan=False)]] = Field(
        default_factory=dict, max_length=MAX_WORLD,
        description="torch's timeout for these ranks instead of timeout: (rank -> s), read by "
        "each worker from its rank before init: orders two ranks' timers that would otherwise "
        "fire together")
    deadline: PositiveSeconds = Field(
        60.0, description="the harness's wall-clock bound for the run from the start line, s;"
        " ranks alive then are 'hang'")
    master_addr: str = Field("127.0.0.1", max_length=MAX_ADDR,
                             description="MASTER_ADDR given to every rank (single host); with "
                             "hosts, the master host's address is used")
    hosts: Optional[List[Host]] = Field(
        None, min_length=1, max_length=MAX_HOSTS,
        description="several hosts, each a network namespace linked by a bridge; ranks are "
        "numbered from the master host (rank 0 hosts the store), then host by host in order")
    nodes: Optional[int] = Field(None, ge=1, le=MAX_HOSTS,
                                 description="shorthand for hosts: node0..")
    ranks_per_node: Optional[int] = Field(None, ge=1, le=MAX_WORLD, description="with nodes")
    hostnames: Literal["machine", "own"] = Field(
        "machine", description="the hosts' names: machine (every host shares the machine's "
        "name, as network namespaces alone do) or own (each host is named after itself, in "
        "a UTS namespace of its own, and the hosts know each other's names)")
    master_host: Optional[str] = Field(None, max_length=MAX_NAME, description="host of rank 0's "
                                       "store; default: the first host")
    ip: Literal["4", "6", "dual"] = Field(
        "4", description="address families of the hosts: 4, 6 (IPv6 only: unique local "
        "addresses inside the run's namespaces; MASTER_ADDR an IPv6 literal) or dual (both; "
        "MASTER_ADDR the IPv4 one). A single host with 6: MASTER_ADDR ::1")
    isolate: Literal["auto", "always", "never"] = Field(
        "auto", description="run a single-host scenario in a private network namespace (private "
        "ports, a filter rule on lo touches nothing else): auto = when the harness can")
    env: Dict[EnvName, EnvValue] = Field(
        default_factory=dict, max_length=MAX_ENV_VARS,
        description="extra env for every rank (names of letters, digits and _)")
    python: Dict[str, Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]] = Field(
        default_factory=dict, max_length=MAX_WORLD + 1,
        description="the interpreter of ranks (another venv, another torch): a path for every "
        "rank, or a mapping of rank numbers (and '*') to paths; a host's python comes between "
        "(rank > host > '*'); ~ and $VARS are expanded; a scenario whose interpreter is "
        "missing or cannot import torch is skipped with the reason")
    workload: Workload = Field(default_factory=lambda: Workload(),
                               description="what the ranks do after init: init (init only), a "
                               "list of steps, or {steps: [...], destroy: true} (the workload "
                               "steps' reference)")
    launcher: Annotated[LauncherSpec, BeforeValidator(launcher_spec_of)] = Field(
        default_factory=lambda: launcher_spec_of("direct"),
        description="how the ranks start: direct (the harness starts each), torchrun (one "
        "agent per host), spawn (one parent per host); a name or a mapping with kind and its "
        "options (docs/launchers.md)")
    program: Annotated[Optional[Program], BeforeValidator(program_of)] = Field(
        None, description="what each rank runs: worker (the harness's own, the default), a "
        "Python file (train.py) or a mapping {script | module, args, cwd}")
    start: Literal["fresh", "fork"] = Field(
        "fork", description="how a rank's interpreter comes to be: fork (the default: forked "
        "from a per-host server that imported torch once; ranks whose start would differ "
        "forked run fresh, with the reason in the report) or fresh (its own python, imports "
        "torch); --start / --harness-start overrides")
    faults: List[Annotated[Fault, BeforeValidator(fault_of)]] = Field(
        default_factory=list, max_length=MAX_FAULTS,
        description="faults, each a mapping with its kind and the kind's parameters")
    dns: Optional[Dns] = Field(
        None, description="a real name server in the topology (dnsmasq, no upstream) that "
        "every host resolves with: records, search domain, the master's name "
        "(docs/how-to/network-faults.md)")
    etcd: Optional[Etcd] = Field(
        None, description="a real etcd of the run, for torchrun's etcd / etcd-v2 rendezvous "
        "(docs/how-to/torchrun.md)")
    expect: List[Expect] = Field(
        default_factory=lambda: [Expect()], max_length=MAX_EXPECT_BLOCKS,
        description="one block, or a list of torch-scoped blocks (the first whose 'torch' range "
        "holds is used)")
    race: Optional[str] = Field(
        None, min_length=1, max_length=MAX_TEXT,
        description="declares a race case: what races (inside torch, not the harness's own "
        "timing) and the frequencies measured; its rows with several outcomes give a "
        f"frequency bound for each, it runs repeat: >= {MIN_RACE_REPEAT} times and gets the "
        "pytest marker 'race'. Without it a case is deterministic: one outcome per row "
        "(harness validate --strict)")
    repeat: int = Field(1, ge=1, le=MAX_REPEAT, description="run the case this many times: "
                        "its ranks' outcome frequencies are reported and checked against "
                        "frequency bounds, and a rank that varies where its expectation "
                        "allows one outcome makes the case flaky (--harness-repeat overrides)")
    marks: List[Annotated[str, AfterValidator(_marker)]] = Field(
        default_factory=list, max_length=MAX_MARKS,
        description="plain labels for pytest's -m (not markers pytest or a plugin gives a "
        "meaning to, such as skip or timeout)")
    case: Optional[str] = Field(None, description="set by the loader: the case id")

    @field_validator("workload", mode="before", json_schema_input_type=Union[
        Workload, List[str], str])
    @classmethod
    def _workload(cls, v: Any) -> Any:
        return _workload_shorthand(v)

    @field_validator("init_url")
    @classmethod
    def _init_url(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            init_url_parts(v)   # raises ValueError naming what is wrong
        return v

    @model_validator(mode="after")
    def _init_args(self) -> Scenario:
        if self.init_args is not None and self.init_url is None:
            raise located("init_args", "init_args goes with init_url (init: tcp and file pass "
                          "both, env none)")
        return self

    @model_validator(mode="after")
    def _race(self) -> Scenario:
        """A race case runs often enough to measure, and each of its racing rows says how
        often each outcome may come (a row whose every bound is 'any' checks nothing)."""
        if self.race is None:
            return self
        if self.repeat < MIN_RACE_REPEAT:
            raise located("repeat", f"a race case runs repeat: >= {MIN_RACE_REPEAT} times "
                          f"(got {self.repeat}): fewer runs measure no frequency")
        for i, block in enumerate(self.expect):
            for label, row in block.ranks.items():
                if len(row.outcome or ()) < 2:
                    continue
                where = ("expect", i, "ranks", label, "outcome")
                bounds = row.frequency or {}
                if set(bounds) != set(row.outcome or ()) or \
                        all(b == "any" for b in bounds.values()):
                    raise located(where, "a racing row of a race case gives each outcome a "
                                  "frequency bound, at least one of them not 'any' "
                                  "({ok: '>= 0.3', timeout: '<= 0.7'})")
        return self

    @field_validator("ip", mode="before",
                     json_schema_input_type=Union[Literal[4, 6], Literal["4", "6", "dual"]])
    @classmethod
    def _ip_word(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @model_validator(mode="after")
    def _hosts(self) -> Scenario:
        if self.nodes is not None or self.ranks_per_node is not None:
            if self.hosts is not None:
                raise located("nodes", "give either hosts or nodes x ranks_per_node, not both")
            n, per = self.nodes or 1, self.ranks_per_node or 1
            if n * per > MAX_WORLD:
                raise located("ranks_per_node" if self.ranks_per_node else "nodes",
                              f"nodes x ranks_per_node = {n} x {per} = {n * per} ranks: at most "
                              f"{MAX_WORLD} in one run")
            self.hosts = [Host(name=f"node{i}", ranks=per) for i in range(n)]
        if self.hosts is not None:
            names = [h.name for h in self.hosts]
            for i, h in enumerate(self.hosts):
                known = [] if isinstance(h.knows, str) else h.knows
                for other in known:
                    if other not in names:
                        raise located(("hosts", i, "knows"), f"{other!r} is not one of "
                                      f"the hosts {names}")
            from ..net.hostspec import names_entry_problem

            for j, h in enumerate(self.hosts):
                for entry, targets in h.names.items():
                    for t in [targets] if isinstance(targets, str) else targets:
                        why = names_entry_problem(t, names)
                        if why:
                            raise located(("hosts", j, "names", entry), why)
            own = [h.hostname or (h.name if self.hostnames == "own" else None)
                   for h in self.hosts]
            dupes = sorted({n for n in own if n and own.count(n) > 1})
            if dupes:
                raise located("hosts", f"two hosts with the host name {dupes[0]!r}: give each "
                              "its own")
            if len(set(names)) != len(names):
                raise located("hosts", f"host names must be unique: {names}")
            total = sum(h.ranks for h in self.hosts)
            if total > MAX_WORLD:
                raise located("hosts", f"the hosts hold {total} ranks: at most {MAX_WORLD} in "
                              "one run")
            if "world_size" in self.model_fields_set and self.world_size != total:
                raise located("world_size", f"world_size {self.world_size} but the hosts hold "
                              f"{total} ranks")
            self.world_size = total
            if self.master_host is not None and self.master_host not in names:
                raise located("master_host", f"master_host {self.master_host!r} is not one of "
                              f"{names}")
        elif self.master_host is not None:
            raise located("master_host", "master_host needs hosts (or nodes)")
        return self

    @field_validator("python", mode="before", json_schema_input_type=Union[
        str, Dict[str, str]])
    @classmethod
    def _python_shorthand(cls, v: Any) -> Any:
        if isinstance(v, str):
            return {"*": v}
        if isinstance(v, dict):
            return {str(k): x for k, x in v.items()}
        return v

    @model_validator(mode="after")
    def _python_ranks(self) -> Scenario:
        for key in self.python:
            if key != "*" and not (key.isdigit() and int(key) < self.world_size):
                raise located("python", f"{key!r}: a rank number below world_size "
                              f"({self.world_size}) or '*'")
        return self

    @model_validator(mode="after")
    def _rank_timeouts(self) -> Scenario:
        for r in self.rank_timeouts:
            if r >= self.world_size:
                raise located("rank_timeouts", f"rank {r}: a rank number below world_size "
                              f"({self.world_size}): its timeout would be ignored")
        return self

    def interpreter(self, rank: int, host: str) -> str:
        """The python a rank runs with as the scenario writes it ('' for the harness's own):
        the rank's entry, else its host's, else '*'."""
        by_host = {h.name: h.python for h in self.hosts or [] if h.python}
        return self.python.get(str(rank)) or by_host.get(host) or self.python.get("*", "")

    def interpreters(self) -> List[str]:
        """Every interpreter the scenario names (as written)."""
        named = list(self.python.values()) + [h.python for h in self.hosts or [] if h.python]
        return list(dict.fromkeys(named))

    @model_validator(mode="after")
    def _counter_hosts(self) -> Scenario:
        names = self.host_names()
        for i, block in enumerate(self.expect):
            for host in block.counters:
                if host not in names:
                    where = ("expect", i, "counters") if len(self.expect) > 1 else \
                        ("expect", "counters")
                    raise located(where, f"{host!r} is not a host of this scenario "
                                  f"({', '.join(names)})")
        return self

    @model_validator(mode="after")
    def _gloo_only(self) -> Scenario:
        if self.backend != "gloo" and "monitored_barrier" in self.workload.steps:
            raise located("workload", "monitored_barrier: torch implements it for the gloo "
                          "backend only")
        return self

    @field_validator("env")
    @classmethod
    def _env_total(cls, v: Dict[str, str]) -> Dict[str, str]:
        total = sum(len(k) + len(x.encode("utf-8", "surrogatepass")) + 2 for k, x in v.items())
        if total > MAX_ENV_TOTAL:
            raise ValueError(f"env holds {total} bytes of names and values: at most "
                             f"{MAX_ENV_TOTAL} in all")
        return v

    def backend_names(self) -> List[str]:
        """The backends the backend string names (``cpu:gloo,cuda:nccl`` -> gloo, nccl);
        omitted: what torch picks on a CPU machine (gloo)."""
        if self.backend is None:
            return ["gloo"]
        names = [part.rsplit(":", 1)[-1].strip().lower() for part in self.backend.split(",")]
        return [n for n in dict.fromkeys(names) if n]

    @model_validator(mode="after")
    def _dns_records(self) -> Scenario:
        if self.dns is None:
            return self
        import ipaddress

        names = self.host_names()
        if self.dns.host in names:
            raise located("dns", f"host {self.dns.host!r} is the name server's own host: name "
                          "yours otherwise, or give dns: host: another name")
        for rec, targets in self.dns.records.items():
            for t in [targets] if isinstance(targets, str) else targets:
                host, _, fam = t.partition("/")
                if (host in names and fam in ("", "4", "6")) or t == "dead":
                    continue
                try:
                    ip = ipaddress.ip_address(t)
                except ValueError:
                    raise located("dns", f"record {rec!r}: {t!r} is not a host of the scenario "
                                  f"({', '.join(names)}; HOST/4 or HOST/6 for one "
                                  "family), 'dead' or an IP address") from None
                if not ip.is_loopback:
                    raise located("dns", f"record {rec!r}: {t} is outside the run: a record "
                                  "may only be a host of the scenario, 'dead' (an address of "
                                  "the run's own network) or loopback")
        return self

    @model_validator(mode="after")
    def _etcd_host(self) -> Scenario:
        if self.etcd is None:
            return self
        names = self.host_names()
        if self.etcd.host == "loopback" and len(names) > 1:
            raise located("etcd", "host 'loopback' is for a single-host run: with several "
                          "hosts the agents could not reach it; give a host of the scenario "
                          "or a name of its own")
        if self.dns is not None and self.etcd.host == self.dns.host:
            raise located("etcd", f"host {self.etcd.host!r} is the name server's own host: "
                          "give etcd another host")
        return self

    def host_names(self) -> List[str]:
        return [h.name for h in self.hosts] if self.hosts else ["local"]

    def hosts_file_names(self) -> List[str]:
        """Names the run's own hosts files give on some host (its hosts' own names, their
        names: entries): each resolves only to an address of the run or to loopback."""
        out = [h.hostname or h.name for h in self.hosts or []
               if h.hostname or self.hostnames == "own"]
        return out + [n for h in self.hosts or [] for n in h.names]

    def needs_namespaces(self) -> bool:
        """The run must have network namespaces: several hosts, a fault or the launcher that
        says so (a literal port), or ``isolate: always``."""
        multi = self.hosts is not None and len(self.hosts) > 1
        whole = self.hostnames == "own" or any(h.is_whole_machine() for h in self.hosts or [])
        own_etcd = self.etcd is not None and self.etcd.own_host(self.host_names())
        return multi or whole or self.isolate == "always" or self.dns is not None \
            or own_etcd \
            or any(f.needs_netns for f in self.faults) \
            or self.launcher.needs_netns(self)

    # -- what each rank runs ---------------------------------------------------------------------
    def program_argv(self) -> List[str]:
        """The user's program after the interpreter ([] for the harness's worker)."""
        return [] if self.program is None else self.program.argv(self._source)

    def program_cwd(self) -> str:
        return "" if self.program is None else self.program.workdir(self._source)

    def program_dict(self) -> Dict[str, Any]:
        if self.program is None:
            return {"worker": True}
        return {**self.program.model_dump(exclude_none=True), "argv": self.program_argv(),
                "cwd": self.program_cwd()}

    def row_sets(self) -> List[Any]:
        """Which rows a run of this case can have (harness.rows): the scenario's job's and
        those of the jobs and ranks its faults add."""
        from ..core.rows import RowSet

        sets = [self.launcher.rows(self)]
        extra = [lab for f in self.faults for lab in f.extra_labels(self)]
        jobs = sorted({lab.split(":", 1)[0] for lab in extra if lab.startswith("job")})
        for job in jobs:
            n = sum(1 for lab in extra if lab.startswith(job + ":"))
            sets.append(self.launcher.rows(self, job=job, world=n))
        others = [lab for lab in extra if not lab.startswith("job")]
        if others:
            sets.append(RowSet(world=0, extra=others))
        return sets

    @field_validator("env", mode="before", json_schema_input_type=Dict[
        str, Union[str, int, float]])
    @classmethod
    def _env_text(cls, v: Any) -> Any:
        if isinstance(v, dict) and len(v) > MAX_ENV_VARS:   # one error, not one per entry
            raise ValueError(f"{len(v)} variables: at most {MAX_ENV_VARS}")
        return env_as_text(v)

    @field_validator("expect", mode="before", json_schema_input_type=Union[Expect, List[Expect]])
    @classmethod
    def _one_block(cls, v: Any) -> Any:
        return [v] if isinstance(v, dict) else v

    @property
    def source(self) -> Optional[str]:
        """The scenario file this case was loaded from (None: built in code)."""
        return self._source

    @property
    def test_id(self) -> str:
        return self.name if self.case is None else f"{self.name}[{self.case}]"

    def expectation_for(self, torch_version: str, cuda: Optional[str] = None
                        ) -> Optional[Expect]:
        for block in self.expect:
            if block.applies_to(torch_version, cuda):
                return block
        return None

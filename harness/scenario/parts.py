"""Values a scenario is made of (pure): the strict model every part of the format derives from,
what ranks do after init (``Workload``), the ``init_url`` template, the launcher and fault
values as the scenario keeps them (their kinds' own models), and ``marks:``.

The scenario itself is :mod:`harness.scenario.schema`; its hosts and services
:mod:`harness.scenario.hosts`; its expectations :mod:`harness.scenario.expectations`.
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Any, List, Optional, Tuple
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from ..core.limits import (
    MAX_MODEL_MB,
    MAX_NAME,
    MAX_SECONDS,
    MAX_STEPS,
    MAX_TRAIN_STEPS,
    located,
)
from ..faults import Fault
from ..launchers import LauncherSpec, launcher_kinds, launcher_of
from ..ranks.workload import WORKLOAD_HELP, WORKLOAD_RE, model_mb, workload_phases

STEP_RE = WORKLOAD_RE   # the worker's grammar (harness.core.protocol)

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


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)



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



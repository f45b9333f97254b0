"""Programs: what each rank runs (pure; the YAML field ``program:``).

``worker`` (the default) is the harness's own rank, :mod:`harness.ranks.worker`: init, the
workload's steps, destroy. Anything else is a user's own Python file or module with its arguments,
run exactly as the scenario's launcher would run it (``python train.py ARGS`` per rank under
``direct``; ``torchrun ... train.py ARGS`` under ``torchrun``; ``python train.py ARGS`` once per
host under ``spawn``, the script itself spawning its ranks). Its phases come from the observer
(:mod:`harness.ranks.observer`), never from a change to its code.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, List, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..core.limits import MAX_ADDR, MAX_SHORT, MAX_STEPS

MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z", re.ASCII)
WORKER = "worker"


def check_args(args: List[str]) -> List[str]:
    """A program's command-line arguments as given, or a ValueError for one that holds a NUL
    byte or is too long (the program's own, a concurrent_job's)."""
    for a in args:
        if "\0" in a or len(a) > MAX_SHORT:
            raise ValueError("an argument holds a NUL byte or is too long")
    return args


class Program(BaseModel):
    """A user's program: ``script`` (a path, relative to the scenario file's folder) or
    ``module`` (``python -m``), with ``args``; ``cwd`` is where it runs (default: the scenario
    file's folder)."""

    model_config = ConfigDict(extra="forbid")

    script: Optional[str] = Field(None, min_length=1, max_length=MAX_SHORT,
                                  description="a Python file, relative to the scenario file")
    module: Optional[str] = Field(None, min_length=1, max_length=MAX_ADDR,
                                  description="a module run as python -m MODULE")
    args: List[str] = Field(default_factory=list, max_length=MAX_STEPS,
                            description="its command-line arguments; {port2} in one becomes a "
                            "second port leased for the run (not MASTER_PORT), e.g. "
                            "--init-port {port2}")
    cwd: Optional[str] = Field(None, max_length=MAX_SHORT, description="where it runs, relative "
                               "to the scenario file (default: the scenario file's folder)")

    @model_validator(mode="after")
    def _one(self) -> Program:
        if (self.script is None) == (self.module is None):
            raise ValueError("give exactly one of script (a file) or module (python -m)")
        if self.module is not None and not MODULE_RE.match(self.module):
            raise ValueError(f"module {self.module[:60]!r} is not a dotted module name")
        check_args(self.args)
        return self

    def base(self, source: Optional[str]) -> Path:
        return Path(source).resolve().parent if source else Path.cwd()

    def script_path(self, source: Optional[str]) -> Optional[Path]:
        return None if self.script is None else (self.base(source) / self.script)

    def argv(self, source: Optional[str]) -> List[str]:
        """What follows the interpreter: ``[/abs/train.py, ARGS]`` or ``[-m, mod, ARGS]``."""
        path = self.script_path(source)
        head = [str(path)] if path is not None else ["-m", str(self.module)]
        return head + list(self.args)

    def workdir(self, source: Optional[str]) -> str:
        base = self.base(source)
        return str((base / self.cwd) if self.cwd else base)

    def problem(self, source: Optional[str]) -> Optional[str]:
        """What is wrong with it on this machine (a missing file), located by the loader."""
        path = self.script_path(source)
        if path is not None and not path.is_file():
            return f"no such file: {path}"
        wd = Path(self.workdir(source))
        if not wd.is_dir():
            return f"cwd: no such folder: {wd}"
        return None

    def describe(self) -> str:
        what = self.script if self.script is not None else f"-m {self.module}"
        return " ".join([str(what)] + list(self.args))


def program_of(v: Any) -> Any:
    """YAML: ``worker``, a path ending in .py, or a mapping."""
    if isinstance(v, str) and v != WORKER:
        return {"script": v} if v.endswith(".py") else {"module": v}
    return v

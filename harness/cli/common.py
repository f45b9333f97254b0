"""What every command of the CLI shares: the console it prints to, finding the scenario files
a command was given (by the rule pytest's collection uses), the paths and -k / -m / --smoke
selection as ``harness run`` hands them to pytest, and the option types (workers, fractions,
seconds)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, List, Optional, Sequence, Union

from ..core.errors import UsageError


def _console(stderr: bool = False) -> Any:
    from rich.console import Console
    con = Console(stderr=stderr, highlight=False, soft_wrap=False)
    if not con.is_terminal and "COLUMNS" not in os.environ:
        con.width = 160   # a log file or a pipe: wide tables rather than wrapped ids
    return con


def _text(s: str, style: str = "") -> Any:
    from rich.text import Text
    return Text(s, style=style)


def find_scenarios(paths: Sequence[str], skipped: Optional[List[Path]] = None) -> List[Path]:
    """Scenario files among the paths named, by the rule pytest's collection uses
    (harness.scenario.discovery); an entry that is not a regular file goes to ``skipped``."""
    from ..scenario.discovery import explain_none
    from ..scenario.discovery import find_scenarios as discover

    try:
        files = discover(paths, skipped=skipped)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    if not files and not (skipped or []):
        raise UsageError(explain_none(paths))
    return files


def scenario_paths(args: argparse.Namespace) -> List[str]:
    """The paths a command was given, with the built-in catalog first under ``--builtin``."""
    paths = list(getattr(args, "paths", None) or [])
    if getattr(args, "builtin", False):
        from ..scenario.catalog import require_builtin

        try:
            paths.insert(0, str(require_builtin()))
        except FileNotFoundError as e:
            raise UsageError(str(e)) from None
    if not paths:
        raise UsageError("give scenario files or folders, or --builtin for the built-in catalog")
    return paths


def _selection_args(args: argparse.Namespace, files: List[Path]) -> List[str]:
    """The paths and the -k / -m / --smoke selection as ``harness run`` hands them to pytest;
    ``harness list -k`` collects with the same, so both select the same cases."""
    pargs: List[str] = [str(f) for f in files]
    if getattr(args, "builtin", False):
        # the catalog as a folder: its cases are named relative to it (FILE.yaml::CASE), as a
        # file named alone would be "::CASE" outside the rootdir; the current folder is the
        # rootdir: evidence goes there, never inside an installed package, and the user's
        # folders keep their ids
        from ..scenario.catalog import require_builtin

        cat = require_builtin().resolve()
        pargs = [str(cat)] + [p for p in pargs if cat not in Path(p).resolve().parents]
        pargs += ["--rootdir", os.getcwd()]
    if getattr(args, "k", None):
        pargs += ["-k", args.k]
    if getattr(args, "m", None) or getattr(args, "smoke", False):
        # --smoke: the catalog's smoke tier (the cases marked smoke), within any -m given
        expr = " and ".join(f"({e})" for e in (args.m, "smoke" if getattr(args, "smoke", False)
                                               else None) if e)
        pargs += ["-m", expr]
    return pargs


def _workers(s: str) -> Union[int, str]:
    """``-n``: a number of pytest-xdist workers, or ``auto`` / ``logical`` (xdist's own: as
    many as the machine's CPUs)."""
    if s in ("auto", "logical"):
        return s
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: give a number of workers, or auto") from None
    if v < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return v


def _fraction(s: str) -> float:
    try:
        v = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: give a fraction (0.5) or a percentage (50%)"
                                         ) from None
    if v < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return v


def _seconds(s: str) -> float:
    try:
        v = float(s[:-1]) if s.endswith("s") else float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: give seconds, e.g. 2 or 2s") from None
    if v < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return v

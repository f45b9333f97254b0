"""Which files are scenarios: one rule for both front doors (the pytest plugin and the CLI).

A ``*.yaml`` / ``*.yml`` file is a scenario when

* it is named explicitly (on the command line), or
* it lies in a folder named ``scenarios``, at any depth below the root folder or below a folder
  named on the command line (that folder's own name counts: ``pytest my/scenarios/``), never
  above them: a checkout that happens to live in ``~/scenarios/`` is not a catalog, or
* its path relative to the root folder matches one of the ``harness_scenarios`` globs (an ini
  option of pytest).

The root folder is pytest's rootdir; the CLI, which is pytest underneath, uses the current
folder. Hidden folders and virtual environments are never walked into. Found while walking a
folder, an entry that is not a regular file (a FIFO, a device, a broken link) is not a scenario
(the caller may list it as skipped); named explicitly, it is, and loading it says what it is.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

SUFFIXES = (".yaml", ".yml")
SKIP_DIRS = {".git", ".hg", ".svn", ".harness", ".venv", "venv", "node_modules", "__pycache__",
             "site-packages", ".tox", ".nox", "build", "dist"}
CATALOG_DIR = "scenarios"


def _resolved(paths: Iterable[Path]) -> List[Path]:
    return [Path(os.path.abspath(p)) for p in paths]


def is_scenario_file(path: Path, *, given: Sequence[Path], root: Path,
                     globs: Sequence[str] = ()) -> bool:
    """The rule above, for one file; ``given``: what was named on the command line."""
    if path.suffix not in SUFFIXES:
        return False
    p = Path(os.path.abspath(path))
    named = _resolved(given)
    if p in named:
        return True
    root = Path(os.path.abspath(root))
    for base in {root, *named}:
        if base in p.parents:
            parts = p.relative_to(base).parts[:-1]
            if base in named:
                parts = (base.name,) + parts
            if CATALOG_DIR in parts:
                return True
    try:
        rel = str(p.relative_to(root))
    except ValueError:
        rel = str(path)
    return any(fnmatch.fnmatch(rel, g) for g in globs)


def find_scenarios(paths: Sequence[str], *, root: Optional[Path] = None,
                   globs: Sequence[str] = (), skipped: Optional[List[Path]] = None) -> List[Path]:
    """Scenario files among the paths named (files, and the folders walked), by the rule
    above; in order, each once. A path that does not exist raises FileNotFoundError."""
    root = Path.cwd() if root is None else root
    given = [Path(p) for p in paths]
    out: List[Path] = []
    for p in given:
        if p.is_dir():
            for dirpath, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
                for f in sorted(files):
                    cand = Path(dirpath) / f
                    if not is_scenario_file(cand, given=given, root=root, globs=globs):
                        continue
                    if cand.is_file():
                        out.append(cand)
                    elif skipped is not None:
                        skipped.append(cand)
        elif p.exists() or p.is_symlink():
            if p.suffix in SUFFIXES:
                out.append(p)
            elif skipped is not None:
                skipped.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or directory")
    seen, uniq = set(), []
    for path in out:
        key = os.path.abspath(path)
        if key not in seen:
            seen.add(key)
            uniq.append(path)
    return uniq


def explain_none(paths: Sequence[str]) -> str:
    """What to say when no scenario file was found under ``paths``."""
    return (f"no scenario files under {' '.join(paths)}: a scenario is a *.yaml/*.yml file "
            f"named on the command line, or in a folder named '{CATALOG_DIR}' (at any depth), "
            "or matching the harness_scenarios ini globs")

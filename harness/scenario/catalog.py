"""The built-in scenario catalog: where it lies in this installation.

In a source checkout the catalog is the repository's top-level ``scenarios/`` folder (where
``pytest scenarios/`` runs it); in an installed wheel it is the package data folder
``harness/scenarios`` (copied there by setup.py's ``build_py``). ``harness run --builtin``,
``harness list --builtin``, ``harness validate --builtin`` and ``harness compare`` read it from
here. ``--builtin`` runs with the current folder as pytest's rootdir, so the catalog's case ids
are ``FILE.yaml::CASE`` from an installed package wherever it lies (``scenarios/FILE.yaml::CASE``
when the current folder is a checkout); ``harness diff`` pairs ids that differ only in the
folders before the file, so reports made either way compare case by case.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

PACKAGE = Path(__file__).resolve().parent.parent


def builtin_dir() -> Optional[Path]:
    """The catalog folder of this installation, or None when it has none (a wheel built
    without it)."""
    for d in (PACKAGE / "scenarios", PACKAGE.parent / "scenarios"):
        if d.is_dir() and any(d.glob("*.yaml")):
            if d.parent == PACKAGE.parent and not (PACKAGE.parent / "pyproject.toml").is_file():
                continue   # a "scenarios" folder beside an installed package is not ours
            return d
    return None


def require_builtin() -> Path:
    """The catalog folder; a clear error when this installation has none."""
    d = builtin_dir()
    if d is None:
        raise FileNotFoundError(f"this installation of torchdist-harness ({PACKAGE}) has no "
                                "built-in catalog (neither harness/scenarios nor a source "
                                "checkout's scenarios/ folder)")
    return d

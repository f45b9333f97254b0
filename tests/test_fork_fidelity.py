"""Fidelity of the warm start (item 1's proof): the catalog run with every rank a fresh
interpreter and again with ``--start fork`` gives the same verdicts (``harness diff`` exits 0,
races and ``varies:`` allowed as the expectations declare them); and, both with ``--start
fork``, with every run's fork servers fresh interpreters (``HARNESS_ZYGOTES=0``) and forked
from the session's zygotes.

Minutes of real runs, so it is skipped unless ``HARNESS_FIDELITY`` is set: ``1`` for the whole
catalog (scenarios/), or the scenario files to run, separated by spaces. ``HARNESS_FIDELITY_N``:
pytest-xdist workers for each of the two runs (default 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
WANTED = os.environ.get("HARNESS_FIDELITY", "")
REASON = ("minutes of catalog runs: set HARNESS_FIDELITY=1 (the whole catalog) or "
          "HARNESS_FIDELITY='scenarios/a.yaml scenarios/b.yaml'")


def _run_and_diff(tmp_path: Path, sides: Dict[str, Tuple[str, Dict[str, str]]]) -> None:
    """Run the wanted files once per side (name -> (start, extra environment)), then `harness
    diff` the first side's report against the second's: it must exit 0."""
    files = ["scenarios"] if WANTED == "1" else WANTED.split()
    n = os.environ.get("HARNESS_FIDELITY_N", "2")
    reports = {}
    for name, (start, extra) in sides.items():
        reports[name] = tmp_path / f"{name}.json"
        env = {k: v for k, v in os.environ.items() if k != "HARNESS_ZYGOTES"}
        p = subprocess.run([sys.executable, "-m", "harness", "run", *files, "--start", start,
                            "-n", n, "--no-progress", "--report", str(reports[name])],
                           cwd=ROOT, capture_output=True, text=True, env={**env, **extra})
        assert reports[name].exists(), f"harness run --start {start} ({name}): rc " \
            f"{p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    old, new = reports.values()
    d = subprocess.run([sys.executable, "-m", "harness", "diff", str(old), str(new)], cwd=ROOT,
                       capture_output=True, text=True)
    assert d.returncode == 0, f"verdicts differ ({' vs '.join(sides)}):\n{d.stdout}\n{d.stderr}"


@pytest.mark.slow
@pytest.mark.timeout(7200)
@pytest.mark.skipif(not WANTED, reason=REASON)
def test_catalog_verdicts_are_the_same_forked_and_fresh(tmp_path):
    _run_and_diff(tmp_path, {"fresh": ("fresh", {}), "fork": ("fork", {})})


@pytest.mark.slow
@pytest.mark.timeout(7200)
@pytest.mark.skipif(not WANTED, reason=REASON)
def test_catalog_verdicts_are_the_same_with_servers_fresh_and_warm(tmp_path):
    """start: fork both times: every run's servers fresh interpreters (HARNESS_ZYGOTES=0), then
    forked from the session's zygotes."""
    _run_and_diff(tmp_path, {"fresh_servers": ("fork", {"HARNESS_ZYGOTES": "0"}),
                             "warm_servers": ("fork", {})})

"""Fidelity of the warm start (item 1's proof): the catalog run with every rank a fresh
interpreter and again with ``--start fork`` gives the same verdicts (``harness diff`` exits 0,
races and ``varies:`` allowed as the expectations declare them).

Minutes of real runs, so it is skipped unless ``HARNESS_FIDELITY`` is set: ``1`` for the whole
catalog (scenarios/), or the scenario files to run, separated by spaces. ``HARNESS_FIDELITY_N``:
pytest-xdist workers for each of the two runs (default 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WANTED = os.environ.get("HARNESS_FIDELITY", "")


@pytest.mark.slow
@pytest.mark.timeout(7200)
@pytest.mark.skipif(not WANTED, reason="minutes of catalog runs: set HARNESS_FIDELITY=1 (the "
                    "whole catalog) or HARNESS_FIDELITY='scenarios/a.yaml scenarios/b.yaml'")
def test_catalog_verdicts_are_the_same_forked_and_fresh(tmp_path):
    files = ["scenarios"] if WANTED == "1" else WANTED.split()
    n = os.environ.get("HARNESS_FIDELITY_N", "2")
    reports = {}
    for start in ("fresh", "fork"):
        reports[start] = tmp_path / f"{start}.json"
        p = subprocess.run([sys.executable, "-m", "harness", "run", *files, "--start", start,
                            "-n", n, "--no-progress", "--report", str(reports[start])],
                           cwd=ROOT, capture_output=True, text=True)
        assert reports[start].exists(), f"harness run --start {start}: rc {p.returncode}\n" \
            f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    d = subprocess.run([sys.executable, "-m", "harness", "diff", str(reports["fresh"]),
                        str(reports["fork"])], cwd=ROOT, capture_output=True, text=True)
    assert d.returncode == 0, f"verdicts differ forked from fresh:\n{d.stdout}\n{d.stderr}"

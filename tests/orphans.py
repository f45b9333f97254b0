"""Shared by the tests that SIGKILL a supervisor mid-run and check what it leaves: a
supervisor process running one scenario for real, its state folder, and a bounded wait on a
condition (never a bare sleep: the wait ends as soon as the condition holds)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import psutil
import pytest

T = TypeVar("T")


def supervisor(scenario: str, tmp_path: Path, cwd: Optional[Path] = None) -> subprocess.Popen:
    """A python process that runs ``scenario`` (YAML text) with ``run_scenario``, its state
    under ``tmp_path`` (HARNESS_TMP); stderr is a pipe the caller closes."""
    script = ("from harness.run.supervisor import run_scenario\n"
              "from harness.scenario.loader import load_text\n"
              f"(scn,) = load_text({textwrap.dedent(scenario)!r})\n"
              "run_scenario(scn)\n")
    env = dict(os.environ, HARNESS_TMP=str(tmp_path))
    return subprocess.Popen([sys.executable, "-c", script], env=env, cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def state_dir(tmp_path: Path) -> Path:
    """Where a supervisor started by :func:`supervisor` keeps its run directories."""
    return tmp_path / f"torchdist-harness-{os.geteuid()}"


def wait_for(cond: Callable[[], Any], limit: float, what: str) -> Any:
    """``cond()``'s first true answer within ``limit`` s, else the test fails naming ``what``."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    pytest.fail(f"waited {limit:g} s for {what}")


def run_in_workload(tmp_path: Path, ranks: Any = (0, 1)) -> Optional[Path]:
    """The run directory whose ranks (``rank-<r>.events``) have all entered their first
    workload step, if one has yet (for :func:`wait_for`)."""
    for run_dir in state_dir(tmp_path).glob("run-*"):
        evs = [run_dir / f"rank-{r}.events" for r in ranks]
        if all(p.exists() and '"workload step 1"' in p.read_text() for p in evs):
            return run_dir
    return None


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie has ended)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def end_supervisor(sup: subprocess.Popen, pids: Any = ()) -> None:
    """A test's cleanup, whatever it asserted: the supervisor killed if it still runs, its
    stderr pipe closed, and every process of its run (``pids``) still alive SIGKILLed."""
    import signal

    if sup.poll() is None:
        sup.kill()
        sup.wait()
    if sup.stderr is not None:
        sup.stderr.close()
    for p in pids:
        if alive(p):
            os.kill(p, signal.SIGKILL)

"""A fault from a third party: installed from its own package, found through the entry point,
its own step kind run for real; and a third-party fault that fails to load is one warning that
names it, while the built-in faults still run.

The packages are built in a temp dir and installed with pip into a folder of their own
(``pip install --target``), put on PYTHONPATH of a child pytest: the project's venv is not
touched. The step is a new kind the harness does not have: SIGSTOP a rank when it enters a
phase and SIGCONT it ``seconds`` later (do and undo of one step, the undo on its own trigger).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

PAUSE = '''
"""pause_rank: freeze a rank for a while when it enters a phase (a third-party fault)."""
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from harness.faults import Fault, Step, Trigger


@dataclass
class Pause(Step):
    rank: str = "1"

    def can_fire(self, rt):
        r = rt.rank(self.rank)
        return r.released and not r.ended

    def do(self, rt):
        rt.rank(self.rank).signal("STOP")

    def undo(self, rt):
        if not rt.rank(self.rank).ended:
            rt.rank(self.rank).signal("CONT")

    def describe(self):
        return f"pause rank {self.rank}"


class PauseRank(Fault):
    kind: Literal["pause_rank"] = "pause_rank"
    summary = "freeze a rank for some seconds when it enters a phase"
    rank: int = 1
    phase: str = "init"
    seconds: float = Field(3.0, gt=0, le=60)

    def apply(self, plan, scn):
        step = Pause(rank=str(self.rank), trigger=Trigger.on_phase(self.rank, self.phase),
                     target=f"rank {self.rank}")
        plan.add_step(self, step)
        step.undo_trigger = Trigger.after_step(step.id, self.seconds)
        plan.notes.append(f"pause_rank: rank {self.rank} frozen {self.seconds:g} s in {self.phase}")
'''

PYPROJECT = '''
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1"

[project.entry-points."torchdist_harness.faults"]
{entry} = "{module}"

[tool.setuptools]
py-modules = ["{module}"]
'''

SCENARIO = """\
name: paused
about: rank 1 is frozen 3 s as it enters init (a third-party fault); the store waits for it
timeout: 30
deadline: 90
isolate: never
faults:
  - {kind: pause_rank, rank: 1, phase: init, seconds: 3}
expect:
  job: ok
  ranks:
    "1": {outcome: ok, within: [2.5, 60]}
"""

HEALTHY = """\
name: healthy
about: a built-in fault still runs beside a broken plugin
timeout: 30
deadline: 90
isolate: never
faults:
  - {kind: delayed_rank, ranks: [1], delay: 1}
expect: {job: ok}
"""


def _package(tmp: Path, name: str, module: str, code: str, entry: str) -> Path:
    d = tmp / f"src-{name}"
    d.mkdir()
    (d / f"{module}.py").write_text(code)
    (d / "pyproject.toml").write_text(PYPROJECT.format(name=name, module=module, entry=entry))
    return d


def _install(pkg: Path, target: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--no-build-isolation", "--disable-pip-version-check", "--target",
                        str(target), str(pkg)], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]


def _pytest(tmp: Path, site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HARNESS_"))}
    env["PYTHONPATH"] = str(site) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                     else "")
    env["COLUMNS"] = "200"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "-p", "no:randomly", *args], cwd=tmp, env=env, capture_output=True,
                          text=True, timeout=240)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("plugins")
    target = tmp / "site"
    _install(_package(tmp, "harness-pause", "harness_pause", PAUSE, "pause"), target)
    _install(_package(tmp, "harness-broken", "harness_broken",
                      "raise ImportError('this plugin is broken on purpose')\n", "broken"),
             target)
    return target


def test_a_third_party_fault_adds_a_step_kind_that_runs_for_real(site, tmp_path):
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "paused.yaml").write_text(SCENARIO)
    p = _pytest(tmp_path, site, "scenarios/", "--harness-report", "r.json", "-q")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    (case,) = json.loads((tmp_path / "r.json").read_text())["cases"]
    ranks = {r["label"]: r for r in case["ranks"]}
    assert ranks["1"]["outcome"] == "ok" and ranks["1"]["duration"] >= 2.5
    (step,) = [s for s in case["timeline"]["steps"] if s["fault"] == "pause_rank"]
    assert step["what"] == "pause rank 1" and step["on"] is not None
    assert 2.5 <= step["off"] - step["on"] <= 10          # undone on its own trigger
    assert case["faults"] == ["pause_rank"]


def test_a_broken_third_party_fault_is_one_warning_naming_it(site, tmp_path):
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "healthy.yaml").write_text(HEALTHY)
    p = _pytest(tmp_path, site, "scenarios/", "-q", "-W", "always")
    assert p.returncode == 0, p.stdout[-3000:]
    warned = [ln for ln in p.stdout.splitlines() if "failed to load" in ln]
    assert len(warned) == 1, p.stdout[-3000:]
    assert "'broken'" in warned[0] and "harness_broken" in warned[0] \
        and "broken on purpose" in warned[0]
    assert "1 passed" in p.stdout


def test_harness_doctor_and_validate_name_the_broken_plugin_once(site, tmp_path):
    f = tmp_path / "healthy.yaml"
    f.write_text(HEALTHY)
    env = {**os.environ, "PYTHONPATH": str(site)}
    p = subprocess.run([sys.executable, "-m", "harness", "validate", str(f)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (p.stdout + p.stderr).count("failed to load") == 1
    listed = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        from harness.faults import REGISTRY
        print(REGISTRY.origin("pause_rank")); print(REGISTRY.origin("kill_rank"))""")],
                            env=env, capture_output=True, text=True, timeout=120)
    assert listed.stdout.splitlines()[:2] == ["entry point 'pause' (harness_pause)",
                                              "entry point 'builtin' (harness.faults)"]

"""``python:`` per host or rank: the schema, the plan, the skip reason, and a real run whose
rank 1 runs with a second venv of the same torch (made here in a few seconds: a venv without pip
whose site-packages point at this venv's by a .pth file; removed after the test)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
import yaml

from harness.core.protocol import READY, ready_event
from harness.judge.classify import classify_run, job_outcome
from harness.machine import interpreters
from harness.run.plan import make_plan
from harness.run.requirements import skip_reason
from harness.run.supervisor import run_scenario
from harness.scenario.loader import ScenarioFileError, load_text


def scn(**fields):
    data = {"name": "py", "about": "interpreters", **fields}
    if "hosts" not in fields and "nodes" not in fields:
        data["world_size"] = 2
    (s,) = load_text(yaml.safe_dump(data, sort_keys=False), "py.yaml")
    return s


def test_a_path_for_every_rank():
    s = scn(python="/opt/py/bin/python")
    assert s.interpreter(0, "local") == s.interpreter(1, "local") == "/opt/py/bin/python"


def test_rank_beats_host_beats_star():
    s = scn(hosts=[{"name": "a", "ranks": 2, "python": "/a/python"},
                   {"name": "b", "ranks": 1}],
            python={"*": "/star/python", 2: "/two/python", 1: "/one/python"})
    assert s.interpreter(0, "a") == "/a/python"
    assert s.interpreter(1, "a") == "/one/python"
    assert s.interpreter(2, "b") == "/two/python"
    s = scn(nodes=2, python={"*": "/star/python"})
    assert s.interpreter(1, "node1") == "/star/python"
    assert set(scn(hosts=[{"name": "a", "python": "/a/p"}, {"name": "b"}],
                   python={1: "/b/p"}).interpreters()) == {"/a/p", "/b/p"}


def test_a_rank_outside_the_world_is_located():
    with pytest.raises(ScenarioFileError) as e:
        scn(python={5: "/x/python"})
    assert "a rank number below world_size (2)" in str(e.value)


def test_the_plan_gives_each_rank_its_interpreter(counter_ports, monkeypatch):
    monkeypatch.setenv("OLD_PY", "/old/bin/python")
    p = make_plan(scn(python={1: "$OLD_PY"}), "/tmp/x", take_port=counter_ports)
    assert p.rank("0").python == "" and p.rank("1").python == "/old/bin/python"
    assert p.to_dict()["ranks"][1]["python"] == "/old/bin/python"


@pytest.mark.parametrize("path,why", [
    ("/nonexistent/bin/python", "no such file"),
    ("$SURELY_UNSET_VAR_FOR_THE_HARNESS/python", "environment variable that is not set"),
    ("no-such-python-anywhere", "not found on PATH"),
    ("{tmp}/plain-file", "not executable"),
])
def test_an_absent_interpreter_is_a_skip_reason_naming_it(path, why, tmp_path):
    (tmp_path / "plain-file").write_text("not a program")
    s = scn(python={1: path.format(tmp=tmp_path)})
    reason = skip_reason(s, {"torch": "2.13.0", "distributed": True, "gloo": True})
    assert reason is not None and why in reason and "python " in reason


def test_an_interpreter_without_torch_is_a_skip_reason(tmp_path):
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    why, _ = interpreters.probe(str(venv / "bin" / "python"))
    shutil.rmtree(venv)
    assert why is not None and "cannot import torch" in why and "torch" in why


@pytest.fixture
def second_venv(tmp_path):
    """A second venv with this venv's torch (a .pth to its site-packages)."""
    venv = tmp_path / "venv2"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "harness-test-base.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    yield venv / "bin" / "python"
    shutil.rmtree(venv)


@pytest.mark.timeout(180)
def test_rank_1_runs_with_the_second_venv(second_venv):
    assert interpreters.probe(str(second_venv))[0] is None
    (s,) = load_text(textwrap.dedent(f"""\
        name: mixed
        about: rank 1 with another interpreter
        world_size: 2
        timeout: 20
        deadline: 60
        workload: [barrier, all_reduce]
        python: {{1: "{second_venv}"}}
        """), "mixed.yaml")
    run = run_scenario(s)
    pythons = {r.label: ready_event(r.events).data["python"] for r in run.ranks
               if ready_event(r.events) is not None}
    assert pythons == {"0": sys.executable, "1": str(second_venv)}
    assert all(e.ev != READY or e.data.get("torch") for r in run.ranks for e in r.events)
    assert job_outcome(classify_run(run)) == "ok"
    assert not Path(run.run_dir).exists()

"""The ``harness`` command, run as a user runs it: ``python -m harness ...`` in a subprocess."""

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.machine.ports import HIGH, LOW
from harness.reports import report

DATA = Path(__file__).parent / "data"
SCENARIOS = DATA / "report_scenarios"
COMMITTED = DATA / "report-gloo.json"


def harness(*args, cwd=None, env=None, timeout=300):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HARNESS_"))}
    e.update(COLUMNS="200", **(env or {}))
    return subprocess.run([sys.executable, "-m", "harness", *map(str, args)], cwd=cwd, env=e,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def scen(tmp_path):
    d = tmp_path / "scenarios"
    shutil.copytree(SCENARIOS, d)
    return d


def test_help_names_every_command():
    p = harness("--help")
    assert p.returncode == 0
    for cmd in ("run", "validate", "list", "show", "diff", "html", "doctor", "schema", "new"):
        assert cmd in p.stdout
    assert harness("frobnicate").returncode == 2


def test_console_script_is_installed():
    exe = Path(sys.executable).parent / "harness"
    if not exe.exists():
        pytest.skip("the package is not installed in this interpreter's environment")
    p = subprocess.run([str(exe), "--version"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.startswith("torchdist-harness ")


# -- validate, list, show, schema ----------------------------------------------------------------

def test_validate_accepts_a_folder_of_valid_files(scen):
    p = harness("validate", scen)
    assert p.returncode == 0, p.stdout
    assert "all valid: 5 files, 6 cases" in p.stdout


def test_validate_lists_every_located_problem_and_exits_1(tmp_path, scen):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad name\nabout: x\nworld_size: 0\nworkload: [jump]\n")
    p = harness("validate", bad, scen / "healthy.yaml")
    assert p.returncode == 1
    out = p.stdout
    assert f"{bad}:1: name:" in out and f"{bad}:3: world_size:" in out
    assert f"{bad}:4: workload[0]: unknown step 'jump'" in out
    assert "✓" in out and "1 invalid file (3 problems) of 2 files" in out


def test_validate_strict_fails_on_expectations_no_run_can_contradict(tmp_path, scen):
    wide = tmp_path / "wide.yaml"
    wide.write_text("name: wide\nabout: x\nexpect:\n  job: [ok, timeout]\n  ranks:\n"
                    '    "1": {outcome: [error, timeout]}\n')
    p = harness("validate", wide, scen / "healthy.yaml")
    assert p.returncode == 0
    assert "1 case with an expectation no run can contradict or an about:" in p.stdout
    p = harness("validate", "--strict", wide, scen / "healthy.yaml")
    assert p.returncode == 1, p.stdout
    assert f"{wide}:4: expect.job: wide: allows ok and a failure (ok|timeout)" in p.stdout
    assert f"{wide}:6: expect.ranks.1.outcome: wide: allows error|timeout" in p.stdout
    assert "1 invalid file (2 problems) of 2 files" in p.stdout


def test_validate_of_nothing_is_bad_input(tmp_path):
    assert harness("validate", tmp_path / "nope").returncode == 2
    assert harness("validate", tmp_path).returncode == 2     # a folder without YAML


def test_list_shows_ids_marks_faults_and_expectations(scen):
    p = harness("list", scen, "--json")
    assert p.returncode == 0
    rows = {r["id"].split("/")[-1]: r for r in json.loads(p.stdout)["cases"]}
    assert set(rows) == {"healthy.yaml::healthy", "busy.yaml::busy_port_released",
                         "delayed.yaml::delayed_rank", "stopped.yaml::stopped_rank",
                         "expect_hang.yaml::wrong_expectation[hang]",
                         "expect_hang.yaml::wrong_expectation[nccl]"}
    assert rows["stopped.yaml::stopped_rank"]["faults"] == ["stop_rank"]
    assert rows["stopped.yaml::stopped_rank"]["expect"] == [
        "job hang; 0: timeout phase workload step 3; 1: hang"]
    assert rows["expect_hang.yaml::wrong_expectation[nccl]"]["backend"] == "nccl"
    table = harness("list", "scenarios", cwd=scen.parent)
    assert table.returncode == 0 and "scenarios/stopped.yaml::stopped_rank" in table.stdout
    assert "6 scenario cases in 5 files" in table.stdout


@pytest.mark.parametrize("sel", [["-k", "stop_rank"], ["-k", "not delayed and not busy"],
                                 ["-k", "wrong_expectation and nccl"], ["-m", "not port"],
                                 ["-k", "nosuchthing"]])
def test_list_selects_the_cases_run_would_select(scen, sel):
    """`harness list -k/-m` collects with the arguments `harness run` gives pytest, so it lists
    exactly the cases pytest's own -k/-m selects (fault kinds, backends are keywords)."""
    p = harness("list", "scenarios", *sel, "--json", cwd=scen.parent)
    assert p.returncode == 0, p.stderr
    listed = {r["id"] for r in json.loads(p.stdout)["cases"]}
    col = subprocess.run([sys.executable, "-m", "pytest", "scenarios", "--collect-only", "-q",
                          "-p", "no:cacheprovider", *sel], cwd=scen.parent,
                         capture_output=True, text=True, timeout=300)
    collected = {ln for ln in col.stdout.splitlines() if "::" in ln}
    assert listed == collected
    assert sel[1] != "stop_rank" or listed == {"scenarios/stopped.yaml::stopped_rank"}
    assert not (scen.parent / ".harness").exists()   # nothing run, no evidence folder


def test_run_list_and_compare_take_the_same_selection_options():
    from harness.cli import build_parser
    from harness.reports import compare

    p = build_parser()
    for verb in (["run"], ["list"], ["compare", "a.json", "b"]):
        a = p.parse_args([*verb, "x", "-k", "store", "-m", "not race", "--smoke"])
        assert (a.k, a.m, a.smoke) == ("store", "not race", True), verb
    side = compare.Side("b", "b", python=sys.executable, env={})
    argv = compare.run_argv(side, ["x"], Path("out"), builtin=True, k="store", m="not race",
                            repeat=None, n=None, start=None, keep=None, smoke=True)
    assert argv[argv.index("-k") + 1] == "store" and "--smoke" in argv and "--builtin" in argv


def test_compare_refuses_a_side_variable_the_harness_would_clear_and_names_what_hosts_keep():
    from harness.reports import compare

    assert compare.parse_env(["USE_LIBUV=0", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"]) == {
        "USE_LIBUV": "0", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    for item in ("MASTER_PORT=29500", "TORCHELASTIC_USE_AGENT_STORE=False", "PET_NNODES=2"):
        with pytest.raises(compare.CompareError, match="would not reach the job"):
            compare.parse_env([item])
    side = compare.side("b", sys.executable, {"GLOO_SOCKET_IFNAME": "lo"})
    assert "GLOO_SOCKET_IFNAME: not in cases with hosts:" in side.describe()


def test_show_expands_the_plan(scen):
    p = harness("show", scen / "stopped.yaml")
    assert p.returncode == 0, p.stderr
    for words in ("deadline 3 s", "torch timeout 1 s", "SIGSTOP to rank 1",
                  "when rank 1 enters workload step 2 + 0.1 s", "RANK=1", "WORLD_SIZE=2",
                  "every run reserves its own", "job hang"):
        assert words in p.stdout, words
    busy = harness("show", scen / "busy.yaml")
    assert "hold port" in busy.stdout and "(listening)" in busy.stdout
    assert "at set-up" in busy.stdout and "at 1 s" in busy.stdout


def test_show_json_has_real_ports_from_the_harness_range(scen):
    p = harness("show", scen / "delayed.yaml", "--json")
    assert p.returncode == 0
    (plan,) = json.loads(p.stdout)
    assert LOW <= plan["master_port"] <= HIGH
    assert [r["release"] for r in plan["ranks"]] == [{"at": 0.0}, {"at": 1.0}]
    assert plan["ranks"][0]["env"]["MASTER_PORT"] == str(plan["master_port"])


def test_show_one_case_and_an_unknown_case(scen):
    p = harness("show", scen / "expect_hang.yaml", "--case", "nccl", "--json")
    assert p.returncode == 0 and [x["backend"] for x in json.loads(p.stdout)] == ["nccl"]
    bad = harness("show", scen / "expect_hang.yaml", "--case", "nope")
    assert bad.returncode == 2 and "cases: hang, nccl" in bad.stderr


def test_schema_is_json_schema_of_a_scenario():
    p = harness("schema")
    assert p.returncode == 0
    s = json.loads(p.stdout)
    assert "name" in s["properties"] and "faults" in s["properties"]


# -- new -----------------------------------------------------------------------------------------

def test_new_writes_a_valid_commented_template(tmp_path):
    out = tmp_path / "repro" / "my_hang.yaml"
    p = harness("new", "my_hang", "-o", out)
    assert p.returncode == 0 and out.exists()
    text = out.read_text()
    assert "name: my_hang" in text and text.count("TODO") >= 5
    for kind in ("busy_port", "stop_rank", "delayed_rank", "wrong_port"):
        assert f"kind: {kind}" in text
    assert harness("validate", out).returncode == 0
    assert harness("new", "my_hang", "-o", out).returncode == 2         # no overwrite
    assert harness("new", "my_hang", "-o", out, "--force").returncode == 0
    assert harness("new", "bad name").returncode == 2
    assert harness("new", "x").stdout.startswith("# Scenario \"x\"")


# -- diff and html -------------------------------------------------------------------------------

@pytest.fixture
def changed(tmp_path):
    rep = report.read(COMMITTED)
    new = copy.deepcopy(rep)
    healthy = next(c for c in new["cases"] if c["test_id"] == "healthy")
    healthy["ranks"][1].update(outcome="timeout", exception="DistStoreError")
    delayed = next(c for c in new["cases"] if c["test_id"] == "delayed_rank")
    delayed["ranks"][0]["duration"] = 9.0
    path = tmp_path / "new.json"
    path.write_text(json.dumps(new))
    return path


def test_diff_of_a_report_with_itself_exits_0():
    p = harness("diff", COMMITTED, COMMITTED)
    assert p.returncode == 0 and "no behaviour change" in p.stdout


def test_diff_finds_changes_and_exits_1(changed):
    p = harness("diff", COMMITTED, changed)
    assert p.returncode == 1
    assert "scenarios/healthy.yaml::healthy" in p.stdout and "outcome" in p.stdout
    assert "duration" in p.stdout and "2 behaviour changes in 2 cases" in p.stdout


def test_diff_json_tolerance_and_ignore(changed):
    p = harness("diff", COMMITTED, changed, "--json", "--ignore", "duration")
    assert p.returncode == 1
    d = json.loads(p.stdout)
    assert [c["kind"] for c in d["changes"]] == ["outcome"] and d["summary"]["ignored"] == 1
    loose = harness("diff", COMMITTED, changed, "--json", "--tolerance", "1000%")
    assert [c["kind"] for c in json.loads(loose.stdout)["changes"]] == ["outcome"]
    assert harness("diff", COMMITTED, changed, "--ignore", "outcome,duration").returncode == 0


def test_diff_bad_input_exits_2(tmp_path):
    notjson = tmp_path / "x.json"
    notjson.write_text("hello")
    for args in ((COMMITTED, tmp_path / "missing.json"), (COMMITTED, notjson),
                 (COMMITTED, COMMITTED, "--ignore", "nonsense"),
                 (COMMITTED, COMMITTED, "--tolerance", "lots")):
        p = harness("diff", *args)
        assert p.returncode == 2, args


def test_html_command_renders_a_report(tmp_path):
    out = tmp_path / "r.html"
    p = harness("html", COMMITTED, "-o", out)
    assert p.returncode == 0 and "<svg" in out.read_text()


# -- doctor --------------------------------------------------------------------------------------

def test_doctor_reports_torch_ports_and_leftovers_and_cleans(tmp_path):
    from harness.machine.torch_probe import probe

    run = tmp_path / f"torchdist-harness-{os.geteuid()}" / "run-deadbeef"
    run.mkdir(parents=True)
    (run / "owner.json").write_text(json.dumps({"pid": 999999999, "start_time": 1, "boot_id": ""}))
    env = {"HARNESS_TMP": str(tmp_path)}
    p = harness("doctor", "--json", env=env)
    assert p.returncode == 0, p.stderr
    facts = json.loads(p.stdout)
    assert facts["torch"]["torch"] == probe()["torch"]
    assert facts["ports"]["free"] > 0 and facts["ports"]["range"][0] == LOW
    assert facts["leftovers"] == [str(run)]
    assert set(facts["tools"]) >= {"ip", "nft", "py-spy"}
    clean = harness("doctor", "--clean", env=env)
    assert clean.returncode == 0, clean.stderr
    for words in ("torch", "gloo", "ports", "py-spy", "leftovers",
                  "cleaned run directories: run-deadbeef"):
        assert words in clean.stdout, words
    assert not run.exists()


# -- run -----------------------------------------------------------------------------------------

def test_run_writes_report_html_and_evidence_and_returns_pytests_code(tmp_path):
    d = tmp_path / "scenarios"
    d.mkdir()
    for f in ("healthy.yaml", "expect_hang.yaml"):
        shutil.copy(SCENARIOS / f, d / f)
    p = harness("run", "scenarios", "--report", "r.json", "--html", "r.html", "--keep", "ev",
                "-k", "not nccl", cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr      # one case fails: pytest's exit code 1
    out = p.stdout
    assert "scenarios/healthy.yaml::healthy" in out and "passed" in out
    assert "failed: scenarios/expect_hang.yaml::wrong_expectation[hang]" in out
    assert "1 passed, 1 failed" in out
    rep = report.read(tmp_path / "r.json")
    assert {c["test_id"]: c["status"] for c in rep["cases"]} == {
        "healthy": "passed", "wrong_expectation[hang]": "failed"}    # -k left nccl out
    assert "<svg" in (tmp_path / "r.html").read_text()
    assert any((tmp_path / "ev").iterdir())
    assert all(c["evidence"].startswith(str(tmp_path / "ev")) for c in rep["cases"])


def test_run_with_nothing_selected_exits_5(tmp_path):
    d = tmp_path / "scenarios"
    d.mkdir()
    shutil.copy(SCENARIOS / "healthy.yaml", d)
    p = harness("run", "scenarios", "-m", "no_such_mark", cwd=tmp_path)
    assert p.returncode == 5 and "no scenario case was selected" in p.stdout
    assert harness("run", "nowhere", cwd=tmp_path).returncode == 2


def test_workers_may_be_auto_as_pytest_xdist_takes_them():
    """`harness run -n auto` (and compare's): one worker per CPU, as `pytest -n auto`; a
    word that is neither a number nor auto is refused by the parser, naming what it takes."""
    from harness.cli import build_parser

    p = build_parser()
    assert p.parse_args(["run", "-n", "auto", "x.yaml"]).n == "auto"
    assert p.parse_args(["run", "-n", "3", "x.yaml"]).n == 3
    r = harness("run", "-n", "many", "x.yaml")
    assert r.returncode == 2 and "'many': give a number of workers, or auto" in r.stderr

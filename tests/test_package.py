"""The package as a new user on a cluster image meets it: the wheel, built from this checkout,
installed into a fresh virtual environment that has only torch (tests/wheelenv.py); the
built-in catalog run from there, with a folder of the user's own; ``harness compare`` of two
environments that differ as images differ (the TCPStore backend: ``USE_LIBUV=0`` set by the
image's own site customisation); the CI recipe's scripts from docs/ci.md, run as written.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from wheelenv import ROOT, build_wheel, torch_only_venv, wheel_venv

import harness
from harness.scenario import catalog

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def user_venv(tmp_path_factory, wheel):
    """A fresh venv with only torch, then ``pip install`` of the wheel: its python."""
    return wheel_venv(tmp_path_factory.mktemp("image"), str(wheel))


def run_in(py: Path, argv, cwd: Path, env=None, timeout=600) -> subprocess.CompletedProcess:
    """A command of the user's venv (its bin/ first on PATH, as an activated venv)."""
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    e["PATH"] = f"{py.parent}{os.pathsep}{e.get('PATH', '')}"
    e["COLUMNS"] = "200"
    e.update(env or {})
    return subprocess.run(argv, cwd=cwd, env=e, capture_output=True, text=True,
                          timeout=timeout)


# -- the wheel itself ---------------------------------------------------------------------------

def test_the_wheel_holds_the_catalog_types_marker_and_no_torch_requirement(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    shipped = {n.split("harness/scenarios/", 1)[1] for n in names
               if n.startswith("harness/scenarios/")}
    in_repo = {p.relative_to(ROOT / "scenarios").as_posix()
               for p in (ROOT / "scenarios").rglob("*") if p.is_file()
               and "__pycache__" not in p.parts}
    assert shipped == in_repo
    assert "harness/py.typed" in names
    requires = [ln for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    assert requires and not any(re.match(r"Requires-Dist: torch\b", ln) for ln in requires)
    assert "Classifier: Framework :: Pytest" in meta
    assert "Classifier: Topic :: System :: Distributed Computing" in meta
    assert f"Version: {harness.__version__}" in meta
    for extra in ("proxy", "slurm", "etcd", "py-spy", "parallel"):
        assert f"Provides-Extra: {extra}" in meta


def test_a_checkout_finds_its_catalog_beside_the_package():
    assert catalog.builtin_dir() == ROOT / "scenarios"


def test_version_command_says_the_package_version():
    p = subprocess.run([sys.executable, "-m", "harness", "--version"], capture_output=True,
                       text=True, check=True)
    assert p.stdout.strip() == f"torchdist-harness {harness.__version__}"


def test_builtin_without_a_catalog_is_a_clear_error(monkeypatch, capsys):
    from harness import cli

    monkeypatch.setattr(catalog, "builtin_dir", lambda: None)
    assert cli.main(["list", "--builtin"]) == 2
    err = " ".join(capsys.readouterr().err.split())      # rich wraps at the console's width
    assert "has no built-in catalog" in err and "Traceback" not in err


def test_run_needs_paths_or_builtin(capsys):
    from harness import cli

    assert cli.main(["run"]) == 2
    assert "--builtin" in " ".join(capsys.readouterr().err.split())


# -- installed: the catalog, the user's own folder ----------------------------------------------

MINE = """\
name: mine
about: the user's own scenario, next to the built-in catalog
world_size: 2
timeout: 10
deadline: 40
workload: [all_reduce]
expect:
  job: ok
"""


def _checkout_list() -> dict:
    """The checkout's catalog as `harness list --builtin --json` gives it (a checkout's
    built-in catalog is its scenarios/)."""
    here = subprocess.run([sys.executable, "-m", "harness", "list", "--builtin", "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert here.returncode == 0, here.stderr[-3000:]
    return json.loads(here.stdout)


def _by_case(listing: dict) -> dict:
    """Case id (relative to the catalog: FILE.yaml::CASE) -> what `harness list --json` says
    of it, but where its file lies."""
    return {c["id"]: {k: v for k, v in c.items() if k != "file"} for c in listing["cases"]}


def test_installed_wheel_lists_and_validates_the_whole_catalog_case_for_case(user_venv,
                                                                              tmp_path):
    """Every case of the checkout's catalog is collected and validated from the installed
    wheel, with the same scenario, case, marks, faults, backend, world size, deadline and
    expectations (what `harness list --json` says of each); nothing more, nothing less."""
    listed = run_in(user_venv, ["harness", "list", "--builtin", "--json"], tmp_path)
    assert listed.returncode == 0, listed.stderr[-3000:]
    wheel = json.loads(listed.stdout)
    here = _checkout_list()
    assert wheel["invalid"] == here["invalid"] == []
    ours, theirs = _by_case(wheel), _by_case(here)
    assert "healthy.yaml::healthy" in ours     # named as `harness run --builtin` names it
    assert sorted(ours) == sorted(theirs) and len(ours) > 200
    assert [cid for cid in theirs if ours[cid] != theirs[cid]] == []
    valid = run_in(user_venv, ["harness", "validate", "--builtin"], tmp_path)
    assert valid.returncode == 0, valid.stdout[-3000:] + valid.stderr[-2000:]
    files = len({c["file"] for c in here["cases"]})
    assert f"all valid: {files} files, {len(theirs)} cases" in " ".join(valid.stdout.split())


# one case per part of the package that a wheel must carry for a run to work: the plain
# supervisor and a user's folder beside the catalog, the catalog's own programs/ (a user
# program's path), the fault proxy and nftables in namespaces, a helper module (the port
# holder), faker's values, mount namespaces, torchrun with the observer's sitecustomize, and
# the Slurm test cluster with its job script (skipped, saying why, where Slurm or root is
# missing)
SUBSET = ("healthy.yaml or mine or (program-ddp.yaml and wide_rank) or "
          "(net-store-reset.yaml and during_init) or (busy_port.yaml and accepting_released) "
          "or (malformed_env.yaml and port_word) or (file_init.yaml and read_only_mount) or "
          "(torchrun-ports.yaml and standalone) or (slurm.yaml and node_down_mid_job)")
SUBSET_CASES = {"healthy.yaml::healthy", "ci/scenarios/mine.yaml::mine",
                "program-ddp.yaml::program_ddp[wide_rank]",
                "net-store-reset.yaml::net_store_reset[during_init]",
                "busy_port.yaml::busy_port[accepting_released]",
                "malformed_env.yaml::malformed_env[port_word,seed=0]",
                "file_init.yaml::file_init[read_only_mount]",
                "torchrun-ports.yaml::torchrun_ports[standalone]",
                "slurm.yaml::slurm[node_down_mid_job]"}


def test_installed_wheel_runs_a_subset_of_the_builtin_catalog_with_the_users_folder(
        user_venv, tmp_path):
    v = run_in(user_venv, ["harness", "--version"], tmp_path)
    assert v.stdout.strip() == f"torchdist-harness {harness.__version__}"
    where = run_in(user_venv, [str(user_venv), "-c", "import harness, torch; "
                               "print(harness.__file__); print(torch.__file__)"], tmp_path)
    hfile, tfile = where.stdout.split()
    assert hfile.startswith(str(user_venv.parent.parent)) and "site-packages" in hfile
    assert "torchsite" in tfile                  # the image's torch, not a new one
    (tmp_path / "ci" / "scenarios").mkdir(parents=True)
    (tmp_path / "ci" / "scenarios" / "mine.yaml").write_text(MINE)
    r = run_in(user_venv, ["harness", "run", "--builtin", "ci", "-k", SUBSET,
                           "--report", "r.json", "--html", "r.html"], tmp_path)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    rep = json.loads((tmp_path / "r.json").read_text())
    got = {c["id"]: c["status"] for c in rep["cases"]}
    assert set(got) == SUBSET_CASES
    skipped = {cid: c.get("reason") for c in rep["cases"] for cid in [c["id"]]
               if c["status"] == "skipped"}
    assert set(skipped) <= {"slurm.yaml::slurm[node_down_mid_job]",
                            "net-store-reset.yaml::net_store_reset[during_init]",
                            "file_init.yaml::file_init[read_only_mount]"}, skipped
    if os.geteuid() == 0 and shutil.which("slurmctld", path=os.pathsep.join(
            [os.environ.get("PATH", ""), "/usr/sbin"])):
        assert not skipped, skipped           # this machine has all of it: all of it runs
    assert all(got[c] == "passed" for c in got if c not in skipped), got
    assert rep["environment"]["harness"] == harness.__version__
    assert rep["tool"] == f"torchdist-harness {harness.__version__}"
    assert f"torchdist-harness {harness.__version__}" in (tmp_path / "r.html").read_text()
    assert (tmp_path / ".harness" / "evidence").is_dir()     # in the cwd, not site-packages
    assert not list(user_venv.parent.parent.rglob(".harness"))


@pytest.mark.slow
@pytest.mark.timeout(7200)
@pytest.mark.skipif(not os.environ.get("HARNESS_WHEEL_CATALOG"),
                    reason="the whole built-in catalog from the wheel takes ~20 min on 2 cores: "
                           "HARNESS_WHEEL_CATALOG=1 runs it")
def test_installed_wheel_runs_the_whole_builtin_catalog(tmp_path_factory, wheel, tmp_path):
    """What a user runs in a new image: the wheel with its `parallel` extra (pytest-xdist),
    then `harness run --builtin -n 2`, every case of the catalog from the installed package.
    Every case is in the report and none failed or broke the harness (cases this machine
    cannot run are skipped with their reason)."""
    import time

    py = wheel_venv(tmp_path_factory.mktemp("image-parallel"), f"{wheel}[parallel]")
    t0 = time.monotonic()
    r = run_in(py, ["harness", "run", "--builtin", "-n", "2", "--report", "r.json"], tmp_path,
               timeout=5400)
    took = time.monotonic() - t0
    rep = json.loads((tmp_path / "r.json").read_text())
    ids = {c["id"] for c in rep["cases"]}
    assert ids == set(_by_case(_checkout_list()))
    bad = {c["id"]: c["status"] for c in rep["cases"] if c["status"] not in ("passed", "skipped")}
    print(f"whole built-in catalog from the wheel: {len(ids)} cases in {took / 60:.1f} min")
    assert not bad and r.returncode == 0, (bad, r.stdout[-4000:])


# -- the CI recipe, word for word ---------------------------------------------------------------

def ci_script(name: str) -> str:
    text = (ROOT / "docs" / "ci.md").read_text()
    m = re.search(rf"<!-- ci-script: {name} -->\n```sh\n(.*?)```", text, re.S)
    assert m, f"docs/ci.md has no ci-script block {name!r}"
    return m.group(1)


def test_the_ci_recipe_scripts_run_as_written(user_venv, tmp_path):
    """accept, then gate on the same image: no behaviour change, exit 0, artifacts there; the
    recipes' jobs in docs/ci.md use the same lines."""
    env = {"HARNESS_ARGS": "--builtin -k healthy.yaml"}
    accept = run_in(user_venv, ["bash", "-euo", "pipefail", "-c", ci_script("accept")],
                    tmp_path, env)
    assert accept.returncode == 0, accept.stdout[-3000:] + accept.stderr[-2000:]
    gate = run_in(user_venv, ["bash", "-euo", "pipefail", "-c", ci_script("gate")], tmp_path,
                  env)
    assert gate.returncode == 0, gate.stdout[-4000:] + gate.stderr[-2000:]
    assert "no behaviour change (1 cases compared" in gate.stdout
    out = tmp_path / "harness-compare"
    for f in ("b.json", "b.html", "compare.html", "changes.json", "b.log"):
        assert (out / f).is_file(), f
    doc = (ROOT / "docs" / "ci.md").read_text()
    assert doc.count(ci_script("gate").strip()) == 3        # the script, GitHub's, GitLab's
    assert doc.count(ci_script("accept").strip()) == 2      # the script, GitLab's


# -- compare: two environments that differ as images differ -------------------------------------

def test_compare_names_the_store_backend_change_of_an_image(user_venv, tmp_path_factory,
                                                            tmp_path):
    """Side B: the same torch, but its image sets USE_LIBUV=0 at interpreter start (the old
    TCPStore backend; libuv is the default since torch 2.4). Watched: rank 0's EADDRINUSE
    message family changes from libuv's "... code: -98, name: EADDRINUSE ..." to the old
    store's "... failed to bind to [::]:<n> (errno: 98 ...)"; everything else the same."""
    lib = next((user_venv.parent.parent / "lib").glob("python*/site-packages"))
    old_image = torch_only_venv(tmp_path_factory.mktemp("old-image"),
                                [str(lib), "import os; os.environ.setdefault('USE_LIBUV', '0')"])
    r = run_in(user_venv, ["harness", "compare", str(user_venv), str(old_image.parent.parent),
                           str(ROOT / "scenarios" / "busy_port.yaml"), "-k", "listening",
                           "--out", "cmp", "-q"], tmp_path)
    assert r.returncode == 1, r.stdout[-4000:] + r.stderr[-2000:]
    changes = json.loads((tmp_path / "cmp" / "changes.json").read_text())
    assert [(c["case"], c["rank"], c["kind"]) for c in changes["changes"]] == \
        [("scenarios/busy_port.yaml::busy_port[listening]", "0", "family")]
    (c,) = changes["changes"]
    assert "name: eaddrinuse" in c["old"] and "failed to bind to" in c["new"]
    env = {e["key"]: (e["old"], e["new"]) for e in changes["environment"]}
    assert env["libuv_store_default"] == (True, False)
    assert "python_executable" not in env or env["python_executable"][0] != \
        env["python_executable"][1]
    html = (tmp_path / "cmp" / "compare.html").read_text()
    assert "busy_port[listening]" in html and "failed to bind to" in html
    # the saved report of side A against itself: nothing changed
    same = run_in(user_venv, ["harness", "compare", "cmp/a.json", "cmp/a.json", "--out",
                              "same"], tmp_path)
    assert same.returncode == 0, same.stdout[-3000:]
    assert "no behaviour change" in same.stdout


def test_compare_bad_sides_are_located_errors(tmp_path, capsys):
    from harness import cli

    def err() -> str:     # one line: rich wraps at the console's width
        return " ".join(capsys.readouterr().err.split())

    assert cli.main(["compare", str(tmp_path / "nope.json"), sys.executable, "x"]) == 2
    assert "no such report, interpreter or virtual environment" in err()
    (tmp_path / "dir").mkdir()
    assert cli.main(["compare", str(tmp_path / "dir"), sys.executable, "x"]) == 2
    assert "without bin/python" in err()
    assert cli.main(["compare", sys.executable, sys.executable]) == 2
    assert "give scenario files or folders, or --builtin" in err()
    assert cli.main(["compare", sys.executable, sys.executable, "--env-b", "1X", "a"]) == 2
    assert "KEY=VALUE" in err()


def test_a_case_run_from_a_checkout_and_from_a_wheel_is_one_case():
    from harness.reports.diff import diff_reports

    def rep(cid):
        return {"cases": [{"id": cid, "status": "passed", "job": "ok",
                           "ranks": [{"label": "0", "outcome": "ok", "duration": 1.0}]}]}

    res = diff_reports(rep("scenarios/healthy.yaml::healthy"), rep("healthy.yaml::healthy"))
    assert res.changes == [] and res.compared == 1
    two = {"cases": rep("a/x.yaml::c")["cases"] + rep("b/x.yaml::c")["cases"]}
    res = diff_reports(two, rep("x.yaml::c"))     # ambiguous: not paired
    assert {c.kind for c in res.changes} == {"removed", "added"}


def test_an_interpreter_side_runs_as_often_as_the_saved_side_ran():
    from harness.reports.compare import repeat_of

    assert repeat_of({"cases": [{"repeat": 5, "status": "passed"},
                                {"repeat": 5, "status": "failed"},
                                {"status": "skipped"}]}) == 5
    assert repeat_of({"cases": [{"status": "passed"}]}) == 0


def test_sureness_says_how_the_sides_were_repeated():
    from harness.reports.compare import sureness

    once = {"cases": [{"repeat": 1, "status": "passed"}]}
    five = {"cases": [{"repeat": 5, "status": "passed"}]}
    assert "once per side" in sureness(once, five)
    assert "ran 5 times on side A and 5 on side B" in sureness(five, five)
    assert "p < 0.05" in sureness(five, five)


def test_repeated_message_families_change_only_beyond_chance():
    from harness.reports.diff import diff_reports

    def rep(fams):
        return {"cases": [{"id": "c", "status": "passed", "repeat": sum(fams.values()),
                           "ranks": [{"label": "0", "outcomes": {"error": sum(fams.values())},
                                      "durations": [1.0] * sum(fams.values()),
                                      "families": fams}]}]}

    same = diff_reports(rep({"E: a": 3, "E: b": 2}), rep({"E: a": 2, "E: b": 3}))
    assert same.changes == []
    moved = diff_reports(rep({"E: a": 5, "E: b": 1}), rep({"E: b": 6}))
    assert {c.kind for c in moved.changes} == {"family"}
    assert all("sure it changed" in c.note for c in moved.changes)
    # the same on every run of each side: a change even with 2 runs (Fisher alone: p = 0.33)
    (steady,) = diff_reports(rep({"E: a": 2}), rep({"E: b": 2})).changes
    assert (steady.kind, steady.old, steady.new) == ("family", "2/2: E: a", "2/2: E: b")
    assert "no race seen" in steady.note


def test_repeated_outcomes_steady_on_each_side_are_a_change_however_few_runs():
    from harness.reports.diff import diff_reports

    def rep(outcome):
        return {"cases": [{"id": "c", "status": "passed", "repeat": 3,
                           "ranks": [{"label": "1", "outcomes": {outcome: 3},
                                      "durations": [7.0] * 3}]}]}

    (c,) = diff_reports(rep("timeout"), rep("hang")).changes
    assert (c.kind, c.old, c.new) == ("outcome", "3/3: timeout", "3/3: hang")


def test_python_override_keeps_the_scenarios_own_interpreters(counter_ports):
    """--harness-python is the default of every process (a torchrun agent's too); a
    scenario's own python: entries win."""
    from harness.pytest_plugin import with_interpreter
    from harness.run.plan import make_plan
    from harness.scenario.loader import load_text

    (s,) = load_text(textwrap.dedent("""\
        name: py
        about: interpreters
        world_size: 2
        python: {1: /other/python}
        expect: {job: ok}
        """), "py.yaml")
    p = make_plan(with_interpreter(s, "/image/python"), "/tmp/x", take_port=counter_ports)
    assert p.rank("0").python == "/image/python" and p.rank("1").python == "/other/python"
    (t,) = load_text(textwrap.dedent("""\
        name: tr
        about: torchrun
        world_size: 2
        launcher: torchrun
        expect: {job: ok}
        """), "tr.yaml")
    p = make_plan(with_interpreter(t, "/image/python"), "/tmp/x", take_port=counter_ports)
    agents = [r for r in p.ranks if r.role == "agent"]
    assert agents and all(r.python == "/image/python" for r in agents)


def test_a_venv_folder_stands_for_its_python(tmp_path):
    from harness.machine import interpreters

    (tmp_path / "v" / "bin").mkdir(parents=True)
    (tmp_path / "v" / "bin" / "python").write_text("")
    assert interpreters.resolve(str(tmp_path / "v")) == str(tmp_path / "v" / "bin" / "python")
    assert interpreters.resolve(str(tmp_path)) == str(tmp_path)     # no bin/python: as given


def test_compare_names_the_phase_change_of_lazy_gloo_init(tmp_path):
    """Side B sets TORCH_GLOO_LAZY_INIT=1, as an image's ENV line would: gloo connects at the
    first collective instead of in init_process_group. Watched (torch 2.13.0+cpu, 4 runs: one
    by hand with both cases of the file, three of this test): rank 1 (RANK=2 of 2) fails in
    init on both sides, but rank 0, which times out waiting for it, now does so in 'workload
    step 1' instead of 'init' (5.0 and 5.6 s in the run by hand, about the same on both
    sides), and the scenario's expectation (phase init) fails on side B."""
    r = subprocess.run([sys.executable, "-m", "harness", "compare", sys.executable,
                        sys.executable, "--env-b", "TORCH_GLOO_LAZY_INIT=1",
                        str(ROOT / "scenarios" / "rank_out_of_range.yaml"), "-k",
                        "rank_equals_world_size", "--out", str(tmp_path / "cmp"), "-q"],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 1, r.stdout[-4000:] + r.stderr[-2000:]
    changes = json.loads((tmp_path / "cmp" / "changes.json").read_text())
    case = "scenarios/rank_out_of_range.yaml::rank_out_of_range[rank_equals_world_size]"
    assert {(c["case"], c["rank"], c["kind"], c["old"], c["new"])
            for c in changes["changes"]} == {
        (case, None, "status", "passed", "failed"),
        (case, "0", "phase", "init", "workload step 1")}
    assert {"key": "env TORCH_GLOO_LAZY_INIT", "old": None, "new": "1"} in \
        changes["environment"]
    assert "workload step 1" in r.stdout and "2 behaviour changes in 1 case" in r.stdout


def test_sigterm_to_compare_alone_stops_its_side_run_and_leaves_nothing(tmp_path):
    """`kill PID` of `harness compare` (not its group) while a side's ranks run: the side's
    `harness run` gets the SIGTERM too, cleans up its run, and every descendant is gone."""
    import signal as sig
    import time

    import psutil

    p = subprocess.Popen([sys.executable, "-m", "harness", "compare", sys.executable,
                          sys.executable, str(ROOT / "scenarios" / "wrong_port.yaml"),
                          "--out", str(tmp_path / "cmp"), "-q"], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    me = psutil.Process(p.pid)
    until = time.monotonic() + 180
    ranks = []
    while time.monotonic() < until and not ranks:
        try:
            ranks = [k for k in me.children(recursive=True)
                     if "harness.ranks.worker" in " ".join(k.cmdline())]
        except psutil.Error:
            pass
        time.sleep(0.2)
    assert ranks, "no rank of side A's run appeared within 180 s"
    descendants = me.children(recursive=True)
    p.send_signal(sig.SIGTERM)
    out, _ = p.communicate(timeout=300)
    assert p.returncode == -sig.SIGTERM, out[-3000:]
    assert "interrupted by SIGTERM" in out
    _, alive = psutil.wait_procs(descendants, timeout=30)
    assert [a for a in alive if a.status() != psutil.STATUS_ZOMBIE] == []

"""Evidence folders (harness.evidence and the plugin): per-session folders, a ``latest`` link,
pruning that touches only the harness's own finished sessions, one-line errors for an evidence
path that cannot be used. Real sessions run the cheapest real scenario (one rank, init only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.reports import evidence as ev

pytestmark = pytest.mark.timeout(300)

SCENARIO = """\
name: {name}
about: a one-rank scenario for the evidence tests
world_size: 1
timeout: 10
deadline: 60
isolate: never
workload: init
"""


def write(root: Path, rel: str, name: str, extra: str = "") -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(SCENARIO.format(name=name) + extra)


def session_folders(d: Path):
    return sorted(p.name for p in d.iterdir() if p.name.startswith("session-"))


# -- pure parts ----------------------------------------------------------------------------------

def test_a_short_test_id_keeps_its_readable_folder_name():
    assert ev.case_folder_name("scenarios/a.yaml::a[ok]") == "scenarios_a.yaml__a_ok_"


def test_a_long_test_id_is_cut_with_a_hash_and_stays_unique():
    a = "scenarios/" + "x" * 300 + ".yaml::a"
    b = "scenarios/" + "x" * 300 + ".yaml::b"
    na, nb = ev.case_folder_name(a), ev.case_folder_name(b)
    assert len(na.encode()) <= ev.CASE_NAME_MAX and na != nb
    assert na.startswith("scenarios_xxxx")


def test_a_file_is_no_evidence_folder(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    assert ev.check_root(f) == f"{f} is not a folder"
    assert ev.check_root(f / "below") == f"{f} is not a folder"


def test_a_path_component_too_long_is_said(tmp_path):
    assert "longer than 255 bytes" in ev.check_root(tmp_path / ("y" * 300))


def test_a_missing_folder_below_a_writable_one_is_fine(tmp_path):
    assert ev.check_root(tmp_path / "a" / "b") is None


def _old_session(root: Path, name: str, pid: int, started: str) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / ev.MARKER).write_text(json.dumps({"tool": "torchdist-harness", "version": "0",
                                           "pid": pid, "start_time": 1, "boot_id": "",
                                           "started": started}))
    (d / "case").mkdir()
    return d


def test_pruning_removes_only_marked_sessions_of_dead_owners_beyond_the_newest(tmp_path):
    dead = [_old_session(tmp_path, f"session-2026010{i}T000000Z-00000{i}", 999999999,
                         f"2026-01-0{i}T00:00:00") for i in range(1, 5)]
    from harness.machine.procs import identity

    live = tmp_path / "session-20250101T000000Z-aaaaaa"    # the oldest, but still running
    live.mkdir()
    (live / ev.MARKER).write_text(json.dumps({
        "tool": "torchdist-harness", "started": "2025-01-01T00:00:00",
        **identity(os.getpid())}))
    unmarked = tmp_path / "session-20240101T000000Z-bbbbbb"
    unmarked.mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    removed = ev.prune(tmp_path, keep=2)
    assert removed == [dead[0].name, dead[1].name]
    assert [d.exists() for d in dead] == [False, False, True, True]
    assert live.exists() and unmarked.exists() and (tmp_path / "notes.txt").exists()


# -- sessions, for real ----------------------------------------------------------------------------

def pytest_run(root: Path, *args: str, timeout: int = 240):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HARNESS_"))}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def proj(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    write(tmp_path, "scenarios/one.yaml", "one")
    return tmp_path


def test_an_evidence_folder_with_a_users_file_keeps_it(proj):
    d = proj / "mine"
    d.mkdir()
    (d / "thesis.tex").write_text("precious")
    (d / "old-run").mkdir()
    p = pytest_run(proj, "--harness-evidence", str(d))
    assert p.returncode == 0, p.stdout + p.stderr
    assert (d / "thesis.tex").read_text() == "precious" and (d / "old-run").is_dir()
    (name,) = session_folders(d)
    assert os.readlink(d / "latest") == name
    assert (d / name / "scenarios_one.yaml__one" / "observation.json").exists()
    marker = json.loads((d / name / ev.MARKER).read_text())
    assert marker["tool"] == "torchdist-harness" and marker["pid"] > 0
    assert f"harness: evidence of this session: {d / name}" in p.stdout


def test_a_second_session_keeps_the_first_ones_evidence(proj):
    first = pytest_run(proj)
    second = pytest_run(proj)
    assert first.returncode == second.returncode == 0
    d = proj / ".harness" / "evidence"
    a, b = session_folders(d)
    assert os.readlink(d / "latest") == b
    for name in (a, b):
        assert (d / name / "scenarios_one.yaml__one" / "verdicts.json").exists()


def test_xdist_workers_share_the_controllers_session_folder(proj):
    write(proj, "scenarios/two.yaml", "two")
    p = pytest_run(proj, "-n", "2")
    assert p.returncode == 0, p.stdout + p.stderr
    d = proj / ".harness" / "evidence"
    (name,) = session_folders(d)
    assert sorted(x.name for x in (d / name).iterdir() if x.is_dir()) == \
        ["scenarios_one.yaml__one", "scenarios_two.yaml__two"]


def test_a_failure_table_names_the_session_folder(proj):
    write(proj, "scenarios/wrong.yaml", "wrong", "expect:\n  job: hang\n")
    p = pytest_run(proj, "-k", "wrong")
    assert p.returncode == 1
    (name,) = session_folders(proj / ".harness" / "evidence")
    assert f"evidence: {proj / '.harness' / 'evidence' / name / 'scenarios_wrong.yaml__wrong'}" \
        in p.stdout


@pytest.mark.parametrize("make,why", [
    (lambda d: d.write_text(""), "is not a folder"),
    (lambda d: None, "longer than 255 bytes"),
], ids=["a-file", "too-long"])
def test_an_unusable_evidence_path_is_one_line_at_the_start(proj, make, why):
    d = proj / "ev-file" if "folder" in why else proj / ("z" * 300)
    make(d)
    p = pytest_run(proj, "--harness-evidence", str(d))
    assert p.returncode == pytest.ExitCode.USAGE_ERROR
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"ERROR: --harness-evidence {d}: cannot "
                                                   "hold evidence:") and why in lines[0], \
        p.stderr
    assert "Traceback" not in p.stdout + p.stderr


def test_a_test_id_too_long_for_a_file_name_gets_a_shortened_folder(proj):
    deep = "/".join(["d" * 60] * 4)
    write(proj, f"scenarios/{deep}/long.yaml", "long")
    p = pytest_run(proj, "-k", "long")
    assert p.returncode == 0, p.stdout + p.stderr
    d = proj / ".harness" / "evidence"
    (name,) = session_folders(d)
    (case,) = [x for x in (d / name).iterdir() if x.is_dir()]
    assert len(case.name) <= ev.CASE_NAME_MAX and (case / "observation.json").exists()


def test_a_rank_that_cannot_start_is_a_test_error_with_its_evidence(proj):
    write(proj, "scenarios/nopython.yaml", "nopython", "env: {PYTHONHOME: /nonexistent}\n")
    p = pytest_run(proj, "-k", "nopython", "-rE")
    assert p.returncode == 1
    assert "1 error" in p.stdout and "passed" not in p.stdout and "failed" not in p.stdout
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("harness error"))
    assert "rank 0 exited with status 1 before it was ready: Python or the harness worker " \
           "could not start: ModuleNotFoundError: No module named 'encodings'" in line
    where = Path(line.rsplit("(evidence: ", 1)[1].rstrip(")"))
    assert (where / "rank-0.err").exists() and (where / "harness-error.txt").exists()
    assert "Traceback" not in p.stdout


def test_harness_run_keep_names_the_session_folder_and_keeps_a_users_file(proj):
    d = proj / "kept"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HARNESS_"))}
    p = subprocess.run([sys.executable, "-m", "harness", "run", "scenarios", "--keep", str(d),
                        "--no-progress"], cwd=proj, env=dict(env, COLUMNS="200"),
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    (name,) = session_folders(d)
    assert f"evidence: {d / name}" in p.stdout
    assert (d / "notes.txt").read_text() == "mine"

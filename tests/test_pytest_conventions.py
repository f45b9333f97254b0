"""Scenario items behave as Python tests do under pytest's own options: the scenarios' marks in
``pytest --markers``, ``--lf``, ``--sw``, ``-x``, ``-k``, and live progress under ``-v`` (the
start line, each rank's end) instead of a silent wait. Real runs, in a subprocess each (the
cache of --lf and --sw lives between them), of the cheapest scenario there is: one rank, init.
"""

from __future__ import annotations

import re

import pytest

CASES = """\
name: conv
about: cases for pytest's conventions; 'bad' expects an error that never comes
world_size: 1
timeout: 10
deadline: 60
workload: init
marks: [conventions_mark]
cases:
  first:
    about: ok
    expect: {job: ok}
  bad:
    about: expects an error, ends ok
    expect: {job: error}
  last:
    about: ok
    expect: {job: ok}
"""

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def conv(pytester):
    (pytester.path / "scenarios").mkdir()
    (pytester.path / "scenarios" / "conv.yaml").write_text(CASES)
    return pytester


def outcomes(result):
    """{case: PASSED/FAILED} from a -v run's lines."""
    return dict(re.findall(r"conv\.yaml::conv\[(\w+)\] (PASSED|FAILED)", result.stdout.str()))


def test_scenario_marks_are_listed_by_pytest_markers(conv):
    result = conv.runpytest("--markers", "-p", "no:cacheprovider")
    text = result.stdout.str()
    assert "@pytest.mark.conventions_mark: scenario mark (marks: in conv.yaml)" in text
    assert "@pytest.mark.scenario: a torchdist-harness scenario case" in text


def test_last_failed_reruns_only_the_failed_case(conv):
    first = conv.runpytest_subprocess("-v")
    assert outcomes(first) == {"first": "PASSED", "bad": "FAILED", "last": "PASSED"}
    again = conv.runpytest_subprocess("-v", "--lf")
    assert outcomes(again) == {"bad": "FAILED"}
    assert "run-last-failure: rerun previous 1 failure" in again.stdout.str()


def test_stepwise_stops_at_the_failure_and_resumes_there(conv):
    first = conv.runpytest_subprocess("-v", "--sw")
    assert outcomes(first) == {"first": "PASSED", "bad": "FAILED"}   # stopped: 'last' not run
    again = conv.runpytest_subprocess("-v", "--sw")
    assert outcomes(again) == {"bad": "FAILED"}                      # resumed at 'bad'
    assert "skipping 1 already passed items" in again.stdout.str()


def test_exitfirst_stops_after_the_first_failed_case(conv):
    result = conv.runpytest_subprocess("-v", "-x", "-p", "no:cacheprovider")
    assert outcomes(result) == {"first": "PASSED", "bad": "FAILED"}
    result.assert_outcomes(passed=1, failed=1)


def test_k_selects_scenario_cases_by_name(conv):
    result = conv.runpytest_subprocess("-v", "-k", "last", "-p", "no:cacheprovider")
    assert outcomes(result) == {"last": "PASSED"}
    result.assert_outcomes(passed=1, deselected=2)


def test_verbose_shows_the_start_line_and_each_ranks_end_live(conv):
    result = conv.runpytest_subprocess("-v", "-k", "first", "-p", "no:cacheprovider")
    lines = result.stdout.lines
    start = next(i for i, ln in enumerate(lines) if "conv[first]: start line: 1 process ready"
                 in ln and "released; deadline 60 s" in ln)
    end = next(i for i, ln in enumerate(lines) if re.search(
        r"conv\[first\]: rank 0: ended at \d+\.\d\d s in exit: ok", ln))
    verdict = next(i for i, ln in enumerate(lines) if ln.endswith("PASSED") or
                   "conv[first] PASSED" in ln)
    assert start < end < verdict


def test_quiet_runs_print_no_progress_lines(conv):
    result = conv.runpytest_subprocess("-k", "first", "-p", "no:cacheprovider")
    assert "start line:" not in result.stdout.str()
    result.assert_outcomes(passed=1, deselected=2)


# -- the same through `harness run` --------------------------------------------------------------

def _harness_run(cwd, *argv):
    """`harness run` in a child process (its cache must outlive it); the report's cases in
    the order they ran, as {case: status}."""
    import json
    import subprocess
    import sys

    report = cwd / "r.json"
    report.unlink(missing_ok=True)
    p = subprocess.run([sys.executable, "-m", "harness", "run", *argv, "--report", str(report),
                        "--no-progress"], cwd=cwd, capture_output=True, text=True, timeout=300)
    cases = json.loads(report.read_text())["cases"]
    ran = {c["id"].split("[")[-1].rstrip("]"): c["status"] for c in cases}
    assert p.returncode == (1 if "failed" in ran.values() else 0), \
        p.stdout[-3000:] + p.stderr[-2000:]
    assert "Interrupted" not in p.stdout        # --sw's stop is a failed run, not an interrupt
    return ran


@pytest.fixture
def elsewhere(tmp_path):
    """The scenarios in a project of their own (its pytest.ini makes it pytest's rootdir),
    run from another folder: the cache must be the current folder's, not the project's."""
    project = tmp_path / "project"
    (project / "scenarios").mkdir(parents=True)
    (project / "scenarios" / "conv.yaml").write_text(CASES)
    (project / "pytest.ini").write_text("[pytest]\n")
    here = tmp_path / "here"
    here.mkdir()
    return here, str(project / "scenarios")


def test_harness_run_last_failed_and_failed_first_use_the_current_folders_cache(elsewhere):
    here, folder = elsewhere
    assert _harness_run(here, folder) == {"first": "passed", "bad": "failed", "last": "passed"}
    assert (here / ".pytest_cache" / "v" / "cache" / "lastfailed").is_file()
    assert not (here.parent / "project" / ".pytest_cache").exists()
    assert _harness_run(here, folder, "--lf") == {"bad": "failed"}
    ran = _harness_run(here, folder, "--ff")
    assert list(ran) == ["bad", "first", "last"] and ran["bad"] == "failed"


def test_harness_run_stepwise_stops_at_the_failure_and_resumes_there(elsewhere):
    here, folder = elsewhere
    assert _harness_run(here, folder, "--sw") == {"first": "passed", "bad": "failed"}
    assert _harness_run(here, folder, "--sw") == {"bad": "failed"}

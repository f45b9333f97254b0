"""Repeated runs (pure part): frequencies per rank, frequency bounds, flaky ranks; the bound
syntax; and what `harness diff` makes of repeated reports (Fisher's exact test, spreads).

The real repeated run (pytest --harness-repeat and `harness run --repeat`) is at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from harness.judge.classify import Verdict
from harness.reports.diff import diff_reports, fisher_exact
from harness.scenario.expect import check_repeated, repeated_table
from harness.scenario.loader import ScenarioFileError, load_text
from harness.scenario.schema import Expect, bound_holds, parse_bound


def runs(*outcomes_per_run):
    """Verdicts of N runs: each argument is one run's outcomes by label."""
    return [[Verdict(label=k, outcome=o, phase="init", duration=1.0) for k, o in r.items()]
            for r in outcomes_per_run]


def exp(ranks):
    return Expect.model_validate({"ranks": ranks})


# -- bounds ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, yes, no", [
    (">= 0.6", [0.6, 0.9, 1.0], [0.59, 0.0]), ("<= 0.2", [0.0, 0.2], [0.21]),
    ("> 0", [0.1], [0.0]), ("< 1", [0.99], [1.0]), ("== 1", [1.0], [0.9]),
    ("0.3..0.7", [0.3, 0.5, 0.7], [0.29, 0.71]), ("any", [0.0, 1.0], []),
])
def test_bounds(text, yes, no):
    assert all(bound_holds(text, f) for f in yes) and not any(bound_holds(text, f) for f in no)


@pytest.mark.parametrize("text", [">> 0.5", ">= 2", "0.8..0.2", "often", ""])
def test_bad_bounds_are_refused(text):
    with pytest.raises(ValueError):
        parse_bound(text)


def test_a_bad_bound_in_a_file_is_located_at_the_outcome():
    text = 'name: s\nabout: x\nexpect:\n  ranks:\n    "1":\n      outcome: {timeout: "> 2"}\n'
    with pytest.raises(ScenarioFileError) as e:
        load_text(text, "s.yaml")
    p = e.value.problems[0]
    assert (p.line, p.field, len(e.value.problems)) == (6, "expect.ranks.1.outcome", 1)


def test_the_mapping_form_gives_the_allowed_set_and_the_bounds():
    (s,) = load_text('name: s\nabout: x\nrepeat: 5\nexpect:\n  ranks:\n    "1":\n'
                     '      outcome: {timeout: ">= 0.6", error: }\n', "s.yaml")
    r = s.expect[0].ranks["1"]
    assert (s.repeat, r.outcome, r.frequency) == (5, ["timeout", "error"],
                                                  {"timeout": ">= 0.6", "error": "any"})


# -- check_repeated -------------------------------------------------------------------------------

def test_frequencies_are_counted_per_rank():
    res = check_repeated(exp({"1": {"outcome": ["timeout", "error"]}}),
                         runs({"1": "timeout"}, {"1": "timeout"}, {"1": "error"}))
    assert res.counts == {"1": {"timeout": 2, "error": 1}}
    assert res.frequencies("1") == "timeout 2/3, error 1/3"
    assert not res.failed


def test_a_bound_that_does_not_hold_is_a_mismatch():
    e = exp({"1": {"outcome": {"timeout": ">= 0.6", "error": None}}})
    res = check_repeated(e, runs(*([{"1": "timeout"}] * 2 + [{"1": "error"}] * 3)))
    (m,) = res.bounds
    assert (m.label, m.field, m.expected, m.observed) == \
        ("1", "frequency", "timeout >= 0.6", "timeout 2/5 (0.40)")
    assert res.mismatches == [] and res.failed


def test_a_rank_that_varies_where_one_outcome_is_allowed_is_flaky():
    res = check_repeated(exp({"1": {"outcome": "ok"}, "0": {"outcome": ["ok", "error"]}}),
                         runs({"0": "ok", "1": "ok"}, {"0": "error", "1": "timeout"}))
    assert res.flaky == ["1"]                        # rank 0 declared its race
    assert [(i, m.label) for i, m in res.mismatches] == [(2, "1")]
    text = repeated_table(runs({"0": "ok", "1": "ok"}, {"0": "error", "1": "timeout"}),
                          exp({"1": {"outcome": "ok"}}), res)
    assert "flaky: rank 1 varied (ok 1/2, timeout 1/2) where its expectation allows only ok" \
        in text and "run 2:" in text


def test_one_run_checks_no_bound_and_is_never_flaky():
    res = check_repeated(exp({"1": {"outcome": {"timeout": ">= 0.6", "ok": None}}}),
                         runs({"1": "ok"}))
    assert (res.bounds, res.flaky, res.failed) == ([], [], False)


# -- diff of repeated reports ---------------------------------------------------------------------

def test_fisher_exact_known_values():
    assert fisher_exact(4, 8, 0, 8) == pytest.approx(0.0769, abs=1e-3)
    assert fisher_exact(7, 10, 3, 10) == pytest.approx(0.1789, abs=1e-3)
    assert fisher_exact(5, 10, 5, 10) == 1.0


def _report(counts, durations):
    n = sum(counts.values())
    rank = {"label": "1", "outcome": max(counts, key=counts.get), "outcomes": counts,
            "durations": durations, "phase": "init", "duration": durations[0]}
    case = {"id": "s.yaml::s", "status": "passed", "repeat": n, "timeout": 5,
            "expectation": {"ranks": {"1": {"outcome": sorted(counts)}}}, "ranks": [rank]}
    return {"format": 2, "environment": {}, "cases": [case]}


def test_frequencies_that_repeats_cannot_tell_apart_are_no_change():
    old = _report({"timeout": 7, "error": 3}, [6.0] * 10)
    new = _report({"timeout": 4, "error": 6}, [6.5] * 10)
    assert diff_reports(old, new).changes == []          # p = 0.37


def test_a_clear_frequency_change_is_a_change_and_says_how_sure():
    old = _report({"timeout": 10}, [6.0] * 10)
    new = _report({"timeout": 1, "error": 9}, [6.0] * 10)
    res = diff_reports(old, new)
    assert {(c.kind, c.old, c.new) for c in res.changes} == {
        ("frequency", "timeout 10/10", "timeout 1/10"), ("frequency", "error 0/10", "error 9/10")}
    assert all("% sure it changed" in c.note for c in res.changes)


def _many(rows):
    """A report of one repeated case whose rank rows ("1", "2", ...) each have these counts."""
    ranks = [{"label": str(i + 1), "outcome": max(c, key=c.get), "outcomes": c,
              "durations": [6.0] * sum(c.values()), "phase": "init", "duration": 6.0}
             for i, c in enumerate(rows)]
    case = {"id": "s.yaml::s", "status": "passed", "repeat": sum(rows[0].values()),
            "timeout": 5, "expectation": {"ranks": {"*": {"outcome": ["timeout", "error"]}}},
            "ranks": ranks}
    return {"format": 2, "environment": {}, "cases": [case]}


def test_a_frequency_change_counts_only_beyond_chance_over_all_the_diffs_tests():
    """0/10 against 5/10 is p = 0.033: a change when it is the diff's only test, not among
    20 other rows of unchanged races (at 5% each, chance alone flags one of 20)."""
    moved = ({"timeout": 10, "error": 0}, {"timeout": 5, "error": 5})
    alone = diff_reports(_many([moved[0]]), _many([moved[1]]))
    assert [(c.kind, c.old, c.new) for c in alone.changes] == [
        ("frequency", "error 0/10", "error 5/10"), ("frequency", "timeout 10/10", "timeout 5/10")]
    assert all("over the diff's 1 frequency test)" in c.note for c in alone.changes)
    same = [{"timeout": 7, "error": 3}] * 20
    crowd = diff_reports(_many([moved[0]] + same), _many([moved[1]] + same))
    assert crowd.changes == []
    assert len(crowd.within) == 2 and all("not beyond chance over the diff's 21 frequency "
                                          "tests" in c.note for c in crowd.within)
    # a clear change still counts in the crowd: 0/10 against 10/10 is steady, 1/10 against
    # 10/10 p = 1e-4
    clear = ({"timeout": 10, "error": 0}, {"timeout": 1, "error": 9})
    res = diff_reports(_many([clear[0]] + same), _many([clear[1]] + same))
    assert {(c.kind, c.new) for c in res.changes} == {("frequency", "error 9/10"),
                                                     ("frequency", "timeout 1/10")}


def test_repeated_durations_are_compared_against_the_old_spread():
    old = _report({"ok": 5}, [0.2, 0.3, 0.25, 0.4, 3.0])
    assert diff_reports(old, _report({"ok": 5}, [0.3, 2.9, 0.4, 0.2, 0.3])).changes == []
    res = diff_reports(old, _report({"ok": 5}, [9.0, 9.5, 8.8, 9.1, 9.2]))
    assert [(c.kind, c.new) for c in res.changes] == [("duration", 9.1)]


def _branched(outcomes, durations):
    """One repeated row "1" beside a row "2" that races: each run's outcomes kept (``runs``)."""
    rep = _report({"ok": len(durations)}, durations)
    case = rep["cases"][0]
    case["runs"] = [{"job": "ok", "ranks": {"1": "ok", "2": o}} for o in outcomes]
    return rep


def test_a_race_cases_durations_are_compared_within_the_branch_each_run_took():
    """torchrun_restarts one_restart, 2026-12-07: a catalog run whose restarted workers timed
    out 4 of 10 times (agent 56-69 s, median 56.4 s) against one where they never did (6-17 s)
    moved the median past the old spread: no duration change, the outcome counts judge the
    branch."""
    fast, slow = [6.0, 8.5, 7.2, 9.0, 8.1, 6.6], [56.4, 62.7, 68.8, 56.2, 57.0]
    old = _branched(["error"] * 10, fast + [7.0, 7.5, 8.0, 6.9])
    new = _branched(["error"] * 5 + ["timeout"] * 5, fast[:5] + slow)
    assert [c.kind for c in diff_reports(old, new).changes
            if c.kind == "duration"] == []
    # ... but the one branch both took taking longer is a change (one branch: not named)
    new = _branched(["error"] * 10, [x + 30 for x in fast] + [37.0, 37.5, 38.0, 36.9])
    res = diff_reports(old, new)
    assert [(c.kind, c.old) for c in res.changes] == [("duration", "6..9")]
    assert "taking one branch" not in res.changes[0].note
    # a branch taken once or twice on a side is no spread: not compared
    new = _branched(["error"] * 8 + ["timeout"] * 2, fast + [7.0, 7.5, 60.0, 61.0])
    old = _branched(["error"] * 8 + ["timeout"] * 2, fast + [7.0, 7.5, 6.0, 6.1])
    assert [c for c in diff_reports(old, new).changes if c.kind == "duration"] == []


# -- for real -------------------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_harness_run_repeat_reports_frequencies_for_real(tmp_path):
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "healthy.yaml").write_text(textwrap.dedent("""\
        name: healthy
        about: two ranks, all_reduce
        timeout: 20
        deadline: 60
        expect:
          ranks: {"*": {outcome: {ok: ">= 0.9"}}}
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HARNESS_"))}
    p = subprocess.run([sys.executable, "-m", "harness", "run", "scenarios", "--repeat", "3",
                        "--report", "r.json", "--no-progress"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    rep = json.loads((tmp_path / "r.json").read_text())
    (case,) = rep["cases"]
    assert (case["repeat"], case["flaky"], case["job_outcomes"]) == (3, [], {"ok": 3})
    assert [r["outcomes"] for r in case["ranks"]] == [{"ok": 3}, {"ok": 3}]
    assert len(case["walls"]) == 3 and all(len(r["durations"]) == 3 for r in case["ranks"])
    assert "0: ok 3/3" in p.stdout and "time:" in p.stdout
    assert sorted(x.name for x in (tmp_path / ".harness" / "evidence" / "latest").iterdir()
                  if x.is_dir()) == ["scenarios_healthy.yaml__healthy"]
    kept = tmp_path / ".harness" / "evidence" / "latest" / "scenarios_healthy.yaml__healthy"
    assert sorted(x.name for x in kept.iterdir()) == ["run-1", "run-2", "run-3"]
    tb = rep["time"]
    assert tb["workers"] == 1 and tb["inherent"] == pytest.approx(sum(case["walls"]), abs=0.01)
    assert tb["ratio"] == pytest.approx(tb["duration"] / tb["inherent"], rel=0.01)

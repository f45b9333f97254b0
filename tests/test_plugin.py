"""The pytest front door (harness.pytest_plugin), tested with pytest's own ``pytester``.

Collection tests run pytest in-process with --collect-only (no rank is started); the tests that
run a scenario use a subprocess and the cheapest real run there is (one rank, init only).
"""

from __future__ import annotations

import textwrap

import pytest

SCENARIO = """\
name: {name}
about: a one-rank scenario for the plugin's tests
world_size: 1
timeout: 10
deadline: 60
workload: init
"""


def write(pytester, path: str, name: str, extra: str = "") -> None:
    p = pytester.path / path
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(SCENARIO.format(name=name) + textwrap.dedent(extra))


def collected(pytester, *args):
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", *args)
    return result, [ln for ln in result.stdout.lines if "::" in ln]


# -- what is collected ---------------------------------------------------------------------------

def test_yaml_in_a_scenarios_folder_is_collected(pytester):
    write(pytester, "scenarios/store.yaml", "store")
    _, items = collected(pytester)
    assert items == ["scenarios/store.yaml::store"]


def test_yml_suffix_and_nested_scenarios_folder_are_collected(pytester):
    write(pytester, "pkg/scenarios/deep/net.yml", "net")
    _, items = collected(pytester)
    assert items == ["pkg/scenarios/deep/net.yml::net"]


def test_yaml_outside_a_scenarios_folder_is_not_collected(pytester):
    write(pytester, "other/loose.yaml", "loose")
    result, items = collected(pytester)
    assert items == [] and result.ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_yaml_outside_a_scenarios_folder_named_on_the_command_line_is_collected(pytester):
    write(pytester, "other/loose.yaml", "loose")
    _, items = collected(pytester, "other/loose.yaml")
    assert items == ["other/loose.yaml::loose"]


def test_a_race_case_gets_the_race_marker_and_a_guard_for_every_run(pytester):
    write(pytester, "scenarios/racy.yaml", "racy", """\
        race: "a stand-in for a race inside torch (the plugin's test only collects it)"
        repeat: 10
        expect:
          ranks: {"0": {outcome: {ok: ">= 0.9", error: "<= 0.1"}}}
    """)
    write(pytester, "scenarios/plain.yaml", "plain")
    _, items = collected(pytester, "-m", "race")
    assert items == ["scenarios/racy.yaml::racy"]
    _, items = collected(pytester, "-m", "not race")
    assert items == ["scenarios/plain.yaml::plain"]
    items, _ = pytester.inline_genitems("-p", "no:cacheprovider")
    guard = {i.name: i.get_closest_marker("timeout").args[0] for i in items}
    # per run its deadline + 60 s, and 840 s for start-up, clean-up and the admission gate
    assert guard == {"racy": 10 * (60 + 60) + 840, "plain": 60 + 60 + 840}


def test_ini_glob_collects_yaml_elsewhere(pytester):
    pytester.makeini("[pytest]\nharness_scenarios = catalog/*.yaml\n")
    write(pytester, "catalog/one.yaml", "one")
    write(pytester, "other/two.yaml", "two")
    _, items = collected(pytester)
    assert items == ["catalog/one.yaml::one"]


def test_non_yaml_file_in_scenarios_is_not_collected(pytester):
    write(pytester, "scenarios/README.md", "readme")
    write(pytester, "scenarios/a.yaml", "a")
    _, items = collected(pytester)
    assert items == ["scenarios/a.yaml::a"]


def test_project_under_a_folder_named_scenarios_collects_only_its_scenarios(pytester,
                                                                          monkeypatch):
    proj = pytester.mkdir("scenarios") / "proj"
    proj.mkdir()
    (proj / "pytest.ini").write_text("[pytest]\n")
    (proj / "compose.yaml").write_text("services: {}\n")
    monkeypatch.chdir(proj)
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    assert "compose.yaml" not in result.stdout.str()
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_scenarios_are_read_when_pytest_runs_from_outside_the_rootdir(pytester):
    (pytester.mkdir("proj") / "pytest.ini").write_text("[pytest]\n")
    write(pytester, "proj/scenarios/a.yaml", "a")
    result, items = collected(pytester, "proj")
    assert "cannot read" not in result.stdout.str()
    assert len(items) == 1 and result.ret == pytest.ExitCode.OK


def test_broken_file_is_named_as_seen_from_where_pytest_runs(pytester):
    (pytester.mkdir("proj") / "pytest.ini").write_text("[pytest]\n")
    (pytester.path / "proj" / "scenarios").mkdir()
    (pytester.path / "proj" / "scenarios" / "bad.yaml").write_text(
        "name: bad\nabout: x\nworld_size: 0\n")
    result, _ = collected(pytester, "proj")
    assert "proj/scenarios/bad.yaml:3: world_size: " in result.stdout.str()


# -- ids, keywords, marks --------------------------------------------------------------------------

def test_case_ids_are_in_the_test_ids(pytester):
    write(pytester, "scenarios/cased.yaml", "cased", """
        cases:
          quick: {}
          slow:
            timeout: 20
    """)
    _, items = collected(pytester)
    assert items == ["scenarios/cased.yaml::cased[quick]", "scenarios/cased.yaml::cased[slow]"]


def test_faker_seed_is_in_the_test_id(pytester):
    write(pytester, "scenarios/garbage.yaml", "garbage", """
        faults:
          - kind: malformed_env
            seed: 3
        cases:
          port: {}
    """)
    _, items = collected(pytester)
    assert items == ["scenarios/garbage.yaml::garbage[port,seed=3]"]


@pytest.fixture
def three(pytester):
    write(pytester, "scenarios/busy.yaml", "busy", """
        faults:
          - kind: busy_port
        marks: [port_faults]
    """)
    write(pytester, "scenarios/wrong.yaml", "wrong", """
        faults:
          - kind: wrong_port
            ranks: [0]
        marks: [port_faults, slow_store]
    """)
    write(pytester, "scenarios/plain.yaml", "plain", """
        init: tcp
    """)
    return pytester


def test_k_selects_by_fault_kind(three):
    _, items = collected(three, "-k", "busy_port")
    assert items == ["scenarios/busy.yaml::busy"]


def test_k_selects_by_init_method(three):
    _, items = collected(three, "-k", "tcp")
    assert items == ["scenarios/plain.yaml::plain"]


def test_m_selects_by_a_yaml_mark(three):
    _, items = collected(three, "-m", "slow_store")
    assert items == ["scenarios/wrong.yaml::wrong"]


def test_m_selects_every_scenario_with_the_mark(three):
    _, items = collected(three, "-m", "port_faults")
    assert items == ["scenarios/busy.yaml::busy", "scenarios/wrong.yaml::wrong"]


def test_yaml_marks_are_registered_for_strict_markers(three):
    result, items = collected(three, "--strict-markers", "-m", "port_faults and not slow_store")
    assert items == ["scenarios/busy.yaml::busy"]
    assert result.ret == pytest.ExitCode.OK


def test_every_scenario_has_the_scenario_mark(three):
    _, items = collected(three, "-m", "scenario")
    assert len(items) == 3


# -- running ---------------------------------------------------------------------------------------

def test_mismatching_expectation_is_a_failure_table_not_a_traceback(pytester):
    write(pytester, "scenarios/wrong_expect.yaml", "wrong_expect", """
        expect:
          job: timeout
          ranks:
            0: {outcome: timeout, message: "clients joined"}
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    out = result.stdout.str()
    result.assert_outcomes(failed=1)
    assert "Traceback" not in out
    assert "wrong_expect (wrong_expect.yaml) on torch" in out
    assert "ranks did not end as expected" in out
    assert any(ln.startswith("│ ✗ 0 ") for ln in result.stdout.lines), out
    assert "  0: outcome: expected timeout, observed ok" in out
    assert "  0: message: expected /clients joined/, observed (none)" in out
    assert "  job: expected timeout, observed ok" in out


def test_scenario_without_expectation_for_this_torch_is_skipped_with_the_reason(pytester):
    write(pytester, "scenarios/old.yaml", "old", """
        expect:
          - torch: "<2.0"
            job: ok
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    assert "no expectation for torch" in result.stdout.str()
    assert "<2.0" in result.stdout.str()


def test_harness_failure_is_one_line_neither_pass_nor_fail(pytester, monkeypatch):
    monkeypatch.setenv("HARNESS_READY_TIMEOUT", "0.01")   # no rank imports torch that fast
    write(pytester, "scenarios/slow_import.yaml", "slow_import", "isolate: never\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    out = result.stdout.str()
    assert "harness error (neither pass nor fail): ranks ['0'] did not import torch" in out
    assert "launch.py" not in out

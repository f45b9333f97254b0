"""Loading scenario files (harness.loader): YAML -> Scenario cases, with located errors.

Pure: text or files in, Scenario objects or ScenarioFileError out. The catalogue of malformed
files is tests/test_broken_files.py; this file covers what a valid file turns into, ``cases:``,
and the JSON Schema export.
"""

from __future__ import annotations

import glob
import json
import textwrap
from pathlib import Path

import pytest
import yaml

from harness.scenario.loader import Problem, ScenarioFileError, json_schema, load_file, load_text

DATA = Path(__file__).parent / "data"
VALID = DATA / "valid"
REPO = Path(__file__).resolve().parent.parent


def load(text: str):
    return load_text(textwrap.dedent(text), "s.yaml")


def first_problem(text: str) -> Problem:
    with pytest.raises(ScenarioFileError) as e:
        load(text)
    return e.value.problems[0]


# -- a file with every field ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def full():
    (scn,) = load_file(VALID / "full.yaml")
    return scn


def test_full_file_top_level_fields(full):
    assert (full.name, full.backend, full.world_size, full.init, full.timeout, full.deadline,
            full.master_addr) == ("full_example", "gloo", 3, "tcp", 7.5, 40.0, "127.0.0.1")
    assert full.about.startswith("Every field of the format at once")


def test_full_file_env_numbers_read_as_text(full):
    assert full.env == {"GLOO_SOCKET_IFNAME": "lo", "TORCH_CPP_LOG_LEVEL": "INFO",
                        "SOME_NUMBER": "3"}


def test_full_file_workload(full):
    assert full.workload.steps == ["barrier", "all_reduce", "broadcast", "sleep 0.5"]
    assert full.workload.destroy is False


def test_full_file_faults_in_order_with_parameters(full):
    assert [f.model_dump(exclude_unset=True) for f in full.faults] == [
        {"kind": "delayed_rank", "ranks": [2], "delay": 2},
        {"kind": "wrong_port", "ranks": [1]},
    ]


def test_full_file_expect_block(full):
    (e,) = full.expect
    assert e.torch == ">=2.2" and e.job == ["timeout", "error"]
    r0 = e.ranks["0"]
    assert (r0.outcome, r0.exception, r0.message, r0.within, r0.phase) == \
        (["timeout"], "DistStoreError", "clients joined", (1.0, 30.0), ["init"])


def test_full_file_rank_shorthand_list(full):
    assert full.expect[0].ranks["1"].outcome == ["timeout", "error"]


def test_full_file_star_rank(full):
    assert full.expect[0].ranks["*"].outcome == ["ok"]


def test_full_file_marks(full):
    assert full.marks == ["slow", "store_faults"]


def test_full_file_has_no_case(full):
    assert full.case is None and full.test_id == "full_example"


def test_load_file_accepts_str_and_path():
    assert load_file(str(VALID / "full.yaml"))[0] == load_file(VALID / "full.yaml")[0]


# -- shorthands, from YAML -----------------------------------------------------------------------

def test_workload_init_shorthand():
    (s,) = load("""
        name: a
        about: x
        workload: init
    """)
    assert s.workload.steps == []


def test_workload_list_shorthand():
    (s,) = load("""
        name: a
        about: x
        workload: [barrier, broadcast]
    """)
    assert s.workload.steps == ["barrier", "broadcast"]


def test_expect_rank_shorthand_from_yaml_int_key():
    (s,) = load("""
        name: a
        about: x
        expect:
          ranks:
            1: timeout
    """)
    assert s.expect[0].ranks["1"].outcome == ["timeout"]


def test_job_outcome_list():
    (s,) = load("""
        name: a
        about: x
        expect: {job: [timeout, hang]}
    """)
    assert s.expect[0].job == ["timeout", "hang"]


def test_torch_scoped_blocks_choose_by_version():
    (s,) = load_file(VALID / "torch_scoped.yaml")
    assert s.expectation_for("2.3.1+cu121").job == ["timeout", "error"]
    assert s.expectation_for("2.13.0+cpu").job == ["timeout"]
    assert s.expectation_for("2.1.0").job == ["timeout", "error", "hang"]


def test_torch_scoped_block_keeps_its_rank_expectations():
    (s,) = load_file(VALID / "torch_scoped.yaml")
    assert s.expectation_for("2.4.0").ranks["0"].message == "clients joined"


# -- cases ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cases():
    return {s.case: s for s in load_file(VALID / "cases.yaml")}


def test_cases_become_scenarios_in_file_order():
    assert [s.test_id for s in load_file(VALID / "cases.yaml")] == \
        ["cased[short]", "cased[late]", "cased[more_env]"]


def test_empty_case_is_the_top_level(cases):
    short = cases["short"]
    assert (short.timeout, short.env, short.marks) == (5.0, {"A": "1"}, ["base_mark"])
    assert [f.model_dump(exclude_unset=True) for f in short.faults] == \
        [{"kind": "delayed_rank", "delay": 1}]


def test_case_overrides_a_scalar(cases):
    assert cases["late"].timeout == 20.0


def test_case_replaces_a_list_not_appends(cases):
    assert [f.model_dump(exclude_unset=True) for f in cases["late"].faults] == \
        [{"kind": "delayed_rank", "delay": 9}]


def test_case_deep_merges_mappings(cases):
    e = cases["late"].expect[0]
    assert e.job == ["timeout"]
    assert e.ranks["*"].outcome == ["ok"] and e.ranks["1"].outcome == ["timeout"]


def test_case_env_is_merged(cases):
    assert cases["more_env"].env == {"A": "1", "B": "2"}


def test_one_case_does_not_leak_into_another(cases):
    assert "1" not in cases["more_env"].expect[0].ranks
    assert cases["more_env"].timeout == 5.0


def test_case_marks_replace_the_top_level_marks(cases):
    assert cases["more_env"].marks == ["case_mark"]


def test_case_error_is_located_at_the_case_line():
    p = first_problem("""\
        name: a
        about: x
        cases:
          fine: {}
          broken:
            world_size: 0
    """)
    assert (p.line, p.field) == (6, "cases.broken: world_size")


def test_case_fault_error_is_located_in_the_case_fault_list():
    p = first_problem("""\
        name: a
        about: x
        faults:
          - kind: delayed_rank
            delay: 1
        cases:
          fine: {}
          broken:
            faults:
              - kind: delayed_rank
                delay: 1
                ranks: [7]
    """)
    assert (p.line, p.field) == (12, "cases.broken: faults[0].ranks[0]")


def test_top_level_error_is_reported_for_every_case_at_its_own_line():
    with pytest.raises(ScenarioFileError) as e:
        load("""\
            name: a
            about: x
            world_size: 0
            cases:
              one: {}
              two: {}
        """)
    assert [(p.line, p.field) for p in e.value.problems] == \
        [(3, "cases.one: world_size"), (3, "cases.two: world_size")]


def test_case_that_fixes_a_top_level_value_is_valid():
    scns = load("""\
        name: a
        about: x
        world_size: 3
        expect:
          ranks:
            2: ok
        cases:
          three: {}
    """)
    assert scns[0].world_size == 3


def test_case_shrinking_the_world_makes_an_expected_rank_outside_it():
    p = first_problem("""\
        name: a
        about: x
        world_size: 3
        cases:
          three: {}
          two:
            world_size: 2
        expect:
          ranks:
            2: ok
    """)
    assert (p.line, p.field) == (10, "cases.two: expect.ranks.2")
    assert "outside the world" in p.message


@pytest.mark.parametrize("cid", ["has space", "a/b", "x!"])
def test_invalid_case_id_is_located_at_its_key(cid):
    p = first_problem(f"""\
        name: a
        about: x
        cases:
          ok_one: {{}}
          "{cid}": {{}}
    """)
    assert (p.line, p.field) == (5, f"cases.{cid}")


def test_case_that_is_not_a_mapping():
    p = first_problem("""\
        name: a
        about: x
        cases:
          one: 5
    """)
    assert (p.line, p.field) == (4, "cases.one")


def test_cases_that_are_a_list():
    p = first_problem("""\
        name: a
        about: x
        cases: [a, b]
    """)
    assert (p.line, p.field) == (3, "cases")


def test_case_ids_allow_equals_dots_and_dashes():
    scns = load("""\
        name: a
        about: x
        cases:
          delay=9.5: {}
          with-dash: {}
    """)
    assert [s.test_id for s in scns] == ["a[delay=9.5]", "a[with-dash]"]


# -- marks ---------------------------------------------------------------------------------------

def test_marks_from_yaml():
    (s,) = load("""
        name: a
        about: x
        marks: [slow, nightly]
    """)
    assert s.marks == ["slow", "nightly"]


def test_invalid_mark_is_located_at_its_item():
    p = first_problem("""\
        name: a
        about: x
        marks:
          - slow
          - not valid
    """)
    assert (p.line, p.field) == (5, "marks[1]")
    assert "marker name" in p.message


def test_mark_that_is_not_a_string():
    p = first_problem("""\
        name: a
        about: x
        marks: {slow: 1}
    """)
    assert (p.line, p.field) == (3, "marks")


# -- the error object --------------------------------------------------------------------------

def test_problem_str_is_file_line_field_message():
    assert str(Problem("f.yaml", 3, "world_size", "too small")) == "f.yaml:3: world_size: too small"


def test_problem_str_without_field_or_line():
    assert str(Problem("f.yaml", None, "", "cannot read")) == "f.yaml: cannot read"


def test_error_with_several_problems_says_how_many_more():
    with pytest.raises(ScenarioFileError) as e:
        load("""\
            name: a
            about: x
            world_size: 0
            timeout: -1
            deadline: -1
        """)
    assert len(e.value.problems) == 3
    lines = str(e.value).splitlines()
    assert len(lines) == 2 and lines[0].startswith("s.yaml:3: world_size:")
    assert "+2 more problems" in lines[1]


def test_missing_file_is_a_scenario_file_error(tmp_path):
    with pytest.raises(ScenarioFileError, match="cannot read"):
        load_file(tmp_path / "nope.yaml")


# -- JSON Schema export ------------------------------------------------------------------------

def test_json_schema_is_json():
    schema = json_schema()
    assert json.loads(json.dumps(schema)) == schema
    assert schema["title"] == "torchdist-harness scenario"


def test_json_schema_names_every_registered_fault_kind():
    from harness.faults import REGISTRY

    text = json.dumps(json_schema())
    missing = [k for k in REGISTRY.kinds() if f'"const": "{k}"' not in text]
    assert not missing


def test_json_schema_hides_the_loader_only_case_field():
    props = json_schema()["properties"]
    assert "case" not in props and "cases" in props


def _catalog():
    files = sorted(glob.glob(str(REPO / "scenarios" / "**" / "*.y*ml"), recursive=True))
    files += sorted(str(p) for p in VALID.glob("*.yaml"))
    return files


@pytest.fixture(scope="module")
def validator():
    jsonschema = pytest.importorskip(
        "jsonschema", reason="the jsonschema package is not installed in this venv "
        "(pip install jsonschema to check the exported schema)")
    schema = json_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def test_json_schema_is_a_valid_json_schema(validator):
    assert validator.schema["type"] == "object"


@pytest.mark.parametrize("path", _catalog(), ids=lambda p: Path(p).name)
def test_json_schema_accepts_every_file_the_loader_accepts(validator, path):
    try:
        load_file(path)
    except ScenarioFileError as e:
        pytest.skip(f"the loader refuses it: {e}")
    data = yaml.safe_load(Path(path).read_text())
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(data)]
    assert errors == []


@pytest.mark.parametrize("bad", [
    {"name": "a", "about": "x", "colour": "red"},
    {"name": "a", "about": "x", "faults": [{"kind": "no_such_fault"}]},
    {"name": "a", "about": "x", "faults": [{"kind": "wrong_port", "prot": 1}]},
    {"name": "a", "about": "x", "world_size": "two"},
    {"name": "a", "about": "x", "expect": {"ranks": {"0": "sometimes"}}},
    {"about": "x"},
], ids=["unknown_field", "unknown_fault", "unknown_fault_param", "wrong_type",
        "bad_outcome_shorthand", "no_name"])
def test_json_schema_refuses_what_the_loader_refuses(validator, bad):
    assert list(validator.iter_errors(bad))


@pytest.mark.parametrize("launcher", [
    "torchrun", "spawn", {"kind": "torchrun", "nproc_per_node": 2}, {"kind": "launch"},
    {"kind": "spawn", "start_method": "spawn"}], ids=str)
def test_json_schema_accepts_a_top_level_launcher_the_loader_accepts(validator, launcher):
    # the catalog's files set launcher: inside cases (free mappings to the schema), so a
    # top-level one is checked here: the schema refused every name and every option once
    data = {"name": "a", "about": "x", "world_size": 2, "launcher": launcher,
            "expect": {"job": "ok"}}
    load_text(yaml.safe_dump(data), "s.yaml")
    assert [e.message for e in validator.iter_errors(data)] == []


@pytest.mark.parametrize("launcher", [
    "no_such_launcher", {"kind": "torchrun", "nproc_per_nod": 2}, {"kind": "nope"}], ids=str)
def test_json_schema_refuses_a_launcher_the_loader_refuses(validator, launcher):
    data = {"name": "a", "about": "x", "world_size": 2, "launcher": launcher,
            "expect": {"job": "ok"}}
    with pytest.raises(ScenarioFileError):
        load_text(yaml.safe_dump(data), "s.yaml")
    assert list(validator.iter_errors(data))

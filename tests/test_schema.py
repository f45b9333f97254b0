"""The scenario models (harness.schema): fields, defaults, shorthands, version-scoped expectations.

Pure: models are validated from Python data, no YAML and no processes (YAML is test_loader's).
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from harness.scenario.schema import MAX_WORLD, Expect, RankExpect, Scenario, Workload, base_version


def scenario(**fields):
    return Scenario.model_validate({"name": "s", "about": "why", **fields})


def error_locs(excinfo):
    return [tuple(e["loc"]) for e in excinfo.value.errors()]


# -- defaults and every field ------------------------------------------------------------------

def test_defaults_of_a_minimal_scenario():
    s = scenario()
    assert (s.backend, s.world_size, s.init, s.timeout, s.deadline, s.master_addr) == \
        ("gloo", 2, "env", 30.0, 60.0, "127.0.0.1")
    assert s.env == {} and s.faults == [] and s.marks == [] and s.case is None
    assert s.workload.steps == ["all_reduce"] and s.workload.destroy is True
    assert len(s.expect) == 1 and s.expect[0].ranks == {} and s.expect[0].job is None


def test_every_field_is_kept():
    s = scenario(backend="nccl", world_size=4, init="tcp", timeout=5, deadline=12.5,
                 master_addr="localhost", env={"GLOO_SOCKET_IFNAME": "lo"},
                 workload={"steps": ["barrier", "broadcast", "sleep 0.5"], "destroy": False},
                 faults=[{"kind": "wrong_port", "ranks": [1]}],
                 expect={"torch": ">=2.2", "job": ["timeout"],
                         "ranks": {"0": {"outcome": ["timeout"], "exception": "DistStoreError",
                                         "message": "clients joined", "within": [1, 20],
                                         "phase": "init"}}},
                 marks=["slow", "store"])
    assert (s.backend, s.world_size, s.init, s.timeout, s.deadline, s.master_addr) == \
        ("nccl", 4, "tcp", 5.0, 12.5, "localhost")
    assert s.env == {"GLOO_SOCKET_IFNAME": "lo"}
    assert s.workload.steps == ["barrier", "broadcast", "sleep 0.5"] and not s.workload.destroy
    assert s.faults[0].kind == "wrong_port" and s.faults[0].model_dump()["ranks"] == [1]
    r0 = s.expect[0].ranks["0"]
    assert (r0.outcome, r0.exception, r0.message, r0.within, r0.phase) == \
        (["timeout"], "DistStoreError", "clients joined", (1.0, 20.0), ["init"])
    assert s.expect[0].torch == ">=2.2" and s.expect[0].job == ["timeout"]
    assert s.marks == ["slow", "store"]


def test_env_numbers_become_strings():
    assert scenario(env={"A": 1, "B": 2.5, "C": "x"}).env == {"A": "1", "B": "2.5", "C": "x"}


def test_env_bool_is_not_a_string():
    with pytest.raises(ValidationError) as e:
        scenario(env={"A": True})
    assert error_locs(e) == [("env", "A")]


@pytest.mark.parametrize("field,value", [
    ("world_size", 0), ("world_size", MAX_WORLD + 1), ("timeout", 0), ("deadline", -1),
    ("backend", "gloo nccl"), ("init", "udp"), ("name", "has space"), ("about", ""),
])
def test_out_of_range_or_unknown_value_is_refused(field, value):
    with pytest.raises(ValidationError) as e:
        scenario(**{field: value})
    assert error_locs(e) == [(field,)]


def test_name_and_about_are_required():
    with pytest.raises(ValidationError) as e:
        Scenario.model_validate({})
    assert sorted(error_locs(e)) == [("about",), ("name",)]


def test_unknown_field_is_refused_at_every_level():
    with pytest.raises(ValidationError) as e:
        scenario(colour=1, workload={"steps": [], "speed": 2},
                 expect={"ranks": {"0": {"outcome": "ok", "mood": "calm"}}, "when": 1})
    assert sorted(error_locs(e)) == sorted([
        ("colour",), ("workload", "speed"), ("expect", 0, "when"),
        ("expect", 0, "ranks", "0", "mood")])


# -- workload shorthands -----------------------------------------------------------------------

def test_workload_init_means_no_steps():
    assert scenario(workload="init").workload.steps == []


def test_workload_single_step_string():
    assert scenario(workload="barrier").workload.steps == ["barrier"]


def test_workload_list_is_the_steps():
    w = scenario(workload=["barrier", "all_reduce", "sleep 2"]).workload
    assert w.steps == ["barrier", "all_reduce", "sleep 2"] and w.destroy is True


def test_workload_model_accepts_the_shorthand_directly():
    assert Workload.model_validate("init").steps == []


@pytest.mark.parametrize("step", ["jump", "sleep", "sleep x", "all-reduce", "barrier "])
def test_unknown_step_is_refused_at_its_index(step):
    with pytest.raises(ValidationError) as e:
        scenario(workload=["barrier", step])
    assert error_locs(e) == [("workload", "steps", 1)]


# -- expectations ------------------------------------------------------------------------------

def test_expect_single_block_becomes_a_list_of_one():
    s = scenario(expect={"job": "ok"})
    assert len(s.expect) == 1 and s.expect[0].job == ["ok"]


def test_outcome_string_becomes_a_list():
    assert RankExpect.model_validate({"outcome": "timeout"}).outcome == ["timeout"]


def test_outcome_list_is_kept():
    assert RankExpect.model_validate({"outcome": ["timeout", "error"]}).outcome == \
        ["timeout", "error"]


def test_rank_shorthand_outcome_string():
    e = Expect.model_validate({"ranks": {1: "timeout"}})
    assert e.ranks["1"].outcome == ["timeout"] and e.ranks["1"].exception is None


def test_rank_shorthand_outcome_list():
    e = Expect.model_validate({"ranks": {0: ["ok", "error"]}})
    assert e.ranks["0"].outcome == ["ok", "error"]


def test_rank_keys_become_strings():
    e = Expect.model_validate({"ranks": {0: "ok", "*": "timeout", "job2:0": "error"}})
    assert sorted(e.ranks) == ["*", "0", "job2:0"]


def test_unknown_outcome_is_refused():
    with pytest.raises(ValidationError) as e:
        RankExpect.model_validate({"outcome": ["ok", "sometimes"]})
    assert error_locs(e) == [("outcome", 1)]


def test_bad_regex_is_refused():
    with pytest.raises(ValidationError, match="not a valid regular expression"):
        RankExpect.model_validate({"message": "(unclosed"})


@pytest.mark.parametrize("window", [[5, 1], [-1, 3]])
def test_within_must_be_an_ordered_non_negative_window(window):
    with pytest.raises(ValidationError, match=r"\[min, max\]"):
        RankExpect.model_validate({"within": window})


def test_within_of_one_point_is_allowed():
    assert RankExpect.model_validate({"within": [2, 2]}).within == (2.0, 2.0)


@pytest.mark.parametrize("spec", ["banana", "2.4", ">=2.x", "=>2.4"])
def test_bad_torch_range_is_refused(spec):
    with pytest.raises(ValidationError, match="not a version range"):
        Expect.model_validate({"torch": spec})


@pytest.mark.parametrize("version,base", [
    ("2.13.0+cpu", "2.13.0"), ("2.3.1+cu121", "2.3.1"), ("2.6.0a0+git1234", "2.6.0a0"),
    ("2.4.0", "2.4.0"),
])
def test_base_version_drops_the_local_part(version, base):
    assert base_version(version) == base


TORCH_SCOPED = [
    {"torch": ">=2.5", "job": "ok"},
    {"torch": ">=2.2,<2.4", "job": "timeout"},
    {"torch": ">=2.4,<2.5", "job": "error"},
    {"job": "crash"},
]


@pytest.mark.parametrize("version,job", [
    ("2.3.1+cu121", "timeout"), ("2.2.0", "timeout"), ("2.4.1+cpu", "error"),
    ("2.13.0+cpu", "ok"), ("2.5.0", "ok"), ("2.1.2", "crash"),
])
def test_expectation_for_picks_the_first_block_whose_range_holds(version, job):
    s = scenario(expect=TORCH_SCOPED)
    assert s.expectation_for(version).job == [job]


def test_expectation_for_is_none_when_no_block_holds():
    s = scenario(expect=[{"torch": ">=2.4", "job": "ok"}])
    assert s.expectation_for("2.3.1+cu121") is None


def test_block_without_torch_holds_for_every_version():
    assert Expect().applies_to("1.13.1") and Expect().applies_to("2.13.0+cpu")


def test_a_block_of_one_build_holds_for_that_build_only():
    s = scenario(expect=[{"build": "cuda", "job": "error"}, {"build": "cpu", "job": "ok"}])
    assert s.expectation_for("2.14.1+cu130", "13.0").job == ["error"]
    assert s.expectation_for("2.14.1", "12.8").job == ["error"]   # PyPI's CUDA wheel: no +cu
    assert s.expectation_for("2.13.0+cpu", None).job == ["ok"]
    assert scenario(expect=[{"build": "cuda"}]).expectation_for("2.13.0+cpu") is None


def test_prerelease_counts_as_its_base_version():
    assert Expect(torch=">=2.6.0a0").applies_to("2.6.0a0+git1234")


# -- marks, ids --------------------------------------------------------------------------------

@pytest.mark.parametrize("mark", ["bad mark", "1st", "a-b", ""])
def test_invalid_marker_name_is_refused_at_its_index(mark):
    with pytest.raises(ValidationError) as e:
        scenario(marks=["fine", mark])
    assert error_locs(e) == [("marks", 1)]


def test_test_id_without_case_is_the_name():
    assert scenario().test_id == "s"


def test_test_id_with_case():
    assert scenario(case="slow").test_id == "s[slow]"


# -- faults are carried, not validated, by the schema --------------------------------------------

def test_fault_spec_keeps_its_parameters_for_the_plugin():
    s = scenario(faults=[{"kind": "delayed_rank", "delay": 9, "ranks": [1]}])
    assert s.faults[0].model_dump() == {"kind": "delayed_rank", "delay": 9, "ranks": [1]}


def test_a_fault_built_in_code_needs_a_known_kind():
    with pytest.raises(ValidationError, match="unknown fault kind") as e:
        scenario(faults=[{"delay": 1}])
    assert error_locs(e) == [("faults", 0)]


# -- hosts (several network namespaces) ------------------------------------------------------------

def test_single_host_by_default_and_isolated_when_possible():
    s = scenario()
    assert (s.hosts, s.isolate, s.host_names()) == (None, "auto", ["local"])


def test_nodes_times_ranks_per_node_become_hosts_and_the_world():
    s = scenario(nodes=2, ranks_per_node=2)
    assert [(h.name, h.ranks) for h in s.hosts] == [("node0", 2), ("node1", 2)]
    assert s.world_size == 4


def test_world_size_that_contradicts_the_hosts_is_refused():
    with pytest.raises(ValidationError, match="world_size 3 but the hosts hold 4 ranks"):
        scenario(world_size=3, hosts=[{"name": "a", "ranks": 2}, {"name": "b", "ranks": 2}])


def test_master_host_must_be_one_of_the_hosts():
    with pytest.raises(ValidationError, match="master_host 'c' is not one of"):
        scenario(hosts=[{"name": "a"}, {"name": "b"}], master_host="c")

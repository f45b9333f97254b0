"""Planning (harness.plan) and what each fault plugin does to a plan (harness.faults).

Pure: plans are made with a counter as the port source (30000, 30001, ...) and a run dir that
is never created; no process, no socket.
"""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.core.triggers import Trigger
from harness.faults import REGISTRY, Fault
from harness.faults.busy_port import HoldPort
from harness.faults.file_init import StaleFileStore, Unwritable
from harness.faults.malformed_env import ALLOWED, garbage
from harness.faults.signal_rank import Signal
from harness.faults.steps import RUN
from harness.run.plan import MakeDir, make_plan
from harness.scenario.loader import ScenarioFileError, load_text

RUN_DIR = "/tmp/x"


def scn(faults=(), **fields):
    data = {"name": "p", "about": "planned", "world_size": 2, **fields, "faults": list(faults)}
    (s,) = load_text(yaml.safe_dump(data, sort_keys=False), "p.yaml")
    return s


def plan(counter_ports, faults=(), **fields):
    return make_plan(scn(faults, **fields), RUN_DIR, take_port=counter_ports)


def env_of(p, label):
    return p.rank(label).env


def fault_steps(p):
    """The steps faults added (the run's own set-up steps left out)."""
    return [s for s in p.steps if s.fault != RUN]


def resolve(s):
    return list(s.faults)


# -- the plan of a scenario without faults -------------------------------------------------------

def test_env_init_gives_every_rank_torchs_variables(counter_ports):
    p = plan(counter_ports, world_size=3)
    for r in range(3):
        assert env_of(p, r) == {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "30000",
                                "RANK": str(r), "WORLD_SIZE": "3", "LOCAL_RANK": str(r),
                                "LOCAL_WORLD_SIZE": "3", "TMPDIR": f"{RUN_DIR}/tmp"}


def test_a_scenarios_own_tmpdir_is_kept(counter_ports):
    p = plan(counter_ports, world_size=2, env={"TMPDIR": "/var/tmp"})
    assert {env_of(p, r)["TMPDIR"] for r in range(2)} == {"/var/tmp"}


def test_env_init_passes_no_url_and_no_rank(counter_ports):
    i = plan(counter_ports).rank(1).init
    assert (i.method, i.url, i.rank, i.world_size) == ("env", None, None, None)


def test_tcp_init_url_rank_and_world(counter_ports):
    p = plan(counter_ports, init="tcp")
    for r in (0, 1):
        i = p.rank(r).init
        assert (i.method, i.url, i.rank, i.world_size) == ("tcp", "tcp://127.0.0.1:30000", r, 2)


def test_file_init_url_is_in_the_run_dir(counter_ports):
    i = plan(counter_ports, init="file").rank(0).init
    assert (i.method, i.url, i.rank, i.world_size) == \
        ("file", "file:///tmp/x/filestore/pg", 0, 2)


def test_master_addr_of_the_scenario_is_given_to_every_rank(counter_ports):
    p = plan(counter_ports, master_addr="localhost", init="tcp")
    assert env_of(p, 1)["MASTER_ADDR"] == "localhost"
    assert p.rank(1).init.url == "tcp://localhost:30000"


def test_scenario_env_is_added_to_every_rank(counter_ports):
    p = plan(counter_ports, env={"GLOO_SOCKET_IFNAME": "lo", "N": 3})
    assert all(r.env["GLOO_SOCKET_IFNAME"] == "lo" and r.env["N"] == "3" for r in p.ranks)


def test_plan_carries_the_scenario_settings(counter_ports):
    p = plan(counter_ports, timeout=7, deadline=33, workload={"steps": ["barrier"],
                                                              "destroy": False})
    assert (p.scenario, p.case, p.backend, p.world_size, p.timeout, p.deadline, p.workload,
            p.destroy, p.master_port, p.run_dir) == \
        ("p", None, "gloo", 2, 7.0, 33.0, ["barrier"], False, 30000, RUN_DIR)


def test_plan_without_faults_has_no_fault_steps(counter_ports):
    p = plan(counter_ports)
    assert (fault_steps(p), p.notes) == ([], [])
    assert [r.release for r in p.ranks] == [Trigger.at_time(0.0)] * 2
    assert [r.label for r in p.ranks] == ["0", "1"]


def test_plan_takes_one_port_without_faults(counter_ports):
    plan(counter_ports)
    assert counter_ports() == 30001


def test_plan_to_dict_is_json_without_the_port_source(counter_ports):
    d = plan(counter_ports, faults=[{"kind": "busy_port"}]).to_dict()
    assert "take_port" not in d
    (step,) = [st for st in json.loads(json.dumps(d))["steps"] if st["fault"] == "busy_port"]
    assert (step["step"], step["port"], step["when"]) == ("HoldPort", 30000, "at set-up")


def test_step_ids_are_unique_and_name_their_fault(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "busy_port"}, {"kind": "kill_rank", "at": 1},
                                    {"kind": "kill_rank", "at": 2}])
    ids = [s.id for s in fault_steps(p)]
    assert ids == ["busy_port#1", "kill_rank#2", "kill_rank#3"] or len(set(ids)) == 3
    assert [s.fault for s in fault_steps(p)] == ["busy_port", "kill_rank", "kill_rank"]


def test_file_init_of_the_run_makes_the_store_directory_before_the_ranks(counter_ports):
    p = plan(counter_ports, init="file")
    (mk,) = [s for s in p.steps if isinstance(s, MakeDir)]
    assert (mk.path, mk.trigger.is_setup, mk.fault) == ("/tmp/x/filestore", True, RUN)


def test_rank_lookup_of_an_unknown_label(counter_ports):
    with pytest.raises(KeyError, match="no rank 7 in the plan"):
        plan(counter_ports).rank(7)


def test_plan_without_port_source_cannot_take_a_port(counter_ports):
    p = plan(counter_ports)
    p.take_port = None
    with pytest.raises(RuntimeError, match="no port source"):
        p.new_port()


# -- wrong_port ----------------------------------------------------------------------------------

def test_wrong_port_gives_chosen_ranks_a_reserved_port(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "wrong_port"}])
    assert (env_of(p, 0)["MASTER_PORT"], env_of(p, 1)["MASTER_PORT"]) == ("30000", "30001")


def test_wrong_port_explicit_port_takes_no_reserved_port(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "wrong_port", "port": 29999, "ranks": [0]}])
    assert (env_of(p, 0)["MASTER_PORT"], env_of(p, 1)["MASTER_PORT"]) == ("29999", "30000")
    assert counter_ports() == 30001


def test_wrong_port_rewrites_the_tcp_url(counter_ports):
    p = plan(counter_ports, init="tcp", faults=[{"kind": "wrong_port"}])
    assert p.rank(1).init.url == "tcp://127.0.0.1:30001"
    assert p.rank(0).init.url == "tcp://127.0.0.1:30000"


def test_wrong_port_note_names_both_ports(counter_ports):
    (note,) = plan(counter_ports, faults=[{"kind": "wrong_port"}]).notes
    assert "30001" in note and "30000" in note


# -- wrong_addr ----------------------------------------------------------------------------------

def test_wrong_addr_sets_master_addr_of_chosen_ranks(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "wrong_addr", "addr": "127.0.0.2"}])
    assert (env_of(p, 0)["MASTER_ADDR"], env_of(p, 1)["MASTER_ADDR"]) == \
        ("127.0.0.1", "127.0.0.2")


def test_wrong_addr_rewrites_the_tcp_url(counter_ports):
    p = plan(counter_ports, init="tcp", faults=[{"kind": "wrong_addr", "addr": "127.0.0.9"}])
    assert p.rank(1).init.url == "tcp://127.0.0.9:30000"


def test_wrong_addr_after_wrong_port_keeps_the_wrong_port_in_the_url(counter_ports):
    p = plan(counter_ports, init="tcp", faults=[{"kind": "wrong_port"},
                                                {"kind": "wrong_addr", "addr": "127.0.0.9"}])
    assert p.rank(1).init.url == "tcp://127.0.0.9:30001"


# -- rank_collision, rank_out_of_range, world_size_mismatch --------------------------------------

def test_rank_collision_env(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "rank_collision", "rank": 1, "claims": 0}])
    assert (env_of(p, 1)["RANK"], env_of(p, 1)["LOCAL_RANK"], p.rank(1).rank) == ("0", "0", 0)
    assert env_of(p, 0)["RANK"] == "0"


def test_rank_collision_tcp_passes_the_claimed_rank(counter_ports):
    p = plan(counter_ports, init="tcp", faults=[{"kind": "rank_collision"}])
    assert p.rank(1).init.rank == 0


def test_rank_collision_env_init_still_lets_torch_read_env(counter_ports):
    assert plan(counter_ports, faults=[{"kind": "rank_collision"}]).rank(1).init.rank is None


def test_rank_out_of_range_default_is_world_size(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "rank_out_of_range"}])
    assert (env_of(p, 1)["RANK"], p.rank(1).rank) == ("2", 2)


def test_rank_out_of_range_negative_in_tcp_init(counter_ports):
    p = plan(counter_ports, init="file", faults=[{"kind": "rank_out_of_range", "value": -1}])
    assert (env_of(p, 1)["RANK"], p.rank(1).init.rank) == ("-1", -1)


def test_world_size_mismatch_env(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "world_size_mismatch", "world_size": 3}])
    assert (env_of(p, 0)["WORLD_SIZE"], env_of(p, 1)["WORLD_SIZE"]) == ("3", "2")


def test_world_size_mismatch_tcp_init(counter_ports):
    p = plan(counter_ports, init="tcp", faults=[{"kind": "world_size_mismatch",
                                                 "ranks": [1], "world_size": 5}])
    assert (p.rank(0).init.world_size, p.rank(1).init.world_size) == (2, 5)


# -- missing_env ---------------------------------------------------------------------------------

def test_missing_env_unsets_for_every_rank_by_default(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "missing_env", "vars": ["WORLD_SIZE"]}])
    for r in p.ranks:
        assert "WORLD_SIZE" not in r.env and r.unset == ["WORLD_SIZE"]


def test_missing_env_only_chosen_ranks(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "missing_env", "vars": ["MASTER_ADDR", "RANK"],
                                     "ranks": [1]}])
    assert p.rank(0).unset == [] and "MASTER_ADDR" in env_of(p, 0)
    assert sorted(p.rank(1).unset) == ["MASTER_ADDR", "RANK"]
    assert "MASTER_ADDR" not in env_of(p, 1) and "RANK" not in env_of(p, 1)


def test_missing_env_of_a_variable_the_harness_does_not_set_is_unset_too(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "missing_env", "vars": ["GLOO_SOCKET_IFNAME"]}])
    assert p.rank(0).unset == ["GLOO_SOCKET_IFNAME"]


# -- malformed_env -------------------------------------------------------------------------------

def _is_valid(var: str, value: str) -> bool:
    """Would torch accept ``value`` for ``var``? (it calls int(); a port must fit 0..65535)"""
    try:
        n = int(value)
    except ValueError:
        return False
    return 0 <= n <= 65535 if var == "MASTER_PORT" else n >= 0


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(-2 ** 40, 2 ** 40), var=st.sampled_from(ALLOWED))
def test_garbage_is_never_a_valid_value(seed, var):
    assert not _is_valid(var, garbage(var, seed))


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2 ** 31), var=st.sampled_from(ALLOWED))
def test_garbage_is_the_same_for_the_same_seed(seed, var):
    assert garbage(var, seed) == garbage(var, seed)


@pytest.mark.parametrize("var", ALLOWED)
def test_garbage_differs_between_seeds(var):
    assert len({garbage(var, s) for s in range(40)}) > 5


def test_garbage_of_one_seed_differs_between_variables():
    assert len({garbage(v, 3) for v in ALLOWED} | {garbage(v, 4) for v in ALLOWED}) > 2


def test_malformed_env_plan_is_deterministic_by_seed(counter_ports):
    f = [{"kind": "malformed_env", "vars": ["MASTER_PORT", "RANK"], "seed": 17}]
    a = plan(counter_ports, faults=f)
    b = plan(counter_ports, faults=f)
    assert (env_of(a, 1)["MASTER_PORT"], env_of(a, 1)["RANK"]) == \
        (env_of(b, 1)["MASTER_PORT"], env_of(b, 1)["RANK"]) == \
        (garbage("MASTER_PORT", 17), garbage("RANK", 17))


def test_malformed_env_gives_every_rank_the_same_garbage_by_default(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "malformed_env", "seed": 5}])
    assert env_of(p, 0)["MASTER_PORT"] == env_of(p, 1)["MASTER_PORT"] == \
        garbage("MASTER_PORT", 5)


def test_malformed_env_only_chosen_ranks(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "malformed_env", "ranks": [1], "seed": 5}])
    assert env_of(p, 0)["MASTER_PORT"] == "30000"
    assert env_of(p, 1)["MASTER_PORT"] == garbage("MASTER_PORT", 5)


def test_malformed_env_explicit_values(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "malformed_env", "values": {"MASTER_PORT": "abc"}}])
    assert env_of(p, 1)["MASTER_PORT"] == "abc"


def test_malformed_env_values_alone_set_exactly_those_variables(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "malformed_env", "values": {"RANK": "x"}}])
    assert (env_of(p, 1)["RANK"], env_of(p, 1)["MASTER_PORT"]) == ("x", "30000")


def test_malformed_env_value_of_a_variable_not_in_vars_is_a_located_problem():
    text = ("name: p\nabout: x\nfaults:\n  - kind: malformed_env\n    vars: [MASTER_PORT]\n"
            "    values:\n      RANK: x\n")
    with pytest.raises(ScenarioFileError) as e:
        load_text(text, "p.yaml")
    p = e.value.problems[0]
    assert (p.line, p.field) == (7, "faults[0].values.RANK")
    assert "would be ignored" in p.message


def test_malformed_env_note_records_the_seed_and_values(counter_ports):
    (note,) = plan(counter_ports, faults=[{"kind": "malformed_env", "seed": 9}]).notes
    assert "seed 9" in note and repr(garbage("MASTER_PORT", 9)) in note


def test_malformed_env_seed_is_part_of_the_test_id():
    (f,) = resolve(scn([{"kind": "malformed_env", "seed": 9}]))
    assert f.id_suffix() == "seed=9"


def test_malformed_env_with_explicit_values_adds_no_seed_to_the_id():
    (f,) = resolve(scn([{"kind": "malformed_env", "values": {"RANK": "x"}, "vars": ["RANK"]}]))
    assert f.id_suffix() is None


def test_malformed_env_with_some_values_from_faker_keeps_the_seed_in_the_id():
    (f,) = resolve(scn([{"kind": "malformed_env", "values": {"RANK": "x"},
                         "vars": ["RANK", "MASTER_PORT"], "seed": 4}]))
    assert f.id_suffix() == "seed=4"


# -- delayed_rank, busy_port, kill_rank / stop_rank ------------------------------------------------

def test_delayed_rank_start_delays(counter_ports):
    p = plan(counter_ports, world_size=3, faults=[{"kind": "delayed_rank", "ranks": [1, 2],
                                                   "delay": 9}])
    assert [r.release for r in p.ranks] == [Trigger.at_time(0), Trigger.at_time(9),
                                            Trigger.at_time(9)]


def test_busy_port_holds_the_master_port(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "busy_port"}])
    (h,) = fault_steps(p)
    assert isinstance(h, HoldPort)
    assert (h.port, h.mode, h.trigger.is_setup, h.undo_trigger) == (30000, "listening", True,
                                                                     None)


def test_busy_port_mode_and_release(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "busy_port", "mode": "accepting",
                                     "release_after": 2.5}])
    (h,) = fault_steps(p)
    assert (h.mode, h.undo_trigger) == ("accepting", Trigger.at_time(2.5))


def test_kill_rank_at_a_time(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "kill_rank", "rank": 1, "at": 2}])
    (s,) = fault_steps(p)
    assert isinstance(s, Signal)
    assert (s.rank, s.signal, s.trigger, s.undo_trigger, s.fault) == \
        ("1", "KILL", Trigger.at_time(2), None, "kill_rank")


def test_kill_rank_at_a_phase_with_another_signal(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "kill_rank", "rank": 0, "phase": "workload step 1",
                                     "after": 0.5, "signal": "SEGV"}])
    (s,) = fault_steps(p)
    assert (s.rank, s.signal, s.trigger) == \
        ("0", "SEGV", Trigger.on_phase("0", "workload step 1", 0.5))


def test_kill_rank_gated_on_another_process_ending(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "kill_rank", "rank": 1, "phase": "ended",
                                     "of": 0}])
    (s,) = fault_steps(p)
    assert (s.rank, s.trigger) == ("1", Trigger.on_phase("0", "ended"))
    assert s.trigger.describe() == "when rank 0 has ended"
    assert any("SIGKILL to rank 1 when rank 0 has ended" in n for n in p.notes)


def test_kill_rank_of_another_process_phase(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "kill_rank", "rank": 1, "phase": "destroy",
                                     "of": 0, "after": 0.5}])
    (s,) = fault_steps(p)
    assert (s.rank, s.trigger) == ("1", Trigger.on_phase("0", "destroy", 0.5))


def test_kill_rank_once_every_rank_entered_a_phase(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "kill_rank", "rank": 0, "phase": "init",
                                     "of": "*"}])
    (s,) = fault_steps(p)
    assert (s.rank, s.trigger) == ("0", Trigger.on_phase("*", "init"))
    assert s.trigger.describe() == "when every rank has entered init"


def test_a_timed_fault_can_wait_for_every_ranks_phase_but_no_fault_targets_every_rank():
    s = scn([{"kind": "firewall", "ports": "all", "action": "drop", "phase": "workload step 1",
              "rank": "*"}], workload=["barrier"])
    (f,) = s.faults
    assert f.trigger() == Trigger.on_phase("*", "workload step 1")
    with pytest.raises(ScenarioFileError, match="not a wildcard"):
        scn([{"kind": "kill_rank", "rank": "*", "phase": "init"}])


@pytest.mark.parametrize("fault, field, words", [
    ({"kind": "kill_rank", "rank": 1, "at": 2, "of": 0}, "of", "give 'phase' with it"),
    ({"kind": "kill_rank", "rank": 1, "phase": "init", "of": 5}, "of", "outside the world"),
    ({"kind": "kill_rank", "rank": 1, "phase": "init", "of": "agent:x"}, "of", "agent:x"),
    ({"kind": "kill_rank", "rank": 1, "phase": "ended"}, "phase", "name another process"),
    ({"kind": "stop_rank", "rank": 1, "phase": "workload step 7", "of": 0}, "phase",
     "never enters 'workload step 7'"),
])
def test_signal_anchor_mistakes_are_located(fault, field, words):
    text = yaml.safe_dump({"name": "anchor", "about": "a signal's anchor", "world_size": 2,
                           "workload": ["barrier"],
                           "faults": [fault]})
    with pytest.raises(ScenarioFileError) as e:
        load_text(text)
    assert field in str(e.value) and words in str(e.value)


def test_ended_is_no_phase_a_rank_enters():
    from harness.core.protocol import check_trigger_phase
    with pytest.raises(ValueError):
        check_trigger_phase("ended")   # slow_rank, raise_exception... never take it


def test_stop_rank_sends_stop(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "stop_rank", "phase": "init"}])
    (s,) = fault_steps(p)
    assert (s.rank, s.signal, s.trigger, s.heal_signal) == \
        ("1", "STOP", Trigger.on_phase("1", "init"), None)


def test_stop_rank_healed_sends_cont_after_the_stop(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "stop_rank", "at": 1, "heal_after": 3}])
    (s,) = fault_steps(p)
    assert (s.signal, s.heal_signal, s.undo_trigger) == \
        ("STOP", "CONT", Trigger.after_step(s.id, 3))


def test_stop_rank_healed_at_another_process_phase_sends_cont_then(counter_ports):
    """heal_phase + heal_rank: SIGCONT once another process got there (rank 0 ended), not a
    time; the plan's note says so."""
    p = plan(counter_ports, faults=[{"kind": "stop_rank", "phase": "init",
                                     "heal_phase": "ended", "heal_rank": 0}])
    (s,) = fault_steps(p)
    assert (s.signal, s.heal_signal, s.undo_trigger) == \
        ("STOP", "CONT", Trigger.on_phase("0", "ended"))
    assert any("SIGCONT when rank 0 has ended" in n for n in p.notes), p.notes


def test_a_net_fault_healed_when_every_rank_enters_a_phase():
    s = scn([{"kind": "firewall", "ports": "all", "action": "drop", "at": 1,
              "heal_phase": "workload step 1", "heal_rank": "*"}], workload=["barrier"])
    (f,) = s.faults
    assert f.heal("x") == Trigger.on_phase("*", "workload step 1")
    assert f.when() == "at 1 s, healed when every rank has entered workload step 1"


@pytest.mark.parametrize("fault, field, words", [
    ({"kind": "stop_rank", "phase": "init", "heal_phase": "ended"}, "heal_phase",
     "the frozen process enters no phase"),
    ({"kind": "stop_rank", "phase": "init", "heal_phase": "init", "heal_rank": 1},
     "heal_phase", "the frozen process enters no phase"),
    ({"kind": "stop_rank", "at": 1, "heal_phase": "ended", "heal_rank": "agent:node9"},
     "heal_rank", "agent:node9"),
    ({"kind": "stop_rank", "at": 1, "heal_phase": "no such phase", "heal_rank": 0},
     "heal_phase", ""),
    ({"kind": "stop_rank", "at": 1, "heal_after": 2, "heal_phase": "ended", "heal_rank": 0},
     "", "at most one of 'heal_after'"),
    ({"kind": "stop_rank", "at": 1, "heal_rank": 0}, "", "give 'heal_phase' with it"),
    ({"kind": "kill_rank", "at": 1, "heal_phase": "ended", "heal_rank": 0}, "heal_phase",
     "cannot be healed"),
])
def test_a_heal_at_a_phase_that_cannot_come_is_refused_where_it_is_written(fault, field, words):
    with pytest.raises(ScenarioFileError) as e:
        scn([fault])
    assert words in str(e.value) and (not field or field in str(e.value)), str(e.value)


def test_kill_rank_cannot_be_healed():
    with pytest.raises(ScenarioFileError, match="cannot be healed"):
        scn([{"kind": "kill_rank", "at": 1, "heal_after": 2}])


# -- file_init -----------------------------------------------------------------------------------

def test_file_init_per_rank_path(counter_ports):
    p = plan(counter_ports, init="file", faults=[{"kind": "file_init", "mode": "per_rank_path"}])
    assert p.rank(0).init.url == "file:///tmp/x/filestore/pg"
    assert p.rank(1).init.url == "file:///tmp/x/filestore/pg-rank1"


def test_file_init_stale_file_is_prepared(counter_ports):
    p = plan(counter_ports, init="file", faults=[{"kind": "file_init", "mode": "stale_file"}])
    (s,) = fault_steps(p)
    assert isinstance(s, StaleFileStore)
    assert (s.path, s.world_size, s.trigger.is_setup) == ("/tmp/x/filestore/pg", 1, True)
    assert {r.init.url for r in p.ranks} == {"file:///tmp/x/filestore/pg"}


def test_file_init_unwritable_dir(counter_ports):
    p = plan(counter_ports, init="file", faults=[{"kind": "file_init",
                                                  "mode": "unwritable_dir"}])
    (s,) = fault_steps(p)
    assert isinstance(s, Unwritable)
    assert (s.path, s.trigger.is_setup, s.UNDO_AT_TEARDOWN) == ("/tmp/x/readonly", True, True)
    assert {r.init.url for r in p.ranks} == {"file:///tmp/x/readonly/pg"}


# -- concurrent_job ------------------------------------------------------------------------------

def test_concurrent_job_adds_a_second_job_on_the_same_port(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "concurrent_job", "delay": 1.5}])
    extra = [r for r in p.ranks if r.label.startswith("job2:")]
    assert [r.label for r in extra] == ["job2:0", "job2:1"]
    for i, r in enumerate(extra):
        assert (r.rank, r.env["RANK"], r.env["MASTER_PORT"], r.env["WORLD_SIZE"],
                r.release) == (i, str(i), "30000", "2", Trigger.at_time(1.5))


def test_concurrent_job_on_a_phase_the_first_job_never_enters_is_refused():
    with pytest.raises(ScenarioFileError) as e:
        scn(workload=["barrier"],
            faults=[{"kind": "concurrent_job", "rank": 0, "phase": "workload step 3"}])
    (p,) = e.value.problems
    assert p.field == "faults[0].phase" and "workload step 3" in p.message, p
    scn(workload=["barrier", "all_reduce"],   # a phase it enters: taken
        faults=[{"kind": "concurrent_job", "rank": 0, "phase": "workload step 2"}])


def test_concurrent_job_of_another_size(counter_ports):
    p = plan(counter_ports, init="tcp", faults=[{"kind": "concurrent_job", "world_size": 3}])
    extra = [r for r in p.ranks if r.label.startswith("job2:")]
    assert len(extra) == 3
    assert {(r.env["WORLD_SIZE"], r.init.world_size, r.init.url) for r in extra} == \
        {("3", 3, "tcp://127.0.0.1:30000")}


def test_faults_after_concurrent_job_touch_only_the_first_job(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "concurrent_job"},
                                    {"kind": "delayed_rank", "ranks": [1], "delay": 4},
                                    {"kind": "missing_env", "vars": ["WORLD_SIZE"]}])
    assert p.rank("job2:1").release == Trigger.at_time(0) and "WORLD_SIZE" in env_of(p, "job2:0")
    assert p.rank(1).release == Trigger.at_time(4) and "WORLD_SIZE" not in env_of(p, 0)


def test_expectation_may_name_the_second_jobs_ranks():
    s = scn([{"kind": "concurrent_job"}], expect={"ranks": {"job2:0": "error", "job2:1": "ok"}})
    assert sorted(s.expect[0].ranks) == ["job2:0", "job2:1"]


def test_expectation_of_a_second_job_rank_that_does_not_exist_is_located():
    text = ("name: p\nabout: x\nfaults:\n  - kind: concurrent_job\nexpect:\n  ranks:\n"
            "    job2:5: ok\n")
    with pytest.raises(ScenarioFileError) as e:
        load_text(text, "p.yaml")
    p = e.value.problems[0]
    assert (p.line, p.field) == (7, "expect.ranks.job2:5")


# -- check(): problems the schema cannot see, located inside the fault ---------------------------

def checked(kind, init="env", **params):
    s = scn(world_size=2, init=init)
    return REGISTRY.get(kind).model_validate({"kind": kind, **params}).check(s)


def test_check_of_a_rank_list_names_the_index():
    assert checked("delayed_rank", ranks=[0, 2, 1], delay=1) == \
        [(("ranks", 1), "rank 2 is outside the world (world_size 2: ranks 0..1)")]


def test_check_of_a_single_rank_names_the_field():
    assert [loc for loc, _ in checked("kill_rank", rank=-1, at=1)] == [("rank",)]


def test_check_rank_collision_claims_outside():
    assert [loc for loc, _ in checked("rank_collision", rank=1, claims=5)] == [("claims",)]


def test_check_rank_out_of_range_value_inside():
    assert [loc for loc, _ in checked("rank_out_of_range", value=1)] == [("value",)]


def test_check_world_size_mismatch_equal():
    assert [loc for loc, _ in checked("world_size_mismatch", world_size=2)] == [("world_size",)]


def test_check_file_init_needs_init_file():
    assert [loc for loc, _ in checked("file_init", mode="stale_file")] == [("mode",)]
    assert checked("file_init", init="file", mode="stale_file") == []


def test_check_malformed_env_var_not_allowed():
    assert [loc for loc, _ in checked("malformed_env", vars=["RANK", "MASTER_ADDR",
                                                             "PATH"])] == [("vars", 1), ("vars", 2)]


def test_check_wrong_addr_refuses_an_address_off_the_machine():
    ((loc, msg),) = checked("wrong_addr", addr="10.0.0.1")
    assert loc == ("addr",) and "10.0.0.1" in msg


@pytest.mark.parametrize("addr", ["127.0.0.2", "127.255.0.1", "::1", "localhost"])
def test_check_wrong_addr_allows_loopback(addr):
    assert checked("wrong_addr", addr=addr) == []


def test_check_problem_is_located_at_the_fault_line_by_the_loader():
    text = ("name: p\nabout: x\nworld_size: 2\nfaults:\n  - kind: wrong_port\n"
            "  - kind: rank_collision\n    rank: 0\n    claims: 0\n")
    with pytest.raises(ScenarioFileError) as e:
        load_text(text, "p.yaml")
    p = e.value.problems[0]
    assert (p.line, p.field) == (8, "faults[1].claims")


# -- the registry ---------------------------------------------------------------------------------

BUILTIN_KINDS = {"wrong_port", "wrong_addr", "rank_collision", "rank_out_of_range",
                 "world_size_mismatch", "missing_env", "malformed_env", "delayed_rank",
                 "busy_port", "kill_rank", "stop_rank", "file_init", "concurrent_job"}


def test_every_builtin_fault_is_registered():
    assert BUILTIN_KINDS <= set(REGISTRY.kinds())


def test_builtin_faults_come_from_the_entry_point():
    assert REGISTRY.origin("kill_rank") == "entry point 'builtin' (harness.faults)"


@pytest.mark.parametrize("kind", sorted(BUILTIN_KINDS))
def test_every_builtin_fault_says_what_it_does(kind):
    assert REGISTRY.get(kind).summary


def test_the_registry_refuses_a_fault_without_a_kind_name():
    class Nameless(Fault):
        kind: str

    with pytest.raises(TypeError, match="needs a default"):
        REGISTRY.add(Nameless, "a test")


def test_faults_are_kept_typed_on_the_scenario_in_order():
    s = scn([{"kind": "wrong_port"}, {"kind": "delayed_rank", "delay": 1}])
    assert [type(f).__name__ for f in s.faults] == ["WrongPort", "DelayedRank"]


def test_busy_port_with_file_init_is_refused_as_a_no_op():
    from harness.scenario.loader import ScenarioFileError, load_text

    with pytest.raises(ScenarioFileError) as e:
        load_text("name: s\nabout: why\ninit: file\nfaults:\n  - kind: busy_port\n", "s.yaml")
    assert str(e.value).startswith("s.yaml:5: faults[0].kind: busy_port holds MASTER_PORT")


def test_a_second_job_runs_the_program_with_its_own_arguments(tmp_path, counter_ports):
    """concurrent_job args: the second job's ranks run the scenario's program (observed, not
    the harness's worker) with args in place of program.args; without a program, refused."""
    (tmp_path / "t.py").write_text("pass\n")
    text = ("name: p\nabout: x\nworld_size: 2\ndeadline: 10\n"
            "program: {script: t.py, args: [--steps, '3']}\n"
            "faults:\n  - {kind: concurrent_job, args: [--steps, '3', --crash-rank, '1']}\n")
    (s,) = load_text(text, str(tmp_path / "p.yaml"))
    p = make_plan(s, RUN_DIR, take_port=counter_ports)
    first, second = p.rank("0"), p.rank("job2:0")
    assert first.argv[1:] == ["--steps", "3"] and first.observed
    assert second.argv[1:] == ["--steps", "3", "--crash-rank", "1"] and second.observed
    with pytest.raises(ScenarioFileError, match="args are a program's"):
        scn([{"kind": "concurrent_job", "args": ["--x"]}])

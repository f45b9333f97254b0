"""The workload after init (ddp, train, monitored_barrier) and the faults aimed at its phases:
their grammar, their checks, and what each does to a plan (pure: no process)."""

from __future__ import annotations

import pytest
import yaml

from harness.core.protocol import RaiseSpec, Variation, WorkerSpec, model_mb, model_shape
from harness.judge.classify import absent_verdict, classify_run, job_outcome
from harness.judge.observation import RankObservation, RunObservation
from harness.ranks.workload import phase_problem, workload_phases
from harness.run.plan import make_plan
from harness.scenario.loader import ScenarioFileError, load_text

DDP = ["ddp 16MB", "train 3", "monitored_barrier"]


def scn(faults=(), **fields):
    data = {"name": "w", "about": "planned", "world_size": 2, "workload": DDP, **fields,
            "faults": list(faults)}
    (s,) = load_text(yaml.safe_dump(data, sort_keys=False), "w.yaml")
    return s


def problems(faults=(), **fields):
    with pytest.raises(ScenarioFileError) as e:
        scn(faults, **fields)
    return [f"{p.field}: {p.message}" for p in e.value.problems]


def plan(counter_ports, faults=(), **fields):
    return make_plan(scn(faults, **fields), "/tmp/x", take_port=counter_ports)


# -- the workload's grammar and phases ---------------------------------------------------------

@pytest.mark.parametrize("entry,mb", [("ddp", 4.0), ("ddp 64MB", 64.0), ("ddp 1GB", 1024.0),
                                      ("ddp 0.5MB", 0.5)])
def test_model_size_of_a_ddp_entry(entry, mb):
    assert model_mb(entry) == mb


def test_model_shape_is_close_to_the_size_asked_for():
    width, layers = model_shape(64.0)
    assert width == 1024 and layers == 16
    assert abs((width * width + width) * 4 * layers / 2**20 - 64.0) < 4.1
    assert model_shape(0.5)[1] == 1 and model_shape(0.5)[0] < 1024


def test_phases_of_a_ddp_workload():
    assert [p for p, _ in workload_phases(DDP)] == [
        "model", "ddp", "train step 1", "train step 2", "train step 3", "workload step 3"]


def test_train_steps_count_over_every_train_entry():
    phases = [p for p, _ in workload_phases(["ddp", "train 2", "barrier", "train 2"])]
    assert phases[-2:] == ["train step 3", "train step 4"]
    assert "workload step 3" in phases


def test_phase_problem_names_the_phases_the_workload_has():
    assert phase_problem("train step 3", DDP) is None
    why = phase_problem("train step 9", DDP)
    assert why is not None and "train step 1..3" in why
    assert phase_problem("destroy", DDP, destroy=False) is not None


def test_train_needs_a_ddp_entry_before_it():
    assert any("needs a 'ddp SIZE' entry" in p for p in problems(workload=["train 2"]))


def test_two_ddp_entries_are_refused():
    assert any("at most one" in p for p in problems(workload=["ddp", "ddp", "train 1"]))


def test_model_size_is_capped():
    assert any("at most" in p for p in problems(workload=["ddp 100GB"]))


def test_monitored_barrier_is_gloo_only():
    assert any("gloo backend only" in p
               for p in problems(workload=["monitored_barrier"], backend="nccl"))


def test_unknown_entry_lists_the_grammar():
    assert any("'ddp SIZE'" in p for p in problems(workload=["ddp 64"]))


def test_worker_spec_round_trips_the_variation(counter_ports):
    p = plan(counter_ports, [{"kind": "raise_exception", "rank": 1, "phase": "train step 2",
                              "exception": "ValueError", "message": "boom"},
                             {"kind": "slow_rank", "rank": 1, "seconds": 2, "phase": "ddp"}])
    spec = p.worker_spec(p.rank("1"))
    back = WorkerSpec.from_json(spec.to_json())
    assert back.variation == Variation(raise_at=RaiseSpec("train step 2", "ValueError", "boom"),
                                       slow_at={"ddp": 2.0})
    assert WorkerSpec.from_json(p.worker_spec(p.rank("0")).to_json()).variation.is_plain()


# -- faults on the workload's phases -----------------------------------------------------------

def test_absent_rank_is_in_the_world_but_not_launched(counter_ports):
    p = plan(counter_ports, [{"kind": "absent_rank", "ranks": [1]}], world_size=3)
    assert [r.label for r in p.launched_ranks()] == ["0", "2"]
    assert p.rank("1").absent and p.rank("1").env["WORLD_SIZE"] == "3"
    assert p.to_dict()["ranks"][1]["absent"] is True


def test_absent_rank_cannot_take_the_whole_world():
    assert any("at least one must start" in p
               for p in problems([{"kind": "absent_rank", "ranks": [0, 1]}]))


def test_a_fault_on_an_absent_rank_is_refused():
    assert any("rank 1 is absent, and the fault kill_rank acts on it" in p for p in problems(
        [{"kind": "absent_rank", "ranks": [1]}, {"kind": "kill_rank", "rank": 1, "at": 1}]))


def test_raise_exception_only_in_a_phase_the_workload_enters():
    assert any("never enters 'train step 7'" in p for p in problems(
        [{"kind": "raise_exception", "phase": "train step 7"}]))


def test_raise_exception_class_name_is_a_name():
    assert problems([{"kind": "raise_exception", "phase": "ddp", "exception": "os.system"}])


def test_skip_collective_of_a_train_step(counter_ports):
    p = plan(counter_ports, [{"kind": "skip_collective", "rank": 1, "phase": "train step 2"}])
    assert p.rank("1").variation.skip == ["train step 2"]
    assert p.rank("0").variation.is_plain()


def test_skip_collective_refuses_a_phase_that_is_not_a_collective():
    got = problems([{"kind": "skip_collective", "phase": "workload step 1"}],
                   workload=["sleep 1", "barrier"])
    assert any("'sleep 1', not a collective" in p for p in got)
    assert any("not a collective" in p for p in problems(
        [{"kind": "skip_collective", "phase": "ddp"}]))


def test_model_mismatch_needs_a_model(counter_ports):
    assert any("no 'ddp SIZE' entry" in p for p in problems(
        [{"kind": "model_mismatch"}], workload=["barrier"]))
    p = plan(counter_ports, [{"kind": "model_mismatch", "rank": 0, "change": "wider"}])
    assert p.rank("0").variation.model_change == "wider"


def test_slow_rank_sleeps_in_every_phase_after_init_by_default(counter_ports):
    p = plan(counter_ports, [{"kind": "slow_rank", "seconds": 1.5}])
    assert p.rank("1").variation.slow_at == {
        ph: 1.5 for ph, _ in workload_phases(DDP)}


def test_signal_faults_can_target_a_training_step(counter_ports):
    p = plan(counter_ports, [{"kind": "kill_rank", "rank": 1, "phase": "train step 3"}])
    (step,) = [s for s in p.steps if s.fault == "kill_rank"]
    assert step.trigger.phase == "train step 3" and step.trigger.rank == "1"


def test_a_signal_in_a_phase_the_workload_never_enters_is_refused():
    assert any("never enters 'train step 4'" in p for p in problems(
        [{"kind": "stop_rank", "rank": 1, "phase": "train step 4"}]))


# -- the absent outcome ------------------------------------------------------------------------

def test_an_absent_rank_gets_an_absent_verdict_in_plan_order(counter_ports):
    p = plan(counter_ports, [{"kind": "absent_rank", "ranks": [1]}], world_size=3)
    run = RunObservation(plan=p.to_dict(), torch_version="x", wall=1.0, run_dir="/tmp/x",
                         ranks=[RankObservation(label="0", returncode=-9),
                                RankObservation(label="2", returncode=-9)])
    verdicts = classify_run(run)
    assert [(v.label, v.outcome) for v in verdicts] == [
        ("0", "crash"), ("1", "absent"), ("2", "crash")]
    assert job_outcome(verdicts) == "crash"


def test_absent_counts_only_when_every_rank_is_absent():
    v = absent_verdict({"label": "0"})
    assert job_outcome([v]) == "absent"
    ok = absent_verdict({"label": "1"})
    ok.outcome = "ok"
    assert job_outcome([v, ok]) == "ok"


def test_absent_is_an_outcome_an_expectation_may_name():
    s = scn([{"kind": "absent_rank"}], expect={"job": "timeout", "ranks": {"1": "absent"}})
    assert s.expect[0].ranks["1"].outcome == ["absent"]

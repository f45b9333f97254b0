"""rank_timeouts: one rank's own torch timeout, so that two timers that would fire together
fire in a known order (issue 40: gate a race instead of widening it). Pure: the field is
located, carried into every worker's spec, refused where a user's program sets its own
timeout. Real: the rank's init really waits its own timeout, directly and under torchrun
(where the worker learns its rank from RANK)."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from harness.core.protocol import WorkerSpec
from harness.judge.classify import classify_run
from harness.run.plan import make_plan
from harness.scenario.loader import ScenarioFileError, load_text


def scn(**fields):
    data = {"name": "rt", "about": "rank timeouts", "world_size": 2, **fields}
    (s,) = load_text(yaml.safe_dump(data, sort_keys=False), "rt.yaml")
    return s


def problems(**fields):
    with pytest.raises(ScenarioFileError) as e:
        scn(**fields)
    return [f"{p.line}: {p.field}: {p.message}" for p in e.value.problems]


def test_a_rank_outside_the_world_is_a_located_error():
    (p,) = problems(rank_timeouts={2: 5})
    assert p.startswith("4: rank_timeouts:") and "below world_size (2)" in p


def test_a_timeout_below_the_minimum_is_refused():
    (p,) = problems(rank_timeouts={1: 0})
    assert "rank_timeouts.1" in p


def test_a_users_program_is_refused_the_field():
    ps = problems(rank_timeouts={1: 5}, program="train.py")   # (train.py is not there either)
    assert any(p.startswith("4: rank_timeouts: rank_timeouts is not used by launcher direct "
                            "with a program") and "its timeout in the program" in p
               for p in ps), ps


def test_every_workers_spec_carries_the_rank_timeouts(counter_ports):
    plan = make_plan(scn(timeout=7, rank_timeouts={1: 12}), "/tmp/rt", take_port=counter_ports)
    specs = [plan.worker_spec(r) for r in plan.launched_ranks()] + [plan.shared_worker_spec()]
    for spec in specs:   # through the argv's JSON, as the worker reads it
        spec = WorkerSpec.from_json(spec.to_json())
        assert spec.timeout == 7 and spec.timeout_of(1) == 12 and spec.timeout_of(0) == 7
        assert spec.timeout_of(None) == 7


@pytest.mark.timeout(240)
def test_a_ranks_own_timeout_is_the_one_its_init_waits():
    """Rank 1 never starts (delayed past the deadline); rank 0 waits in init for it. With
    timeout 30 and rank 0's own 3 s, rank 0 times out after a few seconds, not 30."""
    from harness.run.supervisor import run_scenario

    (s,) = load_text(textwrap.dedent("""
        name: own_timer
        about: rank 0's timer shortened by rank_timeouts
        world_size: 2
        timeout: 30
        rank_timeouts: {0: 3}
        deadline: 25
        workload: [barrier]
        faults: [{kind: delayed_rank, ranks: [1], delay: 60}]
    """), "own.yaml")
    by = {v.label: v for v in classify_run(run_scenario(s))}
    assert by["0"].outcome == "timeout" and by["0"].phase == "init", by["0"]
    assert by["0"].duration is not None and by["0"].duration < 15, by["0"].duration


@pytest.mark.timeout(240)
def test_under_torchrun_a_worker_takes_its_own_timeout_from_RANK():
    """torchrun starts both workers from one spec; each reads RANK. Rank 1 is stopped
    (SIGSTOP) in its first step; rank 0's barrier waits its own 3 s (gloo's "Timed out waiting
    3000ms"), not the 30 s every other rank has."""
    from harness.run.supervisor import run_scenario

    (s,) = load_text(textwrap.dedent("""
        name: own_timer_torchrun
        about: rank 0's collective timer shortened by rank_timeouts, under torchrun
        world_size: 2
        launcher: torchrun
        timeout: 30
        rank_timeouts: {0: 3}
        deadline: 25
        workload: ["sleep 1", barrier]
        faults: [{kind: stop_rank, rank: 1, phase: "workload step 1"}]
    """), "own.yaml")
    by = {v.label: v for v in classify_run(run_scenario(s))}
    assert by["0"].outcome in ("timeout", "error") and "3000ms" in by["0"].message, by["0"]

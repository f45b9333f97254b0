"""Faults that act through the plan (harness.edits): what each changed per process, taken from
the plan before and after the fault, and its effect read back from what the processes said (the
start record's variables, the init phase's arguments, the phases, the result, the release
time): the pure readers, and real runs (gloo, world 2) where such faults act and where one has
none."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from harness.core.protocol import Event
from harness.judge import edits
from harness.judge.classify import classify_run
from harness.judge.observation import RankObservation
from harness.run.plan import make_plan
from harness.run.supervisor import run_scenario
from harness.scenario.expect import check
from harness.scenario.loader import load_text
from harness.scenario.schema import Expect

linux = pytest.mark.skipif(sys.platform != "linux", reason="real runs need Linux")


def plan_of(text: str, tmp_path: Path):
    (scn,) = load_text(text, "e.yaml")
    ports = iter(range(41000, 41100))
    return make_plan(scn, str(tmp_path / "run"), lambda: next(ports))


BASE = ("name: e\nabout: x\nworld_size: 2\ntimeout: 3\ndeadline: 20\n"
        "workload: [barrier, all_reduce]\n")


# -- planning: the diff names what each fault changed, per process ------------------------------
def test_each_plan_edit_is_recorded_per_fault_and_process(tmp_path):
    plan = plan_of(BASE + "faults:\n"
                   "  - {kind: malformed_env, ranks: [1], values: {MASTER_PORT: abc}}\n"
                   "  - {kind: missing_env, ranks: [0], vars: [WORLD_SIZE]}\n"
                   "  - {kind: delayed_rank, ranks: [1], delay: 2}\n"
                   "  - {kind: skip_collective, rank: 1, phase: workload step 2}\n"
                   "  - {kind: slow_rank, rank: 0, seconds: 1, phase: workload step 1}\n",
                   tmp_path)
    got = [(e.fault_no, e.target, e.what, e.detail) for e in plan.edits]
    assert (1, "1", "env", {"vars": {"MASTER_PORT": "abc"}}) in got
    assert (2, "0", "env", {"vars": {"WORLD_SIZE": None}}) in got
    assert any(n == 3 and t == "1" and w == "release" and d["release"] == {"at": 2.0}
               for n, t, w, d in got)
    assert (4, "1", "skip", {"phase": "workload step 2"}) in got
    assert (5, "0", "slow", {"phases": {"workload step 1": 1.0}}) in got
    # only what each fault changed: rank 0 is not in fault 1's edits, nor rank 1 in fault 2's
    assert {(n, t) for n, t, _, _ in got} == {(1, "1"), (2, "0"), (3, "1"), (4, "1"),
                                              (5, "0")}
    assert "edits" not in plan.to_dict()   # the plan's dump keeps its format


def test_a_fault_with_steps_of_its_own_is_proven_by_them_not_by_the_plan(tmp_path):
    plan = plan_of(BASE + "faults: [{kind: kill_rank, rank: 1, phase: init}]\n", tmp_path)
    assert plan.edits == []


def test_init_arguments_absent_ranks_and_a_second_job_are_edits_too(tmp_path):
    plan = plan_of(BASE.replace("world_size: 2", "world_size: 3") + "init: tcp\nfaults:\n"
                   "  - {kind: wrong_port, ranks: [1], port: 41999}\n"
                   "  - {kind: absent_rank, ranks: [2]}\n"
                   "  - {kind: concurrent_job, world_size: 1}\n", tmp_path)
    got = {(e.fault_no, e.target, e.what): e.detail for e in plan.edits}
    assert got[(1, "1", "env")] == {"vars": {"MASTER_PORT": "41999"}}
    assert got[(1, "1", "init")]["url"].endswith(":41999")
    assert (2, "2", "absent") in got
    assert got[(3, "job2:0", "process")]["job"] == "job2"


# -- reading: pure, on observations made by hand ------------------------------------------------
def row(label: str, events: List[Dict[str, Any]], **kw: Any) -> RankObservation:
    return RankObservation(label=label, pid=kw.pop("pid", 100),
                           events=[Event.from_dict(e) for e in events], **kw)


def start(env: Dict[str, Optional[str]], t: float = 0.5) -> Dict[str, Any]:
    return {"ev": "phase", "t": t, "phase": "start", "launched": {"argv": [], "env": env}}


def one(e: edits.Edit, rows: List[RankObservation], now: float = 9.0) -> Dict[str, Any]:
    (rec,) = edits.read([e], rows, 1.0, now)
    return rec


def test_an_env_edit_acted_when_the_process_had_the_value_and_not_when_it_had_another():
    e = edits.Edit(1, "malformed_env", "1", "env", {"vars": {"MASTER_PORT": "abc",
                                                             "WORLD_SIZE": None}})
    rec = one(e, [row("1", [start({"MASTER_PORT": "abc", "WORLD_SIZE": None})])])
    assert rec["status"] == "acted"
    assert rec["summary"] == "started with MASTER_PORT='abc', WORLD_SIZE unset"
    assert rec["events"] == [{"t": -0.5, "what": "started (pid 100) with MASTER_PORT='abc', "
                                                "WORLD_SIZE unset"}]
    rec = one(e, [row("1", [start({"MASTER_PORT": "29500", "WORLD_SIZE": None})])])
    assert rec["status"] == "no effect"
    assert rec["summary"] == "started with MASTER_PORT='29500', not 'abc'"
    # no process as rank 1: it never started; one that said nothing: not known, never acted
    assert one(e, [])["summary"] == "never started"
    assert one(e, [])["status"] == "no effect"
    silent = one(e, [row("1", [], returncode=1)])
    assert silent["status"] == "not observable" and "sent no start record" in silent["summary"]


def test_a_release_is_read_from_the_supervisor_s_release_time():
    e = edits.Edit(1, "delayed_rank", "1", "release", {"release": {"at": 2.0},
                                                       "released": "at 2 s"})
    ready = {"ev": "ready", "t": 0.9}
    assert one(e, [row("1", [ready], released_at=2.01)])["status"] == "acted"
    early = one(e, [row("1", [ready], released_at=0.0)])
    assert early["status"] == "no effect" and "before its planned 2 s" in early["summary"]
    held = one(e, [row("1", [ready], ended_at=1.5)])
    assert held["status"] == "acted" and "held for the whole run" in held["summary"]
    never = one(e, [row("1", [{"ev": "phase", "t": 0.2, "phase": "import"}], ended_at=0.3)])
    assert never["status"] == "no effect" and "never reached the start line" in never["summary"]


def test_phases_say_whether_a_skip_a_raise_a_sleep_or_a_model_change_happened():
    skip = edits.Edit(1, "skip_collective", "1", "skip", {"phase": "workload step 2"})
    ev = [{"ev": "phase", "t": 3.0, "phase": "workload step 2", "skipped": "all_reduce"}]
    assert one(skip, [row("1", ev)])["summary"] == \
        "skipped all_reduce in workload step 2 at 2 s"
    unreached = one(skip, [row("1", [{"ev": "phase", "t": 2.0, "phase": "init"}])])
    assert unreached["status"] == "no effect"
    assert unreached["summary"] == "never reached workload step 2 (its last phase: init)"

    slow = edits.Edit(1, "slow_rank", "0", "slow", {"phases": {"workload step 1": 2.0}})
    evs = [{"ev": "phase", "t": 2.0, "phase": "workload step 1"},
           {"ev": "phase", "t": 4.1, "phase": "exit"}]
    rec = one(slow, [row("0", evs)])
    assert rec["status"] == "acted" and rec["summary"] == "spent 2.1 s in workload step 1"
    evs[1]["t"] = 2.5
    assert one(slow, [row("0", evs)])["status"] == "no effect"
    # killed in its sleep: the phase was its last word, shorter than the sleep, and it acted
    cut = one(slow, [row("0", evs[:1], ended_at=2.1)])
    assert cut["status"] == "acted"
    assert cut["summary"] == "spent 1.1 s in workload step 1 (it ended in its sleep)"
    # interrupted in its sleep (a SIGINT became KeyboardInterrupt there): its result is the
    # next word, and the phase still ended in the sleep
    raised = evs[:1] + [{"ev": "result", "t": 2.3, "status": "exception",
                         "phase": "workload step 1"}]
    intr = one(slow, [row("0", raised)])
    assert intr["status"] == "acted", intr
    assert intr["summary"] == "spent 0.3 s in workload step 1 (it ended in its sleep)"

    model = edits.Edit(1, "model_mismatch", "1", "model", {"change": "wider"})
    want = edits.model_params("ddp", "wider")
    assert want != edits.model_params("ddp")
    ddp = {"ev": "phase", "t": 2.0, "phase": "ddp", "step": "ddp", "params": want}
    assert one(model, [row("1", [ddp])])["status"] == "acted"
    ddp["params"] = edits.model_params("ddp")
    assert one(model, [row("1", [ddp])])["status"] == "no effect"

    rse = edits.Edit(1, "raise_exception", "1", "raise", {"phase": "init",
                                                          "exception": "ValueError"})
    res = {"ev": "result", "t": 2.2, "status": "exception", "phase": "init",
           "exc": {"type": "ValueError"}}
    evs = [{"ev": "phase", "t": 2.0, "phase": "init"}, res]
    assert one(rse, [row("1", evs)])["summary"] == "raised ValueError entering init at 1.2 s"
    res["exc"] = {"type": "RuntimeError"}
    assert one(rse, [row("1", [{"ev": "phase", "t": 2.0, "phase": "init"}, res])])["status"] \
        == "no effect"


def test_an_absent_rank_acted_when_no_process_ran_as_it():
    e = edits.Edit(1, "absent_rank", "1", "absent", {})
    assert one(e, [row("0", [])])["status"] == "acted"
    assert one(e, [row("1", [start({})])])["status"] == "no effect"
    # another fault's edit of an absent rank is moot, not "never started"
    env = edits.Edit(2, "missing_env", "1", "env", {"vars": {"RANK": None}})
    assert edits.read([env], [], 0.0, 1.0, absent=["1"]) == []


# -- real runs ------------------------------------------------------------------------------------
def _run(text: str, tmp_path: Path):
    (scn,) = load_text(text, "e.yaml")
    return run_scenario(scn, keep=tmp_path)


@linux
def test_plan_faults_that_act_say_so_from_the_ranks_own_words(tmp_path):
    obs = _run(BASE + "faults:\n"
               "  - {kind: delayed_rank, ranks: [1], delay: 1}\n"
               "  - {kind: skip_collective, rank: 1, phase: workload step 2}\n"
               "  - {kind: missing_env, ranks: [1], vars: [LOCAL_WORLD_SIZE]}\n"
               "  - {kind: malformed_env, ranks: [0], values: {LOCAL_RANK: x7}}\n", tmp_path)
    delayed, skip, missing, malformed = obs.effects
    assert [e["status"] for e in obs.effects] == ["acted"] * 4, obs.effects
    released = next(r.released_at for r in obs.ranks if r.label == "1")
    assert released is not None and released >= 1.0 - edits.EARLY
    assert delayed["summary"].startswith(f"released at {released:g} s")
    assert skip["summary"].startswith("skipped all_reduce in workload step 2 at ")
    assert missing["summary"] == "started with LOCAL_WORLD_SIZE unset"
    assert malformed["summary"] == "started with LOCAL_RANK='x7'"
    pid = next(r.pid for r in obs.ranks if r.label == "0")
    assert malformed["targets"][0]["steps"][0]["numbers"] == {"pid": pid}


@linux
def test_a_plan_fault_whose_rank_never_gets_there_had_no_effect_and_fails_its_case(tmp_path):
    obs = _run(BASE + "faults:\n"
               "  - {kind: raise_exception, rank: 1, phase: init, exception: ValueError}\n"
               "  - {kind: skip_collective, rank: 1, phase: workload step 2}\n", tmp_path)
    raised, skip = obs.effects
    assert raised["status"] == "acted"
    assert raised["summary"].startswith("raised ValueError entering init at ")
    assert skip["status"] == "no effect"
    assert skip["summary"] == "never reached workload step 2 (its last phase: init)"
    verdicts = classify_run(obs)
    assert {v.label: v.outcome for v in verdicts}["1"] == "error"
    mism = check(Expect(), verdicts, obs.counters, obs.effects)
    (m,) = mism
    assert m.label == ("fault 2 (skip_collective on rank 1, skips the collective of workload "
                       "step 2)")
    assert m.observed == "no effect: never reached workload step 2 (its last phase: init)"


@linux
def test_an_absent_rank_and_a_second_job_are_read_from_the_processes_that_ran(tmp_path):
    obs = _run(BASE.replace("world_size: 2", "world_size: 3") + "faults:\n"
               "  - {kind: absent_rank, ranks: [2]}\n"
               "  - {kind: concurrent_job, world_size: 1, delay: 0.5}\n", tmp_path)
    absent, job = obs.effects
    assert absent["status"] == "acted"
    assert absent["summary"] == "never started: no process ran as it"
    assert job["status"] == "acted", job
    row = next(r for r in obs.ranks if r.label == "job2:0")
    assert job["summary"] == f"started (pid {row.pid}), released at {row.released_at:g} s"
    assert row.released_at >= 0.5 - edits.EARLY


# -- concurrent_job gated on the first job's progress -------------------------------------------
def test_a_second_job_gated_on_a_phase_is_released_by_that_phase(tmp_path):
    plan = plan_of(BASE + "faults:\n  - {kind: concurrent_job, world_size: 1, "
                   "phase: workload step 2, rank: 1, delay: 0.5}\n", tmp_path)
    job2 = next(r for r in plan.ranks if r.label == "job2:0")
    assert job2.release.to_dict() == {"rank": "1", "phase": "workload step 2", "delay": 0.5}
    # without phase: delay s after the start line, as before
    plan = plan_of(BASE + "faults:\n  - {kind: concurrent_job, world_size: 1, delay: 2}\n",
                   tmp_path)
    assert next(r for r in plan.ranks if r.label == "job2:0").release.to_dict() == {"at": 2.0}


def test_a_second_job_s_gate_names_a_phase_and_a_rank_of_the_first_job(tmp_path):
    for fault, said in (
            ("{kind: concurrent_job, rank: 1}", "rank is whose phase starts the second job"),
            ("{kind: concurrent_job, phase: workload step 2, rank: 5}",
             "rank 5 is outside the world"),
            ("{kind: concurrent_job, phase: lunch}", "phase")):
        with pytest.raises(Exception) as e:
            load_text(BASE + f"faults:\n  - {fault}\n", "e.yaml")
        assert "e.yaml:8: faults[0]." in str(e.value) and said in str(e.value), str(e.value)


@linux
def test_a_second_job_gated_on_a_phase_starts_after_the_first_job_entered_it(tmp_path):
    obs = _run(BASE.replace("[barrier, all_reduce]", '[barrier, "sleep 2", all_reduce]')
               + "faults:\n  - {kind: concurrent_job, world_size: 1, "
               "phase: workload step 2}\n", tmp_path)
    rank0 = next(r for r in obs.ranks if r.label == "0")
    job2 = next(r for r in obs.ranks if r.label == "job2:0")
    released = next(e for e in rank0.events if e.ev == "released")
    entered = next(e.t for e in rank0.events if e.ev == "phase"
                   and e.phase == "workload step 2")
    assert rank0.released_at is not None and job2.released_at is not None
    entered_s = entered - released.t + rank0.released_at   # seconds after the start line
    assert job2.released_at >= entered_s - edits.EARLY, (job2.released_at, entered_s)
    (effect,) = obs.effects
    assert effect["status"] == "acted", effect

"""The warm start (start: fork, harness.forkserver): which ranks are forked (pure: the plan),
and forked ranks for real: their verdicts as fresh ones get them (ok, a wrong port's timeouts, a
hang with stacks, a crash by a signal), their parent the host's server, and nothing left when the
run ends or its supervisor is SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path

import psutil
import pytest
from orphans import run_in_workload, state_dir, supervisor, wait_for

from harness.judge.classify import classify_run
from harness.machine.rundir import sweep
from harness.run.plan import make_plan
from harness.run.supervisor import run_scenario
from harness.scenario.loader import load_text


def scenario(text: str):
    (scn,) = load_text(textwrap.dedent(text), "fork.yaml")
    return scn


def plan_of(text: str):
    n = iter(range(30000, 31000))
    return make_plan(scenario(text), "/tmp/harness-fork-plan", lambda: next(n))


def starts(plan):
    return {r.label: (r.start, r.start_note) for r in plan.ranks}


# -- which ranks are forked (pure) -----------------------------------------------------------------

def test_fork_is_the_default_and_every_rank_is_forked():
    plan = plan_of("""
        name: p
        about: default start
        world_size: 2
    """)
    assert plan.start == "fork"
    assert starts(plan) == {"0": ("fork", ""), "1": ("fork", "")}


def test_start_fresh_starts_no_rank_forked():
    plan = plan_of("""
        name: p
        about: fresh start
        world_size: 2
        start: fresh
    """)
    assert plan.start == "fresh"
    assert starts(plan) == {"0": ("fresh", ""), "1": ("fresh", "")}


def test_fork_forks_every_rank_of_one_environment_though_their_rank_variables_differ():
    plan = plan_of("""
        name: p
        about: fork, a wrong port on rank 1 (MASTER_PORT is read after import)
        world_size: 3
        start: fork
        faults: [{kind: wrong_port, ranks: [1]}]
    """)
    assert plan.ranks[1].env["MASTER_PORT"] != plan.ranks[0].env["MASTER_PORT"]
    assert starts(plan) == {"0": ("fork", ""), "1": ("fork", ""), "2": ("fork", "")}
    assert [r["start"] for r in plan.to_dict()["ranks"]] == ["fork"] * 3


def test_a_rank_with_another_import_time_variable_runs_fresh_and_says_which():
    plan = plan_of("""
        name: p
        about: fork
        world_size: 3
        start: fork
    """)
    from harness.launchers import fork_plan
    plan.ranks[2].env["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    fork_plan(plan.ranks)
    s = starts(plan)
    assert s["0"] == s["1"] == ("fork", "")
    assert s["2"][0] == "fresh" and "TORCH_CPP_LOG_LEVEL" in s["2"][1]


def test_a_rank_of_its_own_interpreter_or_a_program_or_pinned_by_a_fault_runs_fresh():
    from harness.launchers import fork_plan
    plan = plan_of("""
        name: p
        about: fork
        world_size: 4
        start: fork
    """)
    plan.ranks[1].python = "/usr/bin/python3"
    plan.ranks[2].argv, plan.ranks[2].observed = ["train.py"], True
    plan.ranks[3].fresh_only = "a fault says so"
    fork_plan(plan.ranks)
    s = starts(plan)
    assert s["0"] == ("fork", "")
    assert s["1"][0] == "fresh" and "own interpreter" in s["1"][1]
    assert s["2"][0] == "fresh" and "program" in s["2"][1]
    assert s["3"] == ("fresh", "a fault says so")


def test_memory_limit_pins_its_rank_to_a_fresh_interpreter_with_the_reason():
    plan = plan_of("""
        name: p
        about: fork with a memory limit on rank 1
        world_size: 2
        start: fork
        faults: [{kind: memory_limit, rank: 1, mb: 400, via: rlimit}]
    """)
    s = starts(plan)
    assert s["0"] == ("fork", "")
    assert s["1"][0] == "fresh" and "copy-on-write" in s["1"][1]


def test_a_launcher_that_does_not_start_ranks_itself_starts_everything_fresh_and_says_so():
    plan = plan_of("""
        name: p
        about: torchrun under start fork
        world_size: 2
        start: fork
        launcher: torchrun
    """)
    assert all(start == "fresh" and "torchrun launcher" in note
               for start, note in starts(plan).values())


def test_the_catalog_runs_warm_and_every_fresh_rank_says_why():
    """Every catalog case asks for start: fork (its file's top level), and the plan forks
    ranks in most of them; a rank planned fresh carries the reason (a launcher's processes,
    its own interpreter, an environment that differs while torch imports, ...)."""
    from harness.scenario.catalog import builtin_dir
    from harness.scenario.loader import load_file

    n = iter(range(30000, 60000))
    cases = forked = 0
    for f in sorted(builtin_dir().glob("*.yaml")):
        for scn in load_file(f):
            assert scn.start == "fork", f"{f.name}::{scn.name}: start {scn.start}"
            plan = make_plan(scn, "/tmp/harness-fork-plan", lambda: next(n))
            cases += 1
            forked += any(r.start == "fork" for r in plan.ranks)
            assert all(r.start == "fork" or r.start_note for r in plan.launched_ranks()), \
                f"{f.name}::{scn.name}: a rank planned fresh without a reason"
    assert cases > 200 and forked > cases // 2


# -- forked ranks for real ------------------------------------------------------------------------

def run(text: str):
    observed = run_scenario(scenario(text))
    return observed, {v.label: v for v in classify_run(observed)}


def _gone(pids):
    out = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def test_forked_healthy_ranks_are_ok_and_leave_nothing():
    o, vs = run("""
        name: healthy
        about: two forked ranks, barrier and all_reduce
        world_size: 2
        timeout: 20
        deadline: 90
        start: fork
        workload: [barrier, all_reduce]
    """)
    assert [vs["0"].outcome, vs["1"].outcome] == ["ok", "ok"]
    plan = o.plan
    assert [r["start"] for r in plan["ranks"]] == ["fork", "fork"]
    starts_ = [e for r in o.ranks for e in r.events if e.ev == "phase" and e.phase == "start"]
    assert len(starts_) == 2
    assert all(r.returncode == 0 for r in o.ranks)
    assert _gone([r.pid for r in o.ranks]) == []
    assert not Path(o.run_dir).exists()


def test_forked_ranks_of_a_wrong_port_time_out_as_fresh_ones_do():
    o, vs = run("""
        name: wrong_port
        about: rank 1 dials another port; forked
        world_size: 2
        timeout: 5
        deadline: 60
        start: fork
        workload: [all_reduce]
        faults: [{kind: wrong_port, ranks: [1]}]
    """)
    assert (vs["0"].outcome, vs["0"].exception) == ("timeout", "DistStoreError")
    assert (vs["1"].outcome, vs["1"].exception) == ("timeout", "DistNetworkError")
    assert [r["start"] for r in o.plan["ranks"]] == ["fork", "fork"]


def test_a_hung_forked_rank_is_hang_with_its_stacks_and_a_killed_one_is_crash():
    o, vs = run("""
        name: hang_and_kill
        about: rank 1 is SIGKILLed in its sleep; rank 0 sleeps past the deadline
        world_size: 2
        timeout: 60
        deadline: 4
        start: fork
        workload: [sleep 30]
        faults:
          - {kind: kill_rank, rank: 1, phase: workload step 1, after: 0.2}
    """)
    assert vs["0"].outcome == "hang"
    r0 = next(r for r in o.ranks if r.label == "0")
    assert "run_workload" in r0.stacks    # faulthandler's dump, from the forked rank
    r1 = next(r for r in o.ranks if r.label == "1")
    assert (vs["1"].outcome, r1.returncode) == ("crash", -signal.SIGKILL)
    assert _gone([r.pid for r in o.ranks]) == []


SCENARIO = """\
name: orphaned
about: a long forked run whose supervisor is killed
world_size: 2
timeout: 60
deadline: 120
isolate: never
start: fork
workload: [sleep 100]
"""


@pytest.mark.timeout(180)
def test_killed_supervisor_takes_the_fork_server_and_its_ranks_along(tmp_path, monkeypatch):
    # a fresh server (no zygote): tests/test_zygote.py kills a supervisor with a warm one
    monkeypatch.setenv("HARNESS_ZYGOTES", "0")
    sup = supervisor(SCENARIO, tmp_path)
    base = state_dir(tmp_path)
    pids = []
    try:
        run_dir = wait_for(lambda: run_in_workload(tmp_path), 120,
                           "both forked ranks to start their workload")
        recs = [json.loads(ln) for ln in (run_dir / "pids.jsonl").read_text().splitlines()]
        names = [r["name"] for r in recs]
        assert names.count("fork server local") == 1, names
        assert sorted(n for n in names if "forked" in n) == ["rank 0 (forked)", "rank 1 (forked)"]
        pids = [r["pid"] for r in recs if r["name"] != "port owners"]
        server = next(r["pid"] for r in recs if r["name"] == "fork server local")
        ranks = [r["pid"] for r in recs if "forked" in r["name"]]
        assert all(psutil.Process(p).ppid() == server for p in ranks)
        assert _gone(pids) == pids

        sup.send_signal(signal.SIGKILL)
        sup.wait(timeout=30)
        wait_for(lambda: not _gone(pids), 30, "the fork server and its ranks to die")
        removed = sweep(base)
        assert [r.split()[0] for r in removed] == [run_dir.name]
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
        sup.stderr.close()
        for p in _gone(pids):
            os.kill(p, signal.SIGKILL)


def test_a_forked_rank_meets_an_open_files_limit_where_a_fresh_one_does():
    """RLIMIT_NOFILE bounds descriptor numbers: a forked rank has its descriptors at the
    numbers a fresh one has, so a limit of 8 fails the same call of gloo's (the device's
    socket, not epoll_create as with fewer numbers free)."""
    text = """
        name: open_files
        about: rank 1 may have 8 files open
        world_size: 2
        timeout: 10
        deadline: 60
        start: {start}
        workload: [barrier]
        faults: [{{kind: open_files_limit, rank: 1, limit: 8}}]
    """
    seen = {}
    for start in ("fresh", "fork"):
        o, vs = run(text.format(start=start))
        assert [r["start"] for r in o.plan["ranks"]] == [start, start]
        r1 = next(r for r in o.ranks if r.label == "1")
        seen[start] = (vs["1"].outcome, r1.notes, "device.cc" in (vs["1"].message or ""))
    assert seen["fork"] == seen["fresh"]
    assert seen["fork"][0] == "error" and seen["fork"][2]

"""Resource faults (memory_limit, cpu_contention, open_files_limit): what they add to a plan
(pure), and, for real where the machine has cgroups, that nothing of them outlives a run, also
when the run's supervisor is killed with SIGKILL (the sweep removes its cgroups)."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import psutil
import pytest
import yaml
from orphans import run_in_workload, state_dir, supervisor, wait_for

from harness.core.triggers import Trigger
from harness.faults._rank_limit import RankLimit
from harness.faults.cpu_contention import Hogs
from harness.machine import cgroups
from harness.machine.rundir import live_runs, sweep
from harness.run.plan import make_plan
from harness.run.requirements import skip_reason
from harness.scenario.loader import ScenarioFileError, load_text

ENV = {"torch": "2.13.0", "distributed": True, "gloo": True}


def scn(faults=(), **fields):
    data = {"name": "r", "about": "planned", "world_size": 2, "workload": ["ddp 64MB"],
            **fields, "faults": list(faults)}
    (s,) = load_text(yaml.safe_dump(data, sort_keys=False), "r.yaml")
    return s


def plan(counter_ports, faults=(), **fields):
    return make_plan(scn(faults, **fields), "/tmp/x", take_port=counter_ports)


@pytest.mark.parametrize("fault", [
    {"kind": "memory_limit", "rank": 1, "mb": 100},
    {"kind": "cpu_contention", "rank": 1, "how": "hogs", "hogs": 2},
    {"kind": "open_files_limit", "rank": 1, "limit": 8},
])
def test_the_limit_is_set_at_the_start_line_and_the_rank_waits_for_it(counter_ports, fault):
    p = plan(counter_ports, [fault])
    (step,) = [s for s in p.steps if isinstance(s, RankLimit)]
    assert step.trigger == Trigger.at_time(0.0) and step.rank == "1"
    assert p.rank("1").release == Trigger.after_step(step.id)
    assert p.rank("0").release == Trigger.at_time(0.0)


def test_busy_processes_start_at_set_up_before_any_rank(counter_ports):
    p = plan(counter_ports, [{"kind": "cpu_contention", "how": "hogs", "hogs": 8}])
    (hogs,) = [s for s in p.steps if isinstance(s, Hogs)]
    assert hogs.trigger.is_setup and hogs.hogs == 8 and hogs.undoable


def test_a_late_rank_keeps_its_own_release(counter_ports):
    p = plan(counter_ports, [{"kind": "delayed_rank", "ranks": [1], "delay": 3},
                             {"kind": "open_files_limit", "rank": 1, "limit": 8}])
    assert p.rank("1").release == Trigger.at_time(3.0)


def test_memory_limit_needs_a_cgroup_only_when_it_says_so(monkeypatch):
    monkeypatch.setattr(cgroups, "missing", lambda c: f"no cgroup {c} here")
    monkeypatch.setattr("harness.machine.requirement._PROBES", {})   # the probes are tried afresh
    assert skip_reason(scn([{"kind": "memory_limit", "mb": 100, "via": "rlimit"}]), ENV) is None
    assert skip_reason(scn([{"kind": "memory_limit", "mb": 100}]), ENV) is None
    why = skip_reason(scn([{"kind": "memory_limit", "mb": 100, "via": "cgroup"}]), ENV)
    assert why == "memory_limit: no cgroup memory here"
    why = skip_reason(scn([{"kind": "cpu_contention", "how": "quota"}]), ENV)
    assert why == "cpu_contention: no cgroup cpu here"


@pytest.mark.parametrize("fault,field", [
    ({"kind": "memory_limit", "mb": 0}, "mb"),
    ({"kind": "cpu_contention", "percent": 0}, "percent"),
    ({"kind": "cpu_contention", "how": "fork_bomb"}, "how"),
    ({"kind": "open_files_limit", "limit": 2}, "limit"),
    ({"kind": "open_files_limit", "rank": 5, "limit": 20}, "rank"),
])
def test_bad_parameters_are_located(fault, field):
    with pytest.raises(ScenarioFileError) as e:
        scn([fault])
    assert any(field in p.field or field in p.message for p in e.value.problems)


def _tree(root, proc_cgroup, monkeypatch, files):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "self-cgroup").write_text(proc_cgroup)
    monkeypatch.setattr(cgroups, "ROOT", root)
    monkeypatch.setattr(cgroups, "PROC_SELF_CGROUP", root / "self-cgroup")
    monkeypatch.setattr(os, "geteuid", lambda: 0)


def test_v2_is_used_where_the_controller_is_enabled(tmp_path, monkeypatch):
    _tree(tmp_path, "0::/job/harness\n", monkeypatch, {
        "cgroup.controllers": "cpu memory pids", "job/harness/cgroup.controllers": "memory cpu",
        "job/harness/cgroup.subtree_control": "memory"})
    h = cgroups.hierarchy("memory")
    assert (h.version, h.own) == (2, tmp_path / "job" / "harness")


def test_v1_is_used_on_a_hybrid_machine(tmp_path, monkeypatch):
    _tree(tmp_path, "4:memory:/sandbox/x\n1:cpu:/\n0::/\n", monkeypatch, {
        "unified/cgroup.controllers": "", "memory/cgroup.procs": "",
        "cpu/cgroup.procs": ""})
    h = cgroups.hierarchy("memory")
    assert (h.version, h.own) == (1, tmp_path / "memory" / "sandbox" / "x")
    assert cgroups.hierarchy("cpu").own == tmp_path / "cpu"


def test_no_hierarchy_is_a_reason_naming_what_was_looked_for(tmp_path, monkeypatch):
    _tree(tmp_path, "0::/\n", monkeypatch, {"cgroup.controllers": "pids"})
    with pytest.raises(cgroups.CgroupError) as e:
        cgroups.hierarchy("memory")
    assert "no memory controller" in str(e.value) and "no cgroup v1 memory" in str(e.value)


def test_not_root_is_a_reason(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "need root" in cgroups.missing("cpu")


def test_an_oom_kill_noted_on_a_rank_ends_its_reason():
    from harness.judge.classify import classify
    from harness.judge.observation import RankObservation

    obs = RankObservation(label="1", returncode=-9,
                          notes=["the kernel's OOM killer killed it: cgroup v1 ..."])
    v = classify(obs)
    assert (v.outcome, v.reason) == (
        "crash", "killed by SIGKILL (the kernel's OOM killer killed it: cgroup v1 ...)")
    assert RankObservation.from_dict(obs.to_dict()).notes == obs.notes


def test_the_sweep_leaves_live_runs_and_removes_dead_ones(tmp_path):
    why = cgroups.missing("memory")
    if why:
        pytest.skip(why)
    live = cgroups.Cgroup("memory", "livetest", "rank1-memory")
    dead = cgroups.Cgroup("memory", "deadtest", "rank1-memory")
    # a run of another state folder (another TMPDIR, another session's test) with a process in
    # it: not this sweep's to judge, whatever it holds
    foreign = cgroups.Cgroup("memory", "foreigntest", "rank1-memory")
    sleeper = subprocess.Popen(["sleep", "60"])
    other = subprocess.Popen(["sleep", "60"])
    try:
        dead.add(sleeper.pid)
        foreign.add(other.pid)
        removed = cgroups.sweep({"livetest": True, "deadtest": False})
        assert str(dead.path) in removed and not dead.path.exists()
        assert live.path.exists()
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert foreign.path.exists() and other.poll() is None
        assert str(foreign.path) not in removed
    finally:
        sleeper.kill()
        other.kill()
        live.remove()
        dead.remove()
        foreign.remove()


SCENARIO = """\
name: starved
about: a long run with a memory cgroup and CPU hogs whose supervisor is killed
world_size: 2
timeout: 60
deadline: 120
isolate: never
workload: [sleep 100]
faults:
  - {kind: memory_limit, rank: 0, mb: 2000, via: cgroup}
  - {kind: cpu_contention, rank: 1, how: hogs, hogs: 1}
"""


@pytest.mark.timeout(240)
def test_a_killed_run_leaves_no_cgroup_and_no_hog_after_the_sweep(tmp_path):
    why = cgroups.missing("memory")
    if why:
        pytest.skip(why)
    sup = supervisor(SCENARIO, tmp_path)
    base = state_dir(tmp_path)
    pids = []
    try:
        run_dir = wait_for(lambda: run_in_workload(tmp_path, (1,)), 150,
                           "both ranks to start their workload")
        run_id = run_dir.name[len("run-"):]
        pids = [json.loads(ln)["pid"] for ln in (run_dir / "pids.jsonl").read_text().splitlines()]
        # two ranks, one hog, and the fork server of the rank that is forked (start: fork,
        # the default; the one under a memory limit starts fresh)
        assert len(pids) == 4
        mine = [p for p in cgroups.run_cgroups() if p.name.startswith(f"{cgroups.PREFIX}{run_id}")]
        assert len(mine) == 1

        sup.send_signal(signal.SIGKILL)
        sup.wait(timeout=30)
        assert mine[0].exists()                    # nobody tidied up: the supervisor is gone
        removed = cgroups.sweep(live_runs(base))   # as a run's start does: cgroups first
        sweep(base)
        assert removed == [str(mine[0])] and not mine[0].exists()
        wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status()
                              != psutil.STATUS_ZOMBIE for p in pids), 30, "the run's processes")
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
        sup.stderr.close()
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


def test_a_starvation_from_a_phase_leaves_the_release_alone_and_heals_on_another_ranks_end(
        counter_ports):
    p = plan(counter_ports, [{"kind": "cpu_contention", "rank": 1, "how": "hogs", "nice": 19,
                              "phase": "ddp", "heal_phase": "ended", "heal_rank": 0}])
    (step,) = [s for s in p.steps if isinstance(s, RankLimit)]
    assert step.trigger == Trigger.on_phase(1, "ddp")
    assert step.undo_trigger == Trigger.on_phase(0, "ended")
    assert p.rank("1").release == Trigger.at_time(0.0)       # no hold: it starts when it runs
    assert "when rank 1 enters ddp, healed when rank 0 has ended" in " ".join(p.notes)
    # without a time it is the start line's, held before the release, and heals on its own
    p = plan(counter_ports, [{"kind": "cpu_contention", "rank": 1, "heal_after": 2}])
    (step,) = [s for s in p.steps if isinstance(s, RankLimit)]
    assert step.trigger == Trigger.at_time(0.0) and step.undo_trigger is not None
    assert p.rank("1").release == Trigger.after_step(step.id)


@pytest.mark.parametrize("fault,field", [
    ({"kind": "cpu_contention", "phase": "train step 9"}, "phase"),
    ({"kind": "cpu_contention", "heal_phase": "train step 9"}, "heal_phase"),
    ({"kind": "cpu_contention", "rank": "*", "phase": "ddp"}, "rank"),
])
def test_a_starvation_that_would_never_start_or_heal_is_refused_with_its_field(fault, field):
    with pytest.raises(ScenarioFileError) as e:
        scn([fault])
    assert field in str(e.value), str(e.value)

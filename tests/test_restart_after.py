"""kill_rank's restart_after: a killed process started again (issue 41, "a Ctrl-C'd node that
rejoins an elastic job").

Pure: where validate refuses it (located), the rows a restart adds and which expectation key
speaks of them, the plan's copy of the process and the two steps, the job's outcome with a
restart, the attempts of a restarted agent's workers. Real: a rank killed and started again
(the run held open while the restart is due, its row, its effect, nothing left), and a
supervisor SIGKILLed while a restarted process runs (it dies with it; the sweep removes the
run). The torchrun case (an agent interrupted and rejoining) is in the catalog:
scenarios/torchrun-rejoin.yaml.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
from types import SimpleNamespace
from typing import List

import pytest
from orphans import alive, end_supervisor, state_dir, supervisor, wait_for

from harness.core import protocol as P
from harness.core.rows import key_for
from harness.core.triggers import Trigger
from harness.faults.signal_rank import Restart, Signal
from harness.faults.steps import Scheduler
from harness.judge.classify import Verdict, classify, classify_run, job_outcome
from harness.judge.observation import RankObservation
from harness.run.plan import make_plan
from harness.scenario.loader import ScenarioFileError, load_text

HEAD = """\
name: t
about: a
world_size: 2
timeout: 10
deadline: 60
workload: [barrier, "sleep 4", all_reduce]
"""


def load(text: str):
    return load_text(textwrap.dedent(text), "s.yaml")


def problems(text: str) -> List[str]:
    with pytest.raises(ScenarioFileError) as e:
        load(text)
    return [f"{p.line}: {p.field}: {p.message}" for p in e.value.problems]


def plan_of(text: str, counter_ports):
    (scn,) = load(text)
    return make_plan(scn, "/tmp/torchdist-harness/run-x", counter_ports, netns=True,
                     run_id="x")


# -- validate: a restart of a process that never started, of a fault that kills nothing --------

def test_a_signal_that_ends_nothing_is_refused_at_restart_after():
    out = problems(HEAD + 'faults:\n  - {kind: kill_rank, rank: 1, signal: CHLD, at: 1,\n'
                          '     restart_after: 2}\n')
    assert out == ["9: faults[0].restart_after: SIGCHLD does not end a process (by default it "
                   "is ignored): nothing would be started again; send one that ends it (KILL, "
                   "TERM, INT...) or leave restart_after out"], out


def test_a_worker_an_agent_starts_is_refused_and_its_agent_named():
    out = problems(HEAD + "launcher: torchrun\n"
                          'faults:\n  - {kind: kill_rank, rank: 1, at: 1, restart_after: 2}\n')
    assert len(out) == 1 and out[0].startswith("9: faults[0].restart_after: rank 1 is a worker "
                                               "that the torchrun launcher's agent starts"), out
    assert "(here: agent:local)" in out[0]


def test_a_restart_attempts_worker_is_refused():
    out = problems(HEAD + "launcher: {kind: torchrun, max_restarts: 1}\n"
                          'faults:\n  - {kind: kill_rank, rank: "1@1", at: 1, '
                          'restart_after: 2}\n')
    assert len(out) == 1 and out[0].startswith(
        "9: faults[0].restart_after: rank 1@1 is a worker its agent starts in restart "
        "attempt 1"), out


def test_an_agent_not_in_the_run_is_refused_at_rank():
    out = problems(HEAD + "launcher: torchrun\n"
                          'faults:\n  - {kind: kill_rank, rank: "agent:node5", at: 1, '
                          'restart_after: 2}\n')
    assert len(out) == 1 and out[0].startswith(
        "9: faults[0].rank: agent:node5 is not a process of this run"), out


def test_a_rank_the_run_never_starts_is_refused():
    out = problems(HEAD + "faults:\n  - {kind: kill_rank, rank: 1, at: 1, restart_after: 2}\n"
                          "  - {kind: absent_rank, ranks: [1]}\n")
    assert any("rank 1 is absent" in p for p in out), out


def test_the_plan_refuses_a_restart_of_an_absent_rank_located_at_restart_after(counter_ports):
    """The loader's own check names the absent rank first; the plan, below it, refuses too
    (for a caller that plans a case the loader did not check)."""
    from harness.core.errors import PlanRefusal
    from harness.scenario.schema import Scenario

    scn = Scenario.model_validate({
        "name": "t", "about": "a", "world_size": 2,
        "faults": [{"kind": "kill_rank", "rank": 1, "at": 1, "restart_after": 2},
                   {"kind": "absent_rank", "ranks": [1]}]})
    with pytest.raises(PlanRefusal) as e:
        make_plan(scn, "/tmp/torchdist-harness/run-x", counter_ports, run_id="x")
    assert e.value.loc == ("faults", 0, "restart_after")
    assert "absent" in str(e.value)


def test_restart_after_belongs_to_kill_rank():
    out = problems(HEAD + 'faults:\n  - {kind: stop_rank, rank: 1, at: 1, restart_after: 2}\n')
    assert len(out) == 1 and out[0].startswith("8: faults[0].restart_after: unknown field of "
                                               "stop_rank"), out


def test_a_launcher_that_cannot_start_a_process_again_says_why():
    from harness.launchers.slurm import Slurm

    assert Slurm.NO_RESTART and "srun" in Slurm.NO_RESTART


def test_restart_after_is_never_negative():
    out = problems(HEAD + 'faults:\n  - {kind: kill_rank, rank: 1, at: 1, restart_after: -1}\n')
    assert len(out) == 1 and out[0].startswith("8: faults[0].restart_after"), out


# -- rows and expectation keys ------------------------------------------------------------------

def test_the_restart_is_a_row_an_expectation_can_name():
    (scn,) = load(HEAD + "faults:\n  - {kind: kill_rank, rank: 1, at: 1, restart_after: 2}\n"
                         "  - {kind: kill_rank, rank: '1#2', at: 8, restart_after: 1}\n"
                         "expect:\n  ranks:\n    '1': crash\n    '1#2': crash\n"
                         "    '1#3': ok\n")
    assert [f.extra_labels(scn) for f in scn.faults] == [["1#2"], ["1#3"]]


def test_an_unknown_restart_row_is_refused_as_an_expectation_key():
    out = problems(HEAD + "faults:\n  - {kind: kill_rank, rank: 1, at: 1, restart_after: 2}\n"
                          "expect:\n  ranks:\n    '0#2': ok\n")
    assert any(p.startswith("11: ") and "0#2" in p for p in out), out


def test_agent_wildcard_covers_a_restarted_agent():
    assert key_for(["agent:*"], "agent:node1#2") == "agent:*"
    assert key_for(["agent:*", "agent:node1#2"], "agent:node1#2") == "agent:node1#2"


def test_a_restarted_agent_adds_restart_attempts_to_its_job():
    text = """\
        name: t
        about: a
        nodes: 2
        ranks_per_node: 1
        launcher: {kind: torchrun, rdzv_backend: c10d, rdzv_endpoint: node0, max_restarts: 1}
        faults:
          - {kind: kill_rank, rank: "agent:node1", signal: INT, at: 3, restart_after: 3}
        """
    (scn,) = load(text)
    main = scn.row_sets()[0]
    assert main.attempts == 3   # (1 + 1) x (1 restart + 1) - 1
    assert any("agent:node1#2" in s.extra for s in scn.row_sets())
    (plain,) = load(text.replace(", restart_after: 3", ""))
    assert plain.row_sets()[0].attempts == 1


# -- the plan --------------------------------------------------------------------------------------

def test_the_plan_copies_the_killed_process_and_adds_a_kill_and_a_restart(counter_ports):
    plan = plan_of("""\
        name: t
        about: a
        nodes: 2
        ranks_per_node: 1
        env: {FOO: bar}
        launcher: {kind: torchrun, rdzv_backend: c10d, rdzv_endpoint: node0}
        faults:
          - {kind: kill_rank, rank: "agent:node1", signal: INT, phase: rendezvous,
             restart_after: 2.5}
        """, counter_ports)
    first = plan.rank("agent:node1")
    again = plan.rank("agent:node1#2")
    assert again is plan.restarts[0] and again not in plan.ranks
    assert again not in plan.launched_ranks()
    assert (again.argv, again.env, again.host, again.role, again.observed) == \
        (first.argv, first.env, first.host, first.role, first.observed)
    assert again.env is not first.env and again.env["FOO"] == "bar"
    assert again.restart_of == "agent:node1" and again.start == "fresh"
    assert again.release == Trigger.at_time(0.0)
    kill, restart = plan.steps[-2:]
    assert isinstance(kill, Signal) and isinstance(restart, Restart)
    assert (kill.signal, restart.rank, restart.label, restart.kill) == \
        ("INT", "agent:node1", "agent:node1#2", kill.id)
    assert restart.trigger == Trigger.on_phase("agent:node1", P.ENDED, 2.5)
    assert restart.fault_no == kill.fault_no == 1
    d = plan.to_dict()
    assert [r["label"] for r in d["restarts"]] == ["agent:node1#2"]
    assert d["restarts"][0]["restart_of"] == "agent:node1"
    assert "restart_requests" not in d
    assert any("started again as agent:node1#2 2.5 s after it ended" in n for n in plan.notes)


def test_a_restart_copies_what_later_faults_changed(counter_ports):
    plan = plan_of(HEAD + "faults:\n  - {kind: kill_rank, rank: 1, at: 1, restart_after: 2}\n"
                          "  - {kind: wrong_port, ranks: [1]}\n", counter_ports)
    assert plan.rank("1#2").env["MASTER_PORT"] == plan.rank("1").env["MASTER_PORT"] != \
        plan.rank("0").env["MASTER_PORT"]


# -- the steps -------------------------------------------------------------------------------------

class _Rt:
    def __init__(self):
        self.done = {}
        self.started: List[str] = []

    def step_done(self, step_id):
        return self.done.get(step_id)

    def phase_entered(self, rank, phase):
        return 5.0 if (rank, phase) == ("1", P.ENDED) else None

    def rank(self, label):
        return SimpleNamespace(obs=SimpleNamespace(ended_at=5.0), pid=7)

    def restart(self, label):
        self.started.append(label)
        return SimpleNamespace(pid=42)

    def now(self):
        return 7.0


def test_the_restart_waits_for_the_kill_and_holds_the_run_open_until_it_fired():
    rt = _Rt()
    step = Restart(rank="1", label="1#2", kill="kill_rank#1",
                   trigger=Trigger.on_phase("1", P.ENDED, 2.0), id="kill_rank#2",
                   fault_no=1)
    sch = Scheduler([step], rt, rt)
    assert not sch.holding()
    sch.tick(8.0)
    assert rt.started == []        # the process ended, but no kill was sent: nothing to restart
    rt.done["kill_rank#1"] = 4.9
    assert sch.holding()
    sch.tick(6.5)
    assert rt.started == []        # 2 s after its end is 7.0
    sch.tick(7.0)
    assert rt.started == ["1#2"] and not sch.holding()
    (rec,) = sch.effects(9.0)
    assert rec["status"] == "acted" and "rank 1 started again as 1#2 (pid 42) at 7.00 s, " \
        "2.00 s after it ended at 5.00 s" in rec["summary"], rec


# -- verdicts --------------------------------------------------------------------------------------

def test_the_killed_row_no_longer_counts_for_the_job():
    vs = [Verdict("agent:node1", "error", "workers", 3.0, role="agent"),
          Verdict("agent:node1#2", "ok", "exit", 29.0, role="agent",
                  restart_of="agent:node1"),
          Verdict("agent:node0", "ok", "exit", 29.0, role="agent")]
    assert job_outcome(vs) == "ok"
    assert job_outcome(vs[:1] + vs[2:]) == "error"


def test_a_restarts_row_says_so_and_the_report_keeps_it():
    from harness.reports.report import rank_record

    o = RankObservation("1#2", pid=9, released_at=4.25, ended_at=9.0, returncode=0,
                        restart_of="1")
    v = classify(o)
    assert v.restart_of == "1" and "a restart of 1 (restart_after), started at 4.25 s" in \
        v.reason
    assert rank_record(v, o, 0.0)["restart_of"] == "1"
    assert RankObservation.from_dict(o.to_dict()).restart_of == "1"
    assert "restart_of" not in RankObservation("1").to_dict()


def test_a_restarted_agents_workers_go_on_from_the_killed_agents_attempts(tmp_path):
    from harness.launchers import Discovery, RankProcess

    sup = SimpleNamespace(ranks=[], now=lambda: 1.0, addr_of=lambda h: "10.0.0.2",
                          plan=SimpleNamespace(ranks=[SimpleNamespace(host="node0")]))

    def row(label, role, node=None, attempt=0, restart_of=None):
        r = RankProcess(label, SimpleNamespace(pid=None), events=tmp_path / f"{label}.events",
                        stacks=tmp_path / f"{label}.stacks", out=None, err=None,
                        now=lambda: 0.0, host="node1", role=role, held=False)
        r.obs.node, r.obs.attempt, r.obs.restart_of = node, attempt, restart_of
        sup.ranks.append(r)
        return r

    row("agent:node1", P.ROLE_AGENT)
    row("1", P.ROLE_WORKER, node="agent:node1")
    row("agent:node1#2", P.ROLE_AGENT, restart_of="agent:node1")
    hello = {"ev": P.HELLO, "pid": 1234, "role": P.ROLE_WORKER, "node": "agent:node1#2",
             "rank": 1, "attempt": 0}
    path = tmp_path / "1234-99.events"
    path.write_text(json.dumps(hello) + "\n")
    Discovery(tmp_path)._found(sup, path)
    found = sup.ranks[-1]
    assert (found.label, found.obs.attempt, found.obs.host) == ("1@1", 1, "node1")


# -- real runs -------------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_a_killed_rank_is_started_again_and_the_run_waits_for_it():
    """World 1: once rank 0 is killed every process of the run has ended, yet the run goes on
    until its restart (1 s later) has run the workload: a fresh process with the same
    environment, its own row, the job ok."""
    from harness.run.supervisor import run_scenario

    (scn,) = load("""\
        name: restarted
        about: rank 0 killed in its work and started again 1 s later
        world_size: 1
        timeout: 10
        deadline: 60
        workload: [barrier, "sleep 2"]
        faults:
          - {kind: kill_rank, rank: 0, phase: "workload step 2", restart_after: 1}
        """)
    observed = run_scenario(scn)
    vs = {v.label: v for v in classify_run(observed)}
    assert {k: (v.outcome, v.phase) for k, v in vs.items()} == {
        "0": ("crash", "workload step 2"), "0#2": ("ok", "exit")}
    assert vs["0#2"].restart_of == "0" and job_outcome(list(vs.values())) == "ok"
    first, again = (next(r for r in observed.ranks if r.label == x) for x in ("0", "0#2"))
    assert again.pid != first.pid and again.released_at >= first.ended_at + 1.0
    env = lambda r: next(e for e in r.events if e.ev == P.PHASE and  # noqa: E731
                         e.data.get("phase") == "start").data["launched"]["env"]
    assert env(first) == env(again) and "MASTER_PORT" in env(first)
    (fault,) = observed.effects
    assert {t["target"]: t["status"] for t in fault["targets"]} == {
        "rank 0": "acted", "0#2": "acted"}, fault
    assert f"0#2 (pid {again.pid})" in fault["summary"]
    assert not os.path.exists(observed.run_dir)
    assert not [p for p in (first.pid, again.pid) if p and alive(p)]


@pytest.mark.timeout(180)
def test_a_killed_supervisor_takes_a_restarted_process_along(tmp_path):
    """SIGKILL to the harness while the restarted rank runs: the restart has the death
    signal and the pid record every process of a run has; the sweep removes the run."""
    from harness.machine.rundir import sweep

    sup = supervisor("""\
        name: restarted_then_orphaned
        about: the supervisor dies while the restart sleeps
        world_size: 1
        timeout: 10
        deadline: 120
        workload: [barrier, "sleep 1", "sleep 100"]
        faults:
          - {kind: kill_rank, rank: 0, phase: "workload step 2", restart_after: 0}
        """, tmp_path)
    pids: List[int] = []
    try:
        def restarted():
            for d in state_dir(tmp_path).glob("run-*"):
                p = d / "rank-0_r2.events"
                if p.exists() and '"workload step 3"' in p.read_text():
                    return d
            return None

        run_dir = wait_for(restarted, 150, "the restarted rank in its long sleep")
        pids = [json.loads(ln)["pid"] for ln in
                (run_dir / "pids.jsonl").read_text().splitlines()]
        first, again = (next(json.loads(ln)["pid"] for ln in (run_dir / name).read_text()
                             .splitlines() if '"start"' in ln)
                        for name in ("rank-0.events", "rank-0_r2.events"))
        assert again in pids and alive(again) and not alive(first)
        sup.send_signal(signal.SIGKILL)
        sup.wait(timeout=30)
        wait_for(lambda: not any(alive(p) for p in pids), 30, "the restart to die")
        swept = [r.split()[0] for r in sweep(state_dir(tmp_path))]
        assert run_dir.name in swept and not run_dir.exists(), swept
        # the run's own namespace (thx-<run id>-local, where it has root) goes with the
        # namespaces' sweep, as after any SIGKILLed run
        from harness.net import topology

        if not topology.missing():
            own = f"{topology.PREFIX}{run_dir.name[len('run-'):]}-"
            topology.sweep()
            assert not [n for n in topology._list_netns() if n.startswith(own)]
    finally:
        end_supervisor(sup, pids)

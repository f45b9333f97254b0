"""Launchers and programs, pure: the YAML fields, torchrun's flags per agent, the rows a run can
have and which expectation speaks of which row, the classification of agents' and observed
programs' ends (harness.launchers, harness.programs, harness.rows, harness.classify)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.core.protocol import Event, parse_label
from harness.core.rows import RowSet, key_for, key_ok
from harness.judge.classify import Verdict, classify, job_outcome
from harness.judge.observation import RankObservation
from harness.run.plan import make_plan
from harness.scenario.loader import ScenarioFileError, load_text

SCRIPT = Path(__file__).resolve().parent.parent / "scenarios" / "programs" / "train.py"


def load(text: str, source: str = "launchers.yaml"):
    (scn,) = load_text(textwrap.dedent(text), source)
    return scn


def problems(text: str, source: str = "launchers.yaml"):
    with pytest.raises(ScenarioFileError) as e:
        load_text(textwrap.dedent(text), source)
    return [f"{p.line}: {p.field}: {p.message}" for p in e.value.problems]


def plan_of(text: str, counter_ports, netns: bool = True):
    return make_plan(load(text), "/tmp/torchdist-harness/run-x", counter_ports, netns=netns,
                     run_id="x")


def agent_argv(plan, label):
    rp = plan.rank(label)
    argv = rp.argv
    return argv[2:argv.index("-m", 2)] if "-m" in argv[2:] else argv[2:]


# -- torchrun's flags ----------------------------------------------------------------------------

def test_single_host_torchrun_is_one_agent_with_nproc_per_node(counter_ports):
    plan = plan_of("name: t\nabout: a\nworld_size: 3\nlauncher: torchrun\n", counter_ports)
    assert [r.label for r in plan.ranks] == ["agent:local"]
    rp = plan.ranks[0]
    assert rp.role == "agent" and rp.observed and rp.argv[:2] == ["-m", "torch.distributed.run"]
    assert agent_argv(plan, "agent:local") == ["--nnodes", "1", "--nproc-per-node", "3"]
    # the program: the harness's worker, its rank from torchrun's environment
    assert rp.argv[-3:-1] == ["-m", "harness.ranks.worker"]


def test_the_store_sharing_is_the_scenarios_or_else_the_environments(counter_ports, monkeypatch):
    # an image's ENV (harness compare --env-b) reaches the agents unless the scenario says
    # otherwise; the plan records what they run with (until 2026-11-29 it was cleared, so a
    # compare against TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 ran the same job on both sides)
    var = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
    text = "name: t\nabout: a\nworld_size: 2\nlauncher: {kind: torchrun%s}\n"

    def agent(extra=""):
        rp = plan_of(text % extra, counter_ports).rank("agent:local")
        return rp.env.get(var), rp.unset
    monkeypatch.delenv(var, raising=False)
    assert agent() == (None, []) and agent(", share_store: true") == (None, [])
    assert agent(", share_store: false") == ("1", [])
    monkeypatch.setenv(var, "1")
    assert agent() == ("1", []) and agent(", share_store: false") == ("1", [])
    assert agent(", share_store: true") == (None, [var])
    from harness.launchers import process_env
    rp = plan_of(text % ", share_store: true", counter_ports).rank("agent:local")
    assert var not in process_env(rp)
    assert process_env(plan_of(text % "", counter_ports).rank("agent:local"))[var] == "1"


def test_two_hosts_get_the_static_recipe_on_the_master_host(counter_ports):
    plan = plan_of("name: t\nabout: a\nnodes: 2\nranks_per_node: 2\nlauncher: torchrun\n",
                   counter_ports)
    a0, a1 = agent_argv(plan, "agent:node0"), agent_argv(plan, "agent:node1")
    master = plan.host("node0").addr
    assert a0 == ["--nnodes", "2", "--nproc-per-node", "2", "--node-rank", "0",
                  "--master-addr", master, "--master-port", str(plan.master_port)]
    assert a1[a1.index("--node-rank") + 1] == "1"
    assert plan.rank("agent:node1").env["GLOO_SOCKET_IFNAME"] == plan.host("node1").ifname


def test_every_option_becomes_its_flag(counter_ports):
    plan = plan_of("""
        name: t
        about: a
        nodes: 2
        launcher:
          kind: torchrun
          nnodes: "1:2"
          rdzv_backend: c10d
          rdzv_endpoint: node0
          rdzv_id: job7
          rdzv_conf: {join_timeout: 10, read_timeout: 5.5, is_host: true}
          master_addr: node1
          master_port: 29500
          max_restarts: 2
          monitor_interval: 0.5
          agents:
            node1: {rdzv_conf: {is_host: false}, node_rank: 1}
    """, counter_ports)
    a0 = agent_argv(plan, "agent:node0")
    n0, n1 = plan.host("node0").addr, plan.host("node1").addr
    assert a0 == ["--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                  "--rdzv-endpoint", f"{n0}:{plan.master_port}", "--rdzv-id", "job7",
                  "--rdzv-conf", "join_timeout=10,read_timeout=5.5,is_host=true",
                  "--master-addr", n1, "--master-port", "29500", "--max-restarts", "2",
                  "--monitor-interval", "0.5"]
    a1 = agent_argv(plan, "agent:node1")
    assert "--rdzv-conf" in a1 and a1[a1.index("--rdzv-conf") + 1] == "is_host=false"
    assert a1[a1.index("--node-rank") + 1] == "1"
    # a literal port: the run gets namespaces of its own
    assert plan.netns


def test_standalone_and_a_literal_endpoint(counter_ports):
    plan = plan_of("name: t\nabout: a\nlauncher: {kind: torchrun, standalone: true}\n",
                   counter_ports)
    assert agent_argv(plan, "agent:local") == ["--nproc-per-node", "2", "--standalone"]
    plan = plan_of('name: t\nabout: a\nlauncher: {kind: torchrun, rdzv_backend: c10d, '
                   'rdzv_endpoint: "127.0.0.1:29400"}\n', counter_ports)
    assert "127.0.0.1:29400" in agent_argv(plan, "agent:local")


def test_a_second_torchrun_job_has_agents_of_its_own(counter_ports):
    plan = plan_of("""
        name: t
        about: a
        launcher: {kind: torchrun, rdzv_backend: c10d, rdzv_endpoint: "127.0.0.1:29400",
                   rdzv_id: first, agents: {"job2:local": {rdzv_id: second}}}
        faults: [{kind: concurrent_job, delay: 2}]
    """, counter_ports)
    assert [r.label for r in plan.ranks] == ["agent:local", "job2:agent:local"]
    a2 = agent_argv(plan, "job2:agent:local")
    assert a2[a2.index("--rdzv-id") + 1] == "second"
    assert plan.rank("job2:agent:local").release.at == 2


def test_spawn_plans_one_parent_per_host(counter_ports):
    plan = plan_of("name: t\nabout: a\nnodes: 2\nranks_per_node: 2\nlauncher: spawn\n",
                   counter_ports)
    assert [(r.label, r.role) for r in plan.ranks] == [("parent:node0", "parent"),
                                                       ("parent:node1", "parent")]
    p1 = plan.rank("parent:node1")
    assert p1.argv[:2] == ["-m", "harness.ranks.spawner"]
    assert p1.env["NODE_RANK"] == "1" and p1.env["WORLD_SIZE"] == "4"
    assert '"first_rank": 2' in p1.argv[2]


def test_a_users_program_runs_as_its_launcher_would(counter_ports):
    text = f"name: t\nabout: a\nprogram: {{script: {SCRIPT}, args: [--steps, '3']}}\n"
    plan = plan_of(text, counter_ports)
    r1 = plan.rank("1")
    assert r1.argv == [str(SCRIPT), "--steps", "3"] and r1.observed
    assert r1.env["RANK"] == "1" and r1.env["WORLD_SIZE"] == "2"
    plan = plan_of(text + "launcher: torchrun\n", counter_ports)
    assert plan.rank("agent:local").argv[-3:] == [str(SCRIPT), "--steps", "3"]


# -- the YAML: every problem located ---------------------------------------------------------------

def test_launcher_problems_are_located():
    out = problems("""
        name: t
        about: a
        launcher:
          kind: torchrun
          nnodes: "2:x"
          rdzv_backend: zookeeper
          rdzv_conf: {nonsense: 1}
          agents:
            nowhere: {max_restarts: 1}
    """)
    assert any(p.startswith("6: launcher.nnodes:") for p in out), out
    assert any(p.startswith("7: launcher.rdzv_backend:") for p in out), out
    assert any(p.startswith("8: launcher.rdzv_conf:") and "known keys" in p for p in out), out
    out = problems("name: t\nabout: a\nlauncher: {kind: torchrun, agents: {nowhere: {}}}\n")
    assert any("launcher.agents.nowhere" in p and "no host" in p for p in out), out
    out = problems("name: t\nabout: a\nlauncher: pbs\n")
    assert any(p.startswith("3: launcher:") and "unknown launcher 'pbs'" in p
               for p in out), out
    out = problems("name: t\nabout: a\nlauncher: slurm\n")   # a kind now: its own check
    assert any(p.startswith("3: launcher.kind:") and "give the scenario hosts" in p
               for p in out), out


def test_program_problems_are_located(tmp_path):
    src = tmp_path / "s.yaml"
    out = problems("name: t\nabout: a\nprogram: missing.py\nworkload: [barrier]\n", str(src))
    assert any(p.startswith("3: program") and "no such file" in p for p in out), out
    assert any(p.startswith("4: workload") for p in out), out


def test_expectations_and_faults_name_processes_the_run_can_have():
    out = problems("""
        name: t
        about: a
        nodes: 2
        launcher: {kind: torchrun, max_restarts: 1}
        faults: [{kind: kill_rank, rank: "agent:node7", at: 1}]
        expect:
          ranks:
            agent:node0: ok
            "1@1": ok
            "1@2": ok
            parent:*: ok
    """)
    assert any(p.startswith("6: faults[0].rank") for p in out), out
    assert any(p.startswith("11: ") and "1@2" in p for p in out), out
    assert any(p.startswith("12: ") and "no spawning parent" in p for p in out), out
    assert not any(p.startswith(("9: ", "10: ")) for p in out), out


# -- rows ------------------------------------------------------------------------------------------

def test_the_most_specific_key_speaks_of_a_row():
    keys = ["*", "1@*", "*@1", "agent:*", "agent:node1", "0"]
    assert key_for(keys, "0") == "0"
    assert key_for(keys, "1") == "1@*"
    assert key_for(keys, "1@1") == "1@*"
    assert key_for(keys, "0@1") == "*@1"
    assert key_for(keys, "2") == "*"
    assert key_for(keys, "agent:node0") == "agent:*"
    assert key_for(keys, "agent:node1") == "agent:node1"
    assert key_for(["*"], "agent:node0") is None      # '*' is every rank, not every process


def test_row_sets_and_labels():
    rows = RowSet(world=2, attempts=1, agents=["agent:a"])
    assert rows.labels() == ["agent:a", "0", "1", "0@1", "1@1"]
    assert key_ok("1@1", [rows]) is None and key_ok("*@1", [rows]) is None
    assert "attempt 2" in (key_ok("*@2", [rows]) or "")
    assert parse_label("job2:agent:local") == ("agent", "job2", None, 0, "local")
    assert parse_label("pid77") is None


def test_an_elastic_range_allows_a_restart_row_per_node_that_may_join():
    """nnodes MIN:MAX: a node joining later restarts the workers without counting against
    --max-restarts (torch's membership change), so rank 0@1 is a row a case may pin."""
    base = """\
        name: t
        about: a
        nodes: 3
        launcher: {kind: torchrun, rdzv_backend: c10d, NNODES}
        expect: {ranks: {"0@2": {outcome: ok}}}
    """
    scn = load(base.replace("NNODES", 'nnodes: "1:3"'))
    assert scn.launcher.rows(scn).attempts == 2
    with pytest.raises(ScenarioFileError) as e:
        load(base.replace("NNODES", "nnodes: 3"))
    assert "0@2 is not a process of this run" in str(e.value)


# -- classification of agents and observed programs -----------------------------------------------

def _obs(label, role, events, rc):
    evs = [Event(ev, t, data) for ev, t, data in events]
    return RankObservation(label=label, role=role, events=evs, returncode=rc,
                           info={"role": role})


def _result_exc(cls_chain, message, **extra):
    return ("result", 5.0, {"status": "exception", "phase": "workers", "exc": {
        "type": cls_chain[0].rsplit(".", 1)[-1], "mro": list(cls_chain), "message": message,
        "traceback": ""}, **extra})


def test_agent_child_failed_names_the_root_cause_and_counts_restarts():
    o = _obs("agent:local", "agent", [
        ("hello", 0.1, {"role": "agent"}), ("phase", 1.0, {"phase": "rendezvous"}),
        ("restart", 3.0, {"attempt": 1}),
        _result_exc(["torch.distributed.elastic.multiprocessing.errors.ChildFailedError",
                     "builtins.Exception"], "train.py FAILED",
                    root_cause={"rank": 1, "exitcode": -9, "local_rank": 1, "pid": 5})], 1)
    v = classify(o)
    assert (v.outcome, v.root_cause, v.restarts) == ("error", 1, 1)
    assert "rank 1 failed first (killed by SIGKILL)" in v.reason
    assert "restarted its workers 1 time" in v.reason and "exit code 1" in v.reason


def test_rendezvous_timeout_is_a_timeout_and_a_closed_one_an_error():
    base = "torch.distributed.elastic.rendezvous.api."
    o = _obs("agent:a", "agent", [_result_exc([base + "RendezvousTimeoutError",
                                               base + "RendezvousError", "builtins.Exception"],
                                              "")], 1)
    assert (classify(o).outcome, classify(o).reason.split(";")[0]) == \
        ("timeout", "the rendezvous timed out (join timeout)")
    o = _obs("agent:a", "agent", [_result_exc([base + "RendezvousClosedError",
                                               base + "RendezvousError", "builtins.Exception"],
                                              "")], 1)
    assert classify(o).outcome == "error" and "closed" in classify(o).reason


def test_an_observed_program_is_judged_by_its_exit():
    start = [("hello", 0.1, {"role": "worker"}), ("phase", 1.0, {"phase": "init"})]
    assert classify(_obs("0", "worker", start + [("phase", 2.0, {"phase": "exit"})], 0)
                    ).outcome == "ok"
    caught = start + [("raised", 2.0, {"phase": "init", "exc": {
        "type": "DistStoreError", "mro": [
            "torch.distributed.DistStoreError", "builtins.RuntimeError"],
        "message": "wait timeout after 5000ms", "traceback": ""}}),
        ("phase", 2.1, {"phase": "exit"})]
    v = classify(_obs("0", "worker", caught, 1))
    assert (v.outcome, v.phase) == ("timeout", "init") and "caught it" in v.reason
    v = classify(_obs("0", "worker", start, 7))
    assert v.outcome == "crash" and "without a Python exit" in v.reason
    v = classify(_obs("0", "worker", start + [("phase", 2.0, {"phase": "exit"})], 3))
    assert (v.outcome, v.reason) == ("error", "exited with status 3")


def test_a_restarted_worker_does_not_decide_the_job():
    vs = [Verdict("agent:local", "ok", "exit", 9.0, role="agent"),
          Verdict("0", "crash", "x", 3.0), Verdict("1", "crash", "x", 3.0),
          Verdict("0@1", "ok", "exit", 8.0), Verdict("1@1", "ok", "exit", 8.0)]
    assert job_outcome(vs) == "ok"
    assert job_outcome(vs[:3]) == "crash"


def test_a_fault_that_edits_each_ranks_start_is_refused_under_torchrun():
    out = problems("name: t\nabout: a\nlauncher: torchrun\nfaults:\n"
                   "  - {kind: wrong_port, ranks: [1]}\n")
    assert any(p.startswith("5: faults[0].kind: wrong_port:") and "launcher: direct" in p
               for p in out), out


def test_a_fault_on_what_the_worker_does_travels_to_torchruns_workers(counter_ports):
    """slow_rank and rank_workload under torchrun: the agent carries the per-rank variations
    to its workers (each takes its own by RANK), and the plan edit is read back from rank 1."""
    from harness.core.protocol import RANK_VARIATIONS_ENV
    from harness.judge import edits

    p = plan_of("""
        name: t
        about: a
        launcher: torchrun
        workload: [barrier, all_reduce]
        faults:
          - {kind: slow_rank, rank: 1, phase: init, seconds: 3}
          - {kind: rank_workload, rank: 0, steps: [barrier, sleep 1, all_reduce]}
    """, counter_ports)
    import json
    carried = json.loads(p.rank("agent:local").env[RANK_VARIATIONS_ENV])
    assert carried["1"]["slow_at"] == {"init": 3.0} and carried["1"]["steps"] is None
    assert carried["0"]["steps"] == ["barrier", "sleep 1", "all_reduce"]
    assert [(e.target, e.what) for e in p.edits] == [("1", "slow"), ("0", "steps")]
    # the agent's own variables are not an edit of any fault
    assert not any(e.what == "env" for e in p.edits)
    assert edits.snapshot(p)["1"]["shared"]


def test_a_worker_takes_its_own_variation_by_the_rank_its_launcher_gave(monkeypatch):
    import json

    from harness.core import protocol as P
    from harness.ranks.worker import own_variation

    spec = P.WorkerSpec(label="", backend="gloo", timeout=5, steps=["barrier"], destroy=True,
                        init=P.InitSpec("env"))
    monkeypatch.setenv(P.RANK_VARIATIONS_ENV, json.dumps(
        {"1": {"skip": [], "raise_at": {"phase": "init", "exception": "ValueError"},
               "model_change": "", "slow_at": {}, "steps": ["sleep 1"]}}))
    monkeypatch.setenv("RANK", "1")
    got = own_variation(spec)
    assert got.steps == ["sleep 1"] and got.variation.raise_at.exception == "ValueError"
    monkeypatch.setenv(P.RANK_VARIATIONS_ENV, json.dumps({"1": {"slow_at": {"init": 2}}}))
    monkeypatch.setenv("RANK", "0")
    assert own_variation(spec) == spec   # rank 0 has none


def test_a_fault_on_what_the_worker_does_is_refused_to_a_users_program(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    out = problems(f"name: t\nabout: a\nlauncher: torchrun\nprogram: {tmp_path}/train.py\n"
                   "faults:\n  - {kind: slow_rank, rank: 1, phase: init, seconds: 1}\n")
    assert any("faults[0]" in p and "your program" in p for p in out), out

"""Launchers and programs, for real: torchrun agents and their workers, spawning parents and
their children, a user's script under the observer (harness.launchers, harness.observer).

Each test runs one small scenario and checks its rows (one per agent, parent and worker, with
its role, attempt and phases) and that nothing of the run is left: no agent, worker, spawned
child or user script alive, no run directory, no namespace. Timings are generous bounds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
from pathlib import Path
from typing import Dict, List, Tuple

import psutil
import pytest
from orphans import alive, end_supervisor, state_dir, supervisor

from harness.judge.classify import Verdict, classify_run, job_outcome
from harness.machine.rundir import base_dir
from harness.net import topology
from harness.run.supervisor import run_scenario
from harness.scenario.loader import load_text

pytestmark = pytest.mark.timeout(240)
SCRIPT = Path(__file__).resolve().parent.parent / "scenarios" / "programs" / "train.py"
MARKS = ("torch.distributed.run", "harness.ranks.worker", "harness.ranks.spawner",
         "multiprocessing", str(SCRIPT))


def _ours() -> List[str]:
    """Processes below this test process that belong to a run (agents, workers, children)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        if any(m in cmd for m in MARKS):
            out.append(f"{p.pid} {cmd[:120]}")
    return out


def _everything_seen(o) -> List[int]:
    return [r["pid"] for r in o["ranks"] if r.get("pid")]


def _left(o) -> List[str]:
    left = _ours()
    for pid in _everything_seen(o):
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(f"pid {pid} of the run")
        except psutil.NoSuchProcess:
            pass
    if Path(o["run_dir"]).exists():
        left.append(o["run_dir"])
    run_id = o["plan"]["run_id"]
    if not topology.missing():
        ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        left += [n for n in ns.split() if run_id in n]
    for run in base_dir().glob("run-*"):
        try:
            if json.loads((run / "owner.json").read_text()).get("pid") == os.getpid():
                left.append(run.name)
        except (OSError, ValueError):
            pass
    return left


def run(text: str, source: str = "launchers.yaml") -> Tuple[dict, Dict[str, Verdict]]:
    (scn,) = load_text(textwrap.dedent(text), source)
    observed = run_scenario(scn)
    o = observed.to_dict()
    assert _left(o) == []
    return o, {v.label: v for v in classify_run(observed)}


def phases(o, label) -> List[str]:
    row = next(r for r in o["ranks"] if r["label"] == label)
    return [e["phase"] for e in row["events"] if e["ev"] == "phase"]


def test_torchrun_single_host_has_a_row_per_agent_and_worker():
    o, v = run("""
        name: torchrun_healthy
        about: one agent, two workers
        world_size: 2
        timeout: 20
        deadline: 90
        launcher: torchrun
        workload: [barrier, all_reduce]
    """)
    assert sorted(v) == ["0", "1", "agent:local"]
    assert {k: (x.role, x.outcome) for k, x in v.items()} == {
        "agent:local": ("agent", "ok"), "0": ("worker", "ok"), "1": ("worker", "ok")}
    assert v["0"].node == "agent:local" and v["0"].attempt == 0
    assert "rendezvous" in phases(o, "agent:local") and "workers" in phases(o, "agent:local")
    assert phases(o, "1")[-4:] == ["workload step 1", "workload step 2", "destroy", "exit"]
    assert v["agent:local"].returncode == 0 and v["agent:local"].restarts == 0


def test_a_run_leaves_nothing_in_the_temp_folder_of_its_caller(tmp_path, monkeypatch):
    """torchrun's agent makes a torchelastic_* log folder in its TMPDIR each time and never
    removes it: every process of a run has the run's own temp folder as TMPDIR, which goes
    with the run directory."""
    import tempfile

    mine = tmp_path / "system"
    mine.mkdir()
    monkeypatch.setenv("TMPDIR", str(mine))
    monkeypatch.setenv("HARNESS_TMP", str(tmp_path / "state"))
    monkeypatch.setattr(tempfile, "tempdir", None)
    o, v = run("""
        name: torchrun_temp
        about: one agent, two workers
        world_size: 2
        timeout: 20
        deadline: 90
        launcher: torchrun
        workload: [barrier]
    """)
    assert {k: x.outcome for k, x in v.items()} == {"agent:local": "ok", "0": "ok", "1": "ok"}
    assert sorted(p.name for p in mine.iterdir()) == []
    assert {r["env"]["TMPDIR"] for r in o["plan"]["ranks"]} == {f"{o['run_dir']}/tmp"}


def test_kept_evidence_leaves_the_runs_temp_folder_out(tmp_path):
    """A program's temp files are not evidence (they may be large): the kept run directory
    has the ranks' files but not <run>/tmp."""
    (scn,) = load_text(textwrap.dedent("""
        name: kept
        about: two healthy ranks
        world_size: 2
        timeout: 10
        deadline: 30
        workload: [barrier]
    """), "kept.yaml")
    run_scenario(scn, keep=tmp_path / "kept")
    names = {p.name for p in (tmp_path / "kept").iterdir()}
    assert {"rank-0.events", "rank-1.events"} <= names and "tmp" not in names, names


@pytest.mark.parametrize("method", ["spawn", "process"])
def test_spawn_has_a_row_per_parent_and_child(method):
    o, v = run(f"""
        name: spawn_{method}
        about: one parent starts two ranks
        world_size: 2
        timeout: 20
        deadline: 90
        launcher: {{kind: spawn, method: {method}}}
        workload: [barrier, all_reduce]
    """)
    assert {k: (x.role, x.outcome) for k, x in v.items()} == {
        "parent:local": ("parent", "ok"), "0": ("worker", "ok"), "1": ("worker", "ok")}
    assert v["1"].node == "parent:local"
    assert "spawn" in phases(o, "parent:local")


def test_a_users_script_hung_in_ddp_construction_is_reported_as_such(tmp_path):
    """rank 1 never reaches DDP (its data loader never returns): rank 0 hangs inside DDP's
    construction (the parameter broadcast), with its stacks; the user's code is not changed."""
    src = tmp_path / "user.yaml"
    o, v = run(f"""
        name: ddp_hang
        about: a user's script, one rank late for DDP
        world_size: 2
        deadline: 15
        program: {{script: {SCRIPT}, args: ["--slow-rank", "1"]}}
    """, str(src))
    assert (v["0"].outcome, v["0"].phase) == ("hang", "ddp")
    assert "distributed.py" in v["0"].stacks and "__init__" in v["0"].stacks
    assert (v["1"].outcome, v["1"].phase) == ("hang", "init")
    assert "init had returned" in v["1"].reason
    assert "sleep" in v["1"].stacks or "train.py" in v["1"].stacks


def test_a_worker_killed_in_step_3_without_restarts():
    o, v = run("""
        name: torchrun_kill
        about: rank 1 killed in workload step 3, --max-restarts 0
        world_size: 2
        timeout: 20
        deadline: 90
        launcher: {kind: torchrun, max_restarts: 0, monitor_interval: 0.5}
        workload: [barrier, all_reduce, "sleep 3", all_reduce]
        faults:
          - {kind: kill_rank, rank: 1, phase: "workload step 3", of: "*"}
    """)
    a = v["agent:local"]
    assert (a.outcome, a.exception, a.root_cause, a.returncode) == \
        ("error", "ChildFailedError", 1, 1)
    assert "rank 1 failed first (killed by SIGKILL)" in a.reason
    assert (v["1"].outcome, v["1"].phase) == ("crash", "workload step 3")
    assert "sent by the fault" in v["1"].reason
    # the kill waits for every rank to be in the sleep: its agent stops the survivor there
    # (SIGTERM), before any collective could see the peer go
    assert (v["0"].outcome, v["0"].phase) == ("crash", "workload step 3")
    assert job_outcome(list(v.values())) == "crash"
    assert not any("@" in k for k in v)


def _phase_time(o, label, name):
    row = next(r for r in o["ranks"] if r["label"] == label)
    return next(e["t"] for e in row["events"] if e["ev"] == "phase" and e["phase"] == name)


@pytest.mark.parametrize("launcher", ["torchrun", "spawn"])
def test_faults_on_what_a_worker_does_reach_the_workers_a_launcher_starts(launcher):
    """slow_rank and raise_exception under a launcher that starts the workers from one shared
    spec: the worker given rank 1 sleeps in its destroy, the one given rank 0 does not, and
    raise_exception makes rank 0 raise as it enters destroy; each effect is read back."""
    o, v = run(f"""
        name: shared_variations_{launcher}
        about: per-rank variations carried to the workers
        world_size: 2
        timeout: 20
        deadline: 90
        launcher: {launcher}
        workload: [barrier, "sleep 2", all_reduce]
        faults:
          - {{kind: slow_rank, rank: 1, phase: "workload step 2", seconds: 3}}
          - {{kind: raise_exception, rank: 0, phase: destroy, exception: ValueError,
              message: planted}}
    """)
    assert (v["0"].outcome, v["0"].exception, v["0"].phase) == ("error", "ValueError", "destroy")
    slept = {r: _phase_time(o, r, "workload step 3") - _phase_time(o, r, "workload step 2")
             for r in ("0", "1")}
    assert slept["1"] >= 4.9 and slept["0"] < 4.5, slept   # 3 s more than the shared 2 s
    assert {e["kind"]: e["status"] for e in o["effects"]} == \
        {"slow_rank": "acted", "raise_exception": "acted"}, o["effects"]


@pytest.mark.skipif(bool(topology.missing()), reason="namespace hosts need: "
                    + "; ".join(topology.missing()))
@pytest.mark.parametrize("launcher, head", [("torchrun", "agent"), ("spawn", "parent")])
def test_namespace_hosts_one_agent_or_parent_per_host(launcher, head):
    """Two namespace hosts with two ranks each: torchrun's static recipe, or a parent per host
    whose children are ranks 0-1 (node0) and 2-3 (node1), not two sets of spawn indexes."""
    o, v = run(f"""
        name: hosts_{launcher}
        about: two namespace hosts, one agent or parent each
        nodes: 2
        ranks_per_node: 2
        timeout: 20
        deadline: 90
        launcher: {launcher}
        workload: [barrier, all_reduce]
    """)
    assert {k: (x.outcome, x.host) for k, x in v.items()} == {
        f"{head}:node0": ("ok", "node0"), f"{head}:node1": ("ok", "node1"),
        "0": ("ok", "node0"), "1": ("ok", "node0"), "2": ("ok", "node1"), "3": ("ok", "node1")}
    assert v["3"].node == f"{head}:node1"


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_which_address_the_workers_are_told(backend):
    """The seed's precedence rules, read from what the workers were told (their hello): with
    the static backend the endpoint wins over --master-port; with c10d --master-addr/--port are
    ignored and the workers get agent 0's store, not the endpoint's port either."""
    o, v = run(f"""
        name: precedence_{backend}
        about: an endpoint and a master port, which one do the workers get
        world_size: 2
        timeout: 20
        deadline: 90
        launcher: {{kind: torchrun, rdzv_backend: {backend}, rdzv_endpoint: "127.0.0.1:29411",
                    master_addr: 127.0.0.1, master_port: 29500}}
        workload: [barrier]
    """)
    assert {k: x.outcome for k, x in v.items()} == {"agent:local": "ok", "0": "ok", "1": "ok"}
    told = {r["label"]: r["info"] for r in o["ranks"] if r["role"] == "worker"}
    ports = {info["master_port"] for info in told.values()}
    assert len(ports) == 1
    port = ports.pop()
    if backend == "static":
        assert port == "29411"
    else:
        assert port not in ("29411", "29500")
        assert {info["use_agent_store"] for info in told.values()} == {"True"}


SCENARIO = """\
name: orphaned_torchrun
about: a long torchrun run whose supervisor is killed
world_size: 2
timeout: 60
deadline: 120
isolate: never
launcher: torchrun
workload: [sleep 100]
"""



def test_a_killed_supervisor_takes_the_agent_and_its_workers_along(tmp_path):
    """SIGKILL to the harness mid-run: the agent (death signal) and its workers (each watches
    the supervisor: a worker has no death signal on its agent, as under a real torchrun) die;
    the sweep removes the run directory."""
    import time

    from harness.machine.rundir import sweep

    sup = supervisor(SCENARIO, tmp_path)
    base = state_dir(tmp_path)
    pids: List[int] = []
    try:
        run_dir = None
        end = time.monotonic() + 150
        while time.monotonic() < end and run_dir is None:
            for d in base.glob("run-*"):
                evs = list((d / "observed").glob("*.events"))
                sleeping = [p for p in evs if '"workload step 1"' in p.read_text()]
                if len(sleeping) == 2:
                    run_dir = d
            time.sleep(0.2)
        assert run_dir is not None, "the workers never started their workload"
        pids = [json.loads(ln)["pid"] for ln in
                (run_dir / "pids.jsonl").read_text().splitlines()]
        assert len(pids) == 3 and all(alive(p) for p in pids)   # the agent, two workers

        sup.send_signal(signal.SIGKILL)
        sup.wait(timeout=30)
        end = time.monotonic() + 30
        while time.monotonic() < end and any(alive(p) for p in pids):
            time.sleep(0.1)
        assert [p for p in pids if alive(p)] == []
        assert [r.split()[0] for r in sweep(base)] == [run_dir.name]
    finally:
        end_supervisor(sup, pids)


def test_a_worker_that_was_twinned_by_a_spawn_index_gets_its_rank_back(tmp_path):
    """Two hosts' spawn parents (spawn[two_hosts_spawn], catalog run of 2026-11-26): node1's
    child of index 1 first says "rank 1" (its spawn index) and 17 ms later "rank 3" (the
    harness's spawner); node0's real rank 1 said "rank 1" between the two and was labelled
    "1#2". When the index-1 child takes "3", the real rank 1 is "1" again. Two processes that
    both keep claiming one rank stay twinned."""
    from types import SimpleNamespace

    from harness.core import protocol as P
    from harness.launchers import Discovery, RankProcess

    sup = SimpleNamespace(ranks=[])
    disc = Discovery(tmp_path)

    def worker(pid: int, label: str) -> RankProcess:
        r = RankProcess(label, SimpleNamespace(pid=pid), events=tmp_path / f"{pid}.events",
                        stacks=tmp_path / f"{pid}.stacks", out=None, err=None,
                        now=lambda: 0.0, role=P.ROLE_WORKER, held=False)
        r.provisional = True
        sup.ranks.append(r)
        return r

    def say(r: RankProcess, rank: int, how: str) -> None:
        r.obs.events.append(P.Event(P.IDENTITY, 0.0, {"rank": rank, "how": how}))
        disc._look(sup, r)

    other, real = worker(8348, "pid8348"), worker(8349, "pid8349")
    say(other, 1, "spawn index")
    say(real, 1, "spawn index")
    assert (other.label, real.label) == ("1", "1#2")
    say(other, 3, "harness spawner")
    assert (other.label, real.label, real.obs.label) == ("3", "1", "1")
    # a real duplicate: both keep rank 1, the second stays "1#2"
    a, b = worker(1, "pid1"), worker(2, "pid2")
    say(a, 5, "init_process_group")
    say(b, 5, "init_process_group")
    say(b, 5, "init_process_group")
    assert (a.label, b.label) == ("5", "5#2")

"""The run's own etcd (an etcd: block) and its faults: the format and the plan (pure), the skip
reasons, then etcd for real (started, answering, frozen, stopped) and a SIGKILLed run that
leaves no etcd once the next sweep has run. The real tests need Debian's etcd-server (and
root for the namespace one)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, List

import pytest
from servicert import ServiceRuntime

from harness.machine.procs import alive
from harness.net import topology
from harness.run.plan import make_plan
from harness.run.requirements import skip_reason
from harness.scenario.loader import ScenarioFileError, load_text
from harness.services import etcd as etcd_service
from harness.services.etcd import ETCD, SERVICE, EtcdAnswers, get, plain_socket

_NO_ETCD = ETCD.missing()
needs_etcd = pytest.mark.skipif(bool(_NO_ETCD), reason=f"needs: {_NO_ETCD}")
_NO_NS = topology.missing()
needs_ns = pytest.mark.skipif(bool(_NO_NS), reason="needs: " + "; ".join(map(str, _NO_NS)))

BASE = """\
name: e
about: etcd
hosts: [{name: node0}, {name: node1}]
hostnames: own
timeout: 5
workload: [barrier]
"""


def _plan(text: str, base: str = BASE, run_dir: str = "/tmp/run-t1", run_id: str = "t1",
          netns: bool = True) -> Any:
    (scn,) = load_text(base + text, "e.yaml")
    ports = itertools.count(40000)
    return make_plan(scn, run_dir, lambda: next(ports), netns=netns, run_id=run_id)


def _agent_argv(plan: Any, label: str = "agent:node0") -> List[str]:
    return next(r.argv for r in plan.ranks if r.label == label)


# ---- the format ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, line, words", [
    ("etcd: {host: loopback}\n", 7, "single-host run"),
    ("etcd: {hots: etcd}\n", 7, "hots"),
    ("launcher: {kind: torchrun, rdzv_backend: etcd}\n", 7, "needs the scenario's etcd: block"),
    ("etcd: {}\nlauncher: {kind: torchrun, rdzv_backend: etcd-v2, rdzv_endpoint: node0}\n", 8,
     "leave rdzv_endpoint out"),
    ("faults: [{kind: etcd_server, mode: killed, at: 1}]\n", 7,
     "needs the scenario's etcd: block"),
    ("etcd: {}\nlauncher: {kind: torchrun, rdzv_backend: etcd}\n"
     "faults: [{kind: etcd_server, mode: absent, at: 1}]\n", 9, "never starts"),
    ("etcd: {}\nlauncher: {kind: torchrun, rdzv_backend: etcd}\n"
     "faults: [{kind: etcd_server, mode: frozen}]\n", 9, "give when"),
    ("etcd: {}\nlauncher: {kind: torchrun, rdzv_backend: etcd}\n"
     "faults: [{kind: etcd_server, mode: wiped, at: 1, heal_after: 2}]\n", 9,
     "nothing to heal"),
    ("etcd: {}\nfaults: [{kind: etcd_server, mode: paused, at: 1}]\n", 8, "mode"),
    ("dns: {}\netcd: {host: dns}\n", 8, "name server's own host"),
    ("etcd: {}\nlauncher: {kind: torchrun, rdzv_backend: etcd}\n"
     "faults: [{kind: etcd_server, mode: frozen, at: 1, hosts: [node1]}]\n", 9,
     "hosts is for mode dropped"),
    ("etcd: {}\nlauncher: {kind: torchrun, rdzv_backend: etcd}\n"
     "faults: [{kind: etcd_server, mode: dropped, at: 1, hosts: [node7]}]\n", 9,
     "no host 'node7'"),
    ("etcd: {host: node0}\nlauncher: {kind: torchrun, rdzv_backend: etcd}\n"
     "faults: [{kind: etcd_server, mode: dropped, at: 1, hosts: [node0]}]\n", 9,
     "etcd's own host"),
    ("etcd: {}\nlauncher: {kind: torchrun, rdzv_backend: etcd}\n"
     "faults: [{kind: etcd_server, mode: killed, at: 1, restart: dialled}]\n", 9,
     "restart is for mode wiped"),
])
def test_a_bad_etcd_block_or_fault_is_a_located_error(text, line, words):
    with pytest.raises(ScenarioFileError) as e:
        load_text(BASE + text, "e.yaml")
    msg = str(e.value)
    assert f"e.yaml:{line}" in msg and words in msg, msg


def test_dropped_on_the_machines_loopback_is_refused():
    single = "name: e\nabout: etcd\nworld_size: 2\ntimeout: 5\nworkload: [barrier]\n"
    with pytest.raises(ScenarioFileError) as e:
        load_text(single + "etcd: {host: loopback}\n"
                  "launcher: {kind: torchrun, rdzv_backend: etcd}\n"
                  "faults: [{kind: etcd_server, mode: dropped, at: 1}]\n", "e.yaml")
    assert "e.yaml:8" in str(e.value) and "not on the machine's loopback" in str(e.value)


# ---- the plan --------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["etcd", "etcd-v2"])
def test_the_agents_dial_the_runs_etcd_on_its_own_host(backend):
    plan = _plan(f"etcd: {{}}\nlauncher: {{kind: torchrun, rdzv_backend: {backend}}}\n")
    etcd = plan.etcd
    assert etcd.own_host and etcd.host == "etcd" and plan.service_hosts() == ["etcd"]
    assert etcd.addr.endswith(".254") and etcd.client_port != etcd.peer_port
    assert etcd.data_dir == "/tmp/run-t1/etcd/etcd-data"
    for label in ("agent:node0", "agent:node1"):
        argv = _agent_argv(plan, label)
        i = argv.index("--rdzv-endpoint")
        assert argv[i + 1] == f"{etcd.addr}:{etcd.client_port}"
        assert argv[argv.index("--rdzv-backend") + 1] == backend
        # not the static recipe: no master address, no node rank
        assert "--master-addr" not in argv and "--node-rank" not in argv
    (up,) = [s for s in plan.steps if type(s).__name__ == "EtcdUp"]
    assert up.trigger.is_setup and "start etcd on host etcd" in up.describe()


def test_etcd_beside_the_name_server_takes_the_next_last_address():
    plan = _plan("dns: {}\netcd: {}\nlauncher: {kind: torchrun, rdzv_backend: etcd}\n")
    assert plan.service_hosts() == ["dns", "etcd"]
    topo = topology.Topology(plan.run_id, [h.name for h in plan.hosts], link=True,
                             service_hosts=plan.service_hosts())
    assert plan.etcd.addr == topo.hosts["etcd"].addr and plan.etcd.addr.endswith(".253")
    assert plan.dns.addr == topo.hosts["dns"].addr


def test_etcd_on_a_scenario_host_or_loopback_adds_no_host():
    plan = _plan("etcd: {host: node1}\nlauncher: {kind: torchrun, rdzv_backend: etcd}\n")
    assert not plan.etcd.own_host and plan.service_hosts() == []
    assert plan.etcd.addr == plan.host("node1").addr and plan.etcd.host == "node1"
    single = "name: e\nabout: etcd\nworld_size: 2\ntimeout: 5\nworkload: [barrier]\n"
    plan = _plan("etcd: {host: loopback}\nlauncher: {kind: torchrun, rdzv_backend: etcd-v2}\n",
                 base=single, netns=False)
    assert not plan.netns and plan.etcd.addr == "127.0.0.1" and plan.etcd.host == ""
    assert f"127.0.0.1:{plan.etcd.client_port}" in _agent_argv(plan, "agent:local")


def test_the_faults_become_steps_with_their_triggers():
    plan = _plan("etcd: {}\nlauncher: {kind: torchrun, rdzv_backend: etcd}\n"
                 "faults:\n"
                 "  - {kind: etcd_server, mode: frozen, phase: rendezvous, rank: 'agent:node0',"
                 " heal_after: 15}\n"
                 "  - {kind: etcd_server, mode: killed, phase: 'train step 2', rank: 0}\n"
                 "  - {kind: etcd_server, mode: dropped, at: 3}\n"
                 "  - {kind: etcd_server, mode: wiped, at: 4}\n")
    steps = {type(s).__name__ + ("+wipe" if getattr(s, "wipe", False) else ""): s
             for s in plan.steps if s.fault == "etcd_server"}
    assert set(steps) == {"EtcdFreeze", "EtcdKill", "EtcdDrop", "EtcdKill+wipe"}
    frozen = steps["EtcdFreeze"]
    assert (frozen.trigger.rank, frozen.trigger.phase) == ("agent:node0", "rendezvous")
    assert frozen.undo_trigger is not None and frozen.undo_trigger.delay == 15
    assert (steps["EtcdKill"].trigger.rank, steps["EtcdKill"].trigger.phase) == \
        ("0", "train step 2")
    assert steps["EtcdKill"].undo_trigger is None and steps["EtcdDrop"].trigger.at == 3
    assert not type(steps["EtcdKill"]).UNDO_AT_TEARDOWN   # a kill is never healed at teardown
    assert steps["EtcdDrop"].peers == []                   # from every host


def test_a_wipe_restarted_once_dialled_waits_for_every_agents_host():
    """restart: dialled: the new etcd is the step's undo, right after it, held by can_undo
    until each agent's host was counted dialling the dead etcd (the real runs are the catalog's
    rdzv-etcd wiped_in_training_etcd)."""
    plan = _plan("etcd: {}\nlauncher: {kind: torchrun, rdzv_backend: etcd}\n"
                 "faults: [{kind: etcd_server, mode: wiped, restart: dialled, at: 4}]\n")
    (step,) = [s for s in plan.steps if s.fault == "etcd_server"]
    assert step.wipe and step.dialled == ["node0", "node1"]
    assert step.undo_trigger is not None and step.undo_trigger.after == step.id
    assert "once node0, node1 dialled it" in step.describe()


def test_dropped_from_some_hosts_drops_only_their_packets():
    plan = _plan("etcd: {}\nlauncher: {kind: torchrun, rdzv_backend: etcd}\n"
                 "faults: [{kind: etcd_server, mode: dropped, at: 3, hosts: [node1]}]\n")
    (drop,) = [s for s in plan.steps if s.fault == "etcd_server"]
    assert drop.peers == ["node1"] and drop.describe().endswith("(from node1 only)")


def test_absent_leaves_etcd_unstarted_but_the_agents_still_dial_its_address():
    plan = _plan("etcd: {}\nlauncher: {kind: torchrun, rdzv_backend: etcd}\n"
                 "faults: [{kind: etcd_server, mode: absent}]\n")
    assert plan.etcd.start is False
    (up,) = [s for s in plan.steps if type(s).__name__ == "EtcdUp"]
    assert "NOT started" in up.describe()
    assert plan.etcd.endpoint in _agent_argv(plan)


# ---- skip reasons ----------------------------------------------------------------------------

def test_without_python_etcd_the_reason_names_the_extra(monkeypatch):
    import importlib.util

    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "etcd" else real_find(name, *a))
    why = etcd_service._python_etcd_missing()
    assert why is not None and "python-etcd is not installed" in why and "[etcd]" in why


def test_a_missing_etcd_program_is_the_skip_reason():
    (scn,) = load_text(BASE + "etcd: {binary: /nonexistent/etcd}\n"
                       "launcher: {kind: torchrun, rdzv_backend: etcd}\n", "e.yaml")
    env = {"torch": "2.13.0", "distributed": True, "gloo": True}
    why = skip_reason(scn, env)
    if topology.missing():
        assert why is not None and "namespaces" in why
    else:
        assert why == "etcd: the etcd program '/nonexistent/etcd' is not there or not " \
            "executable (etcd: binary:)"


# ---- etcd for real ---------------------------------------------------------------------------



def _answers(plan: Any) -> bool:
    return EtcdAnswers(plain_socket, plan.etcd.addr, plan.etcd.client_port).ready(None)


@needs_etcd
def test_etcd_starts_answers_v2_freezes_restarts_wiped_and_stops(tmp_path):
    from harness.machine.ports import PortLease

    single = "name: e\nabout: etcd\nworld_size: 2\ntimeout: 5\nworkload: [barrier]\n"
    (scn,) = load_text(single + "etcd: {host: loopback}\n"
                       "launcher: {kind: torchrun, rdzv_backend: etcd}\n"
                       "faults: [{kind: etcd_server, mode: frozen, at: 1},\n"
                       "         {kind: etcd_server, mode: wiped, at: 2}]\n", "e.yaml")
    lease = PortLease()
    try:
        plan = make_plan(scn, str(tmp_path), lease.take, netns=False, run_id="t2")
        rt = ServiceRuntime(tmp_path, plan)
        etcd = plan.etcd
        try:
            (up,) = [s for s in plan.steps if type(s).__name__ == "EtcdUp"]
            info = up.do(rt)
            assert info["pid"] == rt.service(SERVICE).pid and info["ready_after"] < 30
            # the v2 API is on (both torch backends use it): a key written and read back
            with __import__("socket").create_connection((etcd.addr, etcd.client_port), 2) as s:
                s.sendall(b"PUT /v2/keys/probe HTTP/1.0\r\nHost: x\r\nContent-Type: "
                          b"application/x-www-form-urlencoded\r\nContent-Length: 7\r\n\r\n"
                          b"value=1")
                assert s.recv(4096).split(b" ")[1] in (b"200", b"201")
            assert '"value":"1"' in get(plain_socket, etcd.addr, etcd.client_port,
                                        "/v2/keys/probe")
            assert (Path(etcd.data_dir) / "member").is_dir()
            freeze, wipe = [s for s in plan.steps if s.fault == "etcd_server"]
            assert freeze.do(rt)["stopped"]           # the kernel says it is stopped
            assert not _answers(plan)                 # frozen: no answer
            freeze.undo(rt)
            end = time.monotonic() + 15   # thawed: answers again (a loaded machine: bounded)
            while not _answers(plan) and time.monotonic() < end:
                time.sleep(0.1)
            assert _answers(plan)
            old = rt.service(SERVICE).pid
            wipe.do(rt)                               # killed, data gone, a new etcd
            assert not alive_pid(old) and rt.service("etcd#2").pid != old
            assert '"errorCode":100' in get(plain_socket, etcd.addr, etcd.client_port,
                                            "/v2/keys/probe")   # Key not found
        finally:
            problems = rt.services.stop_all()
        assert problems == []
        assert not rt.service(SERVICE).running and not rt.service("etcd#2").running
        assert not _answers(plan)
    finally:
        lease.release()


def alive_pid(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"


CHILD = """
import sys
from harness.run.supervisor import run_scenario
from harness.scenario.loader import load_text
(scn,) = load_text(sys.stdin.read(), "k.yaml")
run_scenario(scn)
"""


@needs_etcd
@needs_ns
def test_a_sigkilled_run_leaves_no_etcd_or_namespace_after_the_sweep(tmp_path):
    # etcd frozen from the start: the agents sit in their rendezvous, the run is long enough
    text = (BASE + "deadline: 60\netcd: {}\nlauncher: {kind: torchrun, rdzv_backend: etcd}\n"
            "faults: [{kind: etcd_server, mode: frozen, at: 0}]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HARNESS_"))}
    env["HARNESS_TMP"] = str(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    assert child.stdin is not None
    child.stdin.write(text.encode())
    child.stdin.close()
    base = tmp_path / f"torchdist-harness-{os.geteuid()}"
    end, run, recs = time.monotonic() + 180, None, []
    while time.monotonic() < end and child.poll() is None:
        runs = list(base.glob("run-*"))
        pids = runs[0] / "pids.jsonl" if runs else None
        if pids is not None and pids.exists():
            recs = [json.loads(ln) for ln in pids.read_text().splitlines() if ln.strip()]
            names = {r.get("name") for r in recs}
            if SERVICE in names and {"agent agent:node0", "agent agent:node1"} <= names:
                run = runs[0]
                break
        time.sleep(0.05)
    if run is None:
        child.kill()
        assert child.stdout is not None
        pytest.fail("the run never had etcd and both agents: " +
                    child.stdout.read().decode(errors="replace")[-3000:])
    etcd_rec = next(r for r in recs if r.get("name") == SERVICE)
    assert alive(etcd_rec)
    state = topology.STATE_DIR / f"thx-{run.name[len('run-'):]}.json"
    namespaces = json.loads(state.read_text())["namespaces"]
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    # the death signal (SIGKILL) takes etcd along, frozen or not; the next run's sweep of
    # the run directory is the second net
    from harness.machine.rundir import sweep

    sweep(base)
    end = time.monotonic() + 30
    while time.monotonic() < end and any(alive(r) for r in recs):
        time.sleep(0.05)
    assert [r["pid"] for r in recs if alive(r)] == []
    topology.sweep()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in listed for ns in namespaces)
    assert not run.exists()          # its data directory went with the run directory


# ---- the causes of agents on a rendezvous service (harness.diagnose, pure) --------------------

def _agents_run(agent_outcome: str, worker_outcome: str, exception: Any = None,
                backend: str = "etcd") -> Any:
    from harness.judge.classify import Verdict
    from harness.judge.diagnose import explain_run
    from harness.judge.observation import RunObservation, StepRecord

    argv = ["-m", "torch.distributed.run", "--rdzv-backend", backend, "--rdzv-endpoint",
            "10.0.0.254:2400", "-m", "harness.ranks.worker", "{}"]
    run = RunObservation.from_dict({
        "plan": {"ranks": [{"label": "agent:node0", "argv": argv}]}, "ranks": [],
        "torch_version": "2.13.0+cpu", "wall": 40.0, "run_dir": "/tmp/r", "t0": 0.0,
        "step_log": [StepRecord("run#1", "run", "do", "start etcd on host etcd", "host etcd",
                                0.0).to_dict(),
                     StepRecord("etcd_server#0.1", "etcd_server", "do",
                                "etcd frozen (SIGSTOP)", "host etcd", 6.1).to_dict()],
        "port_owners": [], "rules": {}, "counters": {}})
    agent = Verdict("agent:node0", agent_outcome, "workers", 40.0 if agent_outcome == "hang"
                    else 9.0, exception=exception, role="agent", reason="its reason")
    worker = Verdict("0", worker_outcome, "exit", 8.5, role="worker", node="agent:node0",
                     reason="worker reason")
    return explain_run(run, [agent, worker])


def test_an_agent_hung_after_its_workers_ended_ok_says_so_and_names_the_fault():
    agent, _ = _agents_run("hang", "ok")
    assert agent.cause.startswith("hung after all its workers had ended ok: ranks 0; the "
                                  "faults did: etcd frozen (SIGSTOP) at 6.1 s"), agent.cause


def test_an_agent_failed_after_its_workers_ended_ok_names_its_exception():
    agent, _ = _agents_run("error", "ok", exception="RendezvousConnectionError")
    assert agent.cause.startswith("error (RendezvousConnectionError) after all its workers "
                                  "had ended ok"), agent.cause


def test_an_agent_whose_rendezvous_service_was_faulted_says_which_and_when():
    agent, _ = _agents_run("error", "crash", exception="EtcdConnectionFailed",
                           backend="etcd-v2")
    assert agent.cause == "EtcdConnectionFailed: its rendezvous service (etcd-v2 at " \
        "10.0.0.254:2400) was faulted: etcd frozen (SIGSTOP) at 6.1 s", agent.cause


def test_a_c10d_agent_is_not_blamed_on_a_service():
    agent, _ = _agents_run("error", "crash", exception="RendezvousConnectionError",
                           backend="c10d")
    assert "rendezvous service" not in agent.cause


def test_an_agent_that_raised_itself_is_blamed_on_the_service_even_if_its_worker_erred():
    # watched: the other agent's SIGTERM killed a worker, this agent's worker saw gloo's reset
    # (error), and this agent raised RendezvousConnectionError at its own poll
    agent, _ = _agents_run("error", "error", exception="RendezvousConnectionError",
                           backend="etcd-v2")
    assert "its rendezvous service (etcd-v2 at 10.0.0.254:2400) was faulted" in agent.cause


def test_a_slow_etcd_is_stopped_most_of_the_time_and_runs_after_the_heal(tmp_path):
    """mode slow: the duty cycle really stops etcd (the kernel's state, sampled) and the heal
    leaves it running and answering."""
    from harness.machine.ports import PortLease

    single = "name: e\nabout: etcd\nworld_size: 2\ntimeout: 5\nworkload: [barrier]\n"
    (scn,) = load_text(single + "etcd: {host: loopback}\n"
                       "launcher: {kind: torchrun, rdzv_backend: etcd}\n"
                       "faults: [{kind: etcd_server, mode: slow, stopped_ms: 300, "
                       "running_ms: 50, at: 1}]\n", "e.yaml")
    lease = PortLease()
    try:
        plan = make_plan(scn, str(tmp_path), lease.take, netns=False, run_id="t3")
        rt = ServiceRuntime(tmp_path, plan)
        try:
            (up,) = [s for s in plan.steps if type(s).__name__ == "EtcdUp"]
            up.do(rt)
            (slow,) = [s for s in plan.steps if s.fault == "etcd_server"]
            assert slow.do(rt) == {"stopped_ms": 300, "running_ms": 50}
            pid = rt.service(SERVICE).pid
            states = []
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                states.append(Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0])
                time.sleep(0.01)
            stopped = states.count("T") / len(states)
            assert stopped > 0.5, (stopped, len(states))   # 300 of every 350 ms, loosely
            slow.undo(rt)
            assert Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "T"
            end = time.monotonic() + 15
            while not _answers(plan) and time.monotonic() < end:
                time.sleep(0.1)
            assert _answers(plan)
        finally:
            assert rt.services.stop_all() == []
    finally:
        lease.release()

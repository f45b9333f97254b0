"""The catalog across a real allocation's nodes (--harness-launcher slurm): the pure parts (what
is skipped and why, the plan on an allocation, srun's command line), the node's task helper
run for real on this machine (the start line, signals, its end mirrored, the supervisor's
heartbeat lost), and real runs inside an allocation of the harness's own Slurm test cluster:
a Slurm scenario's task 0 is a user in that allocation and runs pytest / harness run with
--harness-launcher slurm across its two nodes. The real runs skip, naming what is missing,
where Slurm or root is not there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from harness.core.protocol import GO_LINE
from harness.launchers import slurm_job
from harness.net import topology
from harness.run.plan import make_plan
from harness.scenario.loader import load_text
from harness.services import slurm as svc
from harness.tools import allocation_catalog as allocation
from harness.tools.allocation_catalog import Allocation, adapt, unsupported

ROOT = Path(__file__).resolve().parent.parent
ALLOC = Allocation("77", ("cn1", "cn2"))


def scenario(text: str, extra: str = "", name: str = "s.yaml"):
    (scn,) = load_text(textwrap.dedent(text) + textwrap.dedent(extra), name)
    return scn


def cases(text: str, extra: str, name: str = "s.yaml"):
    return {s.case: s for s in load_text(textwrap.dedent(text) + textwrap.dedent(extra),
                                         name)}


BASE = """\
    name: s
    about: a case across an allocation
    timeout: 5
    deadline: 30
"""


# -- the pure parts ---------------------------------------------------------------------------
def test_what_needs_root_or_namespaces_is_skipped_with_the_reason():
    by = cases(BASE, """\
    cases:
      plain: {}
      firewall:
        hosts: [{name: a}, {name: b}]
        faults: [{kind: firewall, host: b, ports: master}]
      proxy_front:
        faults: [{kind: reset_peer, placement: front, traffic: store}]
      own_name:
        hosts: [{name: a, hostname: trainer-0}, {name: b}]
      dns:
        hosts: [{name: a}, {name: b}]
        dns: {domain: cluster.test, records: {master: a}}
      torchrun:
        launcher: torchrun
      memory:
        faults: [{kind: memory_limit, rank: 1, mb: 400}]
      port_holder:
        faults: [{kind: busy_port}]
      file_store:
        init: file
      signals:
        faults: [{kind: kill_rank, rank: 1, phase: init}, {kind: delayed_rank, delay: 1}]
    """)
    why = {k: unsupported(s, ALLOC) for k, s in by.items()}
    assert why["plain"] is None and why["signals"] is None
    assert why["firewall"] == ("firewall: needs root on the allocation's nodes (the harness's "
                               "own network namespaces, nftables and tc); a real allocation "
                               "gives neither")
    assert why["proxy_front"].startswith("reset_peer: the fault proxy is a service of the "
                                         "harness beside the ranks")
    assert why["own_name"].startswith("host a: hostname makes it a machine of the harness's")
    assert why["dns"].startswith("dns: the run's own name server")
    assert why["torchrun"].startswith("launcher torchrun is not built for an allocation's")
    assert why["memory"].startswith("memory_limit: the limit (a cgroup, or RLIMIT_AS")
    assert why["port_holder"].startswith("busy_port: its port holder is a process")
    assert why["file_store"].startswith("init: file puts torch's FileStore")


def test_fewer_nodes_than_hosts_is_skipped_naming_both_counts():
    scn = scenario(BASE, "hosts: [{name: a}, {name: b}, {name: c}]\n")
    assert unsupported(scn, ALLOC) == ("the scenario has 3 hosts and allocation 77 has 2 nodes "
                                       "(cn1, cn2): one node per host")
    assert unsupported(scn, Allocation("78", ("x",))).endswith("has 1 node (x): one node per "
                                                               "host")


def test_a_fault_kind_that_never_said_is_skipped_not_run():
    from typing import Literal

    from harness.faults import Fault

    class Quiet(Fault):
        kind: Literal["quiet_test_kind"] = "quiet_test_kind"

        def apply(self, plan, scn):
            pass

    class Net(Quiet):
        needs_netns = True

    assert Quiet().allocation_problem(None) == (
        "the fault kind quiet_test_kind does not say that it works on a real allocation's "
        "nodes (its class's ON_ALLOCATION)")
    assert Net().allocation_problem(None).startswith("needs root on the allocation's nodes")


# that every built-in kind says whether it works there: tests/test_registries.py


def _plan(scn, alloc=ALLOC):
    ports = iter(range(30000, 30100))
    return make_plan(adapt(scn, alloc), "/shared/run-x", lambda: next(ports), run_id="x",
                     allocation=alloc)


def test_a_direct_scenario_becomes_one_task_per_rank_on_its_hosts_nodes():
    plan = _plan(scenario(BASE, """\
        hosts: [{name: a, ranks: 2}, {name: b, ranks: 2}]
        master_host: b
        faults: [{kind: wrong_port, ranks: [3]}]
    """))
    assert not plan.netns and plan.allocation == {"job": "77", "nodes": ["cn1", "cn2"],
                                                  "shared_dir": ""}
    # host i (the master host first) is node i; MASTER_ADDR is the master's node
    assert {h.name: h.addr for h in plan.hosts} == {"a": "cn2", "b": "cn1"}
    assert [(r.label, r.host) for r in plan.ranks] == [("0", "b"), ("1", "b"), ("2", "a"),
                                                       ("3", "a")]
    assert {r.env["MASTER_ADDR"] for r in plan.ranks} == {"cn1"}
    assert plan.ranks[3].env["MASTER_PORT"] != plan.ranks[0].env["MASTER_PORT"]
    # no resolver view and no interface of the harness's: the nodes' own
    assert all(r.resolver_view == "" and "GLOO_SOCKET_IFNAME" not in r.env for r in plan.ranks)
    assert not [s for s in plan.steps if s.fault == "run"]
    assert plan.launcher.srun_argv(plan) == [
        "srun", "--overlap", "--overcommit", "--jobid=77", "--job-name=harness-x", "-N2",
        "-n4", "--ntasks-per-node=2", "--nodelist=cn1,cn2"]
    assert plan.to_dict()["launcher"] == {"kind": "allocation", "job_id": "77",
                                          "nodes": ["cn1", "cn2"], "inner": "direct"}


def test_a_single_host_case_keeps_its_loopback_master_on_one_node():
    plan = _plan(scenario(BASE))
    assert [h.addr for h in plan.hosts] == ["cn1"]
    assert {r.env["MASTER_ADDR"] for r in plan.ranks} == {"127.0.0.1"}
    assert plan.launcher.srun_argv(plan)[-4:] == ["-N1", "-n2", "--ntasks-per-node=2",
                                                  "--nodelist=cn1"]


def test_a_slurm_scenario_runs_its_srun_options_and_task_script_on_the_nodes():
    scn = scenario("""\
        name: s
        about: a Slurm job
        hostnames: own
        hosts: [{name: node0}, {name: node1}]
        launcher: {kind: slurm, kill_on_bad_exit: false, interface: lo}
    """)
    plan = _plan(scn)
    (srun,) = plan.ranks
    spec = json.loads(srun.argv[-1])
    assert srun.label == "parent:srun" and spec["tasks"] == 2
    assert spec["srun"] == ["srun", "--overlap", "--overcommit", "--jobid=77",
                            "--job-name=harness-x", "-N2", "-n2", "--ntasks-per-node=1",
                            "--nodelist=cn1,cn2", "--job-name=harness", "--unbuffered",
                            "--kill-on-bad-exit=0"]
    assert spec["helper"][1:] == ["-m", "harness.launchers.alloc_task", "/shared/run-x"]
    assert 'RANK="$SLURM_PROCID"' in spec["script"] and "SLURM_CONF" not in srun.env
    assert srun.env["GLOO_SOCKET_IFNAME"] == "lo"
    assert not any(isinstance(s, type) or type(s).__name__ == "SlurmUp" for s in plan.steps)


def test_srun_started_inside_a_step_does_not_take_the_steps_variables_for_options(monkeypatch):
    from harness.launchers.allocation import srun_env

    for k, v in (("SLURM_JOB_ID", "77"), ("SLURM_JOB_NODELIST", "cn[1-2]"),
                 ("SLURM_NTASKS", "2"), ("SLURM_NTASKS_PER_NODE", "1"), ("SLURM_STEP_ID", "0"),
                 ("SLURM_CPUS_PER_TASK", "4"), ("SLURM_PROCID", "0"),
                 ("SLURM_SRUN_COMM_PORT", "4000"), ("HARNESS_SUPERVISOR", "1:2")):
        monkeypatch.setenv(k, v)
    env = srun_env()
    assert (env["SLURM_JOB_ID"], env["SLURM_JOB_NODELIST"]) == ("77", "cn[1-2]")
    assert not [k for k in env if k in ("SLURM_NTASKS", "SLURM_NTASKS_PER_NODE",
                                        "SLURM_CPUS_PER_TASK", "SLURM_PROCID")
                or k.startswith(("SLURM_STEP", "SLURM_SRUN", "HARNESS_"))]


def test_on_an_allocation_srun_names_the_step_not_the_jobs_end():
    text = slurm_job.summary(7, {}, {"1": {"node": "cn2", "how": "Exited with exit code 7"}},
                             ["srun: error: cn2: task 1: Exited with exit code 7"],
                             step="77.4")
    assert text.splitlines()[0] == ("srun exited with status 7; step 77.4 of the allocation "
                                    "(its job goes on); task 1 on cn2: Exited with exit code 7")


def test_outside_an_allocation_both_front_doors_say_so(monkeypatch, tmp_path, capsys):
    from harness.cli import main

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOBID", raising=False)
    with pytest.raises(allocation.NotInAllocation, match="SLURM_JOB_ID is not set"):
        allocation.current()
    f = tmp_path / "scenarios" / "h.yaml"
    f.parent.mkdir()
    f.write_text(textwrap.dedent(BASE))
    rc = main(["run", str(f), "--launcher", "slurm", "--no-progress"])
    out = capsys.readouterr()
    assert rc == 4 and "SLURM_JOB_ID is not set: run it under salloc" in out.out + out.err


def test_a_shared_run_directory_of_another_machine_is_never_swept(tmp_path):
    from harness.machine import rundir

    base = rundir.shared_base(str(tmp_path))
    mine = rundir.RunDir(base, shared=True)
    theirs = base / "run-elsewhere"
    theirs.mkdir()
    (theirs / "owner.json").write_text(json.dumps({"pid": 1, "start_time": 1, "boot_id": "x",
                                                   "host": "another-login-node"}))
    dead = base / "run-deadhere"
    dead.mkdir()
    (dead / "owner.json").write_text(json.dumps({"pid": 1, "start_time": 1, "boot_id": "x"}))
    removed = rundir.sweep(base)
    assert removed == ["run-deadhere"] and theirs.exists() and mine.path.exists()
    mine.remove()


class _Run:
    """What a RemoteProcess asks of its case's run (srun still going)."""

    def __init__(self, alloc: Path):
        self.alloc, self.steps = alloc, []

    def saw_step(self, step):
        self.steps.append(step)

    def srun_gone_for(self):
        return None


def test_a_remote_ranks_event_times_are_placed_on_the_supervisors_clock(tmp_path):
    from harness.launchers import RankProcess
    from harness.launchers.allocation import RemoteProcess

    run = _Run(tmp_path)
    proc = RemoteProcess(run, "0", "t")
    events = tmp_path / "t.events"
    events.write_text(json.dumps({"ev": "phase", "t": 500.0, "phase": "init"}) + "\n")
    row = RankProcess("0", proc, events=events, stacks=tmp_path / "t.stacks", out=None,
                      err=None, now=lambda: 0.0)
    row.read_events()
    assert row.obs.events == [] and proc.running()     # its clock is not known yet: not read
    # the node's monotonic clock is 1000 s behind ours (wall clocks agree)
    node_mono = time.monotonic() - 1000.0
    (tmp_path / "t.status").write_text(
        json.dumps({"ev": "start", "mono": node_mono, "wall": time.time(), "node": "cn1",
                    "addr": "10.1.2.3", "procid": 3, "step": "77.4"}) + "\n"
        + json.dumps({"ev": "child", "mono": node_mono, "pid": 4242}) + "\n"
        + json.dumps({"ev": "exit", "mono": 600.0, "returncode": -9}) + "\n")
    assert not proc.running() and proc.returncode == -9 and proc.pid == 4242
    assert abs(proc.clock_offset - 1000.0) < 0.5 and abs(proc.end_time - 1600.0) < 0.5
    assert run.steps == ["77.4"] and proc.addr == "10.1.2.3"
    row.read_events()
    assert abs(row.obs.events[0].t - 1500.0) < 0.5 and row.obs.pid == 4242
    proc.signal_group(signal.SIGKILL)                  # it ended: no command any more
    assert (tmp_path / "t.cmd").read_text() == ""


# -- the node's task helper, for real on this machine ------------------------------------------
def _helper(tmp_path: Path, entry: dict, procid: int = 0, lost_after: float = 30,
            node: str = "cn1", on: str = "cn1") -> subprocess.Popen:
    run = tmp_path / "run"
    (run / "alloc").mkdir(parents=True, exist_ok=True)
    spec = {"mode": "ranks", "ranks": {node: [entry]}, "heartbeat": str(run / "alloc" /
                                                                          "heartbeat"),
            "lost_after": lost_after}
    (run / "alloc" / "spec.json").write_text(json.dumps(spec))
    (run / "alloc" / "heartbeat").write_text("1\n")
    tag = entry.get("tag", "x")
    (run / "alloc" / f"{tag}.cmd").write_text("")
    env = dict(os.environ, SLURMD_NODENAME=on, SLURM_PROCID=str(procid), SLURM_LOCALID="0",
               SLURM_JOB_ID="77", SLURM_STEP_ID="4", PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "harness.launchers.alloc_task", str(run)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _status(tmp_path: Path, tag: str = "x") -> list:
    path = tmp_path / "run" / "alloc" / f"{tag}.status"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def _cmd(tmp_path: Path, line: str, tag: str = "x") -> None:
    with open(tmp_path / "run" / "alloc" / f"{tag}.cmd", "a") as f:
        f.write(line + "\n")


def _wait_status(tmp_path: Path, ev: str, limit: float = 60) -> dict:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        got = [r for r in _status(tmp_path) if r["ev"] == ev]
        if got:
            return got[0]
        time.sleep(0.05)
    pytest.fail(f"the helper never wrote {ev!r}: {_status(tmp_path)}")


def _entry(tmp_path: Path, code: str, **kw) -> dict:
    run = tmp_path / "run"
    return {"label": "0", "tag": "x", "argv": [sys.executable, "-c", code],
            "env": {"PATH": os.environ["PATH"], "MY_VAR": "mine"}, "protocol": "worker",
            "events": str(run / "x.events"), "stacks": str(run / "x.stacks"),
            "out": str(run / "x.out"), "err": str(run / "x.err"), **kw}


def test_the_helper_holds_the_rank_until_go_and_ends_as_it_ended(tmp_path):
    code = ("import os, sys\n"
            "fd = int(os.environ['HARNESS_EVENT_FD'])\n"
            "os.write(fd, ('ready ' + os.environ['MY_VAR'] + ' ' + os.environ['SLURM_STEP_ID']"
            " + '\\n').encode())\n"
            "line = sys.stdin.buffer.readline()\n"
            "os.write(fd, b'got ' + line)\n"
            "print('to stdout'); sys.exit(5)\n")
    p = _helper(tmp_path, _entry(tmp_path, code))
    events = tmp_path / "run" / "x.events"
    end = time.monotonic() + 60
    while time.monotonic() < end and "ready" not in (events.read_text() if events.exists()
                                                     else ""):
        time.sleep(0.05)
    assert events.read_text() == "ready mine 4\n"        # held: no go yet
    _cmd(tmp_path, "go")
    assert p.wait(timeout=60) == 5                       # srun will see the program's status
    assert events.read_text() == "ready mine 4\ngot " + GO_LINE.decode()
    st = _status(tmp_path)
    assert [r["ev"] for r in st] == ["start", "child", "done", "exit"]
    assert st[0]["step"] == "77.4" and st[0]["node"] == "cn1" and st[-1]["returncode"] == 5
    assert "to stdout" in (tmp_path / "run" / "x.out").read_text()


def test_a_signal_command_reaches_the_rank_and_the_helper_dies_the_same_way(tmp_path):
    code = "import time\nprint('up', flush=True)\ntime.sleep(120)\n"
    p = _helper(tmp_path, _entry(tmp_path, code))
    child = _wait_status(tmp_path, "child")["pid"]
    _cmd(tmp_path, "signal TERM")
    assert p.wait(timeout=60) == -signal.SIGTERM         # "Terminated", as srun would say
    assert _wait_status(tmp_path, "exit")["returncode"] == -signal.SIGTERM
    assert not Path(f"/proc/{child}").exists()


def test_a_lost_supervisor_ends_the_rank_and_the_helper(tmp_path):
    code = "import time\ntime.sleep(120)\n"
    t0 = time.monotonic()
    p = _helper(tmp_path, _entry(tmp_path, code), lost_after=2)
    child = _wait_status(tmp_path, "child")["pid"]
    assert p.wait(timeout=60) == 1                       # the heartbeat never changed
    assert time.monotonic() - t0 < 30
    assert [r["ev"] for r in _status(tmp_path)][-2:] == ["lost", "exit"]
    assert not Path(f"/proc/{child}").exists()


def test_a_spare_task_and_an_absent_rank_run_nothing(tmp_path):
    p = _helper(tmp_path, _entry(tmp_path, "raise SystemExit(9)"), on="other-node")
    assert p.wait(timeout=60) == 0 and _status(tmp_path) == []
    p = _helper(tmp_path, _entry(tmp_path, "raise SystemExit(9)", absent=True))
    assert p.wait(timeout=60) == 0
    assert [r["ev"] for r in _status(tmp_path)] == ["start", "absent"]


# -- real runs inside an allocation of the test cluster ---------------------------------------
MISSING = svc.missing() + topology.missing()
real = pytest.mark.skipif(bool(MISSING), reason="the Slurm test cluster needs: "
                          + "; ".join(MISSING))

INNER_CASES = """\
name: alloc_extra
about: cases written for the allocation test (not the catalog's)
timeout: 5
deadline: 200
cases:
  three_hosts:
    hosts: [{name: a}, {name: b}, {name: c}]
    expect: {job: ok}
  sleepy:
    nodes: 2
    ranks_per_node: 1
    workload: [barrier, "sleep 120"]
"""


def in_allocation(out: Path, steps: list, deadline: int = 500) -> dict:
    """Bring up the test cluster (two nodes), and inside its job run ``steps`` as task 0 (a
    user in the allocation: tests/data/alloc_driver.py); return what it saw."""
    from harness.run.supervisor import run_scenario

    out.mkdir(parents=True, exist_ok=True)
    (out / "steps.json").write_text(json.dumps(steps))
    driver = Path(__file__).parent / "data" / "alloc_driver.py"
    (scn,) = load_text(textwrap.dedent(f"""\
        name: allocation
        about: a user inside an allocation of the test cluster runs the harness there
        hostnames: own
        hosts: [{{name: node0, ranks: 1}}, {{name: node1, ranks: 1}}]
        deadline: {deadline}
        launcher: slurm
        program: {{script: {driver}, args: ["{out}", "{out / 'steps.json'}"]}}
    """), "allocation.yaml")
    run = run_scenario(scn)
    result = json.loads((out / "result.json").read_text())
    assert "error" not in result, result["error"]
    assert {r.label: r.returncode for r in run.ranks}["0"] == 0
    return result


def _report_cases(path: Path) -> dict:
    rep = json.loads(path.read_text())
    return {c["id"].split("::")[-1]: c for c in rep["cases"]}


@real
def test_catalog_cases_run_across_the_allocations_nodes_with_per_rank_verdicts(tmp_path):
    out = tmp_path / "o"
    shared = out / "shared"
    mark = f"TORCHDIST_ALLOC_TEST={uuid.uuid4().hex}"
    extra = out / "scenarios" / "alloc_extra.yaml"
    extra.parent.mkdir(parents=True)
    extra.write_text(INNER_CASES)
    env = {mark.split("=")[0]: mark.split("=")[1]}
    py = sys.executable
    steps = [
        {"do": "run", "name": "pytest", "timeout": 420, "cwd": str(ROOT), "env": env,
         "argv": [py, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs",
                  "--harness-launcher", "slurm", "--harness-shared-dir", str(shared),
                  "--harness-report", str(out / "pytest.json"),
                  "--harness-evidence", str(out / "evidence"),
                  "scenarios/healthy.yaml",
                  "scenarios/slurm.yaml::slurm[healthy_tasks]",
                  "scenarios/slurm.yaml::slurm[task_exits_before_init]",
                  "scenarios/net-healthy-hosts.yaml::net_healthy_hosts[two_hosts]",
                  "scenarios/net-store-port-blocked.yaml",
                  "scenarios/kill_rank.yaml::kill_rank[worker]",
                  "scenarios/stop_rank.yaml::stop_rank[init]",
                  f"{extra}::alloc_extra[three_hosts]"]},
        {"do": "run", "name": "harness_run", "timeout": 200, "cwd": str(ROOT), "env": env,
         "argv": [py, "-m", "harness", "run", "--launcher", "slurm", "--shared-dir",
                  str(shared), "--no-progress", "--report", str(out / "run.json"),
                  "--keep", str(out / "evidence2"), "scenarios/missing_env.yaml",
                  "-k", "world_size and not rank"]},
        {"do": "look", "name": "after", "marker": mark, "state": str(shared)},
    ]
    res = in_allocation(out, steps)
    print(res["pytest"]["stdout"][-4000:], res["harness_run"]["stdout"][-2000:])
    assert res["pytest"]["rc"] == 0, res["pytest"]["stdout"][-6000:]
    got = _report_cases(out / "pytest.json")
    assert got["healthy"]["status"] == "passed"
    hosts = {r["label"]: r for r in got["healthy"]["ranks"]}
    assert {hosts[k]["outcome"] for k in "01"} == {"ok"}
    tasks = {r["label"]: r for r in got["slurm[healthy_tasks]"]["ranks"]}
    assert tasks["0"]["outcome"] == tasks["1"]["outcome"] == "ok"
    assert (tasks["0"]["host"], tasks["1"]["host"]) == ("node0", "node1")
    exits = {r["label"]: r for r in got["slurm[task_exits_before_init]"]["ranks"]}
    assert got["slurm[task_exits_before_init]"]["status"] == "passed"
    assert (exits["0"]["outcome"], exits["1"]["outcome"]) == ("timeout", "error")
    assert "step 1." in exits["parent:srun"]["message"]
    two = {r["label"]: r for r in got["net_healthy_hosts[two_hosts]"]["ranks"]}
    assert {two["0"]["host"], two["1"]["host"]} == {"a", "b"}
    assert got["net_healthy_hosts[two_hosts]"]["status"] == "passed"
    # the signals are sent on the node by its task helper; a hung rank's stacks come back
    killed = {r["label"]: r for r in got["kill_rank[worker]"]["ranks"]}
    assert got["kill_rank[worker]"]["status"] == "passed"
    assert (killed["1"]["outcome"], killed["1"]["returncode"]) == ("crash", -9)
    stopped = {r["label"]: r for r in got["stop_rank[init]"]["ranks"]}
    assert got["stop_rank[init]"]["status"] == "passed" and stopped["1"]["outcome"] == "hang"
    stacks = Path(got["stop_rank[init]"]["evidence"]) / "rank-1.stacks"
    assert "init_process_group" in stacks.read_text()
    fw = {k: c for k, c in got.items() if k.startswith("net_store_port_blocked")}
    assert fw and all(c["status"] == "skipped" for c in fw.values())
    # the file's two three-host cases do not fit the two nodes: that is said first
    three = {k for k in fw if k.endswith("_one_host]")}
    assert len(three) == 2 and len(fw) > 2
    assert all("firewall: needs root on the allocation's nodes" in c["reason"]
               for k, c in fw.items() if k not in three)
    assert all("the scenario has 3 hosts and allocation 1 has 2 nodes" in fw[k]["reason"]
               for k in three)
    assert got["alloc_extra[three_hosts]"]["status"] == "skipped"
    assert "the scenario has 3 hosts and allocation 1 has 2 nodes (node0, node1)" in \
        got["alloc_extra[three_hosts]"]["reason"]
    # the other front door
    assert res["harness_run"]["rc"] == 0, res["harness_run"]["stdout"][-4000:]
    run = _report_cases(out / "run.json")
    assert run and all(c["status"] == "passed" for c in run.values()), run.keys()
    # nothing of the runs is left: no process, no step but the test's own, no run directory
    assert res["after"]["left"] == [], res["after"]["left"]
    assert [s[0] for s in res["after"]["steps"]] == ["1.0"], res["after"]["steps"]
    assert res["after"]["runs"] == []


@real
def test_a_sigkilled_run_on_an_allocation_leaves_nothing_on_the_nodes(tmp_path):
    out = tmp_path / "o"
    shared = out / "shared"
    mark = f"TORCHDIST_ALLOC_TEST={uuid.uuid4().hex}"
    env = {mark.split("=")[0]: mark.split("=")[1]}
    extra = out / "scenarios" / "alloc_extra.yaml"
    extra.parent.mkdir(parents=True)
    extra.write_text(INNER_CASES)
    py = sys.executable
    steps = [
        {"do": "kill", "name": "killed", "cwd": str(ROOT), "env": env, "marker": mark,
         "argv": [py, "-m", "harness", "run", "--launcher", "slurm", "--shared-dir",
                  str(shared), "--no-progress", f"{extra}", "-k", "sleepy"],
         "glob": f"{shared}/*/run-*/alloc/*.status", "holds": '"cmd": "go"', "wait": 200,
         "settle": 40},
        {"do": "look", "name": "killed_left", "marker": mark, "state": str(shared)},
        {"do": "run", "name": "next_run", "timeout": 200, "cwd": str(ROOT), "env": env,
         "argv": [py, "-m", "harness", "run", "--launcher", "slurm", "--shared-dir",
                  str(shared), "--no-progress", "scenarios/healthy.yaml"]},
        {"do": "look", "name": "after", "marker": mark, "state": str(shared)},
    ]
    res = in_allocation(out, steps)
    killed = res["killed"]
    print(json.dumps(killed, indent=1)[:3000])
    assert killed["seen"], "the killed run's ranks were never released"
    names = " ".join(cmd for _, cmd in killed["before"])
    for what in ("harness run", "harness.launchers.slurm_job", "srun", "alloc_task",
                 "harness.ranks.worker"):
        assert what in names, what
    # the supervisor's SIGKILL took its job script and srun with it (death signals), Slurm
    # ended the step, the helpers their ranks: nothing of the run on the nodes
    assert killed["left"] == [], killed["left"]
    assert [s[0] for s in killed["steps"]] == ["1.0"], killed["steps"]
    assert len(res["killed_left"]["runs"]) == 1         # its directory, until the next run
    assert res["next_run"]["rc"] == 0, res["next_run"]["stdout"][-3000:]
    assert res["after"]["runs"] == [] and res["after"]["left"] == []


@real
def test_a_run_directory_a_node_cannot_see_is_refused_naming_the_node(tmp_path):
    out = tmp_path / "o"
    hidden = out / "only-on-node0"
    py = sys.executable
    steps = [
        {"do": "mount", "name": "mount", "path": str(hidden)},
        {"do": "run", "name": "run", "timeout": 200, "cwd": str(ROOT),
         "argv": [py, "-m", "harness", "run", "--launcher", "slurm", "--shared-dir",
                  str(hidden), "--no-progress", "-v",
                  "scenarios/net-healthy-hosts.yaml", "-k", "two_hosts"]},
        {"do": "umount", "name": "umount", "path": str(hidden)},
    ]
    res = in_allocation(out, steps)
    assert res["mount"]["rc"] == 0, res["mount"]
    text = res["run"]["stdout"]
    assert res["run"]["rc"] == 1, text[-3000:]
    assert "is not seen by every node of allocation 1 (node0, node1)" in text, text[-3000:]
    assert "node1 cannot read" in text and "node0 cannot read" not in text
    assert res["umount"]["rc"] == 0

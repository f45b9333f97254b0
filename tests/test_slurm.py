"""The Slurm launcher and its test cluster: the pure parts (slurm.conf, srun's command line,
the task's script, what srun's lines say), located errors, and real runs on the run's own
cluster (munged, slurmctld, one slurmd per host): a job's rows and Slurm's view, and that a
SIGKILLed run leaves nothing once the sweeps ran. The real runs skip, naming what is missing,
where Slurm or root is not there."""

from __future__ import annotations

import json
import signal
import textwrap
from pathlib import Path

import pytest
from orphans import state_dir, supervisor, wait_for

from harness.launchers import slurm_job
from harness.launchers.slurm import SRUN_LABEL, Slurm, _export
from harness.machine.procs import identity
from harness.net import topology
from harness.run.plan import make_plan
from harness.scenario.loader import ScenarioFileError, load_text
from harness.services import slurm as svc


def scenario(text: str, name: str = "s.yaml"):
    (scn,) = load_text(textwrap.dedent(text), name)
    return scn


BASE = """\
    name: s
    about: a job through the run's own Slurm
    hostnames: own
    hosts:
      - {name: node0, ranks: 1}
      - {name: node1, ranks: 1}
    timeout: 10
    deadline: 60
    workload: [barrier, all_reduce]
"""


def _plan(extra: str):
    scn = scenario(BASE + textwrap.indent(textwrap.dedent(extra), "    "))
    ports = iter(range(30000, 30100))
    return scn, make_plan(scn, "/tmp/run-x", lambda: next(ports), netns=True, run_id="x")


# -- the pure parts ---------------------------------------------------------------------------
def test_cluster_config_keeps_everything_in_the_run_directory_with_leased_ports():
    cfg = svc.ClusterConfig("/r/slurm", "harness", "node0", "node0", "10.0.0.1", 30001, 30002,
                            [svc.Node("node0", "node0", "10.0.0.1"),
                             svc.Node("node1", "trainer-1", "10.0.0.2")])
    text = cfg.text()
    assert "SlurmctldHost=node0(10.0.0.1)\n" in text
    assert "SlurmctldPort=30001\n" in text and "SlurmdPort=30002\n" in text
    assert "AuthInfo=socket=/r/slurm/munge/munge.sock\n" in text
    assert "NodeName=trainer-1 NodeAddr=10.0.0.2" in text
    assert "PartitionName=main Nodes=node0,trainer-1 " in text
    paths = [ln.split("=", 1)[1] for ln in text.splitlines()
             if ln.split("=", 1)[0].endswith(("Location", "Dir", "File"))]
    assert paths and all(p.startswith("/r/slurm/") for p in paths)
    assert "/etc/" not in text
    assert cfg.env() == {"SLURM_CONF": "/r/slurm/slurm.conf"}
    assert f"--socket={cfg.munge_socket}" in cfg.munged_argv()
    assert cfg.slurmd_argv(cfg.nodes[1])[:4] == ["slurmd", "-D", "-N", "trainer-1"]


def test_node_prefix_enters_net_and_uts_without_ip_netns_exec_and_binds_the_view(tmp_path):
    for name in ("hosts", "nsswitch.conf"):
        (tmp_path / name).write_text("")
    argv = svc.node_prefix("thx-r-node0", "/run/thx/uts/thx-r-node0", str(tmp_path), "/py")
    assert argv[:3] == ["nsenter", "--net=/run/netns/thx-r-node0",
                        "--uts=/run/thx/uts/thx-r-node0"]
    assert "ip" not in argv and "unshare" in argv and "--mount" in argv
    script = argv[argv.index("-c") + 1]
    assert f"mount --bind {tmp_path}/hosts /etc/hosts" in script
    assert f"mount --bind {tmp_path}/nsswitch.conf /etc/nsswitch.conf" in script
    assert "resolv.conf" not in script          # not in the view: not bound
    assert script.endswith('exec /py -m harness.machine.procs --exec -- "$@"')


def test_srun_gets_the_scenarios_options():
    scn, plan = _plan("""\
        launcher: {kind: slurm, ntasks_per_node: 2, kill_on_bad_exit: true, wait: 5,
                   cpus_per_task: 1, export: "NONE", args: ["--overlap"]}
    """)
    argv = scn.launcher.srun_argv(scn)
    assert argv[:3] == ["srun", "-N2", "--ntasks-per-node=2"]
    for flag in ("--kill-on-bad-exit=1", "--wait=5", "--cpus-per-task=1", "--overlap",
                 "--nodelist=node0,node1"):
        assert flag in argv
    export = next(a for a in argv if a.startswith("--export="))
    assert "PYTHONPATH" in export and "HARNESS_OBSERVE_DIR" in export and "NONE" not in export
    assert scn.launcher.rows(scn).world == 4


def test_export_keeps_the_users_variables_and_adds_the_observers():
    assert _export("ALL") == "ALL"
    got = _export("FOO=1,BAR").split(",")
    assert got[:2] == ["FOO=1", "BAR"] and "SLURM_CONF" in got


def test_the_task_script_derives_rank_world_and_master_as_users_do():
    scn, plan = _plan("launcher: slurm\n")
    script = scn.launcher.task_script(plan, scn, "/py")
    assert 'RANK="$SLURM_PROCID"' in script and 'WORLD_SIZE="$SLURM_NTASKS"' in script
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1' in script
    assert f"MASTER_PORT={plan.master_port}" in script
    scn, plan = _plan("launcher: {kind: slurm, master_addr: hostname, world_size: 3}\n")
    script = scn.launcher.task_script(plan, scn, "/py")
    assert "MASTER_ADDR=$(hostname)" in script and "WORLD_SIZE=3 " in script


def test_the_torchrun_form_runs_one_agent_per_node_with_c10d_on_the_first():
    scn, plan = _plan("launcher: {kind: slurm, form: torchrun}\n")
    script = scn.launcher.task_script(plan, scn, "/py")
    assert "-m torch.distributed.run" in script and "--rdzv-backend=c10d" in script
    assert f'--rdzv-endpoint="$MASTER_ADDR:{plan.master_port}"' in script
    assert scn.launcher.srun_argv(scn)[2] == "--ntasks-per-node=1"
    assert scn.launcher.rows(scn).agents == ["agent:node0", "agent:node1"]


def test_the_plan_starts_the_cluster_after_the_hosts_got_their_names():
    scn, plan = _plan("launcher: slurm\n")
    kinds = [type(s).__name__ for s in plan.steps]
    assert kinds[:2] == ["ShapeHosts", "SlurmUp"]
    (srun,) = plan.ranks
    assert srun.label == SRUN_LABEL and srun.role == "parent" and srun.host == "node0"
    assert srun.env["SLURM_CONF"] == "/tmp/run-x/slurm/slurm.conf"
    cfg = plan.steps[1].cluster
    assert cfg.ctld_port != cfg.slurmd_port and plan.master_port not in (cfg.ctld_port,
                                                                        cfg.slurmd_port)


def test_interface_unset_leaves_gloo_to_pick_by_the_host_name():
    _, plan = _plan("launcher: {kind: slurm, interface: unset}\n")
    (srun,) = plan.ranks
    assert "GLOO_SOCKET_IFNAME" in srun.unset and "GLOO_SOCKET_IFNAME" not in srun.env
    _, plan = _plan("launcher: slurm\n")
    assert plan.ranks[0].env["GLOO_SOCKET_IFNAME"] == "eth0"


@pytest.mark.parametrize("text,where", [
    (BASE.replace("    hostnames: own\n", "") + "    launcher: slurm\n", "hostnames: own"),
    ("    name: s\n    about: x\n    world_size: 2\n    launcher: slurm\n",
     "give the scenario hosts"),
    (BASE + "    launcher: {kind: slurm, nproc_per_node: 2}\n", "torchrun's"),
    (BASE + "    launcher: {kind: slurm, export: 'A,,B'}\n", "export"),
    (BASE + "    launcher: slurm\n    faults: [{kind: concurrent_job, delay: 1}]\n",
     "a second job beside a Slurm job is not supported"),
])
def test_a_scenario_slurm_cannot_run_is_a_located_error(text, where):
    with pytest.raises(ScenarioFileError) as e:
        scenario(text)
    assert where in str(e.value) and "s.yaml:" in str(e.value)


def test_srun_lines_give_each_tasks_exit_status():
    lines = ["srun: error: node1: task 1: Exited with exit code 7",
             "srun: launch/slurm: _step_signal: Terminating StepId=1.0",
             "srun: error: node0: task 0: Terminated",
             "srun: error: node1: tasks 2-3: Exited with exit code 1"]
    tasks = slurm_job.parse_srun(lines)
    assert tasks["1"] == {"node": "node1", "how": "Exited with exit code 7"}
    assert {t: slurm_job.task_code(v["how"]) for t, v in tasks.items()} == \
        {"0": -15, "1": 7, "2": 1, "3": 1}
    # squeue --json as Slurm 22.05.8 gave it for this job (trimmed): exit_code is the raw
    # wait status, as scontrol showed it then: "ExitCode=7:0"
    job = slurm_job.job_of({"meta": {}, "errors": [], "jobs": [
        {"job_id": 1, "job_state": "FAILED", "state_reason": "NonZeroExitCode",
         "exit_code": 1792, "derived_exit_code": 1792, "nodes": "node[0-1]"}]})
    assert job == {"JobId": "1", "JobState": "FAILED", "Reason": "NonZeroExitCode",
                   "ExitCode": "7:0", "NodeList": "node[0-1]"}
    text = slurm_job.summary(7, job, tasks, lines)
    assert text.startswith("srun exited with status 7; job 1 FAILED (NonZeroExitCode) "
                           "ExitCode=7:0; task 0 on node0: Terminated; task 1 on node1: ")
    assert text.endswith("tasks 2-3: Exited with exit code 1")


def test_slurms_json_is_read_for_jobs_and_nodes():
    from harness.services.slurm import states_of

    newest = slurm_job.job_of({"jobs": [
        {"job_id": 1, "job_state": "COMPLETED", "exit_code": 0, "nodes": "node0"},
        {"job_id": 2, "job_state": "NODE_FAIL", "state_reason": "NodeDown", "exit_code": 15,
         "nodes": "node[0-1]"}]})
    assert newest == {"JobId": "2", "JobState": "NODE_FAIL", "Reason": "NodeDown",
                      "ExitCode": "0:15", "NodeList": "node[0-1]"}    # killed by SIGTERM
    later = slurm_job.job_of({"jobs": [{"job_id": 3, "job_state": ["FAILED"], "exit_code": {
        "status": ["EXITED"], "return_code": {"number": 2}, "signal": {"id": {"number": 0}}}}]})
    assert (later["JobState"], later["ExitCode"], later["Reason"]) == ("FAILED", "2:0", "None")
    assert slurm_job.job_of({"jobs": []}) == {} and slurm_job.job_of("nonsense") == {}
    assert states_of({"nodes": [{"name": "node0", "state": "idle", "state_flags": []},
                                {"name": "node1", "state": "down",
                                 "state_flags": ["NOT_RESPONDING"]},
                                {"name": "node2", "state": ["IDLE", "DRAIN"]}]}) == \
        {"node0": "idle", "node1": "down+not_responding", "node2": "idle+drain"}


def test_the_launcher_is_registered_and_its_tools_are_in_doctor():
    from harness.run.requirements import all_requirements

    assert isinstance(scenario(BASE + "    launcher: slurm\n").launcher, Slurm)
    names = {r.name for r in all_requirements()}
    assert {"slurmctld", "slurmd", "srun", "munged", "slurm-root"} <= names


# -- real runs on the test cluster ------------------------------------------------------------
MISSING = svc.missing() + topology.missing()
real = pytest.mark.skipif(bool(MISSING), reason="the Slurm test cluster needs: "
                          + "; ".join(MISSING))


@real
def test_a_job_runs_its_tasks_as_ranks_on_their_nodes_and_keeps_slurms_view(tmp_path):
    from harness.judge.classify import classify
    from harness.run.supervisor import run_scenario

    keep = tmp_path / "kept"
    run = run_scenario(scenario(BASE + "    launcher: slurm\n"), keep=keep)
    rows = {r.label: r for r in run.ranks}
    assert set(rows) == {SRUN_LABEL, "0", "1"}
    assert (rows["0"].host, rows["1"].host) == ("node0", "node1")
    verdicts = {r.label: classify(r, run.t0) for r in run.ranks}
    assert {k: v.outcome for k, v in verdicts.items()} == \
        {SRUN_LABEL: "ok", "0": "ok", "1": "ok"}
    assert (rows[SRUN_LABEL].returncode, rows["0"].returncode, rows["1"].returncode) == (0, 0, 0)
    job = json.loads((keep / "slurm" / "job.json").read_text())
    assert job["srun_exit"] == 0 and job["job"]["JobState"] == "COMPLETED"
    (up,) = [s for s in run.step_log if s.target == "slurm"]
    assert up.error is None and up.info["nodes"] == ["node0", "node1"]
    # every daemon of the cluster went with the run
    conf = str(Path(run.run_dir) / "slurm" / "slurm.conf")
    assert not [p for p in _cmdlines() if conf in p[1]]


@real
def test_a_task_that_exits_under_kill_on_bad_exit_names_each_tasks_status(tmp_path):
    from harness.judge.classify import classify
    from harness.run.supervisor import run_scenario

    programs = Path(__file__).resolve().parents[1] / "scenarios" / "programs"
    # a program: no worker's workload or init timeout (the program has its own)
    run = run_scenario(scenario(BASE.replace("    workload: [barrier, all_reduce]\n", "")
                                .replace("    timeout: 10\n", "") + f"""\
    launcher: {{kind: slurm, kill_on_bad_exit: true}}
    program: {{script: {programs / 'slurm_task.py'}, args: ["--exit-rank", "1"]}}
"""))
    v = {r.label: classify(r, run.t0) for r in run.ranks}
    assert (v["1"].outcome, v["1"].returncode) == ("error", 7)
    assert (v["0"].outcome, v["0"].returncode) == ("crash", -15)     # srun -K: SIGTERM
    assert v[SRUN_LABEL].outcome == "error"
    assert "srun exited with status 143" in (v[SRUN_LABEL].message or "")
    assert "task 1 on node1: Exited with exit code 7" in (v[SRUN_LABEL].message or "")


@real
def test_a_hung_job_is_killed_at_the_deadline_and_its_evidence_kept_without_sockets(tmp_path):
    from harness.judge.classify import classify
    from harness.run.supervisor import run_scenario

    keep = tmp_path / "kept"
    text = BASE.replace("[barrier, all_reduce]", '[barrier, "sleep 60", all_reduce]') \
        .replace("deadline: 60", "deadline: 15") + "    launcher: slurm\n"
    run = run_scenario(scenario(text), keep=keep)
    v = {r.label: classify(r, run.t0) for r in run.ranks}
    assert {k: x.outcome for k, x in v.items()} == {SRUN_LABEL: "hang", "0": "hang", "1": "hang"}
    assert "workload step 2" in (v["0"].phase, v["1"].phase)
    assert (keep / "slurm" / "slurm.conf").is_file()
    assert (keep / "slurm" / "slurmd-node1.log").is_file()
    assert not (keep / "slurm" / "munge").exists()          # the cluster's key stays behind


def _cmdlines():
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out.append((int(d.name), (d / "cmdline").read_bytes().replace(b"\0", b" ")
                            .decode(errors="replace")))
            except OSError:
                continue
    return out


@real
def test_a_sigkilled_slurm_run_leaves_nothing_after_the_sweeps():
    import shutil
    import tempfile

    from harness.machine import rundir

    # a short state folder: munge's socket lies in the run directory (a UNIX socket path is
    # at most 107 bytes; pytest's tmp_path is too deep for it)
    tmp_path = Path(tempfile.mkdtemp(prefix="slk", dir="/tmp"))
    text = BASE.replace("[barrier, all_reduce]", '[barrier, "sleep 60", all_reduce]') + \
        "    launcher: slurm\n"
    before_ns = set(topology._list_netns())
    sup = supervisor(text, tmp_path)
    try:
        def tasks_in_workload():
            for d in state_dir(tmp_path).glob("run-*"):
                evs = list((d / "observed").glob("[0-9]*-*.events"))
                if len(evs) == 2 and all('"workload step 1"' in p.read_text() for p in evs):
                    return d
            return None

        run_dir = wait_for(tasks_in_workload, 240, "both tasks in their workload")
        ours = sorted(set(topology._list_netns()) - before_ns)
        ours = [ns for ns in ours if run_dir.name[len("run-"):] in ns]
        assert len(ours) == 3                              # node0, node1, the switch
        # every process of the run: by the run directory in its command line (munged,
        # slurmctld, slurmds, srun, the job script) or in its namespaces (slurmstepd, tasks)
        pids = {pid for pid, cmd in _cmdlines() if str(run_dir) in cmd}
        for ns in ours:
            pids |= set(topology._netns_pids(ns))
        procs = [identity(p) for p in pids]
        names = " ".join(cmd for pid, cmd in _cmdlines() if pid in pids)
        for daemon in ("munged", "slurmctld", "slurmd -D -N node0", "slurmd -D -N node1",
                       "srun", "slurmstepd", "harness.ranks.worker"):
            assert daemon in names
        sup.send_signal(signal.SIGKILL)
        sup.wait(timeout=30)
        rundir.sweep(state_dir(tmp_path))
        topology.sweep()
        from harness.machine.procs import alive

        wait_for(lambda: not any(alive(p) for p in procs), 30, "the run's processes to go")
        assert not set(topology._list_netns()) & set(ours)
        assert not run_dir.exists()
        assert str(run_dir) not in Path("/proc/mounts").read_text()
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
        assert sup.stderr is not None
        sup.stderr.close()
        shutil.rmtree(tmp_path, ignore_errors=True)


def test_a_machine_without_slurm_skips_naming_the_missing_program(monkeypatch):
    from harness.machine.requirement import Tool
    from harness.run.requirements import skip_reason

    monkeypatch.setattr(svc, "TOOLS", (Tool("slurmd-not-here", package="slurmd",
                                            why="the Slurm launcher's test cluster"),))
    scn = scenario(BASE + "    launcher: slurm\n")
    env = {"torch": "2.13.0", "distributed": True, "gloo": True}
    why = skip_reason(scn, env)
    assert why == ("launcher slurm: slurmd-not-here not found (the Slurm launcher's test "
                   "cluster): apt-get install slurmd") or "network namespaces" in (why or "")


def test_the_cluster_says_it_needs_root_when_the_harness_is_not(monkeypatch):
    import os as real_os

    class NotRoot:
        def __getattr__(self, name):
            return getattr(real_os, name)

        @staticmethod
        def geteuid():
            return 1000

    monkeypatch.setattr(svc, "os", NotRoot())     # only the probe's view of the uid
    why = svc.ROOT.missing()
    assert why is not None and "run as root" in why


def test_a_node_down_fault_needs_the_slurm_launcher_and_a_host():
    with pytest.raises(ScenarioFileError) as e:
        scenario(BASE + "    faults: [{kind: slurm_node_down, host: node1, at: 1}]\n")
    assert "only with launcher: slurm" in str(e.value)
    with pytest.raises(ScenarioFileError) as e:
        scenario(BASE + "    launcher: slurm\n"
                        "    faults: [{kind: slurm_node_down, host: node7, at: 1}]\n")
    assert "no host 'node7'" in str(e.value)
    scn, plan = _plan("launcher: slurm\nfaults: [{kind: slurm_node_down, host: node1, "
                      "at: 2, heal_after: 3}]\n")
    step = next(s for s in plan.steps if type(s).__name__ == "NodeState")
    assert (step.node, step.controller, step.trigger.at) == ("node1", "node0", 2)
    assert step.undo_trigger is not None


def _slurm_run(task1_reason: str, task1_rc: int, srun_message: str):
    from harness.judge.classify import Verdict
    from harness.judge.diagnose import explain_run
    from harness.judge.observation import RunObservation

    verdicts = [
        Verdict(SRUN_LABEL, "error", "import", 5.0, exception="SrunFailed",
                message=srun_message, reason="raised an exception", role="parent"),
        Verdict("0", "crash", "init", 4.9, returncode=-15, reason="killed by SIGTERM",
                role="worker"),
        Verdict("1", "error", "exit", 2.0, returncode=task1_rc, reason=task1_reason,
                role="worker"),
    ]
    run = RunObservation(plan={}, torch_version="2.13.0", ranks=[], wall=5.0, run_dir="/x")
    return {v.label: v for v in explain_run(run, verdicts)}


def test_diagnosis_names_the_task_that_failed_first_and_who_stopped_the_others():
    v = _slurm_run("exited with status 7", 7,
                   "srun exited with status 143; job 1 FAILED (JobLaunchFailure) ExitCode=0:15\n"
                   "srun: error: node1: task 1: Exited with exit code 7\n"
                   "srun: launch/slurm: _step_signal: Terminating StepId=1.0")
    assert v[SRUN_LABEL].cause == ("srun exited with status 143: task 1 failed first: exited "
                                   "with status 7")
    assert v["0"].cause == ("stopped by Slurm: Slurm terminated the step after task 1 failed "
                            "(exited with status 7)")
    assert v["0"].cause_evidence == ["srun: launch/slurm: _step_signal: Terminating StepId=1.0"]


def test_diagnosis_of_a_node_set_down_says_the_node_failed():
    v = _slurm_run("ended without a word (srun: Node failure on node1)", -9,
                   "srun exited with status 143; job 1 NODE_FAIL (NodeDown) ExitCode=0:15\n"
                   "srun: error: Node failure on node1")
    assert v["0"].cause == "stopped by Slurm: the node failed"
    assert v[SRUN_LABEL].cause == ("srun exited with status 143; job 1 NODE_FAIL (NodeDown) "
                                   "ExitCode=0:15 (srun: error: Node failure on node1)")


def test_a_host_with_its_own_python_runs_its_task_with_it():
    """A host's ``python:`` (another venv, a stale image) under srun: one script for every
    task, each picks its interpreter by ``$SLURMD_NODENAME`` (run here by sh)."""
    import subprocess

    scn, plan = _plan("launcher: {kind: slurm, master_addr: hostname}\n")
    script = scn.launcher.task_script(plan, scn, "/bin/true", {"node1": "/bin/echo"})
    assert script.startswith('case "$SLURMD_NODENAME" in node1) PY=/bin/echo;;')

    def run(node):
        env = {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": node, "SLURM_PROCID": "0",
               "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "1"}
        return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True,
                              timeout=30)

    on1, on0 = run("node1"), run("node0")
    assert on1.returncode == 0 and on1.stdout.startswith("-m harness.ranks.worker "), on1
    assert on0.returncode == 0 and on0.stdout == "", on0
    assert not scn.launcher.task_script(plan, scn, "/py").startswith("case")

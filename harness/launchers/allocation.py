"""Ranks started by ``srun`` across the nodes of a real Slurm allocation
(harness.tools.allocation_catalog).

No test cluster is brought up and nothing is set up on the nodes: every case is one ``srun
--overlap`` step of the allocation the supervisor runs in, and each of its tasks is the node's
task helper (:mod:`harness.launchers.alloc_task`), which runs the task's program and does on
the node what the supervisor cannot do from its own machine (release it at the start line,
signal it, take its stacks, tell how it ended). Scenario host *i* (the master host first) is
node *i* of the allocation, in Slurm's order.

* :class:`AllocDirect` (a ``launcher: direct`` scenario): tasks as ranks. The ranks are
  planned exactly as the direct launcher plans them (environment, init arguments, the worker's
  spec with what faults changed in it, a late release, an absent rank), and each task runs the
  rank of its node and local id, held until the start line like a rank the harness starts
  itself. ``srun -N<hosts> --ntasks-per-node=<most ranks on a host>``; the job script is the
  launcher's own process, not a row: the rows are the ranks, as under ``direct``.
* :class:`AllocTasks` (a ``launcher: slurm`` scenario, form tasks): the same job script
  (``parent:srun``, held, srun at the start line) and task script as on the test cluster (rank
  from ``$SLURM_PROCID``, ``MASTER_ADDR`` from ``$SLURM_JOB_NODELIST``...), with srun's options,
  over the allocation's nodes; task N is row N.

Every task's files (its status, commands, events, stacks, output) are in the run directory,
which must lie on a file system every node sees (``--harness-shared-dir``): the supervisor
checks once per process that each node used reads a file it wrote there, and refuses the run
naming the nodes that do not. Times: a task says both its clocks at its start, so the
rank's monotonic event times are placed on the supervisor's clock through the wall clocks
(nodes kept in step by NTP, as on every cluster). Cleanup: the case's own steps only, never
the allocation: a task whose helper has not said it ended gets ``scancel JOB.STEP`` (the step
id its helper reported, recorded in ``alloc/steps`` for the sweep of a killed run), and the
helpers kill their programs when the supervisor's heartbeat stops.
"""

from __future__ import annotations

import json
import os
import signal as _signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Tuple

from pydantic import Field

from ..core import protocol as P
from ..core.errors import HarnessError
from ..core.rows import RowSet
from ..machine import interrupts
from . import LauncherSpec, RankProcess, _tag, process_env
from .alloc_env import NOT_ON_NODES, STEP_PREFIXES, STEP_VARS, srun_env  # noqa: F401

HEARTBEAT = 1.0                     # the supervisor's heartbeat, seconds
LOST_AFTER = float(os.environ.get("HARNESS_ALLOC_LOST_AFTER", "30"))   # a helper gives up
END_GRACE = 5.0        # after srun ended, how long a task's last status line may take to show
CLOSE_WAIT = 20.0      # at the end, how long the tasks get to say they ended
SRUN_WAIT = 15.0       # then how long srun gets to end by itself before its step is cancelled
_SEEN: Dict[Tuple[str, Tuple[str, ...]], bool] = {}    # run-dir bases the nodes were seen to read


def srun_prefix(job_id: str, run_id: str) -> List[str]:
    """srun for a step of the case (pure): beside the allocation's other steps (``--overlap``:
    another case's under ``-n N``, the step a job script's task runs in), more tasks than the
    allocation's CPUs if need be (``--overcommit``: a rank is mostly waiting)."""
    return ["srun", "--overlap", "--overcommit", f"--jobid={job_id}",
            f"--job-name=harness-{run_id}"]


def helper_argv(run_dir: str) -> List[str]:
    """What every task of the case's step runs: the node's task helper (its program is in the
    run directory's ``alloc/spec.json``)."""
    return [sys.executable, "-m", "harness.launchers.alloc_task", run_dir]


def on_allocation(inner: Any, alloc: Any) -> LauncherSpec:
    """The allocation's launcher for a scenario's own (``direct`` or ``slurm`` form tasks)."""
    fields = {"job_id": alloc.job_id, "nodes": list(alloc.nodes), "inner": inner}
    if inner.kind == "direct":
        return AllocDirect(**fields)
    return AllocTasks(**fields)


class _OnAllocation(LauncherSpec):
    """What both forms share: the nodes, the spec file, the job script, the rows' processes."""

    kind: Literal["allocation"] = "allocation"
    job_id: str = Field(description="the allocation's job id")
    nodes: List[str] = Field(description="its nodes in Slurm's order")
    inner: Any = Field(None, exclude=True, description="the scenario's own launcher")
    summary = "srun on the nodes of the Slurm allocation the harness runs in"
    NO_RESTART = ("on an allocation's nodes every process is an srun task of one step: a "
                  "killed one is not started again (restart_after)")

    def describe(self) -> str:
        return f"allocation {self.job_id} ({self.inner.describe()})"

    def model_dump(self, **kw: Any) -> Dict[str, Any]:   # the plan's JSON: what it ran as
        d = super().model_dump(**kw)
        d["inner"] = self.inner.kind
        return d

    # -- planning (pure) ---------------------------------------------------------------------
    def host_order(self, scn: Any) -> List[str]:
        """The scenario's hosts, the master host first: host i runs on node i."""
        names = scn.host_names()
        master = scn.master_host or names[0]
        return [master] + [n for n in names if n != master]

    def node_of(self, scn: Any) -> Dict[str, str]:
        return dict(zip(self.host_order(scn), self.nodes))

    def plan_job(self, plan: Any, scn: Any, job: str, world: int, release: Any = None) -> None:
        from ..core.errors import PlanRefusal

        raise PlanRefusal("a second job on an allocation is not built (one srun step per case)")

    # -- run time ----------------------------------------------------------------------------
    def _run(self, sup: Any) -> AllocRun:
        run = next((o for o in sup.owned if isinstance(o, AllocRun)), None)
        if run is None:
            run = AllocRun(sup, self)
            sup.owned.append(run)
        return run

    def poll(self, sup: Any) -> None:
        sup.discovery.poll(sup)
        self._run(sup).poll()


class AllocDirect(_OnAllocation):
    """Tasks as ranks: a ``launcher: direct`` scenario's ranks, one srun task each."""

    STARTS_RANKS = True

    def rows(self, scn: Any, job: str = "", world: Optional[int] = None) -> RowSet:
        return RowSet(world=world or scn.world_size, job=job)

    def plan(self, plan: Any, scn: Any) -> None:
        self.inner.plan(plan, scn)
        nodes = self.node_of(scn)
        plan.notes.append(f"allocation: {' '.join(self.srun_argv(plan))} <task helper> (one "
                          "task per rank); " + ", ".join(f"{h} -> node {n}"
                                                         for h, n in nodes.items()))

    def srun_argv(self, plan: Any) -> List[str]:
        """srun for the case's ranks (pure): every host's node, as many tasks on each as the
        busiest host has ranks (a node's spare tasks exit at once)."""
        nodes = self.node_of_plan(plan)
        counts: Dict[str, int] = {}
        for rp in plan.ranks:
            counts[nodes[rp.host]] = counts.get(nodes[rp.host], 0) + 1
        used = [n for n in self.nodes if n in counts]
        most = max(counts.values())
        return srun_prefix(self.job_id, plan.run_id) + [
            f"-N{len(used)}", f"-n{len(used) * most}", f"--ntasks-per-node={most}",
            f"--nodelist={','.join(used)}"]

    def start(self, sup: Any) -> List[RankProcess]:
        run = self._run(sup)
        plan = sup.plan
        nodes = self.node_of_plan(plan)
        per_node: Dict[str, List[Dict[str, Any]]] = {}
        rows: List[RankProcess] = []
        for rp in plan.ranks:
            tag = _tag(rp.label)
            entry = run.entry(rp, tag)
            per_node.setdefault(nodes[rp.host], []).append(entry)
            if rp.absent:
                continue
            row = run.row(rp.label, tag, rp=rp, events=Path(entry["events"]),
                          stacks=Path(entry["stacks"]), out=Path(entry["out"]),
                          err=Path(entry["err"]), held=True)
            rows.append(row)
        run.launch({"mode": "ranks", "ranks": per_node}, self.srun_argv(plan), as_row=False)
        return rows

    def node_of_plan(self, plan: Any) -> Dict[str, str]:
        names = [h.name for h in plan.hosts]
        master = next((r.host for r in plan.ranks if r.rank == 0), names[0])
        order = [master] + [n for n in names if n != master]
        return dict(zip(order, self.nodes))


class AllocTasks(_OnAllocation):
    """A ``launcher: slurm`` scenario (form tasks) over the allocation: its job script and
    task script, every task a row."""

    def rows(self, scn: Any, job: str = "", world: Optional[int] = None) -> RowSet:
        rows: RowSet = self.inner.rows(scn, job, world)
        return rows

    def plan(self, plan: Any, scn: Any) -> None:
        from ..net.addresses import IFNAME_VARS
        from .slurm import SRUN_LABEL

        inner = self.inner
        nodes = self.node_of(scn)
        order = self.host_order(scn)
        env = dict(scn.env)
        unset: List[str] = []
        if inner.interface == "unset":
            for var in IFNAME_VARS:
                env.pop(var, None)
                unset.append(var)
        elif inner.interface != "link":   # link: the nodes' own, as the environment says
            for var in IFNAME_VARS:
                env[var] = inner.interface
        per_node = {nodes[h]: plan.host_python(scn, h) for h in order}
        per_node = {n: p for n, p in per_node.items() if p and p != sys.executable}
        script = inner.task_script(plan, scn, sys.executable, per_node)
        srun = inner.srun_argv(scn, [nodes[h] for h in order])
        per = inner._per_node(scn)
        srun = srun_prefix(self.job_id, plan.run_id) + [srun[1], f"-n{len(order) * per}",
                                                        *srun[2:]]
        # the job script runs srun with the task helper; each helper runs the task script
        spec = {"srun": srun, "script": script, "role": P.ROLE_WORKER,
                "export": inner.export, "tasks": len(order) * per,
                "helper": helper_argv(plan.run_dir), "out_dir": str(Path(plan.run_dir) /
                                                                    "slurm"),
                "allocation": self.job_id}
        rp = plan.new_process(label=SRUN_LABEL, rank=None, env=env,
                              init=plan.init_for(scn, 0, scn.world_size), host=order[0],
                              role=P.ROLE_PARENT, observed=True, cwd=scn.program_cwd(),
                              argv=["-m", "harness.launchers.slurm_job", json.dumps(spec)],
                              unset=unset)
        plan.add_process(rp)
        plan.notes.append(f"allocation: {' '.join(srun)} <task helper> sh -c '<task script>'; "
                          + ", ".join(f"{h} -> node {n}" for h, n in nodes.items()))

    def start(self, sup: Any) -> List[RankProcess]:
        from . import start_process

        run = self._run(sup)
        rp = sup.plan.ranks[0]
        spec = json.loads(rp.argv[-1])
        tasks: List[Dict[str, Any]] = []
        for i in range(int(spec["tasks"])):
            label = str(i)
            tag = f"task-{i}"
            events = run.observe / f"{tag}.events"
            entry = {"label": label, "tag": tag, "protocol": "observed", "held": False,
                     "argv": ["sh", "-c", spec["script"]], "cwd": rp.cwd or "/",
                     "events": str(events), "stacks": str(events.with_suffix(".stacks")),
                     "out": str(run.slurm / f"{tag}.out"),
                     "err": str(run.slurm / f"{tag}.err"), "role": P.ROLE_WORKER,
                     "observe_dir": str(run.observe)}
            tasks.append(entry)
        run.launch({"mode": "tasks", "tasks": tasks}, [], as_row=True)
        out = [start_process(sup, rp)]
        for entry in tasks:
            run.row(entry["label"], entry["tag"], rp=None, events=Path(entry["events"]),
                    stacks=Path(entry["stacks"]), out=Path(entry["out"]),
                    err=Path(entry["err"]), held=False, role=P.ROLE_WORKER)
        return out


class RemoteProcess:
    """A row's process on an allocation's node, as its task helper reports it (the
    :class:`harness.machine.procs.ManagedProcess` interface the supervisor uses). It runs until its
    helper said it ended, or srun ended and a few seconds passed without that word (the
    status srun gave the task is then its end); signals and stack dumps are commands to the
    helper."""

    remote = True

    def __init__(self, run: AllocRun, label: str, tag: str):
        self.run = run
        self.label = label
        self.name = f"task {label}"
        self.status_path = run.alloc / f"{tag}.status"
        self.cmd_path = run.alloc / f"{tag}.cmd"
        self.cmd_path.write_text("")
        self.pid: Optional[int] = None
        self.returncode: Optional[int] = None
        self.node: Optional[str] = None
        self.addr = ""                              # its node's name resolved there
        self.procid: Optional[int] = None
        self.step: Optional[str] = None
        self.clock_offset: Optional[float] = None   # node monotonic + this = ours
        self.end_time: Optional[float] = None       # on our monotonic clock
        self.error = ""
        self.lost = False
        self.absent = False
        self._ended = False
        self._offset = 0
        self._partial = b""

    def refresh(self) -> None:
        try:
            with open(self.status_path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            ev = rec.get("ev")
            if ev == "start":
                self.node, self.procid = rec.get("node"), rec.get("procid")
                self.addr = str(rec.get("addr") or "")
                self.step = rec.get("step")
                self.clock_offset = (float(rec["wall"]) - float(rec["mono"])) - \
                    (time.time() - time.monotonic())
                self.run.saw_step(self.step)
            elif ev == "child":
                self.pid = int(rec["pid"])
            elif ev == "absent":
                self.absent, self._ended = True, True
            elif ev == "error":
                self.error = str(rec.get("message", ""))
            elif ev == "lost":
                self.lost = True
            elif ev == "exit":
                self.returncode = rec.get("returncode")
                self.end_time = float(rec["mono"]) + (self.clock_offset or 0.0)
                self._ended = True

    def running(self) -> bool:
        if self._ended:
            return False
        self.refresh()
        if self._ended:
            return False
        gone = self.run.srun_gone_for()
        if gone is not None and gone > END_GRACE:
            self._ended = True
            self.returncode = self.run.task_code(self.procid)
            self.end_time = None
            return False
        return True

    def poll(self) -> Optional[int]:
        return None if self.running() else self.returncode

    def command(self, line: str) -> None:
        if self._ended:
            return
        try:
            with open(self.cmd_path, "a") as f:
                f.write(line + "\n")
        except OSError:
            pass

    def signal_group(self, sig: int) -> None:
        self.command(f"signal {_signal.Signals(sig).name[3:]}")

    def dump_stacks(self) -> None:
        self.command("stacks")

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        end = time.monotonic() + (30.0 if timeout is None else timeout)
        while self.running() and time.monotonic() < end:
            time.sleep(0.05)
        return self.returncode

    def kill(self) -> None:
        """SIGKILL by its helper; the run's closer waits for every task at once."""
        self.signal_group(_signal.SIGKILL)

    stop = kill

    def failure(self) -> str:
        """Why it never became ready, in Slurm's and the helper's words ("" if not known)."""
        if self.error:
            return self.error
        if self.run.srun_gone_for() is not None:
            lines = self.run.srun_lines()
            said = "; ".join(lines[-6:]) if lines else "srun said nothing"
            if self.node is None:
                return (f"its task never started (srun exited with status "
                        f"{self.run.srun_status()}: {said})")
        return ""


class _Go:
    """The start line of a remote rank: the ``go`` command to its helper."""

    def __init__(self, proc: RemoteProcess):
        self.proc = proc

    def write(self, _data: bytes) -> None:
        self.proc.command("go")

    def close(self) -> None:
        pass


class _Heartbeat:
    """The supervisor's heartbeat file, rewritten every second by a daemon thread; the task
    helpers kill their programs when it stops changing (the supervisor was killed)."""

    def __init__(self, path: Path):
        self.path = path
        self.stop = threading.Event()
        self.beat()
        self.thread = threading.Thread(target=self._loop, name="alloc-heartbeat", daemon=True)
        self.thread.start()

    def beat(self) -> None:
        try:
            self.path.write_text(f"{time.time():.3f} {os.getpid()}\n")
        except OSError:
            pass

    def _loop(self) -> None:
        while not self.stop.wait(HEARTBEAT):
            self.beat()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


class AllocRun:
    """One case's life on the allocation (kept in ``Supervisor.owned``): the files the tasks
    read, the heartbeat, the job script, the rows' remote processes; closed after the rows
    were killed: waits for the tasks to say they ended, cancels the case's step when they do
    not, stops srun, and the heartbeat last."""

    def __init__(self, sup: Any, launcher: _OnAllocation):
        self.sup = sup
        self.launcher = launcher
        self.dir: Path = sup.dir
        self.alloc = self.dir / "alloc"
        self.slurm = self.dir / "slurm"
        self.observe = sup.observe_dir
        for d in (self.alloc, self.slurm, self.observe):
            d.mkdir(exist_ok=True)
        self.procs: List[RemoteProcess] = []
        self.steps: List[str] = []
        self.job: Any = None              # the job script: a ManagedProcess, or a row's
        self.job_row: Optional[RankProcess] = None
        self._gone_at: Optional[float] = None
        self._record: Optional[Dict[str, Any]] = None
        self.heartbeat: Optional[_Heartbeat] = None
        self.closed = False
        # node -> scenario host (host i is node i, the master host first)
        self.hosts = {h.machine.hostname: h.name for h in sup.plan.hosts if h.machine.hostname}

    # -- before srun -------------------------------------------------------------------------
    def srun_prefix(self) -> List[str]:
        return srun_prefix(self.launcher.job_id, self.sup.plan.run_id)

    def entry(self, rp: Any, tag: str) -> Dict[str, Any]:
        """What the task of planned rank ``rp`` runs (harness.launchers.alloc_task)."""
        sup = self.sup
        paths = {k: str(self.dir / f"rank-{tag}.{k}") for k in ("events", "stacks", "out",
                                                              "err")}
        if rp.observed:
            paths["events"] = str(self.observe / f"{tag}.events")
            paths["stacks"] = str(self.observe / f"{tag}.stacks")
            full = process_env(rp, {P.OBSERVE_ROLE_ENV: rp.role,
                                    P.OBSERVE_DIR_ENV: str(self.observe),
                                    P.OBSERVE_JOB_ENV: rp.job}, state=self.dir.parent)
            argv = [rp.python or sys.executable, *rp.argv]
        else:
            full = process_env(rp, state=self.dir.parent)
            argv = [rp.python or sys.executable, "-m", "harness.ranks.worker",
                    sup.plan.worker_spec(rp).to_json()]
        # the task's own environment is srun's (this machine's, exported, with what Slurm
        # sets per task on its node: its SLURM_* variables, a GPU binding): the rank gets it
        # with only what the plan makes different, as on one machine
        base = srun_env()
        env = {k: v for k, v in full.items() if base.get(k) != v and k not in NOT_ON_NODES
               and not k.startswith("SLURM")}
        unset = sorted({k for k in base if k not in full and not k.startswith("SLURM")}
                       | set(rp.unset) | set(NOT_ON_NODES))
        return {"label": rp.label, "tag": tag, "argv": argv, "env": env, "unset": unset,
                "protocol": "observed" if rp.observed else "worker", "held": True,
                "cwd": rp.cwd or "/", "absent": rp.absent, "role": rp.role, **paths}

    def row(self, label: str, tag: str, *, rp: Any, events: Path, stacks: Path, out: Path,
            err: Path, held: bool, role: Optional[str] = None) -> RankProcess:
        sup = self.sup
        proc = RemoteProcess(self, label, tag)
        for path in (events, stacks):
            path.touch()
        host = rp.host if rp is not None else sup.plan.hosts[0].name
        row = RankProcess(label, proc, events=events, stacks=stacks, out=out, err=err,
                          now=sup.now, host=host, addr=sup.addr_of(host), plan=rp,
                          role=role or (rp.role if rp is not None else P.ROLE_RANK),
                          go=_Go(proc) if held else None, held=held)
        self.procs.append(proc)
        sup.ranks.append(row)
        return row

    def launch(self, spec: Dict[str, Any], srun: List[str], as_row: bool) -> None:
        """Write the tasks' spec, start the heartbeat, check that the nodes see the run
        directory, then (``as_row`` False) start the job script that runs srun now; with
        ``as_row`` the job script is the plan's own row (parent:srun), started by the
        launcher as every planned process."""
        spec = dict(spec, heartbeat=str(self.alloc / "heartbeat"), lost_after=LOST_AFTER)
        (self.alloc / "spec.json").write_text(json.dumps(spec))
        self.heartbeat = _Heartbeat(self.alloc / "heartbeat")
        self.check_nodes_see()
        if as_row:
            return
        from ..machine.procs import ManagedProcess

        job = {"srun": srun, "helper": helper_argv(str(self.dir)),
               "out_dir": str(self.slurm), "allocation": self.launcher.job_id,
               "role": "", "export": None}
        log = os.open(self.slurm / "job.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            with interrupts.shield():   # a process that exists is a process that is tracked
                self.job = ManagedProcess(
                    [sys.executable, "-m", "harness.launchers.slurm_job", json.dumps(job)],
                    name="job script (srun)", record=self.sup.rundir.pids,
                    env=srun_env(), cwd=str(self.dir), stdout=log, stderr=log)
        finally:
            os.close(log)

    def check_nodes_see(self) -> None:
        """Once per process and run-directory base: every node of the allocation used reads
        a file the supervisor wrote there (else the tasks could neither read their spec nor
        report); a HarnessError naming the nodes that cannot."""
        nodes = tuple(self.launcher.nodes[:len(self.sup.plan.hosts)])
        key = (str(self.dir.parent), nodes)
        if _SEEN.get(key):
            return
        marker = self.dir / "owner.json"
        argv = self.srun_prefix()[:4] + [
            "--job-name=harness-check", f"-N{len(nodes)}", f"-n{len(nodes)}",
            "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", "--kill-on-bad-exit=0",
            "sh", "-c", f'test -r {_q(str(marker))} || {{ echo "$SLURMD_NODENAME cannot '
            f'read {marker}" >&2; exit 3; }}']
        try:
            p = subprocess.run(argv, env=srun_env(), capture_output=True, text=True,
                               timeout=120, start_new_session=True)
        except subprocess.TimeoutExpired:
            raise HarnessError(f"srun did not start the check that the allocation's nodes see "
                               f"{self.dir.parent} within 120 s (is the allocation busy?)"
                               ) from None
        if p.returncode != 0:
            said = [ln for ln in (p.stderr + p.stdout).splitlines() if ln.strip()][-6:]
            raise HarnessError(
                f"the run directory's folder {self.dir.parent} is not seen by every node of "
                f"allocation {self.launcher.job_id} ({', '.join(nodes)}): "
                f"{'; '.join(said) or f'srun exited with status {p.returncode}'}: give a "
                "folder on a file system every node mounts (--harness-shared-dir DIR, or "
                "HARNESS_TMP)")
        _SEEN[key] = True

    # -- while it runs -------------------------------------------------------------------------
    def saw_step(self, step: Optional[str]) -> None:
        if step and step not in self.steps:
            self.steps.append(step)
            try:
                with open(self.alloc / "steps", "a") as f:
                    f.write(step + "\n")
            except OSError:
                pass

    def _job_proc(self) -> Any:
        if self.job is not None:
            return self.job
        if self.job_row is None:
            from .slurm import SRUN_LABEL

            self.job_row = next((r for r in self.sup.ranks if r.label == SRUN_LABEL), None)
        return self.job_row.proc if self.job_row is not None else None

    def srun_gone_for(self) -> Optional[float]:
        """Seconds since the job script (srun) ended; None while it runs (or never ran)."""
        if self._gone_at is not None:
            return time.monotonic() - self._gone_at
        proc = self._job_proc()
        if proc is None or proc.poll() is None:
            return None
        self._gone_at = time.monotonic()
        return 0.0

    def record(self) -> Dict[str, Any]:
        if self._record is None and self.srun_gone_for() is not None:
            try:
                self._record = json.loads((self.slurm / "job.json").read_text())
            except (OSError, ValueError):
                self._record = {}
        return self._record or {}

    def srun_lines(self) -> List[str]:
        lines = self.record().get("srun_lines") or []
        if not lines:
            try:
                lines = (self.slurm / "job.log").read_text(errors="replace").splitlines()
            except OSError:
                lines = []
        return [str(ln) for ln in lines if str(ln).strip()]

    def srun_status(self) -> Any:
        return self.record().get("srun_exit", "unknown")

    def task_code(self, procid: Optional[int]) -> Optional[int]:
        """The exit status srun gave task ``procid`` (0 when srun exited 0), else None."""
        from .slurm_job import task_code

        rec = self.record()
        if procid is None or not rec:
            return None
        how = ((rec.get("tasks") or {}).get(str(procid)) or {}).get("how")
        if how:
            return task_code(how)
        return 0 if rec.get("srun_exit") == 0 else None

    def poll(self) -> None:
        """The rows' helpers' news: where each runs (its node's host and address, what gloo
        names it by), what its observed program said first (its ``hello``, as a row found
        through its events gets it)."""
        for row in self.sup.ranks:
            p = row.proc
            if not isinstance(p, RemoteProcess):
                continue
            if not p._ended:
                p.refresh()
            if p.addr and row.obs.addr != p.addr:
                row.obs.addr = p.addr
            if p.node and p.node in self.hosts and row.obs.host != self.hosts[p.node]:
                row.obs.host = self.hosts[p.node]
            if not row.obs.info:
                hello = next((e for e in row.obs.events if e.ev == P.HELLO), None)
                if hello is not None:
                    row.obs.info = dict(hello.data)

    # -- the end -------------------------------------------------------------------------------
    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        end = time.monotonic() + CLOSE_WAIT
        # no job script ever started (the run was refused before srun): no task to wait for
        never = self._job_proc() is None
        waiting = [] if never else [p for p in self.procs if p.running()]
        while waiting and time.monotonic() < end:
            time.sleep(0.05)
            waiting = [p for p in waiting if p.running()]
        job = self._job_proc()
        # srun ends by itself once its tasks did (the step's completion takes a moment)
        end = time.monotonic() + (0 if waiting else SRUN_WAIT)
        while job is not None and job.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        if job is not None and job.poll() is None or waiting:
            self.cancel()
        if job is not None and job.poll() is None:
            end = time.monotonic() + 15
            while job.poll() is None and time.monotonic() < end:
                time.sleep(0.05)
            job.kill()
        if self.heartbeat is not None:
            self.heartbeat.close()

    def cancel(self) -> None:
        """``scancel JOB.STEP`` for each step of this case (never the allocation)."""
        for step in self.steps:
            if step.split(".")[0] == self.launcher.job_id and step.split(".")[-1].isdigit():
                subprocess.run(["scancel", "--quiet", step], env=srun_env(),
                               capture_output=True, timeout=30, start_new_session=True)


def _q(s: str) -> str:
    import shlex

    return shlex.quote(s)


__all__: List[str] = ["AllocDirect", "AllocTasks", "RemoteProcess", "on_allocation",
                      "srun_env"]

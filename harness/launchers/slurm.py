"""The Slurm launcher: the ranks are started by ``srun`` on a real Slurm test cluster of the
run's own (harness.services.slurm), one node per scenario host.

``launcher: slurm`` or ``{kind: slurm, form: tasks | torchrun, ...srun options}``.

* The cluster: a set-up step (:class:`SlurmUp`, of the pseudo-fault ``run``, after the hosts
  got their names) writes ``<run>/slurm/`` and starts munged and slurmctld on the master host
  and one slurmd per host inside that host's namespaces, each awaited until it answers
  (harness.services.slurm). They are services of the run: stopped with it, in its pid record.
* The job: one process the harness starts on the master host, ``parent:srun`` (the batch
  script's shell, as a user's ``sbatch`` would run it: :mod:`harness.launchers.slurm_job`),
  observed and held until the start line like every launcher's first process; at the start
  line it runs ``srun -N<hosts> --ntasks-per-node=<k> [options] <task>`` and waits for it.
  Its verdict is Slurm's view: ok when srun exits 0, else an error whose message holds srun's
  exit status, the job's state and exit code (``scontrol show job``), each failed task's exit
  code and srun's own lines ("srun: error: node1: task 1: Exited with exit code 7").
* ``form: tasks`` (default): every task is a rank. Its shell does what users' scripts do:
  ``RANK=$SLURM_PROCID``, ``WORLD_SIZE=$SLURM_NTASKS`` (or ``world_size:`` written into the
  script), ``LOCAL_RANK=$SLURM_LOCALID``, ``MASTER_ADDR`` the first host of
  ``scontrol show hostnames $SLURM_JOB_NODELIST`` (``master_addr: hostname``: each node's own
  ``hostname``, the classic mistake), ``MASTER_PORT`` the run's port; then the program.
* ``form: torchrun``: one task per node (``ntasks_per_node`` default 1) runs
  ``torchrun --nnodes=$SLURM_NNODES --nproc-per-node=<host's ranks> --rdzv-backend=c10d
  --rdzv-endpoint=<master>:<port> --rdzv-id=$SLURM_JOB_ID``; its workers are the ranks.
* srun's options: ``ntasks_per_node`` (default: the hosts' ranks, which must then agree),
  ``kill_on_bad_exit`` (``--kill-on-bad-exit=1|0``), ``export`` (``--export=``; the harness
  adds the variables its observer needs), ``wait`` (``--wait=S``), ``cpus_per_task``,
  ``args`` (more srun flags, verbatim).

Tasks are found through their event files (harness.ranks.observer, reached through srun's
environment); each row's host is the node it runs on (its network namespace); a torchrun
agent found that way is ``agent:<host>``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Literal, Optional

from pydantic import Field

from ..core import protocol as P
from ..core.limits import MAX_SHORT, MAX_STEPS, MAX_WORLD
from ..core.rows import RowSet
from ..faults.steps import RUN, Step, StepError
from ..net.addresses import IFNAME_VARS
from . import LauncherSpec, Problem

SRUN_LABEL = P.parent_label("srun")
EXPORT_RE = r"^(ALL|NONE|[A-Za-z_][A-Za-z0-9_]*(=[^,]*)?(,[A-Za-z_][A-Za-z0-9_]*(=[^,]*)?)*)$"
# what the harness's observer needs in every task (srun's --export gets them whatever it says)
OBSERVER_VARS = ("PYTHONPATH", P.OBSERVE_DIR_ENV, P.OBSERVE_ROLE_ENV, P.PID_RECORD_ENV,
                 P.SUPERVISOR_ENV,
                 "PYTHONUNBUFFERED", "PYTHONWARNINGS", "SLURM_CONF", "PATH",
                 "TORCH_CPP_LOG_LEVEL", P.RANK_VARIATIONS_ENV)


class Slurm(LauncherSpec):
    kind: Literal["slurm"] = "slurm"
    summary = "srun on the run's own Slurm test cluster (one node per host): tasks as ranks, " \
        "or one torchrun per node"
    NO_RESTART = ("the slurm launcher starts one srun per run, and srun starts every task "
                  "(and torchrun agent): a killed one is not started again (restart_after)")
    form: Literal["tasks", "torchrun"] = Field(
        "tasks", description="tasks: every srun task is a rank (SLURM_PROCID); torchrun: one "
        "torchrun per node under srun (c10d on the first node)")
    ntasks_per_node: Optional[int] = Field(None, ge=1, le=MAX_WORLD,
                                           description="--ntasks-per-node")
    kill_on_bad_exit: Optional[bool] = Field(None, description="--kill-on-bad-exit=1|0")
    export: Optional[str] = Field(None, max_length=MAX_SHORT, pattern=EXPORT_RE,
                                  description="--export= (ALL, NONE, or VAR[=value],...)")
    wait: Optional[int] = Field(None, ge=0, le=3600, description="--wait=S")
    cpus_per_task: Optional[int] = Field(None, ge=1, le=64, description="--cpus-per-task")
    master_addr: Literal["nodelist", "hostname"] = Field(
        "nodelist", description="how each task's script derives MASTER_ADDR: nodelist (the "
        "first host of SLURM_JOB_NODELIST) or hostname (its own node's name: the mistake)")
    world_size: Optional[int] = Field(None, ge=1, le=MAX_WORLD,
                                      description="WORLD_SIZE written into the task's script "
                                      "(default: $SLURM_NTASKS)")
    nproc_per_node: Optional[int] = Field(None, ge=1, le=MAX_WORLD,
                                          description="torchrun's --nproc-per-node (form "
                                          "torchrun; default: the host's ranks)")
    interface: str = Field(
        "link", pattern=r"^(link|unset|[A-Za-z0-9_.:-]{1,15}(,[A-Za-z0-9_.:-]{1,15})*)$",
        description="GLOO_SOCKET_IFNAME (and NCCL_) the job script exports: link (each node's "
        "link, one name on every node), unset (gloo picks by the node's host name, as a user "
        "who never set it), or an interface name or list (a wrong one)")
    args: Optional[List[str]] = Field(None, max_length=MAX_STEPS,
                                      description="more srun flags, verbatim")

    # -- planning (pure) ---------------------------------------------------------------------
    def _hosts(self, scn: Any) -> List[Any]:
        hosts = list(scn.hosts or [])
        master = scn.master_host or (hosts[0].name if hosts else "")
        return [h for h in hosts if h.name == master] + [h for h in hosts if h.name != master]

    def _per_node(self, scn: Any) -> int:
        if self.ntasks_per_node is not None:
            return self.ntasks_per_node
        if self.form == "torchrun":
            return 1
        hosts = self._hosts(scn)
        return hosts[0].ranks if hosts else 1

    def _nproc(self, scn: Any) -> int:
        if self.nproc_per_node is not None:
            return self.nproc_per_node
        hosts = self._hosts(scn)
        return hosts[0].ranks if hosts else 1

    def _world(self, scn: Any) -> int:
        n = len(self._hosts(scn)) or 1
        if self.form == "torchrun":
            return n * self._per_node(scn) * self._nproc(scn)
        return n * self._per_node(scn)

    def rows(self, scn: Any, job: str = "", world: Optional[int] = None) -> RowSet:
        agents = [P.agent_label(h.name) for h in self._hosts(scn)] \
            if self.form == "torchrun" else []
        return RowSet(world=max(world or 0, self._world(scn), scn.world_size), job=job,
                      agents=agents, parents=[SRUN_LABEL])

    def needs_netns(self, scn: Any) -> bool:
        return True

    def requirements(self, scn: Any) -> List[Any]:
        from ..services.slurm import ROOT, TOOLS

        return [*TOOLS, ROOT]

    def check(self, scn: Any) -> List[Problem]:
        out: List[Problem] = []
        hosts = self._hosts(scn)
        if not hosts:
            out.append((("kind",), "Slurm runs on nodes: give the scenario hosts: (one node "
                        "per host)"))
            return out
        if scn.hostnames != "own" and not all(h.hostname for h in hosts):
            out.append((("kind",), "every Slurm node needs a name of its own: add "
                        "hostnames: own to the scenario (or a hostname: to each host)"))
        counts = {h.ranks for h in hosts}
        if self.form == "tasks" and self.ntasks_per_node is None and len(counts) > 1:
            out.append((("ntasks_per_node",), "the hosts have different numbers of ranks "
                        f"({', '.join(f'{h.name}: {h.ranks}' for h in hosts)}): srun "
                        "--ntasks-per-node gives every node the same; set ntasks_per_node"))
        if self.form == "torchrun" and self.world_size is not None:
            out.append((("world_size",), "world_size is written into the tasks' script (form "
                        "tasks); with form torchrun the world is the nodes' agents' workers "
                        "(nproc_per_node on each)"))
        if self.form == "tasks" and self.nproc_per_node is not None:
            out.append((("nproc_per_node",), "nproc_per_node is torchrun's: use form: "
                        "torchrun"))
        for a in self.args or []:
            if "\0" in a or len(a) > MAX_SHORT:
                out.append((("args",), "an argument holds a NUL byte or is too long"))
        return out

    def srun_argv(self, scn: Any, nodes: Optional[List[str]] = None) -> List[str]:
        """srun and its options (pure), before the task's command. ``nodes``: the Slurm node
        of each host (master first; default: the test cluster's, the hosts' own names)."""
        nodes = nodes or [_node_name(scn, h) for h in self._hosts(scn)]
        argv = ["srun", f"-N{len(nodes)}",
                f"--ntasks-per-node={self._per_node(scn)}",
                f"--nodelist={','.join(nodes)}",
                "--job-name=harness", "--unbuffered"]
        argv += self.srun_options()
        return argv

    def srun_options(self) -> List[str]:
        """The scenario's own srun options (pure)."""
        argv: List[str] = []
        if self.kill_on_bad_exit is not None:
            argv.append(f"--kill-on-bad-exit={int(self.kill_on_bad_exit)}")
        if self.export is not None:
            argv.append(f"--export={_export(self.export)}")
        if self.wait is not None:
            argv.append(f"--wait={self.wait}")
        if self.cpus_per_task is not None:
            argv.append(f"--cpus-per-task={self.cpus_per_task}")
        return argv + list(self.args or [])

    def task_script(self, plan: Any, scn: Any, python: str,
                    per_node: Optional[Dict[str, str]] = None) -> str:
        """The shell each task runs: what a user's job script does before the program.
        ``per_node``: Slurm node name -> interpreter for the hosts whose ``python:`` differs
        (another venv, a stale image): the task picks its own by ``$SLURMD_NODENAME``."""
        if self.master_addr == "hostname":
            master = 'MASTER_ADDR=$(hostname)'
        else:
            master = 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)'
        program = scn.program_argv() or ["-m", "harness.ranks.worker",
                                         plan.shared_worker_spec().to_json()]
        py = shlex.quote(python)
        if per_node:
            cases = " ".join(f"{shlex.quote(n)}) PY={shlex.quote(p)};;"
                             for n, p in sorted(per_node.items()))
            pre = f'case "$SLURMD_NODENAME" in {cases} *) PY={py};; esac; '
            py = '"$PY"'
        else:
            pre = ""
        prog = " ".join(shlex.quote(a) for a in program)
        port = plan.master_port
        if self.form == "torchrun":
            return (f"{pre}{master}; exec {py} -m torch.distributed.run "
                    f'--nnodes="$SLURM_NNODES" --nproc-per-node={self._nproc(scn)} '
                    f'--rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:{port}" '
                    f'--rdzv-id="$SLURM_JOB_ID" {prog}')
        world = str(self.world_size) if self.world_size is not None else '"$SLURM_NTASKS"'
        return (f'{pre}export RANK="$SLURM_PROCID" WORLD_SIZE={world} '
                'LOCAL_RANK="$SLURM_LOCALID" LOCAL_WORLD_SIZE="$SLURM_NTASKS_PER_NODE"; '
                f"export {master}; export MASTER_PORT={port}; exec {py} {prog}")

    def plan(self, plan: Any, scn: Any) -> None:
        import sys

        from ..services.slurm import ClusterConfig, Node

        hosts = self._hosts(scn)
        master = hosts[0]
        directory = os.path.join(plan.run_dir, "slurm")
        cfg = ClusterConfig(
            directory=directory, cluster="harness", controller_host=master.name,
            controller_name=_node_name(scn, master),
            controller_addr=plan.address_of(master.name) or "127.0.0.1",
            ctld_port=plan.new_port(), slurmd_port=plan.new_port(),
            nodes=[Node(h.name, _node_name(scn, h), plan.address_of(h.name) or "")
                   for h in hosts])
        plan.add_step(RUN, SlurmUp(cluster=cfg, target="slurm"))
        env = dict(scn.env)
        unset: List[str] = []
        if self.interface == "link":
            plan.link_env(env, master.name)
        else:
            for var in IFNAME_VARS:
                if self.interface == "unset":
                    env.pop(var, None)
                    unset.append(var)
                else:
                    env[var] = self.interface
        env.update(cfg.env())
        per_node = {_node_name(scn, h): plan.host_python(scn, h.name) for h in hosts}
        per_node = {n: p for n, p in per_node.items() if p and p != sys.executable}
        spec = {"srun": self.srun_argv(scn), "script": self.task_script(plan, scn,
                                                                       sys.executable,
                                                                       per_node),
                "role": P.ROLE_AGENT if self.form == "torchrun" else P.ROLE_WORKER,
                "slurm_conf": str(cfg.conf), "export": self.export}
        rp = plan.new_process(label=SRUN_LABEL, rank=None, env=env,
                              init=plan.init_for(scn, 0, scn.world_size), host=master.name,
                              role=P.ROLE_PARENT, observed=True, cwd=scn.program_cwd(),
                              argv=["-m", "harness.launchers.slurm_job", json.dumps(spec)],
                              unset=unset)
        plan.add_process(rp)
        plan.notes.append(f"slurm: {' '.join(self.srun_argv(scn))} sh -c '<task script>'; "
                          f"controller on {master.name} port {cfg.ctld_port}, slurmd port "
                          f"{cfg.slurmd_port}")

    def plan_job(self, plan: Any, scn: Any, job: str, world: int, release: Any = None) -> None:
        from ..core.errors import PlanRefusal

        raise PlanRefusal("a second job beside a Slurm job is not supported (one srun per "
                          "run): use launcher direct, torchrun or spawn for concurrent_job")

    def describe(self) -> str:
        given = {k: getattr(self, k) for k in self.model_fields_set if k != "kind"}
        return "slurm " + " ".join(f"{k}={v}" for k, v in given.items())

    # -- run time ----------------------------------------------------------------------------
    def start(self, sup: Any) -> List[Any]:
        out = super().start(sup)
        sup.owned.append(StepDaemons(sup))   # closed after the ranks were killed
        return out

    def poll(self, sup: Any) -> None:
        """The tasks (and torchrun's workers) as their event files appear; each row's host is
        the node whose network namespace it runs in; an agent is labelled by its host. Once
        srun ended, each task's exit status is Slurm's (the job script's ``job.json``)."""
        before = len(sup.ranks)
        sup.discovery.poll(sup)
        self._hosts_of_found(sup, before)
        self._task_codes(sup)

    def _task_codes(self, sup: Any) -> None:
        """Each task row's exit status as srun reported it (a task srun does not name exited
        0, when srun's record exists); for rows whose own parent (slurmstepd) told nobody."""
        from ..machine.procs import ForeignProcess
        from .slurm_job import task_code

        srun = next((r for r in sup.ranks if r.label == SRUN_LABEL), None)
        if srun is None or not srun.ended or getattr(srun, "_codes_read", False):
            return
        try:
            record = json.loads((sup.dir / "slurm" / "job.json").read_text())
        except (OSError, ValueError):
            return
        srun._codes_read = True
        tasks = record.get("tasks") or {}
        nodes = {(h.machine.hostname or h.name): h.name for h in sup.plan.hosts}
        # srun names every task that did not exit 0, but not the tasks of a node that failed
        clean = record.get("srun_exit") == 0
        failed = {nodes.get(n, n) for ln in record.get("srun_lines") or []
                  for n in re.findall(r"Node failure on (\S+)", ln)}
        for r in sup.ranks:
            if not isinstance(r.proc, ForeignProcess) or r.proc.returncode is not None:
                continue
            if r.obs.host in failed:
                r.note(f"srun: Node failure on {r.obs.host}")
            code: Optional[int] = None
            if self.form == "tasks" and r.role == P.ROLE_WORKER and r.label.isdigit():
                how = (tasks.get(r.label) or {}).get("how")
                code = task_code(how) if how else (0 if clean else None)
            elif self.form == "torchrun" and r.role == P.ROLE_AGENT:
                hows = [t.get("how") for t in tasks.values()
                        if nodes.get(t.get("node"), t.get("node")) == r.obs.host]
                if len(hows) <= 1 and (self.ntasks_per_node or 1) == 1:
                    code = task_code(hows[0]) if hows and hows[0] else (0 if clean else None)
            if code is None:
                continue
            r.proc.returncode = code
            if r.ended:
                r.obs.returncode = code

    def _hosts_of_found(self, sup: Any, before: int) -> None:
        for r in sup.ranks[before:]:
            host = _host_of_pid(sup, r.pid)
            if host is not None:
                r.obs.host, r.obs.addr = host, sup.addr_of(host)
            if r.role == P.ROLE_AGENT and r.label.startswith("pid"):
                taken = {x.label for x in sup.ranks}
                label = P.agent_label(r.obs.host)
                n = 2
                while label in taken:
                    label = f"{P.agent_label(r.obs.host)}#{n}"
                    n += 1
                r.label = r.obs.label = label
                r.provisional = False


def _node_name(scn: Any, host: Any) -> str:
    return str(host.hostname or host.name)


def _export(value: str) -> str:
    """--export with the observer's variables added (ALL stays ALL)."""
    if value == "ALL":
        return value
    given = [] if value == "NONE" else value.split(",")
    names = {g.split("=", 1)[0] for g in given}
    return ",".join(given + [v for v in OBSERVER_VARS if v not in names])


class StepDaemons:
    """The run's slurmstepd processes: slurmd starts one per job step and it detaches, so it is
    in no pid record and no process group of the run. When the run closes (its tasks are
    killed by then) every slurmstepd in one of the run's network namespaces is killed and
    awaited (a zombie counts as gone); a SIGKILLed run's are killed by the topology's sweep."""

    def __init__(self, sup: Any):
        self.sup = sup

    def pids(self) -> List[int]:
        inodes = set()
        for h in self.sup.plan.hosts:
            try:
                inodes.add(os.stat(f"/run/netns/{h.netns}").st_ino)
            except OSError:
                continue
        out = []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/comm") as f:
                    if f.read().strip() != "slurmstepd":
                        continue
                if os.stat(f"/proc/{d}/ns/net").st_ino in inodes:
                    out.append(int(d))
            except OSError:
                continue
        return out

    def close(self) -> None:
        import signal
        import time

        from ..machine.procs import start_ticks

        found = [(p, start_ticks(p)) for p in self.pids()]
        for pid, _ in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        end = time.monotonic() + 5.0
        while time.monotonic() < end and any(start_ticks(p) == t and t is not None
                                             for p, t in found):
            time.sleep(0.02)


def _await_nodes(cfg: Any, nodes: List[Any], prefix: Any, limit: float = 30.0) -> None:
    """Until sinfo lists every node idle (one look at all of them every 0.05 s); a StepError
    quoting the slurmd's own output when one exits or the limit passes."""
    import time

    from ..services.slurm import node_states

    end = time.monotonic() + limit
    waiting = {n.name: svc for n, svc in nodes}
    while waiting:
        states = node_states(cfg, prefix)
        for name in [x for x in waiting
                     if states.get(x, "").split("+")[0] in ("idle", "mixed", "allocated")]:
            del waiting[name]
        for name, svc in waiting.items():
            if not svc.running:
                raise StepError(f"slurmd of node {name} exited (status {svc.proc.returncode}) "
                                f"before it registered: {svc.output()}")
        if waiting and time.monotonic() >= end:
            name, svc = next(iter(waiting.items()))
            raise StepError(f"slurmd of node {name} did not register within {limit:g} s "
                            f"(sinfo says {states.get(name, 'nothing')}): {svc.output()}")
        if waiting:
            time.sleep(0.05)


def _host_of_pid(sup: Any, pid: Optional[int]) -> Optional[str]:
    """The scenario host whose network namespace the process runs in (None: not known)."""
    if pid is None or sup.topo is None:
        return None
    try:
        ino = os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None
    for h in sup.plan.hosts:
        try:
            if h.netns and os.stat(f"/run/netns/{h.netns}").st_ino == ino:
                return str(h.name)
        except OSError:
            continue
    return None


@dataclass
class SlurmUp(Step):
    """The run's own Slurm cluster: munged, slurmctld, one slurmd per host (in that host's
    namespaces), each awaited until it answers; stopped with the run's services."""

    cluster: Any = None
    UNDO_AT_TEARDOWN: ClassVar[bool] = False   # the services stop with the run

    def do(self, rt: Any) -> Optional[Dict[str, Any]]:
        import sys
        import time

        from ..services import ServiceSpec
        from ..services.slurm import (
            CTLD_SERVICE,
            MUNGE_SERVICE,
            NODE_SERVICE,
            ControllerUp,
            MungeAnswers,
            node_prefix,
        )

        cfg = self.cluster
        t0 = time.monotonic()
        sock = len(os.fsencode(str(cfg.munge_socket)))
        if sock > 107:
            raise StepError(f"munge's socket {cfg.munge_socket} is {sock} bytes long, more than "
                            "a UNIX socket path may be (107): set HARNESS_TMP to a shorter "
                            "folder")
        cfg.write()
        wrap = [sys.executable, "-m", "harness.machine.procs", "--exec", "--"]
        master = cfg.controller_host
        rt.start_service(ServiceSpec(MUNGE_SERVICE, wrap + cfg.munged_argv(), master,
                                     ready=MungeAnswers(cfg)))
        ctl_prefix = tuple(rt.net.exec_prefix(master))
        rt.start_service(ServiceSpec(CTLD_SERVICE, wrap + cfg.slurmctld_argv(), master,
                                     ready=ControllerUp(cfg, ctl_prefix)))
        # every slurmd started first, then all awaited together: they register in parallel
        nodes = []
        for n in cfg.nodes:
            h = rt.net.host(n.host)
            uts = rt.net.uts_file(n.host) if rt.net.hostname(n.host) else None
            view = os.path.join("/etc/netns", h.netns)
            svc = rt.start_service(ServiceSpec(
                NODE_SERVICE + n.host, cfg.slurmd_argv(n), n.host, ready=None,
                prefix=node_prefix(h.netns, str(uts) if uts else None, view)))
            nodes.append((n, svc))
        _await_nodes(cfg, nodes, ctl_prefix)
        return {"up_after_s": round(time.monotonic() - t0, 3),
                "nodes": [n.name for n in cfg.nodes], "ctld_port": cfg.ctld_port,
                "slurmd_port": cfg.slurmd_port, "dir": cfg.directory}

    def describe(self) -> str:
        n = len(self.cluster.nodes) if self.cluster is not None else 0
        return f"start the run's Slurm cluster (munged, slurmctld, {n} slurmd)"

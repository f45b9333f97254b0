"""What the fault steps see of a run: the supervisor's state, the Runtime they act through and
the Clock their triggers read (:mod:`harness.faults.steps`), and where each host's processes
run.

:class:`StepRuntime` is the base of :class:`harness.run.supervisor.Supervisor`: it holds the
run's plan, directory, network, rows and helpers, starts helpers and services on a host
(``harness.services``), and answers when a rank entered a phase or a step was done. The
supervisor's other parts (:mod:`harness.run.stacks`, :mod:`harness.run.probes`) build on it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from ..core.protocol import ENDED, EVERY_RANK
from ..faults.steps import Scheduler, StepError
from ..launchers import Discovery, RankProcess, process_env
from ..machine import interrupts
from ..machine.output_caps import Capture
from ..machine.procs import ManagedProcess
from ..machine.rundir import RunDir
from ..scenario.schema import launcher_spec_of
from ..services import ReadyLine, Service, ServiceError, Services, ServiceSpec
from .plan import HostPlan, RunPlan

READY_TIMEOUT = float(os.environ.get("HARNESS_READY_TIMEOUT", "180"))
POLL = 0.02


def _remote(r: RankProcess) -> bool:
    """The row's process runs on an allocation's node (harness.launchers.allocation): its pid
    means nothing on this machine."""
    return bool(getattr(r.proc, "remote", False))


class StepRuntime:
    """One run's state, and the Runtime and Clock of its fault steps (the supervisor's base)."""

    def __init__(self, plan: RunPlan, run_dir: RunDir, topo: Any = None,
                 launcher: Optional[str] = None,
                 progress: Optional[Callable[[str], None]] = None):
        self.plan = plan
        self.progress = progress         # one line at the start line and at each row's end
        self.topo = topo                 # harness.net.topology.Topology when the run has namespaces
        self.rundir = run_dir
        self.dir = Path(plan.run_dir)
        self.run_dir = self.dir
        # observed processes' events (harness.ranks.observer)
        self.observe_dir = self.dir / "observed"
        self.ranks: List[RankProcess] = []   # every row: ranks, agents, parents, workers
        self.services = Services(self.dir)   # helpers and services (harness.services)
        self.fds: List[int] = []
        self.owned: List[Any] = []   # what a launcher keeps for the run (fork servers): .close()
        self.capture = Capture()
        self.launcher = plan.launcher if plan.launcher is not None and launcher is None \
            else launcher_spec_of(launcher or "direct")
        self.discovery = Discovery(self.observe_dir)
        self.t0: Optional[float] = None
        self.scheduler = Scheduler(plan.steps, self, self)
        self._native: Optional[Dict[str, Tuple[Future, float]]] = None   # early py-spy dumps
        self._sockets_taken: Set[str] = set()     # rows whose sockets are in their observation
        self._torch_checked: Set[str] = set()     # rows whose torch was judged (_check_torch)
        self._native_pool: Optional[ThreadPoolExecutor] = None
        self._store: Any = None    # the store's snapshot, being taken (a Future) or taken
        self._stores: Dict[str, Any] = {}   # the workers' own stores' snapshots, by address
        self._rules_at_deadline: Dict[str, str] = {}

    # -- Runtime -------------------------------------------------------------------------------
    def now(self) -> float:
        return 0.0 if self.t0 is None else time.monotonic() - self.t0

    def rank(self, label: str) -> RankProcess:
        for r in self.ranks:
            if r.label == str(label):
                return r
        raise KeyError(f"no rank {label!r} in this run")

    def host(self, name: str) -> HostPlan:
        return self.plan.host(name)

    def restart(self, label: str) -> RankProcess:
        """Start the plan's restart ``label`` through the launcher (recorded, killed with the
        run like every process it started); a StepError if the launcher cannot."""
        rp = self.plan.restart(label)
        try:
            row = self.launcher.restart(self, rp)
        except (OSError, ValueError) as e:
            raise StepError(f"{label} could not be started again: {e}") from None
        row.obs.restart_of = rp.restart_of
        if self.progress is not None:
            try:
                self.progress(f"{label}: {rp.restart_of} started again at {self.now():.2f} s")
            except Exception:  # noqa: BLE001 - progress is a courtesy
                self.progress = None
        return row

    @property
    def net(self) -> Any:
        if self.topo is None:
            raise StepError("this step needs the run's network namespaces, and it has none")
        return self.topo

    def python(self, module: str, *args: str) -> List[str]:
        return [sys.executable, "-m", module, *args]

    def start_helper(self, name: str, argv: Sequence[str], *, host: Optional[str] = None,
                     ready_line: Optional[bytes] = b"ready") -> Service:
        ready = None if ready_line is None else ReadyLine(ready_line.decode().strip())
        n = sum(1 for _ in self.services)
        return self.start_service(ServiceSpec(f"{name}#{n + 1}", list(argv), host or "",
                                              ready=ready, timeout=READY_TIMEOUT))

    def start_service(self, spec: ServiceSpec) -> Service:
        host = spec.host or self._master_host()

        def spawn(argv: Sequence[str], out: Any, err: Any) -> ManagedProcess:
            return ManagedProcess(argv, name=spec.name, record=self.rundir.pids,
                                  env=process_env(extra={}), cwd=str(self.dir), stdout=out,
                                  stderr=err, prefix=self.prefix(host)
                                  if spec.prefix is None else spec.prefix)

        try:
            with interrupts.shield():   # a process that exists is a process that is tracked
                svc = self.services.start(spec, spawn)
            return svc.wait_ready()
        except ServiceError as e:
            raise StepError(str(e)) from None

    def service(self, name: str) -> Service:
        try:
            return self.services.get(name)
        except ServiceError as e:
            raise StepError(str(e)) from None

    def run_helper(self, name: str, argv: Sequence[str], *, host: Optional[str] = None,
                   timeout: float = READY_TIMEOUT) -> subprocess.CompletedProcess[str]:
        host = host or self._master_host()
        with interrupts.shield():
            proc = ManagedProcess(argv, name=name, record=self.rundir.pids,
                                  env=process_env(self.plan.ranks[0]), cwd=str(self.dir),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  prefix=self.prefix(host))
        try:
            out, err = proc.popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise StepError(f"{name} did not finish within {timeout:.0f} s") from None
        return subprocess.CompletedProcess(proc.argv, proc.popen.returncode,
                                           out.decode(errors="replace"),
                                           err.decode(errors="replace"))

    # -- Clock ---------------------------------------------------------------------------------
    def phase_entered(self, rank: str, phase: str) -> Optional[float]:
        if self.t0 is None:
            return None
        if rank == EVERY_RANK:   # when the last rank of the job's first attempt entered it
            ranks = [str(n) for n in range(self.plan.world_size) if not self._absent(str(n))]
            times = [t for t in (self.phase_entered(n, phase) for n in ranks) if t is not None]
            return max(times) if times and len(times) == len(ranks) else None
        try:
            r = self.rank(rank)
        except KeyError:
            return None
        if phase == ENDED:   # the anchor of a gate on another process's exit
            return r.obs.ended_at if r.ended else None
        t = r.entered(phase)
        return None if t is None else t - self.t0

    def step_done(self, step_id: str) -> Optional[float]:
        return self.scheduler.step_done(step_id)

    def _absent(self, label: str) -> bool:
        """A rank the plan leaves out (absent_rank): it never enters a phase."""
        try:
            return bool(self.plan.rank(label).absent)
        except KeyError:   # a worker a launcher starts: not in the plan
            return False

    # -- where things run ----------------------------------------------------------------------
    def prefix(self, host: str) -> List[str]:
        return self.topo.exec_prefix(host) if self.topo is not None else []

    def host_entry(self, host: str) -> Optional[Dict[str, Optional[str]]]:
        """What :meth:`prefix` enters, as paths (None: the machine's own namespaces)."""
        return self.topo.host_entry(host) if self.topo is not None else None

    def addr_of(self, host: str) -> str:
        if self.plan.hosts and any(h.name == host for h in self.plan.hosts):
            return self.plan.host(host).addr
        return self.plan.hosts[0].addr if self.plan.hosts else "127.0.0.1"

    def _master_host(self) -> str:
        return self.plan.ranks[0].host


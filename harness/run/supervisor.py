"""Launch and supervise one run: start its processes, fire the fault steps, enforce the
deadline, capture the stacks of whatever is still alive, kill it all. Nothing outlives a run.

``run_scenario`` owns one run's life: the sweep of killed runs, the run directory, the port
lease, the plan, the topology, the supervisor, and the cleanup (inside ``interrupts.shield()``:
a SIGTERM or a second Ctrl-C waits until it has finished). The :class:`Supervisor` runs the
plan: a launcher (``harness.launchers``) starts every process; every rank imports torch and
reports ``ready``; only then is the clock started (the start line) and each rank released when
its release trigger holds; the scheduler (``harness.steps``) fires the faults' steps when their
triggers hold, through the small Runtime interface this class implements. The supervisor knows
no fault by name.

A rank's stdout and stderr go through pipes drained by one thread (``harness.capture``): kept
up to a head and a tail with a marker of what was cut, so evidence stays bounded. A rank that
dies before it reported ``ready`` (Python or torch could not start) is a HarnessError naming
the rank and the cause.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from ..core.errors import HarnessError
from ..core.protocol import (
    ENDED,
    EVERY_RANK,
    EXCEPTION,
    PHASE,
    RESULT,
    RUN_TMP,
    STACK_SIGNAL,
    Event,
    last_phase,
    ready_event,
    result_of,
)
from ..faults.steps import Scheduler, StepError
from ..judge import edits, pyspy
from ..judge.effects import aggregate
from ..judge.observation import RunObservation
from ..judge.stderrlines import key_lines
from ..launchers import Discovery, RankProcess, close_fds, process_env
from ..machine import cgroups, interrupts
from ..machine.output_caps import Capture
from ..machine.ports import PortLease
from ..machine.procs import (
    ForeignProcess,
    ManagedProcess,
    cpu_seconds,
    kill_observed,
    runqueue_wait,
)
from ..machine.rundir import RunDir, kill_recorded, sweep
from ..net.sockets import port_owners
from ..scenario.schema import Scenario, launcher_spec_of
from ..services import ReadyLine, Service, ServiceError, Services, ServiceSpec
from .plan import HostPlan, RunPlan, make_plan

READY_TIMEOUT = float(os.environ.get("HARNESS_READY_TIMEOUT", "180"))
POLL = 0.02
# native stacks (py-spy symbolizes libtorch: ~0.4 s of CPU per rank) are started this long
# before the deadline for the ranks alive then, so that the verdict does not wait for them
STACK_LEAD = float(os.environ.get("HARNESS_STACK_LEAD", "2.0"))
TAIL = 4000
STACKS_MAX = 1 << 20     # a faulthandler dump is kept up to this many bytes per rank


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _read_stacks(path: Path) -> str:
    """A rank's faulthandler dump, at most STACKS_MAX bytes (the file is cut to that too, with
    a marker: it is evidence, and a rank with thousands of threads must not make it huge)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            data = f.read(STACKS_MAX)
    except OSError:
        return ""
    if size > STACKS_MAX:
        note = f"\n[harness: {size - STACKS_MAX} bytes of stacks cut here]\n".encode()
        data += note
        try:
            with open(path, "r+b") as f:
                f.seek(STACKS_MAX)
                f.write(note)
                f.truncate()
        except OSError:
            pass
    return data.decode(errors="replace")


_ERROR_LINE = re.compile(r"^(?:[\w.]+(?:Error|Exception|Interrupt|Exit)\b|Fatal Python error)")


def _broken_by_scenario(events: Sequence[Event]) -> bool:
    """Torch was found and refused to import under the scenario's environment (a TORCH_*
    variable with a value torch rejects, say: ValueError), while it imports in a clean
    interpreter here (the environment probe). That is torch's behaviour, the scenario's
    result (error in phase import). An ImportError is not: then torch could not be loaded at
    all, and the rank could not be started (a harness error, as before)."""
    from ..machine.torch_probe import probe

    raised = [e for e in events if e.ev == RESULT and e.data.get("status") == EXCEPTION
              and e.data.get("phase") == "import"]
    if not raised:
        return False
    mro = [str(c) for c in (raised[-1].data.get("exc") or {}).get("mro", [])]
    not_loaded = any(c.endswith(("ImportError", "ModuleNotFoundError")) for c in mro) or \
        str((raised[-1].data.get("exc") or {}).get("type", "")).endswith("ImportError")
    return not not_loaded and probe().get("torch") not in (None, "none")


def start_failure(label: str, returncode: Optional[int], events: Sequence[Event],
                  stderr: str) -> str:
    """One line: why a rank died before it was ready (could not start Python, import torch or
    the worker). The worker's own exception record wins, else the telling line of stderr."""
    phase = next((e.phase for e in reversed(events) if e.ev == PHASE), None)
    exc = next((e.data.get("exc") for e in events
                if e.ev == RESULT and e.data.get("status") == EXCEPTION and e.data.get("exc")),
               None)
    if exc:
        first = (str(exc.get("message", "")).strip().splitlines() or [""])[0]
        cause = f"{exc.get('type')}: {first}"
    else:
        lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
        telling = [ln for ln in lines if _ERROR_LINE.match(ln)]
        cause = (telling[-1] if telling else lines[-1] if lines else "(no output on stderr)")
    if returncode is None:
        how = "ended"
    elif returncode < 0:
        how = f"was killed by {signal.Signals(-returncode).name}" if -returncode in \
            signal.valid_signals() else f"was killed by signal {-returncode}"
    else:
        how = f"exited with status {returncode}"
    if phase is None:
        what = "Python or the harness worker could not start"
    elif phase == "import":
        what = "could not import torch"
    else:
        what = f"the harness worker failed in phase {phase}"
    return f"rank {label} {how} before it was ready: {what}: {cause[:300]}"


def _raised(events: Sequence[Event]) -> bool:
    """The row's result says it raised (a timeout or an error): its sockets are worth a look
    before it exits."""
    return any(e.ev == RESULT and e.data.get("status") == EXCEPTION for e in events)


def _remote(r: RankProcess) -> bool:
    """The row's process runs on an allocation's node (harness.launchers.allocation): its pid
    means nothing on this machine."""
    return bool(getattr(r.proc, "remote", False))


def native_stacks_available() -> bool:
    return pyspy.executable() is not None


def native_stacks(pid: int) -> Tuple[List[Dict[str, Any]], str]:
    """A stuck rank's C++ frames (TCPStore::ping -> recv ...) by ``py-spy dump --native
    --json`` (harness.pyspy; py-spy pauses it while reading): (threads, their text). Empty
    without py-spy; the text is py-spy's error when it is not permitted (CAP_SYS_PTRACE)."""
    return pyspy.dump(pid)


class Supervisor:
    """Runs one RunPlan. It is the Runtime that fault steps act through (harness.steps) and
    the Clock their triggers read. Use ``run_scenario`` unless you build plans yourself."""

    def __init__(self, plan: RunPlan, run_dir: RunDir, topo: Any = None,
                 launcher: Optional[str] = None,
                 progress: Optional[Callable[[str], None]] = None):
        self.plan = plan
        self.progress = progress         # one line at the start line and at each row's end
        self.topo = topo                 # harness.topology.Topology when the run has namespaces
        self.rundir = run_dir
        self.dir = Path(plan.run_dir)
        self.run_dir = self.dir
        self.observe_dir = self.dir / "observed"   # observed processes' events (harness.observer)
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

    # -- start ---------------------------------------------------------------------------------
    def _wait_ready(self) -> None:
        limit = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < limit:
            pending = False
            for r in self.ranks:
                if not r.held:
                    continue
                r.read_events()
                if r.ready():
                    continue
                if r.running():
                    pending = True
                    continue
                r.read_events()
                if not r.ready() and _broken_by_scenario(r.obs.events):
                    continue    # a verdict (error in phase import), not a failure to start
                if not r.ready():   # died before it was ready: the harness could not start it
                    detail = getattr(r.proc, "failure", lambda: "")()
                    if detail:      # a task on an allocation's node: Slurm's words
                        raise HarnessError(f"rank {r.label} was never ready on the "
                                           f"allocation: {detail}")
                    err = ""
                    if r.err_path is not None:
                        self.capture.wait_eof([r.err_path], timeout=2.0)
                        stream = self.capture.stream(r.err_path)
                        err = _tail(r.err_path) + (bytes(stream.tail[-TAIL:]).decode(
                            errors="replace") if stream is not None else "")
                    raise HarnessError(start_failure(r.label, r.proc.returncode,
                                                     r.obs.events, err))
            if not pending:
                return
            time.sleep(POLL)
        slow = [r.label for r in self.ranks if r.held and not r.ready()]
        raise HarnessError(f"ranks {slow} did not import torch within {READY_TIMEOUT:.0f} s "
                           "(set HARNESS_READY_TIMEOUT for a slower machine)")

    def _check_torch(self) -> None:
        """Every process that said ``ready`` ran the torch of the interpreter it was given
        (protocol.torch_identity against harness.probe of that interpreter), or the run is a
        harness error naming who ran which torch from where: a report must never say one torch
        while ranks ran another (a path that leaks another environment's site-packages). A
        process whose plan sets its own PYTHONPATH chose its torch itself and is not judged."""
        from ..machine.torch_probe import probe

        for r in self.ranks:
            e = ready_event(r.obs.events)
            got = e.data.get("torch_path") if e is not None else None
            if e is None or not got or r.label in self._torch_checked:
                continue
            self._torch_checked.add(r.label)
            if r.plan is not None and "PYTHONPATH" in r.plan.env:
                continue
            python = (r.plan.python if r.plan is not None else "") or None
            want = probe(python)
            if not want.get("torch_path") or want.get("error"):
                continue   # the probe could not tell: no claim either way
            if os.path.realpath(got) != os.path.realpath(want["torch_path"]):
                raise HarnessError(
                    f"{r.label} ran torch {e.data.get('torch')} from {got} (interpreter "
                    f"{e.data.get('python') or '?'}), but its interpreter "
                    f"{python or sys.executable} has torch {want.get('torch')} at "
                    f"{want['torch_path']}: something on its path shadows the interpreter's "
                    "own torch, so the run would report the wrong torch")

    # -- the end -------------------------------------------------------------------------------
    def _capture_stacks(self, live: List[RankProcess]) -> None:
        """Every live rank's stacks, all ranks at once: py-spy's native stacks where permitted
        (one py-spy per rank, in parallel), then the faulthandler dump of every rank
        (protocol.STACK_SIGNAL; SIGCONT too, so that a stopped rank can write it). What a
        resumed rank does after the deadline is not part of the run: its events are cut at
        the deadline."""
        import psutil

        early = self._native or {}
        spied: List[RankProcess] = []
        remote = [r for r in live if _remote(r)]
        for r in remote:     # on an allocation's node: its task helper signals it there
            r.proc.dump_stacks()
        live_here = [r for r in live if not _remote(r)]
        for r in live:
            r.read_events()
            r.cutoff = len(r.obs.events)
        for r in live_here:
            if r.label in early:
                continue
            try:
                stopped = psutil.Process(r.proc.pid).status() == psutil.STATUS_STOPPED
            except psutil.Error:
                stopped = False
            if stopped and native_stacks_available():
                r.obs.native_stacks = ("(no native stacks: the rank is stopped (SIGSTOP) and "
                                       "py-spy cannot attach to a stopped process)")
            else:
                spied.append(r)
        # the dump signal first: py-spy pauses a rank while it reads it, which would hold up
        # the rank's own dump
        for r in live_here:
            try:
                os.kill(r.proc.pid, STACK_SIGNAL)
                os.kill(r.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        pool = ThreadPoolExecutor(max_workers=max(1, len(spied)), thread_name_prefix="py-spy")
        try:
            self._read_dumps(live, remote, early,
                             {r.label: (pool.submit(native_stacks, r.proc.pid), self.now())
                              for r in spied})
        finally:
            # also when interrupted: an idle worker no shutdown woke would hold the
            # interpreter's exit for good (its py-spy, if any, ends by its own timeout)
            with interrupts.shield():
                pool.shutdown(wait=False)

    def _read_dumps(self, live: List[RankProcess], remote: List[RankProcess],
                    early: Dict[str, Tuple[Future, float]],
                    late: Dict[str, Tuple[Future, float]]) -> None:
        """Each live rank's faulthandler dump once complete, and its py-spy dump: ``early``
        (taken before the deadline) or ``late`` (now)."""
        # faulthandler writes from its signal handler at once; a dump is complete when the
        # file stopped growing (three looks 10 ms apart: 20 ms without a byte); a rank gets up
        # to 3 s
        sizes: Dict[str, int] = {}
        stable: Dict[str, int] = {}
        # a remote rank's dump goes through its helper (a command file, a poll) and a shared
        # file system: more time
        limit = time.monotonic() + (10.0 if remote else 3.0)
        while time.monotonic() < limit:
            done = True
            for r in live:
                size = r.stacks_path.stat().st_size if r.stacks_path.exists() else 0
                stable[r.label] = stable.get(r.label, 0) + 1 \
                    if size and sizes.get(r.label) == size else 0
                if stable[r.label] < 2:
                    done = False
                sizes[r.label] = size
            if done:
                break
            time.sleep(0.01)
        for r in live:
            r.obs.stacks = _read_stacks(r.stacks_path)
            taken = early.get(r.label) or late.get(r.label)
            if taken is not None:
                future, at = taken
                threads, text = future.result()
                r.obs.native_stacks = (f"(taken at {at:.2f} s)\n" + text) if text else text
                r.obs.native_threads = threads

    def _sample_cpu(self, rows: Optional[Sequence[RankProcess]] = None) -> None:
        """(seconds after the start line, CPU seconds used) of each live row on this machine,
        appended to its ``cpu_samples``: read twice, before the deadline and at it, they tell a
        rank still at work from one blocked in a call (harness.diagnose: still progressing)."""
        now = round(self.now(), 3)
        for r in (self.ranks if rows is None else rows):
            if _remote(r) or r.ended or r.proc.pid is None:
                continue
            used = cpu_seconds(int(r.proc.pid))
            if used is not None:
                r.obs.cpu_samples.append((now, used))

    def _start_native_stacks(self) -> None:
        """py-spy, in parallel, ``STACK_LEAD`` s (at most a quarter of the deadline) before the
        deadline, once, for every rank that is alive and has said nothing for that long (it
        looks stuck: py-spy pauses a process while it reads its native stack, which must not
        slow down a rank still at work; those are read at the deadline). The ranks still alive
        at the deadline keep theirs, marked with the time they were taken (a stuck rank's
        native stack does not change); the others' are dropped."""
        import psutil

        self._native = {}
        self._sample_cpu()     # the first of two reads: a rank at work uses CPU between them
        if not native_stacks_available():
            return
        alive = []
        quiet_since = time.monotonic() - min(STACK_LEAD, self.plan.deadline / 4)
        for r in self.ranks:
            if _remote(r) or r.ended or r.proc.poll() is not None:
                continue
            r.read_events()
            if r.obs.events and r.obs.events[-1].t > quiet_since:
                continue
            try:
                if psutil.Process(r.proc.pid).status() == psutil.STATUS_STOPPED:
                    continue
            except psutil.Error:
                continue
            alive.append(r)
        if alive:
            self._native_pool = ThreadPoolExecutor(max_workers=len(alive))
            now = self.now()
            self._native = {r.label: (self._native_pool.submit(native_stacks, r.proc.pid), now)
                            for r in alive}

    def _say(self, line: str) -> None:
        """A progress line (pytest -v shows them live); a failing printer never stops a run."""
        if self.progress is not None:
            try:
                self.progress(line)
            except Exception:  # noqa: BLE001 - progress is a courtesy
                self.progress = None

    def _say_end(self, r: RankProcess) -> None:
        if self.progress is None:
            return
        res = result_of(r.obs.events)
        if res is not None and res.data.get("status") == "exception":
            how = f"raised {(res.data.get('exc') or {}).get('type') or 'an exception'}"
        elif res is not None:
            how = "ok"
        else:
            how = f"exit status {r.obs.returncode}"
        who = f"rank {r.label}" if r.label.isdigit() else r.label
        self._say(f"{who}: ended at {r.obs.ended_at or 0:.2f} s in "
                  f"{last_phase(r.obs.events)}: {how}")

    def run(self) -> RunObservation:
        self.scheduler.setup()            # set-up steps: before any process of the run starts
        looking = self._port_owners_start()   # while the ranks import (none binds before
        self.observe_dir.mkdir(exist_ok=True)  # the start line)
        self.launcher.start(self)
        self._wait_ready()
        self._check_torch()
        owners = self._port_owners_end(looking)
        memory = self._own_memory()
        self.t0 = time.monotonic()
        torch_version = next((str(e.data.get("torch")) for r in self.ranks
                              for e in [ready_event(r.obs.events)] if e is not None), "unknown")
        deadline = self.plan.deadline
        self._say(f"start line: {len(self.ranks)} process{'es' * (len(self.ranks) != 1)} "
                  f"ready (torch {torch_version}), released; deadline {deadline:g} s")
        while True:
            now = self.now()
            for r in self.ranks:
                if not r.released and r.plan is not None and r.running() \
                        and r.plan.release.due(now, self):
                    r.release(now)
                r.read_events()
                if r.label not in self._sockets_taken and _raised(r.obs.events):
                    self._take_sockets([r])   # before it exits, if it has not yet
                    if self._store is None:
                        self._take_store()
                if r.poll_end(self.now()):
                    self._say_end(r)
            self.launcher.poll(self)          # workers started by agents or parents
            self.scheduler.tick(now)
            if all(r.ended for r in self.ranks):
                before = len(self.ranks)
                self.launcher.poll(self)      # the last words of a worker that just appeared
                if len(self.ranks) == before and all(r.ended for r in self.ranks):
                    break
            if now >= deadline:
                break
            if self._native is None and now >= deadline - min(STACK_LEAD, deadline / 4):
                self._start_native_stacks()
            time.sleep(POLL)
        live = [r for r in self.ranks if not r.ended]
        if live:
            self._take_store(again=True)
            self._say(f"deadline {deadline:g} s: {', '.join(r.label for r in live)} still "
                      "alive: taking stacks, killing")
            self._take_sockets(live)
            self._sample_cpu(live)   # the second read, before the stacks' pause
            for r in live:   # what the load added to its duration, before the stacks' pause
                pid = r.obs.pid
                r.obs.waited_at_deadline = runqueue_wait(int(pid)) \
                    if pid and not _remote(r) else None
            self._capture_stacks(live)
            for r in live:
                r.obs.killed_at_deadline = True
            self._kill(live)
        for r in self.ranks:
            self._wait(r)
            r.read_events()
            if r.cutoff is not None:
                del r.obs.events[r.cutoff:]
            if r.obs.returncode is None:
                r.obs.returncode = r.proc.returncode
                if r.obs.ended_at is None or r.obs.killed_at_deadline:
                    r.obs.ended_at = round(self.now(), 3)
        self.launcher.poll(self)   # exit statuses the agents collected last
        for r in self.ranks:
            if isinstance(r.proc, ForeignProcess) and r.obs.returncode is None:
                r.obs.returncode = r.proc.returncode
        self.capture.close()    # every rank is gone: the last bytes, the tails, the markers
        for r in self.ranks:
            r.obs.stdout_tail = _tail(r.out_path) if r.out_path else ""
            r.obs.stderr_tail = _tail(r.err_path) if r.err_path else ""
            r.obs.stderr_key = key_lines(r.err_path) if r.err_path else ""
            if not r.obs.stacks and r.stacks_path.exists():
                r.obs.stacks = _read_stacks(r.stacks_path)
        wall = self.now()
        rules = self._rules_at_deadline or ({h.name: self._rules(h.name)
                                             for h in self.plan.hosts}
                                            if self.topo is not None else {})
        store = self._store_snapshot()
        stores = self._stores_snapshots()
        counters = {h.name: self._counters(h.name) for h in self.plan.hosts} \
            if self.topo is not None else {}
        # what each fault did: read before teardown (nft counters go with the namespaces)
        # (a fault without steps: what it changed in the plan, from what the processes said)
        effects = aggregate(self.plan.faults, self.scheduler.effects(self.now()) + edits.read(
            self.plan.edits, [r.obs for r in self.ranks], self.t0, self.now(),
            absent=[r.label for r in self.plan.ranks if r.absent]))
        problems = self.scheduler.teardown(wall)
        if problems:
            raise HarnessError("; ".join(problems))
        self._check_torch()     # workers found after the start line (an agent's, a parent's)
        assert self.t0 is not None
        return RunObservation(plan=self.plan.to_dict(), torch_version=torch_version,
                              ranks=[r.obs for r in self.ranks], wall=round(wall, 3),
                              run_dir=str(self.dir), t0=self.t0,
                              step_log=list(self.scheduler.log), port_owners=owners,
                              rules=rules, counters=counters, harness_memory=memory,
                              store=store, stores=stores,
                              servers=[o.record() for o in self.owned if hasattr(o, "record")],
                              effects=effects)

    def _take_sockets(self, rows: Sequence[RankProcess]) -> None:
        """The TCP sockets of ``rows``, read from /proc (harness.sockets: no process is
        entered, nothing waits), each remote end named when a process of the run holds it.
        Evidence only: whatever goes wrong leaves the rows without sockets."""
        from ..net.sockets import children, snapshot

        names: Dict[int, str] = {}
        rows = [r for r in rows if not _remote(r)]   # a node's /proc is not this machine's
        try:
            for r in self.ranks:
                if _remote(r):
                    continue
                if r.proc.pid is not None and r.proc.poll() is None:
                    names[r.proc.pid] = r.label if r.label.startswith(f"{r.role}:") \
                        or f":{r.role}:" in r.label else f"{r.role} {r.label}"
                    if r.role == "rank":
                        names[r.proc.pid] = f"rank {r.label}"
            for pid in list(names):
                for c in children(pid):
                    names.setdefault(c, f"a child of {names[pid]} (pid {c})")
            for svc in self.services:
                try:
                    names.setdefault(svc.pid, f"{svc.name} (pid {svc.pid}, the harness's)")
                except Exception:  # noqa: BLE001 - not started
                    continue
            table = snapshot(names, t=round(self.now(), 3))
        except Exception:  # noqa: BLE001 - evidence only: never fail the run for it
            return
        for r in rows:
            self._sockets_taken.add(r.label)
            if r.proc.pid in table:
                r.obs.sockets = table[r.proc.pid]

    def _store_addr(self) -> Optional[Tuple[str, str]]:
        """(host, "ip:port") where the job's store listens (harness.jobstore: the port the
        launch gives it, not necessarily the lease), on the loopback of its host (TCPStore
        listens on every address of its host; asking by loopback needs no name and no route);
        where rank 0 was told another MASTER_PORT (a fault), that one. A port chosen at run
        time (torchrun's standalone or single-node launch) is the one its rank-0 worker was
        handed, as observed. None: no store port is known (init: file, or none observed)."""
        store = self.plan.store()
        first = self.plan.ranks[0]
        port = str(store.port) if store.port is not None else ""
        if not port and store.kind == "tcp":
            for r in self.ranks:
                info = r.obs.info or {}
                if r.obs.role == "worker" and info.get("rank") == 0 and \
                        str(info.get("use_agent_store")) != "False" and \
                        str(info.get("master_port") or "").isdigit():
                    return r.obs.host, f"127.0.0.1:{info['master_port']}"
        if first.rank == 0 and first.role == "rank" and store.kind == "tcp" and \
                not first.init.url:
            told = str((first.env or {}).get("MASTER_PORT") or "")
            port = told if told.isdigit() else port
        if not port:
            return None
        host = store.host or first.host
        six = ":" in str(self.plan.master_addr) and not str(self.plan.master_addr).startswith("[")
        return host, (f"[::1]:{port}" if six else f"127.0.0.1:{port}")

    def _take_store(self, again: bool = False) -> None:
        """Ask the run's store what it holds (harness.storeprobe), once, in a thread: at the
        deadline before the kill, or when a rank first raises. Evidence only. The nft rules
        in force are read at the deadline too (a rule a trigger lifts later is still shown)."""
        if (self._store is not None and not again) or not self.plan.ranks:
            return
        if self.plan.allocation is not None:   # the store is on a node, not on this machine
            return
        from ..net.storeprobe import StoreSnapshot, connect_and_ask

        where = self._store_addr()
        host, addr = where if where is not None else ("", "")
        t = round(self.now(), 3)

        def asking() -> Optional[StoreSnapshot]:
            if where is None:   # no store port known: nothing to ask
                return None
            fam = socket.AF_INET6 if addr.startswith("[") else socket.AF_INET
            try:
                sock = self.topo.socket(host, fam, socket.SOCK_STREAM) \
                    if self.topo is not None else socket.socket(fam, socket.SOCK_STREAM)
            except Exception as e:  # noqa: BLE001 - evidence only
                return StoreSnapshot(addr=addr, host=host, t=t, error=str(e))
            snap = connect_and_ask(sock, addr)
            snap.host, snap.t = host, t
            return snap

        # submitted and shut down as one: a Ctrl-C between (one landing in the worker thread's
        # start is enough) left the worker waiting for work that never came, its executor held
        # by the traceback, and the interpreter's exit joined it for good (pytest hung after
        # two quick Ctrl-Cs: 2 of 6 tries)
        with interrupts.shield():
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
            try:
                self._store = pool.submit(asking)
                for whost, waddr in self._worker_stores():
                    if waddr != addr:
                        self._stores[waddr] = pool.submit(self._asker(whost, waddr, t))
            finally:
                pool.shutdown(wait=False)
        if self.topo is not None and self.now() >= self.plan.deadline:
            self._rules_at_deadline = {h.name: self._rules(h.name) for h in self.plan.hosts}

    def _asker(self, host: str, addr: str, t: float) -> Any:
        from ..net.storeprobe import StoreSnapshot, connect_and_ask

        def asking() -> StoreSnapshot:
            try:
                sock = self.topo.socket(host, socket.AF_INET, socket.SOCK_STREAM) \
                    if self.topo is not None else socket.socket(socket.AF_INET,
                                                                socket.SOCK_STREAM)
            except Exception as e:  # noqa: BLE001 - evidence only
                return StoreSnapshot(addr=addr, host=host, t=t, error=str(e))
            snap = connect_and_ask(sock, addr)
            snap.host, snap.t = host, t
            return snap
        return asking

    def _worker_stores(self) -> List[Tuple[str, str]]:
        """(host, "127.0.0.1:port") of each store torchrun's workers host themselves
        (TORCHELASTIC_USE_AGENT_STORE False: their rank 0 starts a TCPStore on MASTER_PORT),
        asked on the host of the worker that hosts it."""
        out: Dict[str, str] = {}
        for r in self.ranks:
            info = r.obs.info or {}
            if r.obs.role != "worker" or str(info.get("use_agent_store")) != "False" or \
                    not str(info.get("master_port") or "").isdigit():
                continue
            addr = f"127.0.0.1:{info['master_port']}"
            if info.get("rank") == 0 or addr not in out:
                out[addr] = r.obs.host
        return [(h, a) for a, h in out.items()]

    def _stores_snapshots(self) -> List[Dict[str, Any]]:
        out = []
        for fut in self._stores.values():
            try:
                out.append(dict(fut.result(timeout=5.0).to_dict()))
            except Exception:  # noqa: BLE001 - evidence only
                pass
        return out

    def _store_snapshot(self) -> Dict[str, Any]:
        if self._store is None:
            return {}
        try:
            snap = self._store.result(timeout=5.0)
            return dict(snap.to_dict()) if snap is not None else {}
        except Exception:  # noqa: BLE001 - evidence only
            return {}

    def _own_memory(self) -> Dict[str, Any]:
        """The harness's own resident memory when every rank is ready: this supervisor and what
        its launcher keeps for the run (fork servers; a forked rank's pages shared with its
        server are counted once, in the server), in MiB, and per rank of the run."""
        import psutil

        def rss(pid: int) -> float:
            try:
                return float(psutil.Process(pid).memory_info().rss) / (1 << 20)
            except psutil.Error:
                return 0.0

        sup = rss(os.getpid())
        servers = sum(rss(int(o.pid)) for o in self.owned if getattr(o, "pid", None))
        n = max(1, len(self.ranks))
        return {"supervisor_mb": round(sup, 1), "servers_mb": round(servers, 1),
                "ranks": len(self.ranks), "per_rank_mb": round((sup + servers) / n, 2)}

    def _port_owners_start(self) -> Any:
        """Who holds MASTER_PORT, seen from the master host (inside its namespace if any:
        psutil only sees the network namespace it runs in): asked now, in a child that the
        ranks' start does not wait for (:meth:`_port_owners_end` reads it before the start
        line; no rank binds a port before it)."""
        if self.plan.allocation is not None:   # the master port is a node's, not ours
            return []
        port = self.plan.store().port   # the job's store port (harness.jobstore)
        if port is None:
            return []
        if self.topo is None:
            return port_owners(port)
        # harness.sockets imports nothing of the harness: the child costs ~40 ms of CPU
        # where one importing harness.launch cost ~0.3 s, once per run with namespaces
        code = ("import json,sys; from harness.net.sockets import port_owners; "
                f"print(json.dumps(port_owners({port})))")
        try:
            with interrupts.shield():
                return ManagedProcess(self.prefix(self.plan.store().host or
                                                  self._master_host()) +
                                      [sys.executable, "-c", code], name="port owners",
                                      record=self.rundir.pids, env=process_env(),
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        except OSError:
            return []

    def _port_owners_end(self, looking: Any) -> List[Dict[str, Any]]:
        if not isinstance(looking, ManagedProcess):
            return list(looking)
        try:
            out, _ = looking.popen.communicate(timeout=60)
            return list(json.loads(out.decode().strip().splitlines()[-1]))
        except (subprocess.TimeoutExpired, ValueError, IndexError, OSError):
            return []
        finally:
            looking.kill()

    def _counters(self, host: str) -> Dict[str, int]:
        try:
            return dict(self.topo.counters(host))
        except Exception:  # noqa: BLE001 - evidence only: never fail the run for it
            return {}

    def _rules(self, host: str) -> str:
        try:
            return str(self.topo.rules(host))
        except Exception as e:  # evidence only: never fail the run for it
            return f"(could not list: {e})"

    def _kill(self, rows: List[RankProcess]) -> None:
        """SIGKILL: the processes the harness started first (an agent that saw its workers die
        would start new ones), then the others, then whatever the observer recorded."""
        for r in sorted(rows, key=lambda r: not r.held):
            r.proc.signal_group(signal.SIGKILL)
        kill_observed(self.rundir.pids)

    def _wait(self, r: RankProcess) -> None:
        if isinstance(r.proc, ForeignProcess):
            r.proc.wait(10.0)
        else:
            r.proc.wait()

    def close(self) -> None:
        """Kill everything this run started (also after an exception), undo what steps left
        (a directory made immutable, say), close files. Call it inside ``interrupts.shield()``."""
        self._kill(self.ranks)
        for r in self.ranks:
            r.close_go()
            r.proc.kill()
        kill_observed(self.rundir.pids)
        for thing in self.owned:
            thing.close()
        if self._native_pool is not None:   # early py-spy dumps: quick once the ranks are gone
            self._native_pool.shutdown(wait=True)
        self.scheduler.teardown(self.now())
        self.services.stop_all()
        close_fds(self.fds)
        self.capture.close()


def run_scenario(scn: Scenario, keep: Optional[Path] = None,
                 progress: Optional[Callable[[str], None]] = None,
                 allocation: Any = None) -> RunObservation:
    """Plan and run one scenario case for real; leaves nothing behind, also when interrupted
    (Ctrl-C, SIGTERM: the cleanup runs shielded, then the interrupt goes on).

    ``keep``: copy the run directory (events, stacks, stdout/stderr) there before removal; also
    when the harness failed (a HarnessError), with the error in ``harness-error.txt``.
    ``progress``: called with one line when the start line is released, when each row ends
    and at the deadline (``pytest -v`` prints them live).
    ``allocation`` (harness.allocation.Allocation): the ranks run across its nodes (the
    scenario adapted by ``harness.allocation.adapt``); the run directory goes to its shared
    folder, and no namespace is made.
    """
    from ..net import topology

    can_netns = not topology.missing() and allocation is None
    with interrupts.shield():
        # a killed run's cgroups (resource faults) first, while its run directory still says
        # the run is dead (a cgroup of a run no directory here speaks of is not ours to judge)
        cgroups.sweep()
        sweep()
        if not topology.missing():
            topology.sweep()
        base = None
        if allocation is not None and allocation.shared_dir:
            from ..machine.rundir import shared_base

            base = shared_base(allocation.shared_dir)
            sweep(base)
        rundir = RunDir(base, shared=allocation is not None)
    sup: Optional[Supervisor] = None
    topo: Any = None
    lease: Optional[PortLease] = None
    failure: Optional[BaseException] = None
    try:
        lease = PortLease()
        plan = make_plan(scn, str(rundir.path), lease.take, netns=can_netns, run_id=rundir.id,
                         allocation=allocation)
        if plan.netns and not can_netns:
            raise HarnessError("this scenario needs network namespaces: "
                               + "; ".join(topology.missing()))
        if plan.netns:
            topo = topology.Topology(plan.run_id, [h.name for h in plan.hosts],
                                     link=plan.link or None, ip=plan.ip,
                                     service_hosts=plan.service_hosts())
            with interrupts.shield():   # made whole or torn down whole
                topo.__enter__()
        sup = Supervisor(plan, rundir, topo, progress=progress)
        return sup.run()
    except StepError as e:
        failure = HarnessError(f"a fault step failed: {e}")
        raise failure from None
    except BaseException as e:  # noqa: B036 - noted for the cleanup, re-raised
        failure = e
        raise
    finally:
        with interrupts.shield():
            left = _cleanup(sup, topo, lease, rundir, keep, failure)
        if isinstance(failure, KeyboardInterrupt):
            interrupts.note_cleaned(rundir.id, left)
        elif left and failure is None:
            raise HarnessError("cleanup left things behind: " + "; ".join(left))


_NOT_EVIDENCE = shutil.ignore_patterns("filestore", "readonly", "owner.json", "pids.jsonl",
                                       "*.sock", "munge",   # munge: the Slurm cluster's key
                                       "etcd-data")   # etcd preallocates a 64 MB log there


def _not_evidence(folder: str, names: List[str]) -> Set[str]:
    """What a kept run directory leaves out: the patterns above, and anything that is neither
    a file nor a folder (a socket a daemon left, such as a Slurm step daemon's in its spool)."""
    import stat

    out = set(_NOT_EVIDENCE(folder, names))
    for name in names:
        try:
            mode = os.lstat(os.path.join(folder, name)).st_mode
        except OSError:
            out.add(name)
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
            out.add(name)
    return out


def _cleanup(sup: Optional[Supervisor], topo: Any, lease: Optional[PortLease], rundir: RunDir,
             keep: Optional[Path], failure: Optional[BaseException]) -> List[str]:
    """Everything a run made goes, in order: processes, network, ports, run directory.
    Returns what could not be removed (said, never raised: the first error matters)."""
    left: List[str] = []
    if sup is not None:
        try:
            sup.close()
        except Exception as e:  # noqa: BLE001 - go on with the rest
            left.append(f"closing the run's processes: {e}")
    killed = kill_recorded(rundir.path)   # anything recorded that is still alive
    if killed:
        left.append(f"processes {killed} had to be killed from the run's record")
    if topo is not None:
        try:
            topo.__exit__(None, None, None)
        except Exception as e:  # noqa: BLE001
            left.append(str(e))
    if lease is not None:
        lease.release()
    keep_error = ""
    if keep is not None and not isinstance(failure, KeyboardInterrupt):
        try:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copytree(rundir.path, keep, dirs_exist_ok=True,
                            ignore=lambda f, names: _not_evidence(f, names) | (
                                {RUN_TMP} if Path(f) == rundir.path else set()))
            if isinstance(failure, Exception):
                (keep / "harness-error.txt").write_text(f"{failure}\n")
        except OSError as e:
            keep_error = f"could not keep the evidence in {keep}: {e.strerror or e}"
    rundir.remove()
    if rundir.path.exists():
        left.append(f"run directory {rundir.path}")
    if keep_error and failure is None:
        raise HarnessError(keep_error)
    return left

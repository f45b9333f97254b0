"""Launch and supervise one run: start its processes, fire the fault steps, enforce the
deadline, capture the stacks of whatever is still alive, kill it all. Nothing outlives a run.

``run_scenario`` owns one run's life: the sweep of killed runs, the run directory, the port
lease, the plan, the topology, the supervisor, and the cleanup (inside ``interrupts.shield()``:
a SIGTERM or a second Ctrl-C waits until it has finished). The :class:`Supervisor` runs the
plan: a launcher (``harness.launchers``) starts every process; every rank imports torch and
reports ``ready``; only then is the clock started (the start line) and each rank released when
its release trigger holds; the scheduler (``harness.faults.steps``) fires the faults' steps
when their triggers hold, through the small Runtime interface this class implements
(:mod:`harness.run.runtime`). The supervisor knows no fault by name. At the deadline it takes
the live rows' stacks (:mod:`harness.run.stacks`); the evidence of a live run (sockets, the
store, port owners, rules, counters) is :mod:`harness.run.probes`.

A rank's stdout and stderr go through pipes drained by one thread
(``harness.machine.output_caps``): kept up to a head and a tail with a marker of what was cut,
so evidence stays bounded. A rank that dies before it reported ``ready`` (Python or torch could
not start) is a HarnessError naming the rank and the cause.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from ..core.errors import HarnessError
from ..core.protocol import (
    EXCEPTION,
    PHASE,
    RESULT,
    RUN_TMP,
    Event,
    last_phase,
    ready_event,
    result_of,
)
from ..faults.steps import StepError
from ..judge import edits
from ..judge.effects import aggregate
from ..judge.observation import RunObservation
from ..judge.stderrlines import key_lines
from ..launchers import RankProcess, close_fds
from ..machine import cgroups, interrupts
from ..machine.ports import PortLease
from ..machine.procs import ForeignProcess, kill_observed, runqueue_wait
from ..machine.rundir import RunDir, kill_recorded, sweep
from ..scenario.schema import Scenario
from .plan import make_plan
from .probes import Probes
from .runtime import POLL, READY_TIMEOUT, _remote
from .stacks import STACK_LEAD, DeadlineStacks, _read_stacks
from .stacks import native_stacks_available as native_stacks_available

TAIL = 4000


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL))
            return f.read().decode(errors="replace")
    except OSError:
        return ""



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


class Supervisor(Probes, DeadlineStacks):
    """Runs one RunPlan. It is the Runtime that fault steps act through (harness.faults.steps)
    and the Clock their triggers read. Use ``run_scenario`` unless you build plans yourself."""

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
        """Every process that said ``ready`` ran the torch of the interpreter it ran on
        (protocol.torch_identity against harness.machine.torch_probe of that interpreter: the
        one the process names, else its plan's), or the run is a harness error naming who ran
        which torch from where: a report must never say one torch while ranks ran another (a
        path that leaks another environment's site-packages). The interpreter the process
        names, not its plan's: a spawned child or a Slurm task has the plan of its row, not of
        the parent or task that started it on another interpreter (``harness run --python``,
        compare's other side). A process whose plan sets its own PYTHONPATH chose its torch
        itself and is not judged."""
        from ..machine.torch_probe import probe

        for r in self.ranks:
            e = ready_event(r.obs.events)
            got = e.data.get("torch_path") if e is not None else None
            if e is None or not got or r.label in self._torch_checked:
                continue
            self._torch_checked.add(r.label)
            if r.plan is not None and "PYTHONPATH" in r.plan.env:
                continue
            python = e.data.get("python") or \
                (r.plan.python if r.plan is not None else "") or None
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
        owners, memory = self._start()
        torch_version = next((str(e.data.get("torch")) for r in self.ranks
                              for e in [ready_event(r.obs.events)] if e is not None), "unknown")
        deadline = self.plan.deadline
        self._say(f"start line: {len(self.ranks)} process{'es' * (len(self.ranks) != 1)} "
                  f"ready (torch {torch_version}), released; deadline {deadline:g} s")
        self._watch(deadline)
        live = [r for r in self.ranks if not r.ended]
        if live:
            self._at_deadline(live, deadline)
        self._reap()
        return self._observation(torch_version, owners, memory)

    def _start(self) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
        """Every process started and ready, its torch checked, then the start line (``t0``):
        (who held the master port, the harness's own memory) as seen before it."""
        self.scheduler.setup()            # set-up steps: before any process of the run starts
        looking = self._port_owners_start()   # while the ranks import (none binds before
        self.observe_dir.mkdir(exist_ok=True)  # the start line)
        self.launcher.start(self)
        self._wait_ready()
        self._check_torch()
        owners = self._port_owners_end(looking)
        memory = self._own_memory()
        self.t0 = time.monotonic()
        return owners, memory

    def _watch(self, deadline: float) -> None:
        """From the start line until every row ended or the deadline: release the ranks, read
        their events, fire the steps, take the evidence of a row that raised."""
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
            if all(r.ended for r in self.ranks) and not self.scheduler.holding():
                before = len(self.ranks)
                self.launcher.poll(self)      # the last words of a worker that just appeared
                if len(self.ranks) == before and all(r.ended for r in self.ranks):
                    break
            if now >= deadline:
                break
            if self._native is None and now >= deadline - min(STACK_LEAD, deadline / 4):
                self._start_native_stacks()
            time.sleep(POLL)

    def _at_deadline(self, live: List[RankProcess], deadline: float) -> None:
        """The rows alive at the deadline: the store, their sockets, CPU and stacks, then the
        kill."""
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
        self.settle_store()   # the store's answer before the kill ends the store
        self._kill(live)

    def _reap(self) -> None:
        """Every row's end: its exit status, its events cut at the deadline, its output's
        tails and stacks."""
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

    def _observation(self, torch_version: str, owners: List[Dict[str, Any]],
                     memory: Dict[str, Any]) -> RunObservation:
        """What was seen of the run, read before the teardown (the steps' undo and what nft
        counted go with it)."""
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
    ``allocation`` (harness.tools.allocation_catalog.Allocation): the ranks run across its
    nodes (the scenario adapted by ``harness.tools.allocation_catalog.adapt``); the run
    directory goes to its shared folder, and no namespace is made.
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

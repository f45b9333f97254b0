"""Launchers: how the processes of a run come to life (the launcher seam).

A launcher is a small pydantic model (the YAML field ``launcher:``, a name or a mapping with
``kind`` first, like a fault) and owns everything about how a scenario's ranks start:

* its options and ``check(scenario)`` (located problems the schema cannot see);
* ``rows(scenario)``: which processes a run can have (:class:`harness.core.rows.RowSet`: ranks and
  restart attempts, agents, parents), for expectation keys and fault targets;
* ``plan(plan, scenario)``: the processes it starts itself, as :class:`harness.run.plan.RankPlan`
  objects (label, role, argv, environment, host, release trigger), pure;
  ``plan_job(...)`` the same for a second job (``concurrent_job``);
* at run time, ``start(sup)``: every planned process through :mod:`harness.machine.procs`, returning
  a :class:`RankProcess` each; and ``poll(sup)``, every tick of the supervisor: the processes it did
  not start itself (an agent's workers, a parent's children) as their event files appear in the
  run's ``observed/`` folder (harness.ranks.observer writes them).

The supervisor does the rest the same way for every launcher: waits until every process it
holds is ready (torch imported), starts the clock (the start line), releases each when its
release trigger holds, fires the fault steps, enforces the deadline, takes the stacks of
whatever is alive and kills it all. It names no launcher.

Kinds: ``direct`` (:mod:`.direct`: one ``python`` per rank), ``torchrun`` (:mod:`.torchrun`: one
agent per host), ``spawn`` (:mod:`.spawn`: one parent per host that spawns its ranks),
``slurm`` (:mod:`.slurm`: ``srun`` on the run's own Slurm test cluster).
"""

from __future__ import annotations

import json
import os
import signal as _signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, ClassVar, Dict, List, Optional, Tuple

from pydantic import BaseModel, ConfigDict

from ..core import protocol as P
from ..core.rows import RowSet
from ..core.triggers import Trigger
from ..judge.observation import RankObservation, SignalSent
from ..machine import interrupts
from ..machine.procs import ForeignProcess, ManagedProcess
from ..machine.rundir import package_path
from ..net import resolver
from ..net.addresses import IFNAME_VARS

# A planned process is a harness.run.plan.RankPlan; this room does not import the plan (the plan
# and the schema import the launchers), so it is typed by its name only.
RankPlan = Any

Problem = Tuple[Tuple[Any, ...], str]   # (location inside the launcher, message)
SITE_DIR = str(Path(__file__).resolve().parent.parent / "ranks" / P.OBSERVE_SITE)
# what the harness's own environment must not pass on to a rank (the job's variables, a
# torchrun's or pytest's): torchrun reads PET_* as its defaults, and a worker told
# TORCHELASTIC_USE_AGENT_STORE=True by an inherited environment never hosts its store
CLEARED = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
           "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE",
           "NODE_RANK")
CLEARED_PREFIXES = ("PYTEST_", "HARNESS_", "TORCHELASTIC_", "PET_")
# what torch reads only after import (init_process_group's env://, the gloo/NCCL device): a rank
# forked from a warm server (start: fork) may have its own. Every other variable is read, or
# may be, while Python and torch load (TORCH_CPP_LOG_LEVEL, OMP_*/MKL_*, PYTHON*, LD_*...): a
# forked rank has its server's, so only ranks that agree on all of them share a server.
RUNTIME_ENV = frozenset(("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                         "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
                         "ROLE_WORLD_SIZE", *IFNAME_VARS))


class LauncherSpec(BaseModel):
    """Base of the launchers (see the module doc)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    kind: str
    summary: ClassVar[str] = ""
    # it starts every rank itself, so a fault may edit a rank's environment or arguments
    STARTS_RANKS: ClassVar[bool] = False
    # why a process it starts cannot be started again mid-run (kill_rank's restart_after);
    # None: it can (:meth:`restart`)
    NO_RESTART: ClassVar[Optional[str]] = None

    # -- planning (pure) ---------------------------------------------------------------------------
    def check(self, scn: Any) -> List[Problem]:
        return []

    def rows(self, scn: Any, job: str = "", world: Optional[int] = None) -> RowSet:
        return RowSet(world=world or scn.world_size, job=job)

    def needs_netns(self, scn: Any) -> bool:
        """The run must be in namespaces of its own (a literal port such as 29400)."""
        return False

    def requirements(self, scn: Any) -> List[Any]:
        """What it needs from the machine (harness.machine.requirement's kinds: the skip
        reason)."""
        return []

    def plan(self, plan: Any, scn: Any) -> None:
        raise NotImplementedError

    def plan_job(self, plan: Any, scn: Any, job: str, world: int,
                 release: Optional[Trigger] = None) -> None:
        raise NotImplementedError(f"a second job is not planned for launcher {self.kind}")

    def describe(self) -> str:
        return self.kind

    def assign_start(self, plan: Any, scn: Any) -> None:
        """Decide, per planned process, whether it starts fresh or forked from a warm server
        (``RankPlan.start``; ``start_note`` says why a process runs fresh where the run asked
        for fork). Only a launcher that starts the ranks itself can fork them: this one
        starts everything fresh and says so."""
        if plan.start != "fork":
            return
        for rp in plan.ranks:
            rp.start_note = (f"the {self.kind} launcher starts this process fresh (start: fork "
                             "forks ranks the harness starts itself: launcher direct)")

    # -- run time ----------------------------------------------------------------------------------
    def start(self, sup: Any) -> List[RankProcess]:
        """Start every process the plan holds (not released yet); each is recorded."""
        out = [start_process(sup, rp) for rp in sup.plan.launched_ranks()]
        return out

    def restart(self, sup: Any, rp: RankPlan) -> RankProcess:
        """Start a planned restart (``RankPlan.restart_of``) mid-run: a fresh process as the
        first one was started (same argv, environment, host), recorded and owned by the run,
        released at once (it is not held for a start line that has passed)."""
        return start_process(sup, rp)

    def poll(self, sup: Any) -> None:
        """The processes started by others (workers) as their event files appear."""
        sup.discovery.poll(sup)


class RankProcess:
    """One row as the supervisor sees it: a process (started by the harness, or found through
    its events), its event reader, what was observed, whether it was released or has ended.
    It is the :class:`harness.faults.steps.RankControl` that steps act on."""

    def __init__(self, label: str, proc: Any, *, events: Path, stacks: Path,
                 out: Optional[Path], err: Optional[Path], now: Callable[[], float],
                 host: str = "local", addr: str = "", plan: Optional[RankPlan] = None,
                 role: str = P.ROLE_RANK, go: Any = None, held: bool = True):
        self.plan = plan
        self.label = label
        self.proc = proc
        self.role = role
        self.held = held                  # it waits for the start line
        self.events_path, self.stacks_path, self.out_path, self.err_path = \
            events, stacks, out, err
        self.reader = P.EventReader(events)
        self.obs = RankObservation(label=label, pid=proc.pid, host=host,
                                   addr=addr or "127.0.0.1", role=role)
        self._now = now
        self._go = go                     # where the start line is written (stdin or a pipe)
        self._released = not held
        self._ended = False
        self.cutoff: Optional[int] = None    # events after the deadline are not the run's
        self.seen = 0                        # events the launcher has looked at (identity...)
        self.provisional = False             # labelled "pidN" until its rank is known

    # -- RankControl ---------------------------------------------------------------------------
    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid

    @property
    def released(self) -> bool:
        return self._released

    @property
    def ended(self) -> bool:
        return self._ended

    def signal(self, name: str) -> None:
        """SIG<name> to the process's group (its own process only, if it leads none),
        recorded as evidence."""
        self.proc.signal_group(int(getattr(_signal, "SIG" + name)))
        self.obs.signals.append(SignalSent(name, round(self._now(), 3)))

    def note(self, text: str) -> None:
        """Evidence a step found out about the rank (the OOM killer killed it), for its
        verdict's reason."""
        self.obs.notes.append(text)

    # -- the supervisor's side -----------------------------------------------------------------
    def read_events(self) -> None:
        # a process on another machine (an allocation's node): its events' monotonic times are
        # placed on this machine's clock, once its helper said how (until then: not read yet)
        offset = getattr(self.proc, "clock_offset", 0.0)
        if offset is None:
            return
        new = self.reader.read()
        if offset:
            new = [P.Event(e.ev, e.t + offset, e.data) for e in new]
        self.obs.events.extend(new)
        if self.obs.pid is None and self.proc.pid is not None:
            self.obs.pid = self.proc.pid

    def ready(self) -> bool:
        return self.obs.ready()

    def entered(self, phase: str) -> Optional[float]:
        """When (monotonic) the process entered ``phase``."""
        return P.entered(self.obs.events, phase)

    def release(self, now: float) -> None:
        """The start line: one line on the process's start-line channel."""
        self._released = True
        self.obs.released_at = round(now, 3)
        go, self._go = self._go, None
        try:
            if go is not None:
                go.write(P.GO_LINE)
                go.close()
        except (BrokenPipeError, OSError):
            pass

    def running(self) -> bool:
        return bool(self.proc.running())

    def poll_end(self, now: float) -> bool:
        """Mark the process ended if it exited; True when it just did."""
        if self._ended or self.running():
            return False
        self._ended = True
        self.read_events()
        self.obs.returncode = self.proc.returncode
        self.obs.ended_at = round(now, 3)
        end = getattr(self.proc, "end_time", None)   # when it ended on its node, if said
        if end is not None:
            self.obs.ended_at = round(max(0.0, now - max(0.0, time.monotonic() - end)), 3)
        return True

    def close_go(self) -> None:
        go, self._go = self._go, None
        if go is not None:
            try:
                go.close()
            except OSError:
                pass


def import_key(rp: RankPlan) -> Tuple[Any, ...]:
    """What a rank's interpreter depends on up to ``import torch``: its environment but the
    variables torch reads later (RUNTIME_ENV), what it unsets, its resolver view. Ranks with
    one key can be forked from one server that imported torch with it."""
    return (tuple(sorted((k, v) for k, v in rp.env.items() if k not in RUNTIME_ENV)),
            tuple(sorted(k for k in rp.unset if k not in RUNTIME_ENV)), rp.resolver_view)


def key_difference(a: Tuple[Any, ...], b: Tuple[Any, ...]) -> List[str]:
    """The variables (or "the resolver view") in which two import keys differ."""
    env_a, env_b = dict(a[0]), dict(b[0])
    names = sorted({k for k in set(env_a) | set(env_b) if env_a.get(k) != env_b.get(k)}
                   | (set(a[1]) ^ set(b[1])))
    return names + (["the resolver view"] if a[2] != b[2] else [])


def fork_plan(ranks: List[RankPlan]) -> None:
    """``start: fork`` for the ranks a launcher starts itself (pure): per host, the ranks that
    can be forked and share the most common import key are forked from that host's server;
    every other rank runs fresh with the reason in ``start_note``."""
    groups: Dict[str, Dict[Tuple[Any, ...], List[RankPlan]]] = {}
    for rp in ranks:
        why = fork_refusal(rp)
        if why:
            rp.start, rp.start_note = "fresh", why
            continue
        groups.setdefault(rp.host, {}).setdefault(import_key(rp), []).append(rp)
    for host, by_key in groups.items():
        keys = list(by_key)
        best = max(keys, key=lambda k: len(by_key[k]))    # the first of the largest
        for key in keys:
            for rp in by_key[key]:
                if key == best:
                    rp.start, rp.start_note = "fork", ""
                    continue
                diff = ", ".join(key_difference(key, best))
                rp.start = "fresh"
                rp.start_note = (f"its environment differs from the forked ranks' on host "
                                 f"{host} in {diff} (read while torch imports; a forked rank "
                                 "has its server's)")


def fork_refusal(rp: RankPlan) -> str:
    """Why this rank cannot be forked from a warm server ("" if it can)."""
    if rp.python:
        return f"it runs its own interpreter ({rp.python}): a server imports torch in one"
    if rp.observed or rp.argv:
        return ("it runs a user's program, observed from interpreter start (sitecustomize): "
                "a forked rank would skip that start")
    if rp.role != P.ROLE_RANK:
        return f"it is a {rp.role}, not a rank"
    if rp.fresh_only:
        return rp.fresh_only
    return ""


def supervisor_identity() -> str:
    """This process (the run's supervisor) as "pid:start ticks": an observed worker, which has no
    death signal against its agent or parent (a real one outlives them), dies when it is gone."""
    from ..machine.procs import start_ticks

    return f"{os.getpid()}:{start_ticks(os.getpid()) or 0}"


def process_env(rp: Optional[RankPlan] = None, extra: Optional[Dict[str, str]] = None,
                state: Optional[Path] = None) -> Dict[str, str]:
    """The environment of a process the harness starts for a rank (or, without ``rp``, a
    helper on the rank's machine): the harness's own minus what would leak into the job
    (pytest's, the harness's and torchrun's variables, a MASTER_ADDR of the caller), then the
    process's plan, the resolver view it must resolve with, and the harness importable wherever
    it lives (the observer's sitecustomize first, for an observed process). ``state``: the
    state folder that holds the package's path folder (an allocation's shared one; default:
    this machine's)."""
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(CLEARED_PREFIXES) or k in CLEARED:
            env.pop(k)
    if rp is not None:
        env.update(rp.env)
        for k in rp.unset:
            env.pop(k, None)
        # the rank resolves names with the harness's files only (no DNS query leaves)
        env[resolver.ENV_VIEW] = rp.resolver_view
        if os.environ.get(resolver.ENV_USERNS):
            env[resolver.ENV_USERNS] = os.environ[resolver.ENV_USERNS]
        # torch's C++ store/gloo log lines (connect, retry, timeout) land in the rank's stderr
        if "TORCH_CPP_LOG_LEVEL" not in rp.env:
            env["TORCH_CPP_LOG_LEVEL"] = "INFO"
    env.update(extra or {})
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("PYTHONWARNINGS", "ignore")
    # the harness package alone, never the folder above it (rundir.package_path)
    pkg = package_path(state)
    head = [SITE_DIR, pkg] if rp is not None and rp.observed else [pkg]
    env["PYTHONPATH"] = os.pathsep.join(head + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                                else []))
    return env


def planned_names(rp: RankPlan) -> str:
    """The variables a process's plan sets or unsets (``PLANNED_ENV``): it records what it got
    of them, to compare with the plan."""
    return ",".join(sorted(set(rp.env) | set(rp.unset)))


def _tag(label: str) -> str:
    return label.replace(":", "-").replace("@", "_").replace("#", "_r")


def start_process(sup: Any, rp: RankPlan) -> RankProcess:
    """Start one planned process: the harness's worker speaking the protocol on inherited
    descriptors, or an observed program (harness.ranks.observer) held until the start line."""
    if not rp.observed:
        from .direct import start_worker

        return start_worker(sup, rp)
    tag = _tag(rp.label)
    events = sup.observe_dir / f"{tag}.events"
    stacks = sup.observe_dir / f"{tag}.stacks"
    out, err = sup.dir / f"{tag}.out", sup.dir / f"{tag}.err"
    out_w, err_w = sup.capture.pipe(out), sup.capture.pipe(err)
    go_r, go_w = os.pipe()
    env = process_env(rp, {
        P.OBSERVE_ROLE_ENV: rp.role, P.OBSERVE_DIR_ENV: str(sup.observe_dir),
        P.OBSERVE_EVENTS_ENV: str(events), P.OBSERVE_LABEL_ENV: rp.label,
        P.OBSERVE_JOB_ENV: rp.job, P.GO_FD_ENV: str(go_r), P.PLANNED_ENV: planned_names(rp),
        P.PID_RECORD_ENV: str(sup.rundir.pids.path), P.SUPERVISOR_ENV: supervisor_identity()})
    try:
        with interrupts.shield():   # a process that exists is a process that is tracked
            proc = ManagedProcess([rp.python or sys.executable, *rp.argv],
                                  name=f"{rp.role} {rp.label}",
                                  record=sup.rundir.pids, env=env, cwd=rp.cwd or "/",
                                  stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w,
                                  pass_fds=(go_r,), prefix=sup.prefix(rp.host))
            row = RankProcess(rp.label, proc, events=events, stacks=stacks, out=out, err=err,
                              now=sup.now, host=rp.host, addr=sup.addr_of(rp.host), plan=rp,
                              role=rp.role, go=os.fdopen(go_w, "wb", buffering=0))
            sup.ranks.append(row)
    finally:
        os.close(out_w)
        os.close(err_w)
        os.close(go_r)
    return row


class Discovery:
    """Finds the processes of a run that the harness did not start (an agent's workers, a
    parent's children) as their event files appear in the run's ``observed/`` folder, gives
    each its row (label from its rank and restart attempt, host from its agent), labels a
    worker whose rank it learns later, and hands each worker the exit status its agent or
    parent collected."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.known: Dict[str, Optional[RankProcess]] = {}
        self.reaped: Dict[int, int] = {}

    def poll(self, sup: Any) -> None:
        try:
            names = [e.name for e in os.scandir(self.folder) if e.name.endswith(".events")]
        except OSError:
            names = []
        for r in sup.ranks:
            self.known.setdefault(r.events_path.name, r)
        for name in names:
            if name not in self.known:
                self._found(sup, self.folder / name)
        for r in sup.ranks:
            self._look(sup, r)

    def _found(self, sup: Any, path: Path) -> None:
        try:
            with open(path, "rb") as f:
                first = f.readline()
        except OSError:
            return
        if not first.endswith(b"\n"):
            return   # still being written: next tick
        try:
            hello = json.loads(first)
        except ValueError:
            self.known[path.name] = None
            return
        if not isinstance(hello, dict) or hello.get("ev") != P.HELLO:
            self.known[path.name] = None
            return
        try:
            pid = int(hello["pid"])
            ticks = int(path.name[: -len(".events")].split("-")[1])
        except (KeyError, TypeError, ValueError, IndexError):
            self.known[path.name] = None
            return
        role = str(hello.get("role", P.ROLE_WORKER))
        node = hello.get("node") or ""
        owner = next((r for r in sup.ranks if r.label == node), None)
        host = owner.obs.host if owner is not None else sup.plan.ranks[0].host
        job = str(hello.get("job") or "")
        rank, attempt = hello.get("rank"), int(hello.get("attempt") or 0)
        if owner is not None and owner.role == P.ROLE_AGENT:
            # a restart for a membership change (a node joined) does not count against
            # --max-restarts, so TORCHELASTIC_RESTART_COUNT stays: the agent's own count of
            # the times it restarted its workers is the attempt
            owner.read_events()
            attempt = max(attempt, sum(1 for e in owner.obs.events if e.ev == P.RESTART))
        if owner is not None and owner.obs.restart_of:
            # a restarted agent's (or parent's) workers go on from the attempts of the one it
            # restarts (kill_rank's restart_after): its first worker of rank 1 after the
            # killed agent's "1" is "1@1", not a twin of "1"
            attempt += _attempts_after(sup, owner.obs.restart_of)
        label = P.worker_label(int(rank), attempt, job) if isinstance(rank, int) \
            else f"pid{pid}"
        row = RankProcess(_unique(sup, label), ForeignProcess(pid, ticks), events=path,
                          stacks=path.with_suffix(".stacks"), out=None, err=None, now=sup.now,
                          host=host, addr=sup.addr_of(host), role=role, held=False)
        row.obs.node = node or None
        row.obs.attempt = attempt
        row.obs.info = {k: v for k, v in hello.items() if k not in ("ev", "t")}
        row.obs.released_at = round(sup.now(), 3)
        row.provisional = not isinstance(rank, int)
        self.known[path.name] = row
        sup.ranks.append(row)
        if pid in self.reaped:
            row.proc.returncode = self.reaped[pid]

    def _look(self, sup: Any, r: RankProcess) -> None:
        """New events of a row: a worker's rank learnt late, a child's exit status."""
        events = r.obs.events
        for e in events[r.seen:]:
            if e.ev == P.REAPED:
                try:
                    pid, rc = int(e.data["pid"]), int(e.data["returncode"])
                except (KeyError, TypeError, ValueError):
                    continue
                self.reaped[pid] = rc
                for w in sup.ranks:
                    if w.pid == pid and isinstance(w.proc, ForeignProcess):
                        w.proc.returncode = rc
                        if w.ended:
                            w.obs.returncode = rc
            elif e.ev == P.IDENTITY and r.role == P.ROLE_WORKER:
                # the latest word wins: a spawn index first, then the rank the harness's spawn
                # program or init_process_group gives (the host's first rank + the index)
                rank = e.data.get("rank")
                now = P.parse_label(r.label.split("#")[0])
                if isinstance(rank, int) and (r.provisional or now is None
                                              or now.rank != rank):
                    r.provisional = False
                    job = str(r.obs.info.get("job") or "")
                    left = r.label
                    r.label = r.obs.label = _unique(sup, P.worker_label(rank, r.obs.attempt,
                                                                        job))
                    _give_back(sup, left)
        r.seen = len(events)


def _attempts_after(sup: Any, label: str) -> int:
    """How many attempts the workers of the process ``label`` had (its own restart's workers
    number on from there): 1 + the highest attempt of a worker it started, 0 if it started
    none; through a chain of restarts."""
    rows = [r for r in sup.ranks if r.obs.node == label]
    if not rows:
        own = next((r for r in sup.ranks if r.label == label), None)
        return _attempts_after(sup, own.obs.restart_of) \
            if own is not None and own.obs.restart_of else 0
    return 1 + max(r.obs.attempt for r in rows)


def _give_back(sup: Any, left: str) -> None:
    """A worker left the label ``left`` (its spawn index was not its rank: a parent on the
    second host): the worker that was labelled ``left#2`` only because of that claim takes the
    label its own rank gives. Two processes that both keep claiming one rank stay ``#2``."""
    if "#" in left or any(w.label == left for w in sup.ranks):
        return
    twins = [w for w in sup.ranks if w.role == P.ROLE_WORKER and w.label.startswith(left + "#")
             and w.label[len(left) + 1:].isdigit()]
    if twins:
        w = min(twins, key=lambda w: int(w.label[len(left) + 1:]))
        w.label = w.obs.label = left


def _unique(sup: Any, label: str) -> str:
    """``label``, or ``label#2``... when another row has it (two processes claim one rank)."""
    taken = {r.label for r in sup.ranks}
    if label not in taken:
        return label
    n = 2
    while f"{label}#{n}" in taken:
        n += 1
    return f"{label}#{n}"


def close_fds(fds: List[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()


def launcher_kinds() -> Dict[str, type[LauncherSpec]]:
    """Every launcher kind by name."""
    from .direct import Direct
    from .slurm import Slurm
    from .spawn import Spawn
    from .torchrun import Launch, Torchrun

    return {c.model_fields["kind"].default: c for c in (Direct, Torchrun, Launch, Spawn, Slurm)}


def launcher_of(v: Any) -> Any:
    """YAML: a kind's name, or a mapping with ``kind`` (default: direct)."""
    if v is None:
        return {"kind": "direct"}
    if isinstance(v, str):
        return {"kind": v}
    return v

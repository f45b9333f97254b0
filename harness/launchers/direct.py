"""The direct launcher: the harness starts every rank itself, one interpreter per rank.

With the harness's worker (``program: worker``, the default) each rank is a fresh
``python -m harness.ranks.worker SPEC`` that speaks the worker protocol on inherited descriptors:
its event and stack channels, the start line on its stdin (harness.core.protocol). With a user's
program each rank is ``python train.py ARGS`` (or ``python -m MODULE ARGS``) with RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, as a cluster script would, and
runs under the observer (harness.ranks.observer), held until the start line.

Every rank runs in its own session (harness.machine.procs), in its host's network namespace when the
run has them, with its stdout and stderr drained by the run's capture (bounded). Ranks are
numbered from the master host (with env:// rank 0 hosts the store at MASTER_ADDR), then host by
host in order.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Tuple

from ..core import protocol as P
from ..core.rows import RowSet
from ..machine import interrupts
from ..machine.procs import ManagedProcess
from . import LauncherSpec, RankProcess, _tag, fork_plan, planned_names, process_env, start_process


class Direct(LauncherSpec):
    kind: Literal["direct"] = "direct"
    summary = "the harness starts each rank itself (python per rank, env:// variables set)"
    STARTS_RANKS = True

    def rows(self, scn: Any, job: str = "", world: Optional[int] = None) -> RowSet:
        return RowSet(world=world or scn.world_size, job=job)

    def plan(self, plan: Any, scn: Any) -> None:
        hosts = plan.hosts
        master = next(h for h in hosts if h.name == (scn.master_host or hosts[0].name))
        counts = {h.name: h.ranks for h in scn.hosts} if scn.hosts else \
            {hosts[0].name: scn.world_size}
        argv = scn.program_argv()
        r = 0
        for host in [master] + [h for h in hosts if h is not master]:
            count = counts[host.name]
            for local in range(count):
                env = plan.rank_env(scn, r, scn.world_size, host.name, local, count)
                plan.add_process(plan.new_process(
                    label=str(r), rank=r, env=env, host=host.name,
                    init=plan.init_for(scn, r, scn.world_size), argv=argv,
                    observed=bool(argv), cwd=scn.program_cwd(),
                    python=plan.python_for(scn, r, host.name)))
                r += 1

    def start(self, sup: Any) -> List[RankProcess]:
        return start_direct(sup)

    def assign_start(self, plan: Any, scn: Any) -> None:
        if plan.start == "fork":
            fork_plan(plan.launched_ranks())

    def plan_job(self, plan: Any, scn: Any, job: str, world: int, release: Any = None) -> None:
        for i in range(world):
            rp = plan.add_job_rank(scn, f"{job}:{i}", i, world, release=release)
            # observed: a user's program (bool of the argv just set; in one tuple assignment
            # it read the empty argv before it, and the job ran the harness's worker instead)
            rp.argv, rp.job, rp.cwd = scn.program_argv(), job, scn.program_cwd()
            rp.observed = bool(rp.argv)


def start_direct(sup: Any) -> List[RankProcess]:
    """Start the plan's ranks: the fork servers first (one per host with forked ranks), then
    the fresh ranks (they import torch while the servers do), then the forked ones. A server
    comes warm from the session's zygote (harness.ranks.forkclient) where it can, else fresh; a
    warm one that cannot serve the run is replaced by a fresh one, its reason kept. A server
    that cannot fork at all (it failed to start, or torch left threads behind at import) is
    not a failure: its ranks start fresh, and their ``start_note`` says why."""
    from ..ranks.forkclient import ForkServer, prune_zygotes

    ranks = sup.plan.launched_ranks()
    forked = [rp for rp in ranks if rp.start == "fork"]
    servers = {}
    ddps = {}
    for rp in forked:
        if rp.host not in servers:
            ddps[rp.host] = any(any(s.startswith("ddp") for s in sup.plan.worker_spec(r).steps)
                                for r in forked if r.host == rp.host)
            servers[rp.host] = _start_server(sup, rp, ddps[rp.host], ForkServer)
    out = [start_process(sup, rp) for rp in ranks if rp.start != "fork"]
    timeout = float(os.environ.get("HARNESS_READY_TIMEOUT", "180"))
    for host, server in servers.items():
        group = [rp for rp in forked if rp.host == host]
        why = server.wait_ready(timeout)
        if why is not None and server.warm:   # a zygote that failed serves no later run
            prune_zygotes(getattr(server.proc, "zygote", None))
        if why is not None and server.warm and not server.fatal():
            server.close()
            sup.owned.remove(server)
            server = _start_server(sup, group[0], ddps[host], ForkServer,
                                   fresh_because=f"the warm server could not serve: {why}")
            why = server.wait_ready(timeout)
        if why is not None:
            server.close()
            for rp in group:
                rp.start, rp.start_note = "fresh", f"the fork server could not fork: {why}"
                out.append(start_process(sup, rp))
            continue
        out += fork_workers(sup, server, group)
    order = {id(rp): i for i, rp in enumerate(sup.plan.ranks)}
    sup.ranks.sort(key=lambda r: order.get(id(r.plan), len(order)))
    return out


def _start_server(sup: Any, rp: Any, ddp: bool, cls: Any, fresh_because: str = "") -> Any:
    """The fork server of ``rp``'s host, with the environment the host's forked ranks share up
    to ``import torch`` (the runtime variables left out): forked from the session's zygote of
    that environment, which enters the host's namespaces itself (``Supervisor.host_entry``),
    or, where none can serve (``fresh_because``, or the zygote's reason), a fresh
    interpreter started in the host's namespaces by its exec prefix."""
    from ..ranks.forkclient import warm_zygote
    from . import RUNTIME_ENV

    env = {k: v for k, v in process_env(rp).items() if k not in RUNTIME_ENV}
    log = sup.dir / f"forkserver-{_tag(rp.host)}.log"
    entry = sup.host_entry(rp.host)
    zygote, why = None, fresh_because
    if not why and entry is not None and os.geteuid() != 0:
        why = "entering a host's namespaces (setns) needs root"
    if not why:
        zygote, why = warm_zygote(sys.executable, env, ddp)

    def fresh(argv: List[str], fd: int) -> Any:
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            with interrupts.shield():
                return ManagedProcess(argv, name=f"fork server {rp.host}",
                                      record=sup.rundir.pids, env=env, cwd="/",
                                      stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                      pass_fds=(fd,), prefix=sup.prefix(rp.host))
        finally:
            os.close(out)

    def warm(argv: List[str], fd: int) -> Any:
        assert zygote is not None
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            with interrupts.shield():
                return zygote.request(fd, out, env, entry, str(sup.rundir.pids.path), rp.host)
        finally:
            os.close(out)

    server = None
    if zygote is not None:
        try:
            server = cls(warm, sys.executable, ddp, rp.host)
            server.warm = True
        except OSError as e:   # the zygote went away: this run's server starts fresh
            why = f"the zygote could not be asked: {e}"
    if server is None:
        server = cls(fresh, sys.executable, ddp, rp.host)
        server.note = why
    sup.owned.append(server)   # closed with the run, after its ranks were killed
    return server


def _rank_files(sup: Any, rp: Any) -> Tuple[Dict[str, Path], int, int]:
    """A rank's evidence files in the run directory, and its event and stack descriptors
    (opened here, closed with the run): the same for a fresh rank and a forked one."""
    tag = _tag(rp.label)
    paths = {k: sup.dir / f"rank-{tag}.{k}" for k in ("events", "stacks", "out", "err")}
    ev_fd = os.open(paths["events"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sup.fds.append(ev_fd)
    st_fd = os.open(paths["stacks"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sup.fds.append(st_fd)
    return paths, ev_fd, st_fd


def fork_workers(sup: Any, server: Any, group: List[Any]) -> List[RankProcess]:
    """Fork the host's ranks from its ready server: each gets the descriptors a fresh rank
    inherits (events, stacks, stdout, stderr, the start line on stdin) and its environment."""
    reqs, fds, rows = [], [], []
    close: List[int] = []
    for rp in group:
        paths, ev_fd, st_fd = _rank_files(sup, rp)
        out_w, err_w = sup.capture.pipe(paths["out"]), sup.capture.pipe(paths["err"])
        go_r, go_w = os.pipe()
        close += [out_w, err_w, go_r]
        reqs.append({"label": rp.label, "cwd": "/",
                     "env": process_env(rp, {P.PLANNED_ENV: planned_names(rp)}),
                     "spec": sup.plan.worker_spec(rp).to_json(),
                     "fd_numbers": [ev_fd, st_fd]})   # where a fresh rank has them
        fds.append((ev_fd, st_fd, out_w, err_w, go_r))
        rows.append((rp, paths, os.fdopen(go_w, "wb", buffering=0)))
    try:
        with interrupts.shield():   # a process that exists is a process that is tracked
            procs = server.fork(reqs, fds, sup.rundir.pids)
            out = []
            for (rp, paths, go), proc in zip(rows, procs):
                rank = RankProcess(rp.label, proc, events=paths["events"],
                                   stacks=paths["stacks"], out=paths["out"], err=paths["err"],
                                   now=sup.now, host=rp.host, addr=sup.addr_of(rp.host),
                                   plan=rp, role=rp.role, go=go)
                sup.ranks.append(rank)
                out.append(rank)
    finally:
        for fd in close:
            os.close(fd)
    return out


def start_worker(sup: Any, rp: Any) -> RankProcess:
    """Start the harness's worker for one planned rank (the worker protocol on inherited
    descriptors; the start line on its stdin)."""
    plan = sup.plan
    paths, ev_fd, st_fd = _rank_files(sup, rp)
    spec = plan.worker_spec(rp)     # the workload, and this rank's variation (faults in it)
    out_w, err_w = sup.capture.pipe(paths["out"]), sup.capture.pipe(paths["err"])
    env = process_env(rp, {P.EVENT_FD_ENV: str(ev_fd), P.STACK_FD_ENV: str(st_fd),
                           P.PLANNED_ENV: planned_names(rp)})
    try:
        with interrupts.shield():   # a process that exists is a process that is tracked
            proc = ManagedProcess(
                [rp.python or sys.executable, "-m", "harness.ranks.worker", spec.to_json()],
                name=f"rank {rp.label}", record=sup.rundir.pids, env=env, cwd="/",
                stdin=subprocess.PIPE, stdout=out_w, stderr=err_w,
                pass_fds=(ev_fd, st_fd), prefix=sup.prefix(rp.host))
            rank = RankProcess(rp.label, proc, events=paths["events"], stacks=paths["stacks"],
                               out=paths["out"], err=paths["err"], now=sup.now, host=rp.host,
                               addr=sup.addr_of(rp.host), plan=rp, role=rp.role,
                               go=proc.popen.stdin)
            sup.ranks.append(rank)
    finally:
        os.close(out_w)
        os.close(err_w)
    return rank


__all__: List[str] = ["Direct", "fork_workers", "start_direct", "start_worker"]

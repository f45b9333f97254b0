"""The direct launcher: the harness starts every rank itself, one interpreter per rank.

With the harness's worker (``program: worker``, the default) each rank is a fresh
``python -m harness.worker SPEC`` that speaks the worker protocol on inherited descriptors: its
event and stack channels, the start line on its stdin (harness.protocol). With a user's program
each rank is ``python train.py ARGS`` (or ``python -m MODULE ARGS``) with RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, as a cluster script would, and
runs under the observer (harness.observer), held until the start line.

Every rank runs in its own session (harness.procs), in its host's network namespace when the
run has them, with its stdout and stderr drained by the run's capture (bounded). Ranks are
numbered from the master host (with env:// rank 0 hosts the store at MASTER_ADDR), then host by
host in order.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, List, Literal, Optional

from .. import interrupts
from .. import protocol as P
from ..procs import ManagedProcess
from ..rows import RowSet
from . import LauncherSpec, RankProcess, _tag, process_env


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

    def plan_job(self, plan: Any, scn: Any, job: str, world: int, release: Any = None) -> None:
        for i in range(world):
            rp = plan.add_job_rank(scn, f"{job}:{i}", i, world, release=release)
            rp.argv, rp.observed, rp.job, rp.cwd = scn.program_argv(), bool(rp.argv), job, \
                scn.program_cwd()


def start_worker(sup: Any, rp: Any) -> RankProcess:
    """Start the harness's worker for one planned rank (the worker protocol on inherited
    descriptors; the start line on its stdin)."""
    plan = sup.plan
    tag = _tag(rp.label)
    paths = {k: sup.dir / f"rank-{tag}.{k}" for k in ("events", "stacks", "out", "err")}
    ev_fd = os.open(paths["events"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sup.fds.append(ev_fd)
    st_fd = os.open(paths["stacks"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sup.fds.append(st_fd)
    spec = plan.worker_spec(rp)     # the workload, and this rank's variation (faults in it)
    out_w, err_w = sup.capture.pipe(paths["out"]), sup.capture.pipe(paths["err"])
    env = process_env(rp, {P.EVENT_FD_ENV: str(ev_fd), P.STACK_FD_ENV: str(st_fd)})
    try:
        with interrupts.shield():   # a process that exists is a process that is tracked
            proc = ManagedProcess(
                [rp.python or sys.executable, "-m", "harness.worker", spec.to_json()],
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


__all__: List[str] = ["Direct", "start_worker"]

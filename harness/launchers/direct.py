"""The direct launcher: every rank is a fresh ``python -m harness.worker`` started by the harness.

Each rank runs in its own session (harness.procs), in its host's network namespace when the run
has them, with its event and stack channels as inherited file descriptors and its stdout and
stderr drained by the run's capture (bounded). It imports torch, says ``ready`` and waits on its
stdin for the start line (harness.protocol).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, List

from .. import interrupts
from .. import protocol as P
from ..procs import ManagedProcess
from . import Launcher, RankProcess, process_env


class DirectLauncher(Launcher):
    name = "direct"

    def start(self, sup: Any) -> List[RankProcess]:
        plan = sup.plan
        out: List[RankProcess] = []
        for rp in plan.launched_ranks():
            tag = rp.label.replace(":", "-")
            paths = {k: sup.dir / f"rank-{tag}.{k}" for k in ("events", "stacks", "out", "err")}
            ev_fd = os.open(paths["events"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            sup.fds.append(ev_fd)
            st_fd = os.open(paths["stacks"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            sup.fds.append(st_fd)
            spec = plan.worker_spec(rp)
            out_w, err_w = sup.capture.pipe(paths["out"]), sup.capture.pipe(paths["err"])
            env = process_env(rp, {P.EVENT_FD_ENV: str(ev_fd), P.STACK_FD_ENV: str(st_fd)})
            try:
                with interrupts.shield():   # a process that exists is a process that is tracked
                    proc = ManagedProcess(
                        [rp.python or sys.executable, "-m", "harness.worker", spec.to_json()],
                        name=f"rank {rp.label}", record=sup.rundir.pids, env=env, cwd="/",
                        stdin=subprocess.PIPE, stdout=out_w, stderr=err_w,
                        pass_fds=(ev_fd, st_fd), prefix=sup.prefix(rp.host))
                    rank = RankProcess(rp, proc, events=paths["events"], stacks=paths["stacks"],
                                       out=paths["out"], err=paths["err"], now=sup.now,
                                       addr=sup.addr_of(rp.host))
                    out.append(rank)
                    sup.ranks.append(rank)
            finally:
                os.close(out_w)
                os.close(err_w)
        return out

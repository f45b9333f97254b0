"""The spawn launcher: one parent process per host starts that host's ranks itself.

``launcher: spawn`` or ``{kind: spawn, method: spawn | process, start_method: spawn | fork |
forkserver}``. The parent is observed (harness.ranks.observer), held until the start line after
importing torch; its children are found through their own event files (their rank from the
harness's spawn program, torch's spawn index or their ``init_process_group`` arguments).

With the harness's worker, the parent is ``python -m harness.ranks.spawner SPEC``
(harness.ranks.spawner): ``method: spawn`` calls ``torch.multiprocessing.start_processes``
(``mp.spawn``: the parent joins and raises when a child fails, and torch terminates the others),
``method: process`` starts one ``multiprocessing.Process`` per rank and joins them (the parent exits
0 whatever its children did, as that pattern does). Each child sets RANK (the host's first rank +
its index), LOCAL_RANK and runs the worker's steps. With a user's program, the parent is ``python
train.py ARGS``: the script spawns its ranks itself; it gets MASTER_ADDR, MASTER_PORT, WORLD_SIZE,
LOCAL_WORLD_SIZE and NODE_RANK (the host's index), as a cluster script would set them.
"""

from __future__ import annotations

import json
from typing import Any, List, Literal, Optional

from pydantic import Field

from ..core import protocol as P
from ..core.rows import RowSet
from . import LauncherSpec, Problem


class Spawn(LauncherSpec):
    kind: Literal["spawn"] = "spawn"
    summary = "one parent per host spawns its ranks (torch.multiprocessing.spawn or " \
        "multiprocessing.Process)"
    method: Literal["spawn", "process"] = Field(
        "spawn", description="spawn: torch.multiprocessing.spawn; process: one "
        "multiprocessing.Process per rank (the harness's worker only)")
    start_method: Literal["spawn", "fork", "forkserver"] = Field(
        "spawn", description="multiprocessing's start method (the harness's worker only)")

    def _hosts(self, scn: Any) -> List[Any]:
        hosts = [(h.name, h.ranks) for h in scn.hosts] if scn.hosts else \
            [("local", scn.world_size)]
        master = scn.master_host or hosts[0][0]
        return [h for h in hosts if h[0] == master] + [h for h in hosts if h[0] != master]

    def rows(self, scn: Any, job: str = "", world: Optional[int] = None) -> RowSet:
        return RowSet(world=world or scn.world_size, job=job,
                      parents=[P.parent_label(h, job) for h, _ in self._hosts(scn)])

    def check(self, scn: Any) -> List[Problem]:
        out: List[Problem] = []
        if scn.program_argv():
            for name in ("method", "start_method"):
                if name in self.model_fields_set:
                    out.append(((name,), "a user's program spawns its ranks itself: "
                                f"{name} is for the harness's worker"))
        return out

    def plan(self, plan: Any, scn: Any) -> None:
        self._plan(plan, scn, "", None)

    def plan_job(self, plan: Any, scn: Any, job: str, world: int, release: Any = None) -> None:
        self._plan(plan, scn, job, release, world)

    def _plan(self, plan: Any, scn: Any, job: str, release: Any,
              world: Optional[int] = None) -> None:
        hosts = self._hosts(scn)
        if world is not None:   # a second job: its own world on the first host
            hosts = [(hosts[0][0], world)]
        total = sum(n for _, n in hosts)
        first = 0
        for index, (host, n) in enumerate(hosts):
            env = plan.rank_env(scn, None, total, host, None, n)
            env.setdefault("NODE_RANK", str(index))
            argv = scn.program_argv()
            if not argv:
                spec = {"method": self.method, "start_method": self.start_method, "nprocs": n,
                        "first_rank": first, "world_size": total,
                        "worker": json.loads(plan.shared_worker_spec().to_json()),
                        "init": scn.init, "init_args": _init_args(plan, scn)}
                argv = ["-m", "harness.ranks.spawner", json.dumps(spec)]
            rp = plan.new_process(label=P.parent_label(host, job), rank=None, env=env,
                                  init=plan.init_for(scn, first, total), host=host,
                                  role=P.ROLE_PARENT, argv=argv, observed=True, job=job,
                                  cwd=scn.program_cwd(), python=plan.host_python(scn, host))
            if release is not None:
                rp.release = release
            plan.add_process(rp)
            first += n

    def describe(self) -> str:
        return f"spawn (method {self.method}, start method {self.start_method})"


def _init_args(plan: Any, scn: Any) -> dict:
    """How a child initialises: env:// (RANK set), or the tcp:// or file:// URL with its rank."""
    if scn.init == "env":
        return {}
    url = plan.init_for(scn, 0, scn.world_size).url
    return {"url": url}

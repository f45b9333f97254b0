"""The harness's spawning parent: ``python -m harness.ranks.spawner SPEC`` (the spawn launcher).

It runs observed (harness.ranks.observer): held until the start line, then it starts its host's
ranks the way users do, ``torch.multiprocessing.start_processes`` (``mp.spawn``) or one
``multiprocessing.Process`` per rank, each child running the harness's worker steps
(:func:`harness.ranks.worker.run_observed`) as rank ``first_rank + index``. Standard library and the
harness's light modules only, so that a spawned child imports little before torch.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict


def child(index: int, spec: Dict[str, Any]) -> None:
    """One rank, in the child process: who it is, then the worker's steps."""
    from ..core import protocol as P
    from . import observer
    from .worker import run_observed

    rank = int(spec["first_rank"]) + int(index)
    os.environ["RANK"] = str(rank)
    os.environ["LOCAL_RANK"] = str(index)
    os.environ["WORLD_SIZE"] = str(spec["world_size"])
    observer.identify(rank, "harness spawner")
    w = dict(spec["worker"])
    init = dict(w["init"])
    if spec.get("init") in ("tcp", "file"):
        init.update(method=spec["init"], url=spec["init_args"]["url"], rank=rank,
                    world_size=int(spec["world_size"]))
    w["init"] = init
    run_observed(P.WorkerSpec.from_json(json.dumps(w)))


def main() -> None:
    from harness.ranks.spawner import child as target  # pickled by its module's name, not __main__

    spec = json.loads(sys.argv[1])
    n = int(spec["nprocs"])
    if spec["method"] == "spawn":
        import torch.multiprocessing as mp

        mp.start_processes(target, args=(spec,), nprocs=n, join=True,
                           start_method=spec["start_method"])
        return
    import multiprocessing

    ctx = multiprocessing.get_context(spec["start_method"])
    procs = [ctx.Process(target=target, args=(i, spec)) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()


if __name__ == "__main__":
    main()

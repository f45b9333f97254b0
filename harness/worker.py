"""The code inside each rank: phase events, the workload, a result record.

Run as ``python -m harness.worker SPEC_JSON`` by the supervisor, never by hand. It speaks the
worker protocol (:mod:`harness.protocol`: the event channel, the stack channel, the start line,
the phases). Order: enter the resolver view (``harness.resolver``, before any thread exists)
-> start -> import torch -> "ready" -> wait for the start line on stdin -> init -> workload
step 1..N -> destroy -> exit. The rank exits with ``os._exit`` (0 ok,
1 exception) so that no interpreter teardown of torch's threads can blur the verdict.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time
from datetime import timedelta
from typing import Any

from . import protocol as P
from . import resolver
from .procs import die_with_parent

_EV_FD = -1
_PHASE = "start"


def emit(ev: str, **fields: Any) -> None:
    if _EV_FD >= 0:
        os.write(_EV_FD, P.encode(ev, **fields))


def phase(name: str, **fields: Any) -> str:
    global _PHASE
    _PHASE = name
    emit(P.PHASE, phase=name, **fields)
    return name


def run_workload(spec: P.WorkerSpec, dist: Any, torch: Any) -> None:
    phase("init")
    kwargs: dict = {"timeout": timedelta(seconds=spec.timeout)}
    if spec.backend is not None:    # None: omitted, as a user who leaves it to torch
        kwargs["backend"] = spec.backend
    init = spec.init
    # the URL as planned (tcp://, file://, or the scenario's init_url as written); env://
    # otherwise. rank and world_size only where the plan passes them as arguments.
    kwargs["init_method"] = init.url if init.url is not None else "env://"
    if init.rank is not None:
        kwargs["rank"] = init.rank
    if init.world_size is not None:
        kwargs["world_size"] = init.world_size
    device = torch.device("cpu")
    if spec.backend is not None and "nccl" in spec.backend.lower() and torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group(**kwargs)
    rank, world = dist.get_rank(), dist.get_world_size()
    emit(P.JOINED, rank=rank, world_size=world)
    for i, step in enumerate(spec.steps, start=1):
        phase(f"workload step {i}", step=step)
        if step == "barrier":
            dist.barrier()
        elif step == "all_reduce":
            t = torch.tensor([float(rank + 1)], device=device)
            dist.all_reduce(t)
            want = world * (world + 1) / 2
            if float(t.item()) != want:
                raise AssertionError(f"all_reduce sum is {t.item()}, expected {want} "
                                     f"(world_size {world})")
        elif step == "broadcast":
            t = torch.tensor([float(rank == 0) * 42.0], device=device)
            dist.broadcast(t, src=0)
            if float(t.item()) != 42.0:
                raise AssertionError(f"broadcast gave {t.item()}, expected 42.0")
        elif step.startswith("sleep "):
            time.sleep(float(step.split()[1]))
        else:  # the schema rejects unknown steps; this is a bug guard
            raise ValueError(f"unknown step {step!r}")
    if spec.destroy:
        phase("destroy")
        dist.destroy_process_group()


def main() -> None:
    global _EV_FD
    # first, while single-threaded: the harness's resolver view (no DNS leaves the machine)
    try:
        resolver.enter_from_env()
    except resolver.ViewError as e:
        print(f"harness worker: cannot enter the resolver view: {e}", file=sys.stderr)
        os._exit(4)
    spec = P.WorkerSpec.from_json(sys.argv[1])
    _EV_FD = int(os.environ.pop(P.EVENT_FD_ENV))
    stack_file = os.fdopen(int(os.environ.pop(P.STACK_FD_ENV)), "w")
    die_with_parent()
    faulthandler.register(P.STACK_SIGNAL, file=stack_file, all_threads=True)
    phase("start", pid=os.getpid())
    try:
        phase("import")
        import torch
        import torch.distributed as dist

        emit(P.READY, torch=torch.__version__, pid=os.getpid())
        line = sys.stdin.buffer.readline()
        if line != P.GO_LINE:  # the supervisor went away before the start line
            os._exit(3)
        emit(P.RELEASED)
        run_workload(spec, dist, torch)
    except BaseException as exc:  # noqa: B036 - the verdict needs every kind, KeyboardInterrupt too
        emit(P.RESULT, status=P.EXCEPTION, phase=_PHASE, exc=P.ExceptionRecord.of(exc).to_dict())
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    phase("exit")
    emit(P.RESULT, status=P.OK, phase="exit")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

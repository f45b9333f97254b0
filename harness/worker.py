"""The code inside each rank: phase events, the workload, a result record.

Run as ``python -m harness.worker SPEC_JSON`` by the supervisor, never by hand. Everything it
reports goes as JSON lines to an inherited file descriptor (``HARNESS_EVENT_FD``): each line is
written with one ``write(2)`` before the next step starts, so what was said survives a SIGKILL.
``SIGUSR1`` dumps the Python stacks of all threads (faulthandler) to ``HARNESS_STACK_FD``, which
works even while the rank is blocked inside C++ (``TCPStore`` connect, gloo's mesh).

Order: enter the resolver view (``harness.resolver``, before any thread exists) -> start ->
import torch -> "ready" -> wait for the start line on stdin -> init ->
workload step 1..N -> destroy -> exit. The rank exits with ``os._exit`` (0 ok, 1 exception) so
that no interpreter teardown of torch's threads can blur the verdict.
"""

from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import signal
import sys
import time
import traceback
from datetime import timedelta
from typing import Any, Dict

from harness import resolver

_EV_FD = -1
_PHASE = "start"


def emit(ev: str, **fields: Any) -> None:
    rec = {"ev": ev, "t": time.monotonic(), **fields}
    data = (json.dumps(rec, default=str) + "\n").encode()
    if _EV_FD >= 0:
        os.write(_EV_FD, data)


def phase(name: str, **fields: Any) -> str:
    global _PHASE
    _PHASE = name
    emit("phase", phase=name, **fields)
    return name


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG: the kernel SIGKILLs this rank when the supervisor dies."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() != parent:  # the supervisor died before prctl took effect
        os._exit(3)


def describe(exc: BaseException) -> Dict[str, Any]:
    cls = type(exc)
    return {
        "type": cls.__name__,
        "qualname": f"{cls.__module__}.{cls.__qualname__}",
        "mro": [f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__],
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(cls, exc, exc.__traceback__)),
    }


def run_workload(spec: Dict[str, Any], dist: Any, torch: Any) -> None:
    phase("init")
    kwargs: Dict[str, Any] = {"backend": spec["backend"],
                              "timeout": timedelta(seconds=spec["timeout"])}
    init = spec["init"]
    if init["method"] == "env":
        kwargs["init_method"] = "env://"
    else:
        kwargs["init_method"] = init["url"]
        if init["method"] == "file":
            # nothing else makes the run's file-store directory, and torch's FileStore retries
            # open() of a path in a missing directory far past the group's timeout (a healthy
            # 'init: file' run hung to the deadline); an existing (even unwritable) one is kept
            os.makedirs(os.path.dirname(init["url"][len("file://"):]), exist_ok=True)
        kwargs["rank"] = init["rank"]
        kwargs["world_size"] = init["world_size"]
    device = torch.device("cpu")
    if spec["backend"] == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group(**kwargs)
    rank, world = dist.get_rank(), dist.get_world_size()
    emit("joined", rank=rank, world_size=world)
    for i, step in enumerate(spec["steps"], start=1):
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
    if spec["destroy"]:
        phase("destroy")
        dist.destroy_process_group()


def make_stale_filestore(path: str, world_size: int) -> None:
    """Leave a FileStore file the way a killed job does: used, then SIGKILLed mid-run."""
    import torch.distributed as dist

    os.makedirs(os.path.dirname(path), exist_ok=True)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=world_size,
                            timeout=timedelta(seconds=10))
    dist.barrier()
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    global _EV_FD
    # first, while single-threaded: the harness's resolver view (no DNS leaves the machine)
    try:
        resolver.enter_from_env()
    except resolver.ViewError as e:
        print(f"harness worker: cannot enter the resolver view: {e}", file=sys.stderr)
        os._exit(4)
    if len(sys.argv) == 4 and sys.argv[1] == "--stale-filestore":
        make_stale_filestore(sys.argv[2], int(sys.argv[3]))
        return
    spec = json.loads(sys.argv[1])
    _EV_FD = int(os.environ.pop("HARNESS_EVENT_FD"))
    stack_file = os.fdopen(int(os.environ.pop("HARNESS_STACK_FD")), "w")
    _die_with_parent()
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    phase("start", pid=os.getpid())
    try:
        phase("import")
        import torch
        import torch.distributed as dist

        emit("ready", torch=torch.__version__, pid=os.getpid())
        line = sys.stdin.readline()
        if not line:  # the supervisor went away before the start line
            os._exit(3)
        emit("released")
        run_workload(spec, dist, torch)
    except BaseException as exc:  # noqa: B036 - the verdict needs every kind, KeyboardInterrupt too
        emit("result", status="exception", phase=_PHASE, exc=describe(exc))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    phase("exit")
    emit("result", status="ok", phase="exit")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

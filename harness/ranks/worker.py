"""The code inside each rank: phase events, the workload, a result record.

Run as ``python -m harness.ranks.worker SPEC_JSON`` by the supervisor, never by hand. It speaks the
worker protocol (:mod:`harness.core.protocol`: the event channel, the stack channel, the start line,
the phases, the workload). Order: enter the resolver view (``harness.net.resolver``, before any
thread exists) -> start -> import torch (and DDP's lazy imports, if the workload has ``ddp``)
-> "ready" -> wait for the start line on stdin -> init -> the workload's phases -> destroy ->
exit. Each workload entry is run by its step kind (:mod:`harness.ranks.workload`, one module
per kind). A rank's :class:`~harness.core.protocol.Variation` (from faults) makes it skip a
collective, raise at a phase, or build another model. The rank exits with ``os._exit`` (0 ok,
1 exception) so that no interpreter teardown of torch's threads can blur the verdict.

Started by a torchrun agent or by the harness's spawning parent (harness.ranks.spawner), it has no
inherited channel: the observer (harness.ranks.observer) already runs in it, and the worker sends
its events through the observer's file (:func:`run_observed`); it is not held (its agent or parent
was).
"""

from __future__ import annotations

import builtins
import dataclasses
import faulthandler
import json
import os
import platform
import socket
import sys
import time
from datetime import timedelta
from typing import Any, Callable, List, NoReturn, Optional

from ..core import protocol as P
from ..machine.procs import default_signal_dispositions, die_with_parent, runqueue_wait
from ..net import resolver
from . import workload

_EV_FD = -1
_PHASE = "start"
_RAISE: Optional[P.RaiseSpec] = None
_SLOW: dict = {}
_EMIT: Optional[Callable[..., None]] = None   # the observer's, when it runs observed


def _waited() -> dict:
    """The result's ``cpu_wait``: seconds this rank's threads waited for a CPU (summed; only
    threads still alive), all of its life (the supervisor subtracts what the released event
    says was waited before the start line)."""
    w = runqueue_wait()
    return {"cpu_wait": w} if w is not None else {}


def emit(ev: str, **fields: Any) -> None:
    if _EMIT is not None:
        _EMIT(ev, **fields)
    elif _EV_FD >= 0:
        os.write(_EV_FD, P.encode(ev, **fields))


def phase(name: str, **fields: Any) -> str:
    """Enter a phase: say so; a rank told to raise there raises now, one told to be slow
    there sleeps first (its Variation)."""
    global _PHASE
    _PHASE = name
    emit(P.PHASE, phase=name, **fields)
    if _RAISE is not None and _RAISE.phase == name:
        raise _exception(_RAISE)
    if name in _SLOW:
        time.sleep(_SLOW[name])
    return name


def _exception(spec: P.RaiseSpec) -> BaseException:
    """The exception a fault names: a builtin class, or torch.distributed's."""
    cls = getattr(builtins, spec.exception, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        import torch.distributed as dist

        cls = getattr(dist, spec.exception, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        return RuntimeError(f"harness: no exception class {spec.exception!r} to raise")
    return cls(spec.message)


def run_workload(spec: P.WorkerSpec, dist: Any, torch: Any) -> None:
    """init, each workload entry as its step kind runs it (harness.ranks.workload), destroy."""
    # rank_timeouts: this rank's own timer; the rank as the plan passes it, else as the
    # launcher set it in the environment (torchrun, launch, spawn: RANK; srun: SLURM_PROCID)
    init = spec.init
    timeout = spec.timeout_of(P.own_rank(init.rank))
    kwargs: dict = {"timeout": timedelta(seconds=timeout)}
    if spec.backend is not None:    # None: omitted, as a user who leaves it to torch
        kwargs["backend"] = spec.backend
    # the URL as planned (tcp://, file://, or the scenario's init_url as written); env://
    # otherwise. rank and world_size only where the plan passes them as arguments.
    kwargs["init_method"] = init.url if init.url is not None else "env://"
    if init.rank is not None:
        kwargs["rank"] = init.rank
    if init.world_size is not None:
        kwargs["world_size"] = init.world_size
    # the init phase says what it passes (a fault's plan edit is read back from it)
    phase("init", init_method=kwargs["init_method"], init_rank=init.rank,
          init_world_size=init.world_size,
          **({"init_timeout": timeout} if spec.rank_timeouts else {}))
    device = torch.device("cpu")
    # a rank that may use NCCL takes its own GPU, as a training script does: the backend names
    # nccl, or is omitted (torch then takes cpu:gloo,cuda:nccl where CUDA is there)
    if (spec.backend is None or "nccl" in spec.backend.lower()) and torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group(**kwargs)
    w = workload.Running(spec=spec, dist=dist, torch=torch, device=device, init_kwargs=kwargs,
                         phase=phase, emit=emit, skip=set(spec.variation.skip))
    w.joined()
    for i, entry in enumerate(spec.steps, start=1):
        kind = workload.kind_of(entry)
        if kind is None:   # the schema rejects unknown steps; this is a bug guard
            raise ValueError(f"unknown step {entry!r}")
        kind.run(w, entry, i)
    if spec.destroy:
        phase("destroy")
        dist.destroy_process_group()


def run_observed(spec: P.WorkerSpec) -> None:
    """The worker under an agent or a spawning parent: events through the observer, no start
    line (the agent or parent was held), then ``os._exit`` as always."""
    global _EMIT, _RAISE, _SLOW
    from . import observer

    _EMIT = observer.self_reporting()
    spec = own_variation(spec)
    _RAISE, _SLOW = spec.variation.raise_at, dict(spec.variation.slow_at)
    try:
        phase("import")
        import torch
        import torch.distributed as dist

        emit(P.READY, torch=torch.__version__, pid=os.getpid(), hostname=socket.gethostname(),
             **P.torch_identity(torch))
        run_workload(spec, dist, torch)
    except BaseException as exc:  # noqa: B036 - the verdict needs every kind
        observer.result_exception(exc, phase=_PHASE)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    phase("exit")
    observer.result_ok()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _spec_arg(args: List[str]) -> str:
    """The spec among the arguments: the legacy launcher (torch.distributed.launch) puts
    ``--local-rank=N`` before the script's own arguments."""
    return next((a for a in args if not a.startswith("--local")), args[0] if args else "")


def main() -> None:
    observer = sys.modules.get("harness.ranks.observer")
    if observer is not None and observer.observed():   # under an agent or a parent
        run_observed(P.WorkerSpec.from_json(_spec_arg(sys.argv[1:])))
    # first, while single-threaded: the harness's resolver view (no DNS leaves the machine)
    try:
        resolver.enter_from_env()
    except resolver.ViewError as e:
        print(f"harness worker: cannot enter the resolver view: {e}", file=sys.stderr)
        os._exit(4)
    spec = P.WorkerSpec.from_json(_spec_arg(sys.argv[1:]))
    ev_fd = int(os.environ.pop(P.EVENT_FD_ENV))
    stack_fd = int(os.environ.pop(P.STACK_FD_ENV))
    die_with_parent()
    default_signal_dispositions()
    run_rank(spec, ev_fd, stack_fd)


def own_variation(spec: P.WorkerSpec) -> P.WorkerSpec:
    """A worker of a shared spec (started by torchrun, launch, spawn or srun) takes what its own
    rank does differently (slow_rank, raise_exception, rank_workload...) from the variable its
    launcher's process carries (harness.run.plan.RunPlan.variations), by the rank it was given."""
    text = os.environ.pop(P.RANK_VARIATIONS_ENV, "")
    rank = P.own_rank(spec.init.rank)
    if not text or rank is None:
        return spec
    mine = json.loads(text).get(str(rank))
    if mine is None:
        return spec
    var = P.Variation.of(mine)
    steps = list(var.steps) if var.steps is not None else spec.steps
    return dataclasses.replace(spec, variation=var, steps=steps)


def run_rank(spec: P.WorkerSpec, ev_fd: int, stack_fd: int) -> NoReturn:
    """The rank from its ``start`` phase to its exit: a fresh interpreter (main) or a process
    forked from a warm server (harness.ranks.forkserver: torch is imported already, so its import
    phase is instant). Its resolver view and death signal are set up by then."""
    global _EV_FD, _RAISE, _SLOW
    spec = own_variation(spec)
    _RAISE, _SLOW = spec.variation.raise_at, dict(spec.variation.slow_at)
    _EV_FD = ev_fd
    stack_file = os.fdopen(stack_fd, "w")
    faulthandler.register(P.STACK_SIGNAL, file=stack_file, all_threads=True)
    # what it was started with, as it got it (a forked rank: its server's argv): the plan's
    # variables' values and the argv, to compare with the plan
    planned = os.environ.pop(P.PLANNED_ENV, "")
    phase("start", pid=os.getpid(), **({"launched": {
        "argv": list(getattr(sys, "orig_argv", []))[:40],
        "env": P.planned_env_record(planned)}} if planned else {}))
    try:
        phase("import")
        import torch
        import torch.distributed as dist

        for entry in spec.steps:   # before the start line: a phase times its own work
            kind = workload.kind_of(entry)
            if kind is not None:
                kind.prepare(torch)
        emit(P.READY, torch=torch.__version__, pid=os.getpid(),
             python_version=platform.python_version(), hostname=socket.gethostname(),
             **P.torch_identity(torch))
        line = sys.stdin.buffer.readline()
        if line != P.GO_LINE:  # the supervisor went away before the start line
            os._exit(3)
        waited = runqueue_wait()
        emit(P.RELEASED, **({"cpu_wait": waited} if waited is not None else {}))
        run_workload(spec, dist, torch)
    except BaseException as exc:  # noqa: B036 - the verdict needs every kind, KeyboardInterrupt too
        emit(P.RESULT, status=P.EXCEPTION, phase=_PHASE, exc=P.ExceptionRecord.of(exc).to_dict(),
             **_waited())
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    phase("exit")
    emit(P.RESULT, status=P.OK, phase="exit", **_waited())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

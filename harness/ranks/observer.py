"""The observer: what the harness sees of a process whose code it did not write.

A torchrun agent and its workers, a parent that spawns its ranks, a user's own script: the
harness cannot change their code, so every such process runs this module at interpreter start
(``harness/ranks/_site/sitecustomize.py``, first on ``PYTHONPATH``, chaining to any other
``sitecustomize``). It does nothing unless ``HARNESS_OBSERVE_ROLE`` says what the process is
(:mod:`harness.core.protocol`, "roles"). Then, first thing and single-threaded:

* it enters the harness's resolver view (``HARNESS_RESOLVER_VIEW``, harness.net.resolver), so that
  the process and everything it starts resolves names with the harness's files;
* it writes its identity to the run's pid record (unless the harness started it and recorded it
  already) and asks for a death signal (PR_SET_PDEATHSIG: SIGKILL when its parent dies), so that
  nothing it is part of outlives the run;
* it opens its event file (``HARNESS_OBSERVE_EVENTS``, or ``<HARNESS_OBSERVE_DIR>/<pid>-<start>
  .events``) and says ``hello``: role, pid, parent pid, rank, local rank, restart attempt
  (``TORCHELASTIC_RESTART_COUNT``), what it was told (MASTER_ADDR/PORT, the agent store);
* ``faulthandler`` writes all threads' stacks to ``<events>.stacks`` on protocol.STACK_SIGNAL;
* it sets what its children will be (an agent's and a parent's are workers, a worker's are
  children) and hooks, without importing anything heavy, the modules when they are imported:
  ``torch.distributed`` (``init_process_group`` -> phase init and ``joined``, collectives ->
  ``collective N``, ``destroy_process_group`` -> destroy), DistributedDataParallel (construction
  -> ``ddp``, forward -> ``train step N``), torchrun's agent (rendezvous, restarts, workers
  started), ``torch.multiprocessing.spawn`` and ``multiprocessing`` (a child's spawn index and
  its exception), and ``subprocess``/``multiprocessing`` reaping (a child's exit status:
  ``reaped``);
* ``sys.excepthook`` records an uncaught exception as the ``result`` (an agent's
  RendezvousTimeoutError, its ChildFailedError with the root-cause rank), ``atexit`` the phase
  ``exit``;
* a process the harness holds (``HARNESS_GO_FD``: an agent, a spawning parent, a rank it
  started directly) imports torch, says ``ready`` and waits for the start line on that
  descriptor before the program's own code runs. Workers an agent or a parent starts are not
  held.

Nothing here may break the program it watches: every hook passes the call through unchanged and
swallows its own errors. Only the standard library (and core.protocol, machine.procs and
net.resolver of the harness, which use only it) is imported, so that any interpreter can run it.
"""

from __future__ import annotations

import atexit
import faulthandler
import functools
import os
import socket
import sys
import threading
from typing import Any, Callable, Dict, List, Optional

from ..core import protocol as P

_COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce",
    "reduce_scatter", "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "barrier",
    "monitored_barrier", "all_to_all", "all_to_all_single", "gather", "gather_object", "scatter",
    "scatter_object_list", "send", "recv", "isend", "irecv", "batch_isend_irecv",
)
MAX_PHASE_EVENTS = 20000     # collective and train-step phases reported one by one, then only
#                              every 1000th (an event file stays bounded in a long loop)
_EXC_TEXT = 20000            # an exception's message and traceback are cut to this


class _State:
    def __init__(self) -> None:
        self.role = ""
        self.fd = -1
        self.events_path = ""
        self.phase = "start"
        self.rank: Optional[int] = None
        self.result_sent = False
        self.self_reporting = False   # the harness's worker speaks the protocol itself
        self.collectives = 0
        self.steps = 0
        self.phase_events = 0
        self.exit_code: Optional[int] = None
        self.local = threading.local()
        self.hooks: Dict[str, List[Callable[[Any], None]]] = {}
        self.reaped: set = set()
        self.stacks: Any = None       # kept open: faulthandler writes to it on STACK_SIGNAL
        self.go_fd = -1               # where a held process reads the start line


_S = _State()


# -- the channel ---------------------------------------------------------------------------------

def emit(ev: str, **fields: Any) -> None:
    """One event, one write(2), to this process's event file (nothing if not observed)."""
    if _S.fd < 0:
        return
    try:
        os.write(_S.fd, P.encode(ev, **fields))
    except OSError:
        pass


def phase(name: str, **fields: Any) -> None:
    _S.phase = name
    emit(P.PHASE, phase=name, **fields)


def _counted_phase(name: str, **fields: Any) -> None:
    """A phase that a loop may enter many times: reported one by one up to a bound."""
    _S.phase_events += 1
    n = _S.phase_events
    if n <= MAX_PHASE_EVENTS or n % 1000 == 0:
        phase(name, **fields)
    else:
        _S.phase = name


def _exc_dict(exc: BaseException) -> Dict[str, Any]:
    d = P.ExceptionRecord.of(exc).to_dict()
    d["message"] = d["message"][:_EXC_TEXT]
    d["traceback"] = d["traceback"][-_EXC_TEXT:]
    return d


def observed() -> bool:
    return _S.fd >= 0


def current_role() -> str:
    return _S.role


def self_reporting() -> Callable[..., None]:
    """For the harness's own worker run under an agent or a parent: it sends its phases itself,
    so the hooks stand aside; returns the function it emits events with."""
    _S.self_reporting = True
    return emit


def identify(rank: int, how: str) -> None:
    """This worker is rank ``rank`` (told by the harness's spawn program, a spawn index, or
    init_process_group's arguments)."""
    if _S.rank != rank:
        _S.rank = rank
        emit(P.IDENTITY, rank=rank, how=how)


def _waited() -> Dict[str, Any]:
    """Seconds this process's live threads waited for a CPU, all its life (machine.procs)."""
    from ..machine.procs import runqueue_wait

    w = runqueue_wait()
    return {"cpu_wait": w} if w is not None else {}


def result_ok() -> None:
    """The harness's worker finished its workload."""
    _S.result_sent = True
    emit(P.RESULT, status=P.OK, phase="exit", **_waited())


def result_exception(exc: BaseException, phase: Optional[str] = None, **extra: Any) -> None:
    """The process's result: this exception (once; the first one is the one that counts)."""
    if _S.result_sent:
        return
    _S.result_sent = True
    emit(P.RESULT, status=P.EXCEPTION, phase=phase or _S.phase, exc=_exc_dict(exc), **extra,
         **_waited())


# -- the post-import hooks -------------------------------------------------------------------------

def when_imported(name: str, fn: Callable[[Any], None]) -> None:
    """Call ``fn(module)`` once ``name`` is imported (now, if it is already)."""
    mod = sys.modules.get(name)
    if mod is not None and getattr(getattr(mod, "__spec__", None), "_initializing", False) \
            is False:
        _safe(fn, mod)
        return
    _S.hooks.setdefault(name, []).append(fn)


def _safe(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - the watched program must never suffer for a hook
        try:
            sys.stderr.write(f"harness observer: a hook failed: {type(e).__name__}: {e}\n")
        except Exception:  # noqa: BLE001
            pass


class _Loader:
    """Wraps a module's loader: after the module ran, its hooks run (then the original loader's
    other methods answer as before)."""

    def __init__(self, loader: Any, name: str):
        self._loader, self._name = loader, name

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        for fn in _S.hooks.pop(self._name, []):
            _safe(fn, module)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._loader, attr)


class _Finder:
    """A meta path finder that finds nothing itself: for a hooked module it asks the others and
    wraps the loader they give."""

    def __init__(self) -> None:
        self._busy: set = set()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in _S.hooks or name in self._busy:
            return None
        import importlib.util

        self._busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        except Exception:  # noqa: BLE001 - the import system says it again without us
            return None
        finally:
            self._busy.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, name)  # type: ignore[assignment]
        return spec

    def invalidate_caches(self) -> None:
        pass


# -- the hooks on torch.distributed ----------------------------------------------------------------

def _depth() -> int:
    return int(getattr(_S.local, "depth", 0))


def _watch(fn: Callable[..., Any], enter: Callable[..., Optional[str]],
           after: Optional[Callable[..., None]] = None) -> Callable[..., Any]:
    """Wrap ``fn``: ``enter(args, kwargs)`` says the phase (and emits it) when the call is the
    outermost watched one; a call that raises is noted (``raised``); one that returns, ``done``."""
    if getattr(fn, "__harness_watched__", False):
        return fn

    @functools.wraps(fn)
    def watched(*args: Any, **kwargs: Any) -> Any:
        if _S.self_reporting or _depth() or _S.fd < 0:
            return fn(*args, **kwargs)
        name = None
        try:
            name = enter(args, kwargs)
        except Exception:  # noqa: BLE001
            pass
        _S.local.depth = _depth() + 1
        try:
            out = fn(*args, **kwargs)
        except BaseException as exc:
            _S.local.depth = _depth() - 1
            if name is not None:
                emit(P.RAISED, phase=name, exc=_exc_dict(exc))
            raise
        _S.local.depth = _depth() - 1
        if name is not None:
            try:
                if after is not None:
                    after(args, kwargs, out)
                if not name.startswith(("collective", "train step")):
                    emit(P.DONE, phase=name)
            except Exception:  # noqa: BLE001
                pass
        return out

    watched.__harness_watched__ = True  # type: ignore[attr-defined]
    return watched


def _init_enter(args: Any, kwargs: Dict[str, Any]) -> str:
    rank = kwargs.get("rank", -1)
    if (rank is None or rank == -1) and len(args) >= 5 and isinstance(args[4], int):
        rank = args[4]
    if rank is None or rank == -1:
        env = os.environ.get("RANK", "")
        rank = int(env) if env.isdigit() else None
    if isinstance(rank, int) and rank >= 0:
        identify(rank, "init_process_group")
    backend = kwargs.get("backend", args[0] if args else None)
    method = kwargs.get("init_method", args[1] if len(args) > 1 else None)
    timeout = kwargs.get("timeout")
    phase("init", rank=rank, backend=str(backend) if backend is not None else None,
          init_method=str(method)[:200] if method is not None else "env://",
          timeout=_seconds(timeout),
          master_addr=os.environ.get("MASTER_ADDR"), master_port=os.environ.get("MASTER_PORT"))
    return "init"


def _seconds(timeout: Any) -> Optional[float]:
    total = getattr(timeout, "total_seconds", None)
    return float(total()) if callable(total) else None


def _init_after(args: Any, kwargs: Any, out: Any) -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    identify(rank, "joined")
    emit(P.JOINED, rank=rank, world_size=world)


def _collective_enter(op: str) -> Callable[..., str]:
    def enter(args: Any, kwargs: Any) -> str:
        _S.collectives += 1
        name = f"collective {_S.collectives}"
        _counted_phase(name, op=op)
        return name
    return enter


def _destroy_enter(args: Any, kwargs: Any) -> str:
    phase("destroy")
    return "destroy"


def _hook_c10d(mod: Any) -> None:
    mod.init_process_group = _watch(mod.init_process_group, _init_enter, _init_after)
    mod.destroy_process_group = _watch(mod.destroy_process_group, _destroy_enter)
    for op in _COLLECTIVES:
        fn = getattr(mod, op, None)
        if callable(fn):
            setattr(mod, op, _watch(fn, _collective_enter(op)))
    _copy_to_package(mod)


def _copy_to_package(mod: Any) -> None:
    """``torch.distributed`` re-exports the functions: point its names at the watched ones."""
    pkg = sys.modules.get("torch.distributed")
    if pkg is None:
        return
    for name in ("init_process_group", "destroy_process_group") + _COLLECTIVES:
        fn = getattr(mod, name, None)
        if fn is not None and hasattr(pkg, name):
            setattr(pkg, name, fn)


def _ddp_enter(args: Any, kwargs: Any) -> str:
    module = args[1] if len(args) > 1 else kwargs.get("module")
    n = None
    try:
        n = sum(int(p.numel()) for p in module.parameters())
    except Exception:  # noqa: BLE001
        pass
    phase("ddp", parameters=n)
    return "ddp"


def _step_enter(args: Any, kwargs: Any) -> str:
    _S.steps += 1
    name = f"train step {_S.steps}"
    _counted_phase(name)
    return name


def _hook_ddp(mod: Any) -> None:
    cls = getattr(mod, "DistributedDataParallel", None)
    if cls is None:
        return
    cls.__init__ = _watch(cls.__init__, _ddp_enter)
    cls.forward = _watch(cls.forward, _step_enter)


# -- torchrun's agent ------------------------------------------------------------------------------

def _hook_agent_api(mod: Any) -> None:
    cls = getattr(mod, "SimpleElasticAgent", None)
    if cls is None:
        return
    rounds = {"n": 0}

    def rdzv_enter(args: Any, kwargs: Any) -> str:
        rounds["n"] += 1
        phase("rendezvous", round=rounds["n"])
        return "rendezvous"

    def rdzv_after(args: Any, kwargs: Any, out: Any) -> None:
        wg = args[1] if len(args) > 1 else kwargs.get("worker_group")
        emit(P.RENDEZVOUS_DONE, group_rank=getattr(wg, "group_rank", None),
             group_world_size=getattr(wg, "group_world_size", None),
             master_addr=getattr(wg, "master_addr", None),
             master_port=getattr(wg, "master_port", None))

    cls._rendezvous = _watch(cls._rendezvous, rdzv_enter, rdzv_after)
    restarts = {"n": 0}
    orig_restart = cls._restart_workers

    @functools.wraps(orig_restart)
    def restart(self: Any, *args: Any, **kwargs: Any) -> Any:
        restarts["n"] += 1
        emit(P.RESTART, attempt=restarts["n"])
        return orig_restart(self, *args, **kwargs)

    cls._restart_workers = restart


def _hook_rdzv_registry(mod: Any) -> None:
    """Making the rendezvous handler connects to (or hosts) its store, before the agent runs:
    an agent stuck there is in its rendezvous too."""
    cls = getattr(mod, "RendezvousHandlerRegistry", None)
    if cls is None:
        return

    def enter(args: Any, kwargs: Any) -> str:
        params = args[1] if len(args) > 1 else kwargs.get("params")
        phase("rendezvous", round=0, backend=getattr(params, "backend", None),
              endpoint=getattr(params, "endpoint", None))
        return "rendezvous"

    cls.create_handler = _watch(cls.create_handler, enter)


def _hook_local_agent(mod: Any) -> None:
    cls = getattr(mod, "LocalElasticAgent", None)
    if cls is None:
        return

    def enter(args: Any, kwargs: Any) -> str:
        phase("workers")
        return "workers"

    def after(args: Any, kwargs: Any, out: Any) -> None:
        if isinstance(out, dict):
            emit(P.WORKERS_STARTED, pids={str(k): v for k, v in out.items()})

    cls._start_workers = _watch(cls._start_workers, enter, after)


# -- spawning parents and their children -----------------------------------------------------------

def _hook_torch_spawn(mod: Any) -> None:
    orig_wrap = getattr(mod, "_wrap", None)
    if orig_wrap is not None:
        @functools.wraps(orig_wrap)
        def _wrap(fn: Any, i: int, *rest: Any, **kw: Any) -> Any:
            if _S.role == P.ROLE_WORKER:
                identify(int(i), "spawn index")
                fn = _recording(fn)
            return orig_wrap(fn, i, *rest, **kw)

        mod._wrap = _wrap
    start = getattr(mod, "start_processes", None)
    if start is not None:
        mod.start_processes = _watch(start, lambda a, k: _parent_phase())
        if getattr(mod, "spawn", None) is not None:
            mod.spawn = _watch(mod.spawn, lambda a, k: _parent_phase())
        tmp = sys.modules.get("torch.multiprocessing")
        if tmp is not None:
            for name in ("spawn", "start_processes"):
                if hasattr(tmp, name):
                    setattr(tmp, name, getattr(mod, name))


def _parent_phase() -> Optional[str]:
    if _S.role != P.ROLE_PARENT or _S.phase == "spawn":
        return None
    phase("spawn")
    return "spawn"


def _recording(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A child's function: its exception is the child's result (multiprocessing and
    torch.multiprocessing catch it and exit 1, so no excepthook ever sees it)."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            if not isinstance(exc, SystemExit):
                result_exception(exc)
            raise
    return run


def _hook_mp_process(mod: Any) -> None:
    cls = getattr(mod, "BaseProcess", None)
    if cls is None:
        return
    orig = cls._bootstrap
    orig_start = cls.start

    @functools.wraps(orig)
    def _bootstrap(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _S.role == P.ROLE_WORKER:
            self.run = _recording(self.run)
        return orig(self, *args, **kwargs)

    @functools.wraps(orig_start)
    def start(self: Any, *args: Any, **kwargs: Any) -> Any:
        _parent_phase()
        out = orig_start(self, *args, **kwargs)
        if _S.role == P.ROLE_PARENT:
            emit(P.WORKERS_STARTED, pids={"?": getattr(self, "pid", None)})
        return out

    cls._bootstrap = _bootstrap
    cls.start = start


def _reaped(pid: Any, returncode: Any) -> None:
    if pid in _S.reaped or returncode is None:
        return
    _S.reaped.add(pid)
    emit(P.REAPED, pid=pid, returncode=returncode)


def _hook_subprocess(mod: Any) -> None:
    cls = mod.Popen
    orig = cls._handle_exitstatus

    @functools.wraps(orig)
    def _handle_exitstatus(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig(self, *args, **kwargs)
        try:
            _reaped(self.pid, self.returncode)
        except Exception:  # noqa: BLE001
            pass
        return out

    cls._handle_exitstatus = _handle_exitstatus


def _hook_mp_popen(mod: Any) -> None:
    cls = mod.Popen
    orig = cls.poll

    @functools.wraps(orig)
    def poll(self: Any, *args: Any, **kwargs: Any) -> Any:
        rc = orig(self, *args, **kwargs)
        if rc is not None:
            try:
                _reaped(self.pid, rc)
            except Exception:  # noqa: BLE001
                pass
        return rc

    cls.poll = poll


# -- the end -------------------------------------------------------------------------------------

def _excepthook(prev: Callable[..., Any]) -> Callable[..., Any]:
    def hook(tp: Any, exc: BaseException, tb: Any) -> None:
        try:
            extra: Dict[str, Any] = {}
            first = getattr(exc, "get_first_failure", None)
            if callable(first):   # torchrun's ChildFailedError: the root cause's rank
                rank, failure = first()
                extra["root_cause"] = {"rank": rank, "local_rank": getattr(
                    failure, "local_rank", None), "exitcode": getattr(failure, "exitcode", None),
                    "pid": getattr(failure, "pid", None)}
                extra["failures"] = {str(r): getattr(f, "exitcode", None)
                                     for r, f in (getattr(exc, "failures", {}) or {}).items()}
            result_exception(exc, **extra)
        except Exception:  # noqa: BLE001
            pass
        prev(tp, exc, tb)
    return hook


def _at_exit() -> None:
    if not _S.result_sent:
        phase("exit", code=_S.exit_code)


def _exit_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def exit(code: Any = None) -> Any:
        _S.exit_code = code if isinstance(code, int) or code is None else 1
        return orig(code)
    return exit


# -- start ---------------------------------------------------------------------------------------

def _role_of(env_role: str) -> str:
    """What this process is, given the role its environment names."""
    if env_role == P.ROLE_MP_WORKER:
        argv = " ".join(list(getattr(sys, "orig_argv", [])) + list(getattr(sys, "argv", [])))
        return P.ROLE_WORKER if "--multiprocessing-fork" in argv else P.ROLE_CHILD
    return env_role


_CHILD_ROLE = {P.ROLE_AGENT: P.ROLE_WORKER, P.ROLE_PARENT: P.ROLE_MP_WORKER,
               P.ROLE_RANK: P.ROLE_CHILD, P.ROLE_WORKER: P.ROLE_CHILD, P.ROLE_CHILD: P.ROLE_CHILD}


def _after_fork_in_child() -> None:
    """A forked child of a parent is a worker (multiprocessing's fork start method); of anything
    else, a child. It gets its own event file; the parent's stays the parent's."""
    parent_role = _S.role
    if _S.fd >= 0:
        try:
            os.close(_S.fd)
        except OSError:
            pass
    _S.fd = -1
    _S.go_fd = -1
    _S.local = threading.local()   # a fork inside a watched call must not silence the child
    _S.result_sent = False
    _S.rank = None
    _S.reaped = set()
    _S.collectives = _S.steps = _S.phase_events = 0
    _start(P.ROLE_WORKER if parent_role == P.ROLE_PARENT else P.ROLE_CHILD, forked=True)


def install() -> None:
    """Called by harness/ranks/_site/sitecustomize.py in every interpreter the harness observes
    (then :func:`hold_if_asked`, once any other sitecustomize ran)."""
    env_role = os.environ.get(P.OBSERVE_ROLE_ENV, "")
    if not env_role or _S.role:
        return
    # first, while single-threaded: the resolver view (harness.net.resolver)
    from ..net import resolver

    try:
        resolver.enter_from_env()
    except resolver.ViewError as e:
        sys.stderr.write(f"harness observer: cannot enter the resolver view: {e}\n")
        os._exit(4)
    _start(_role_of(env_role))


def _watch_supervisor(ident: str) -> None:
    """Kill this process (SIGKILL) when the run's supervisor ("pid:start ticks") is gone, so an
    observed worker outlives its agent or parent as a real one does, never the run. One daemon
    thread blocked on a pidfd: it holds no GIL and wakes only when the supervisor exits."""
    import select
    import signal
    import threading

    from ..machine.procs import start_ticks

    try:
        pid, ticks = (int(x) for x in ident.split(":", 1))
        fd = os.pidfd_open(pid)
    except (ValueError, OSError):
        os.kill(os.getpid(), signal.SIGKILL)   # no supervisor (any more): nothing to outlive
        return
    if start_ticks(pid) != ticks:               # the pid was reused: the supervisor is gone
        os.kill(os.getpid(), signal.SIGKILL)

    def wait() -> None:
        try:
            select.select([fd], [], [])
        finally:
            os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait, name="harness-supervisor-watch", daemon=True).start()


def _start(role: str, forked: bool = False) -> None:
    from ..machine.procs import PidRecord, default_signal_dispositions, die_with_parent

    _S.role = role
    own_events = os.environ.pop(P.OBSERVE_EVENTS_ENV, "")
    label = os.environ.pop(P.OBSERVE_LABEL_ENV, "")
    go_fd = os.environ.pop(P.GO_FD_ENV, "")
    planned = os.environ.pop(P.PLANNED_ENV, "")
    record = os.environ.get(P.PID_RECORD_ENV, "")
    os.environ[P.OBSERVE_ROLE_ENV] = _CHILD_ROLE.get(role, P.ROLE_CHILD)
    if label:   # what this process starts belongs to it
        os.environ[P.OBSERVE_NODE_ENV] = label
    if not own_events and record:   # the harness did not start it: it records itself
        try:
            PidRecord(record).add(os.getpid(), f"observed {role}")
        except OSError:
            pass
    if role == P.ROLE_WORKER and os.environ.get(P.SUPERVISOR_ENV):
        # an agent's or a parent's worker: a real one outlives its agent's SIGKILL (torchrun
        # sets no death signal; mp.spawn sets its own SIGINT, after this), so it must not die
        # with its parent here; it dies with the run's supervisor instead
        _watch_supervisor(os.environ[P.SUPERVISOR_ENV])
        default_signal_dispositions()
    elif role != P.ROLE_CHILD:
        # not for a child: it may be started from a thread that ends before it (pdeathsig
        # follows the thread); the run's record and its end kill children
        die_with_parent()
        default_signal_dispositions()
    if not forked:
        os.register_at_fork(after_in_child=_after_fork_in_child)
    if role == P.ROLE_CHILD:
        return
    folder = os.environ.get(P.OBSERVE_DIR_ENV, "")
    from ..machine.procs import start_ticks

    path = own_events or (os.path.join(folder, f"{os.getpid()}-{start_ticks(os.getpid())}"
                                              ".events") if folder else "")
    if not path:
        return
    if not _open_events(path):
        return
    _hello(role, label, planned, forked)
    phase("start", pid=os.getpid())
    if not forked:
        _install_hooks(role)
    if go_fd:
        _S.go_fd = int(go_fd)


def _open_events(path: str) -> bool:
    """The event file and its stacks file beside it; False (said) when they cannot be written."""
    try:
        _S.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        stacks = open(path[: -len(".events")] + ".stacks" if path.endswith(".events")
                      else path + ".stacks", "a")
        faulthandler.register(P.STACK_SIGNAL, file=stacks, all_threads=True)
        _S.stacks = stacks
    except OSError as e:
        sys.stderr.write(f"harness observer: cannot write events to {path}: {e}\n")
        _S.fd = -1
        return False
    _S.events_path = path
    return True


def _hello(role: str, label: str, planned: str, forked: bool) -> None:
    """``hello``: who this process is and what it was told."""
    env = os.environ
    rank = env.get("RANK", "")
    _S.rank = int(rank) if rank.isdigit() and role in (P.ROLE_WORKER, P.ROLE_RANK) else None
    emit(P.HELLO, role=role, pid=os.getpid(), ppid=os.getppid(), label=label or None,
         node=env.get(P.OBSERVE_NODE_ENV) if not label else None,
         job=env.get(P.OBSERVE_JOB_ENV, ""), rank=_S.rank,
         local_rank=_int(env.get("LOCAL_RANK")), group_rank=_int(env.get("GROUP_RANK")),
         world_size=_int(env.get("WORLD_SIZE")),
         attempt=_int(env.get("TORCHELASTIC_RESTART_COUNT")) or 0,
         master_addr=env.get("MASTER_ADDR"), master_port=env.get("MASTER_PORT"),
         use_agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE"),
         gloo_socket_ifname=env.get("GLOO_SOCKET_IFNAME"),
         run_id=env.get("TORCHELASTIC_RUN_ID"), forked=forked,
         argv=[a[:200] for a in getattr(sys, "orig_argv", [])[:40]],
         **({"env": P.planned_env_record(planned)} if planned else {}))


def _install_hooks(role: str) -> None:
    """Hooks on modules as they are imported, on uncaught exceptions, sys.exit and atexit."""
    when_imported("torch.distributed.distributed_c10d", _hook_c10d)
    when_imported("torch.distributed", lambda m: _copy_to_package(
        sys.modules.get("torch.distributed.distributed_c10d")))
    when_imported("torch.nn.parallel.distributed", _hook_ddp)
    when_imported("torch.multiprocessing.spawn", _hook_torch_spawn)
    when_imported("multiprocessing.process", _hook_mp_process)
    if role in (P.ROLE_AGENT, P.ROLE_PARENT):
        when_imported("torch.distributed.elastic.agent.server.api", _hook_agent_api)
        when_imported("torch.distributed.elastic.rendezvous.api", _hook_rdzv_registry)
        when_imported("torch.distributed.elastic.agent.server.local_elastic_agent",
                      _hook_local_agent)
        when_imported("subprocess", _hook_subprocess)
        when_imported("multiprocessing.popen_fork", _hook_mp_popen)
    sys.meta_path.insert(0, _Finder())
    sys.excepthook = _excepthook(sys.excepthook)
    sys.exit = _exit_wrapper(sys.exit)
    atexit.register(_at_exit)


def hold_if_asked() -> None:
    """For sitecustomize, after any other sitecustomize ran: a held process waits here."""
    if _S.go_fd >= 0:
        fd, _S.go_fd = _S.go_fd, -1
        _hold(fd)


def _int(v: Optional[str]) -> Optional[int]:
    return int(v) if v is not None and v.isdigit() else None


def _hold(fd: int) -> None:
    """The start line: import torch (what 'ready' means), say so, wait for the go."""
    phase("import")
    try:
        import torch

        version = str(torch.__version__)
    except Exception as e:  # noqa: BLE001 - the program itself will say it again
        emit(P.RESULT, status=P.EXCEPTION, phase="import", exc=_exc_dict(e))
        _S.result_sent = True
        os._exit(1)
    emit(P.READY, torch=version, pid=os.getpid(), hostname=socket.gethostname(),
         **P.torch_identity(torch))
    line = b""
    try:
        with os.fdopen(fd, "rb", buffering=0) as go:
            line = go.readline()
    except OSError:
        pass
    if line != P.GO_LINE:   # the harness went away before the start line
        os._exit(3)
    emit(P.RELEASED, **_waited())

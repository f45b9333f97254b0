"""Shared fixtures of the harness's own tests.

``pytester`` runs pytest inside pytest (the plugin tests); the builders below make observation
dicts shaped exactly like ``harness.observe.RunObservation.to_dict()`` (checked against a real run
in tests/test_launch.py), so that classify and expect are tested on what the supervisor
really produces, without processes.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Dict, List, Optional, Sequence

import pytest

from harness.judge.observation import RankObservation, RunObservation

pytest_plugins = ["pytester"]

# The start line on the monotonic clock, for built observations.
T0 = 5000.0

# Exception MROs exactly as the worker records them (``describe``), torch 2.2 .. 2.13.
MRO = {
    "DistStoreError": ["torch.distributed.DistStoreError", "torch.distributed.DistError",
                       "builtins.RuntimeError", "builtins.Exception", "builtins.BaseException",
                       "builtins.object"],
    "DistNetworkError": ["torch.distributed.DistNetworkError", "torch.distributed.DistError",
                         "builtins.RuntimeError", "builtins.Exception", "builtins.BaseException",
                         "builtins.object"],
    "DistBackendError": ["torch.distributed.DistBackendError", "torch.distributed.DistError",
                         "builtins.RuntimeError", "builtins.Exception", "builtins.BaseException",
                         "builtins.object"],
    "RuntimeError": ["builtins.RuntimeError", "builtins.Exception", "builtins.BaseException",
                     "builtins.object"],
    "ValueError": ["builtins.ValueError", "builtins.Exception", "builtins.BaseException",
                   "builtins.object"],
    "TimeoutError": ["builtins.TimeoutError", "builtins.OSError", "builtins.Exception",
                     "builtins.BaseException", "builtins.object"],
    "AssertionError": ["builtins.AssertionError", "builtins.Exception", "builtins.BaseException",
                       "builtins.object"],
    "KeyboardInterrupt": ["builtins.KeyboardInterrupt", "builtins.BaseException",
                          "builtins.object"],
}

PHASES = ["start", "import", "init", "workload step 1", "workload step 2", "destroy", "exit"]

# A faulthandler dump as a rank writes it on SIGUSR1 while blocked in the store's connect.
HUNG_STACKS = """\
Thread 0x00007f3a1c7fe640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 629 in wait
  File "/usr/lib/python3.11/threading.py", line 1016 in _bootstrap

Current thread 0x00007f3a2f1b5740 (most recent call first):
  File "/site-packages/torch/distributed/rendezvous.py", line 189 in _create_c10d_store
  File "/site-packages/torch/distributed/rendezvous.py", line 268 in _env_rendezvous_handler
  File "/site-packages/torch/distributed/distributed_c10d.py", line 1683 in init_process_group
  File "/work/main/harness/ranks/worker.py", line 83 in run_workload
  File "/work/main/harness/ranks/worker.py", line 143 in main
  File "/work/main/harness/ranks/worker.py", line 157 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "<frozen runpy>", line 198 in _run_module_as_main
"""


def exc_record(cls: str, message: str) -> Dict[str, Any]:
    mro = MRO[cls]
    return {"type": cls, "qualname": mro[0], "mro": list(mro), "message": message,
            "traceback": f"Traceback (most recent call last):\n  ...\n{mro[0]}: {message}\n"}


def rank_obs(label: str = "0", *, reached: str = "exit", exc: Optional[Dict[str, Any]] = None,
             result: bool = True, end: float = 1.2, returncode: Optional[int] = None,
             killed_at_deadline: bool = False, signals: Sequence[Dict[str, Any]] = (),
             stacks: str = "", host: str = "local", addr: str = "127.0.0.1",
             pid: int = 4242, role: str = "rank", attempt: int = 0,
             node: Optional[str] = None) -> Dict[str, Any]:
    """One RankObservation as a dict: events up to the phase ``reached`` (1 s between phases
    after the start line is not assumed: every phase event is at T0 + a fraction of ``end``),
    then a result record (ok, or the exception ``exc``) unless ``result`` is False."""
    upto = PHASES.index(reached)
    events: List[Dict[str, Any]] = [
        {"ev": "phase", "t": T0 - 1.2, "phase": "start", "pid": pid,
         "launched": {"argv": ["/venv/bin/python", "-m", "harness.ranks.worker"], "env": {}}},
        {"ev": "phase", "t": T0 - 1.1, "phase": "import"},
        {"ev": "ready", "t": T0 - 0.1, "torch": "2.13.0+cpu", "pid": pid,
         "python": "/venv/bin/python", "python_version": "3.11.7", "hostname": "vm",
         "torch_path": "/venv/lib/python3.11/site-packages/torch"},
    ]
    if upto >= PHASES.index("init"):
        events.append({"ev": "released", "t": T0 + 0.01, "cpu_wait": 0.01})
    steps = ["all_reduce", "barrier"]
    for i, ph in enumerate(PHASES[2:upto + 1]):
        t = T0 + 0.02 + end * i / 10
        if ph.startswith("workload step"):
            rank = label.split(":")[-1].split("@")[0]
            if rank.isdigit() and not any(e["ev"] == "joined" for e in events):
                events.append({"ev": "joined", "t": t, "rank": int(rank),
                               "world_size": 2})
            n = int(ph.rsplit(" ", 1)[1])
            events.append({"ev": "phase", "t": t, "phase": ph, "step": steps[n - 1]})
        elif ph == "init":   # the worker says what it passes to init_process_group
            rank = label.split(":")[-1].split("@")[0]
            events.append({"ev": "phase", "t": t, "phase": ph, "init_method": "env://",
                           "init_rank": int(rank) if rank.isdigit() else None,
                           "init_world_size": 2})
        else:
            events.append({"ev": "phase", "t": t, "phase": ph})
    if result:
        if exc is None:
            events.append({"ev": "result", "t": T0 + end, "status": "ok", "phase": "exit",
                           "cpu_wait": 0.02})
        else:
            events.append({"ev": "result", "t": T0 + end, "status": "exception",
                           "phase": reached, "exc": exc, "cpu_wait": 0.02})
    if returncode is None:
        returncode = -9 if killed_at_deadline else (0 if exc is None else 1)
    return {
        "label": label, "pid": pid, "host": host, "addr": addr, "events": events,
        "returncode": returncode, "killed_at_deadline": killed_at_deadline,
        "signals": list(signals), "stacks": stacks, "native_stacks": "", "native_threads": [],
        "stdout_tail": "", "stderr_tail": "", "stderr_key": "",
        "released_at": 0.0, "ended_at": round(end + 0.04, 3), "notes": [],
        "role": role, "node": node, "attempt": attempt, "info": {}, "sockets": [],
        "waited_at_deadline": None, "cpu_samples": [],
    }


def run_obs(*ranks: Dict[str, Any]) -> Dict[str, Any]:
    """A RunObservation as a dict around the given ranks (plan reduced to what classify reads)."""
    return {"plan": {"scenario": "built", "case": None, "notes": []},
            "torch_version": "2.13.0+cpu", "ranks": list(ranks),
            "wall": max((r["ended_at"] or 0.0) for r in ranks) if ranks else 0.0,
            "run_dir": "/tmp/torchdist-harness/run-built", "t0": T0, "step_log": [],
            "port_owners": [], "rules": {}, "counters": {}, "store": {}, "stores": [],
            "effects": [],
            "harness_memory": {"supervisor_mb": 40.0, "servers_mb": 0.0, "ranks": 2,
                               "per_rank_mb": 20.0}, "servers": []}


def typed_rank(*args: Any, **kw: Any) -> RankObservation:
    """``rank_obs`` as the typed object the supervisor makes (its JSON form is the dict)."""
    return RankObservation.from_dict(rank_obs(*args, **kw))


def typed_run(*ranks: RankObservation) -> RunObservation:
    return RunObservation.from_dict(run_obs(*(r.to_dict() for r in ranks)))


@pytest.fixture
def obs() -> Any:
    """The observation builders: ``obs.rank(...)``, ``obs.run(...)`` (typed, as the supervisor
    makes them), ``obs.rank_dict``/``obs.run_dict`` (their JSON form), ``obs.exc(cls, msg)``."""
    class _Builders:
        rank = staticmethod(typed_rank)
        run = staticmethod(typed_run)
        rank_dict = staticmethod(rank_obs)
        run_dict = staticmethod(run_obs)
        exc = staticmethod(exc_record)
        t0 = T0
        hung_stacks = HUNG_STACKS
    return _Builders


@pytest.fixture
def counter_ports() -> Callable[[], int]:
    """A port source for pure planning: 30000, 30001, ..."""
    return itertools.count(30000).__next__


@pytest.fixture(scope="session")
def nobody_python() -> List[str]:
    """argv prefix of a Python that the user nobody runs, with this venv's packages and this
    harness (the venv's own python may live where nobody cannot go, e.g. under /root)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    if os.geteuid() != 0:
        pytest.skip("switching to the user nobody needs root")
    if not Path("/usr/bin/setpriv").exists():
        pytest.skip("setpriv is not installed (util-linux)")
    repo = Path(__file__).resolve().parents[1]
    site = next(p for p in sys.path if p.endswith("site-packages"))
    candidates = [os.path.realpath(sys.executable),
                  f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"]
    become = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "env",
              f"PYTHONPATH={repo}:{site}", "HOME=/nonexistent"]
    for py in candidates:
        p = subprocess.run(become + [py, "-c", "import sys, subprocess; subprocess.run("
                                     "[sys.executable, '-c', 'import yaml, pydantic, torch'], "
                                     "check=True)"],
                           capture_output=True, text=True, timeout=120, cwd="/")
        if p.returncode == 0:
            return become + [py]
    pytest.skip(f"no Python here that the user nobody may run (tried {candidates})")


# -- longest first ---------------------------------------------------------------------------

SLOWEST = __import__("pathlib").Path(__file__).parent / "data" / "slowest-tests.txt"


def _slowest() -> Dict[str, float]:
    out: Dict[str, float] = {}
    for ln in SLOWEST.read_text().splitlines():
        if ln.strip() and not ln.lstrip().startswith("#"):
            secs, nodeid = ln.split(None, 1)
            out[nodeid.strip()] = float(secs)
    return out


def pytest_collection_modifyitems(session: Any, config: Any, items: List[Any]) -> None:
    """The modules with the slowest tests (tests/data/slowest-tests.txt) first, slowest first,
    and within a module its slow tests first; every other order kept. pytest-xdist hands tests
    out in this order, so a 100 s test no longer starts when the others are nearly done (the
    preflight module, collected late, held the last 100 s of the run to itself)."""
    secs = _slowest()
    module = {id(it): it.nodeid.split("::", 1)[0] for it in items}
    worst: Dict[str, float] = {}
    first: Dict[str, int] = {}
    for i, it in enumerate(items):
        m = module[id(it)]
        worst[m] = max(worst.get(m, 0.0), secs.get(it.nodeid, 0.0))
        first.setdefault(m, i)
    index = {id(it): i for i, it in enumerate(items)}
    items.sort(key=lambda it: (-worst[module[id(it)]], first[module[id(it)]],
                               -secs.get(it.nodeid, 0.0), index[id(it)]))

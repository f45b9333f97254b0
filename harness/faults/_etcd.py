"""The run's own etcd, planned and faulted (its set-up and fault steps), for a scenario with an
``etcd:`` block (torchrun's ``etcd`` / ``etcd-v2`` rendezvous); the service itself (command
line, readiness, requirements) is :mod:`harness.services.etcd`.

* Where: ``etcd: {host: NAME}``. A name that is not a scenario host is a host of its own on the
  run's link (like the name server: the topology's ``service_hosts``, the last addresses of
  the run's network, no ranks); a scenario host runs it in that host's namespace, on its
  address; ``loopback`` runs it on 127.0.0.1 of a single-host run (in the machine's network
  namespace when the run has none: no root needed).
* Ports: a client and a peer port leased for the run (never 2379/2380, so that runs beside it
  under ``pytest -n 4`` never share one). Data: ``<run>/etcd/etcd-data`` (left out of the
  kept evidence: etcd preallocates a 64 MB write-ahead log; its log is ``service-etcd.err``).
* Started by the set-up step :class:`EtcdUp` through ``python -m harness.procs --exec`` (a
  death signal for a program the harness did not write; the pid record lets the next run's
  sweep kill it after a SIGKILLed run), ready when ``GET /version`` answers 200 from inside
  its host; stopped with the run like every service.
* Faults (:mod:`harness.faults.etcd_server`) act through its steps: never started,
  SIGKILLed (restarted on its data by a heal), frozen (SIGSTOP, SIGCONT heals), its client
  port dropped on its host (an nftables drop, removed by the heal), wiped (killed, its data
  directory removed, started again empty). A restart is a new service of the run
  (``etcd#2``...): the plan keeps which one is current.
"""

from __future__ import annotations

import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional

from ..services.etcd import DATA_DIR, ETCD, SERVICE, EtcdAnswers, argv, plain_socket, url
from ..steps import RUN, Step


@dataclass
class EtcdPlan:
    """The etcd of a run (pure data; the fault sets ``start``; a restart counts
    ``generation``)."""

    host: str                  # the host whose namespace it runs in ("" : the master host)
    addr: str                  # the address it listens on and the agents dial
    client_port: int
    peer_port: int
    directory: str             # <run>/etcd
    binary: str = "etcd"
    own_host: bool = False     # a host of its own (a service host of the topology)
    start: bool = True         # False: never started (etcd_server mode absent)
    generation: int = 1

    @property
    def endpoint(self) -> str:
        """What ``--rdzv-endpoint`` says."""
        return f"[{self.addr}]:{self.client_port}" if ":" in self.addr else \
            f"{self.addr}:{self.client_port}"

    @property
    def data_dir(self) -> str:
        # a name of its own: the kept evidence leaves it out (etcd preallocates a 64 MB WAL)
        return str(Path(self.directory) / DATA_DIR)

    @property
    def service(self) -> str:
        """The name of the current etcd service of the run."""
        return SERVICE if self.generation == 1 else f"{SERVICE}#{self.generation}"

    def where(self) -> str:
        return f"host {self.host}" if self.host else "loopback"

    def describe(self) -> str:
        return f"etcd on {self.where()} at {url(self.addr, self.client_port)}"


def plan_etcd(plan: Any, scn: Any) -> EtcdPlan:
    """The etcd of the run from the scenario's ``etcd:`` block, and its set-up step. Pure."""
    from ..machine import _which
    from ..topology import Topology

    spec = scn.etcd
    names = [h.name for h in plan.hosts]
    v6 = plan.ip == "6"
    if spec.host == "loopback":
        host, addr, own = "", "::1" if v6 else "127.0.0.1", False
    elif spec.host in names:
        host, own = spec.host, False
        addr = plan.address_of(spec.host) or ("::1" if v6 else "127.0.0.1")
    else:
        # the name server's host first, as the plan lists them (RunPlan.service_hosts)
        services = ([scn.dns.host] if scn.dns is not None else []) + [spec.host]
        topo = Topology(plan.run_id, names, link=True, ip=plan.ip, service_hosts=services)
        host, addr, own = spec.host, topo.hosts[spec.host].addr, True
    binary = spec.binary or _which(ETCD.name) or ETCD.name
    etcd = EtcdPlan(host=host, addr=addr, client_port=plan.new_port(),
                    peer_port=plan.new_port(), directory=str(Path(plan.run_dir) / "etcd"),
                    binary=binary, own_host=own)
    plan.etcd = etcd
    plan.add_step(RUN, EtcdUp(etcd=etcd, target=etcd.where()))
    plan.notes.append(f"etcd: {etcd.describe()} (--enable-v2, data in the run directory)")
    return etcd


def _factory(rt: Any, etcd: EtcdPlan) -> Any:
    """Sockets made where etcd is: its host's namespace, or the machine's without one."""
    if not rt.plan.netns:
        return plain_socket
    host = etcd.host or rt.plan.ranks[0].host
    net = rt.net
    return lambda fam, kind: net.socket(host, fam, kind)


def start_etcd(rt: Any, etcd: EtcdPlan) -> Dict[str, Any]:
    """Start (or start again) the run's etcd on its data directory; wait until it answers."""
    from ..services import ServiceSpec

    Path(etcd.data_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
    cmd = rt.python("harness.procs", "--exec", "--",
                    *argv(etcd.binary, etcd.addr, etcd.client_port, etcd.peer_port,
                          etcd.data_dir))
    svc = rt.start_service(ServiceSpec(etcd.service, cmd, etcd.host, ready=EtcdAnswers(
        _factory(rt, etcd), etcd.addr, etcd.client_port)))
    return {"pid": svc.pid, "ready_after": svc.ready_after, "service": etcd.service}


STOP_WAIT = 2.0


def _wait_state(pid: int, state: str, limit: float) -> bool:
    """Poll /proc/PID/stat until the process is in ``state`` (``T``: stopped), up to
    ``limit`` s; whether it got there."""
    import time

    end = time.monotonic() + limit
    while True:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat[stat.rindex(")") + 2:].startswith(state):
                return True
        except (OSError, ValueError):
            return False
        if time.monotonic() >= end:
            return False
        time.sleep(0.005)


@dataclass
class EtcdUp(Step):
    """Set-up: start the run's etcd and wait until it answers (nothing when the scenario's
    fault says it never starts)."""

    UNDO_AT_TEARDOWN: ClassVar[bool] = False   # stopped with the run; its data goes with it
    etcd: Optional[EtcdPlan] = None

    def do(self, rt: Any) -> Dict[str, Any]:
        etcd = self.etcd
        assert etcd is not None
        if not etcd.start:
            return {"started": False, "endpoint": etcd.endpoint}
        return start_etcd(rt, etcd)

    def describe(self) -> str:
        assert self.etcd is not None
        if not self.etcd.start:
            return f"etcd is NOT started (nothing listens at {self.etcd.endpoint})"
        return f"start {self.etcd.describe()}"


@dataclass
class EtcdAbsent(Step):
    """Set-up, of the fault: etcd is not started (the plan's ``start`` is off); nothing to do
    but say so in the step log and on the timeline."""

    UNDO_AT_TEARDOWN: ClassVar[bool] = False
    etcd: Optional[EtcdPlan] = None

    def do(self, rt: Any) -> Dict[str, Any]:
        assert self.etcd is not None
        return {"endpoint": self.etcd.endpoint}

    def describe(self) -> str:
        assert self.etcd is not None
        return f"etcd not started: nothing listens at {self.etcd.endpoint}"


@dataclass
class EtcdKill(Step):
    """etcd SIGKILLed (its group, reaped); ``wipe``: its data directory removed and etcd
    started again empty at once. A heal (``undo``, never at teardown) starts it again on
    what is left of its data."""

    UNDO_AT_TEARDOWN: ClassVar[bool] = False
    etcd: Optional[EtcdPlan] = None
    wipe: bool = False

    def do(self, rt: Any) -> Dict[str, Any]:
        etcd = self.etcd
        assert etcd is not None
        svc = rt.service(etcd.service)
        pid = svc.pid
        svc.proc.kill()
        info: Dict[str, Any] = {"pid": pid, "signal": "SIGKILL"}
        if self.wipe:
            shutil.rmtree(etcd.data_dir, ignore_errors=True)
            etcd.generation += 1
            info["restarted"] = start_etcd(rt, etcd)
        return info

    def undo(self, rt: Any) -> None:
        assert self.etcd is not None
        self.etcd.generation += 1
        start_etcd(rt, self.etcd)

    def describe(self) -> str:
        return "etcd's data wiped (SIGKILL, data removed, started again empty)" if self.wipe \
            else "etcd killed (SIGKILL)"


@dataclass
class EtcdFreeze(Step):
    """etcd frozen: SIGSTOP to its group; SIGCONT heals (also at teardown)."""

    etcd: Optional[EtcdPlan] = None

    def do(self, rt: Any) -> Dict[str, Any]:
        assert self.etcd is not None
        svc = rt.service(self.etcd.service)
        svc.proc.signal_group(signal.SIGSTOP)
        # a signal is delivered when the process is next scheduled: on a loaded machine etcd
        # answered a request after kill() had returned (watched once in the real test), so
        # the step is done when the kernel says the process is stopped (bounded)
        stopped = _wait_state(svc.pid, "T", STOP_WAIT)
        return {"pid": svc.pid, "signal": "SIGSTOP", "stopped": stopped}

    def undo(self, rt: Any) -> None:
        assert self.etcd is not None
        rt.service(self.etcd.service).proc.signal_group(signal.SIGCONT)

    def describe(self) -> str:
        return "etcd frozen (SIGSTOP)"


@dataclass
class EtcdSlow(Step):
    """etcd made slow: a duty cycle of SIGSTOP for ``stopped_ms`` and SIGCONT for
    ``running_ms``, kept by a thread of the supervisor until the heal (or teardown), which
    leaves it running. Every request waits up to ``stopped_ms`` for its answer; a client whose
    own timeout is shorter sees a slow service as a dead one."""

    etcd: Optional[EtcdPlan] = None
    stopped_ms: int = 200
    running_ms: int = 50
    _stop: Any = field(default=None, init=False, repr=False, compare=False)
    _thread: Any = field(default=None, init=False, repr=False, compare=False)

    def do(self, rt: Any) -> Dict[str, Any]:
        import threading

        assert self.etcd is not None
        proc = rt.service(self.etcd.service).proc
        stop = threading.Event()
        cycles = [0]

        def cycle() -> None:
            while not stop.is_set():
                proc.signal_group(signal.SIGSTOP)
                cycles[0] += 1
                if stop.wait(self.stopped_ms / 1000.0):
                    break
                proc.signal_group(signal.SIGCONT)
                stop.wait(self.running_ms / 1000.0)
            proc.signal_group(signal.SIGCONT)

        self._stop, self._thread = stop, threading.Thread(target=cycle, name="etcd-slow",
                                                          daemon=True)
        self._thread.start()
        return {"stopped_ms": self.stopped_ms, "running_ms": self.running_ms}

    def undo(self, rt: Any) -> None:
        if self._stop is not None:
            self._stop.set()
            self._thread.join(timeout=2.0)
            self._stop = self._thread = None
        assert self.etcd is not None
        rt.service(self.etcd.service).proc.signal_group(signal.SIGCONT)

    def describe(self) -> str:
        return f"etcd slow (stopped {self.stopped_ms} ms, running {self.running_ms} ms, again)"


@dataclass
class EtcdDrop(Step):
    """etcd unreachable: an nftables drop of every packet to its client port on its host
    (established connections too); the heal removes it."""

    UNDO_AT_TEARDOWN: ClassVar[bool] = False   # the rule goes with the run's namespaces
    etcd: Optional[EtcdPlan] = None
    peers: List[str] = field(default_factory=list)   # only from these hosts (none: from all)
    _handles: List[str] = field(default_factory=list, init=False, repr=False, compare=False)

    def _host(self, rt: Any) -> str:
        assert self.etcd is not None
        return self.etcd.host or rt.plan.ranks[0].host

    def do(self, rt: Any) -> Dict[str, Any]:
        assert self.etcd is not None
        peers: List[Optional[str]] = list(self.peers) or [None]   # None: from everyone
        self._handles = [rt.net.filter_rule(self._host(rt), action="drop", direction="in",
                                            ports=[self.etcd.client_port], peer=p)
                         for p in peers]
        return {"rules": list(self._handles), "port": self.etcd.client_port}

    def undo(self, rt: Any) -> None:
        for h in self._handles:
            rt.net.remove_rule(self._host(rt), h)
        self._handles = []

    def describe(self) -> str:
        assert self.etcd is not None
        return f"etcd's client port {self.etcd.client_port} dropped on its host" + (
            f" (from {', '.join(self.peers)} only)" if self.peers else "")


__all__ = ["EtcdAbsent", "EtcdDrop", "EtcdFreeze", "EtcdKill", "EtcdPlan", "EtcdUp", "plan_etcd",
           "start_etcd"]

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
* Started by the set-up step :class:`EtcdUp` through ``python -m harness.machine.procs --exec`` (a
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
from typing import Any, ClassVar, Dict, List, Optional, Set, Tuple

from ..services.etcd import DATA_DIR, ETCD, SERVICE, EtcdAnswers, argv, plain_socket, url
from . import _probe
from .steps import RUN, Effect, Step


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
    from ..machine.requirement import _which
    from ..net.topology import Topology

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
    cmd = rt.python("harness.machine.procs", "--exec", "--",
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


def _waiting(rt: Any, etcd: EtcdPlan) -> Dict[str, Any]:
    """What waits on etcd's client port now, as the kernel counts it (etcd's own namespace):
    connections not yet accepted, and connections with request bytes etcd has not read."""
    pid = rt.service(etcd.service).pid
    socks = _probe.sockets(pid, etcd.client_port, "tcp")
    # etcd's own gateway connections to its client port (HTTP/2 frames it reads when it runs
    # again) are no client's request
    mine = _probe.own_connections(pid, etcd.client_port)
    # told by their endpoints, not their inode: a dial still in the accept queue has no inode
    # yet, and its preface (33 bytes) sits unread in it (seen in a test: etcd frozen right
    # after it came up read "1 connection with 33 unread request bytes" with no client)
    own = {(s["local"], s["remote"]) for s in mine}
    # and the harness's own readiness requests (EtcdAnswers.asked_from: their source ports)
    asked = _readiness_ports(rt, etcd)
    harness = [s for s in socks if s["state"] != "LISTEN"
               and int(s["remote"].rsplit(":", 1)[1], 16) in asked]
    own |= {(s["local"], s["remote"]) for s in harness}
    unread = [s for s in socks if s["state"] != "LISTEN" and s["rx"] > 0
              and (s["local"], s["remote"]) not in own]
    # a connection not accepted yet has no inode: one of etcd's own dials waiting in its
    # accept queue (seen in a test under load: '1 not accepted' with no client) is no request
    own_queued = sum(1 for s in mine + harness if s["inode"] == 0)
    return {"t": round(rt.now(), 3),
            "not_accepted": max(0, sum(s["rx"] for s in socks if s["state"] == "LISTEN")
                                - own_queued),
            "unread_connections": len(unread), "unread_bytes": sum(s["rx"] for s in unread)}


def _readiness_ports(rt: Any, etcd: EtcdPlan) -> Set[int]:
    """The source ports of the harness's readiness requests to the run's etcd."""
    ready = getattr(rt.service(etcd.service).spec, "ready", None)
    return set(ready.asked_from) if isinstance(ready, EtcdAnswers) else set()


def _waiting_text(w: Dict[str, Any]) -> str:
    return (f"{w['unread_connections']} connection{'s' * (w['unread_connections'] != 1)} with "
            f"{w['unread_bytes']} unread request bytes, {w['not_accepted']} not accepted")


def _refused(rt: Any, etcd: EtcdPlan) -> Tuple[bool, str]:
    """Whether a connection to etcd's endpoint is refused now (asked from where the agents
    ask: its host's namespace), and what happened."""
    import socket

    fam = socket.AF_INET6 if ":" in etcd.addr else socket.AF_INET
    try:
        with _factory(rt, etcd)(fam, socket.SOCK_STREAM) as s:
            s.settimeout(2.0)
            s.connect((etcd.addr, etcd.client_port))
    except ConnectionRefusedError:
        return True, "connection refused"
    except OSError as e:
        return False, f"{type(e).__name__}: {e}"
    return False, "a connection was accepted"


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

    def effect(self, rt: Any) -> Effect:
        """Nothing listens at the endpoint the agents were given: a connection asked at the end
        of the run, from etcd's host, is refused."""
        assert self.etcd is not None
        refused, what = _refused(rt, self.etcd)
        return Effect(acted=refused,
                      summary=f"a connection to {self.etcd.endpoint} at the end of the run: "
                              f"{what}" + ("" if refused else " (something listens there)"),
                      numbers={"refused": int(refused)},
                      events=[{"t": round(rt.now(), 3),
                               "what": f"connect to {self.etcd.endpoint}: {what}"}])

    def describe(self) -> str:
        assert self.etcd is not None
        return f"etcd not started: nothing listens at {self.etcd.endpoint}"


@dataclass
class EtcdKill(Step):
    """etcd SIGKILLed (its group, reaped); ``wipe``: its data directory removed and etcd
    started again empty at once, or (``dialled``: scenario hosts) once each of those hosts has
    dialled the dead etcd (its connects refused by a counting reject rule on etcd's host per
    host: what a closed port answers anyway), at most ``bound`` s: the undo, gated on the
    counters. A heal (``undo``, never at teardown) starts it again on what is left of its
    data."""

    UNDO_AT_TEARDOWN: ClassVar[bool] = False
    etcd: Optional[EtcdPlan] = None
    wipe: bool = False
    dialled: List[str] = field(default_factory=list)
    bound: float = 30.0
    _seen: Optional[Dict[str, Any]] = field(default=None, init=False, repr=False, compare=False)
    _rules: Dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)
    _first: Dict[str, float] = field(default_factory=dict, init=False, repr=False,
                                     compare=False)

    def do(self, rt: Any) -> Dict[str, Any]:
        etcd = self.etcd
        assert etcd is not None
        svc = rt.service(etcd.service)
        pid = svc.pid
        svc.proc.kill()
        # the process reaped by kill(): its status says how it ended
        self._seen = {"t": round(rt.now(), 3), "pid": pid, "status": svc.proc.returncode,
                      "was": svc.name}
        info: Dict[str, Any] = {"pid": pid, "signal": "SIGKILL"}
        if self.wipe:
            shutil.rmtree(etcd.data_dir, ignore_errors=True)
            self._seen["data_left"] = Path(etcd.data_dir).exists()
            if self.dialled:
                self._rules = {h: rt.net.filter_rule(etcd.host, action="reject", direction="in",
                                                     ports=[etcd.client_port], peer=h,
                                                     counter=True)
                               for h in self.dialled}
                info["restart"] = "once " + ", ".join(self.dialled) + " dialled it"
            else:
                info["restarted"] = self._start_again(rt)
        return info

    def _start_again(self, rt: Any) -> Dict[str, Any]:
        assert self.etcd is not None and self._seen is not None
        self.etcd.generation += 1
        started = start_etcd(rt, self.etcd)
        self._seen["new_pid"] = started["pid"]
        self._seen["restarted_at"] = round(rt.now(), 3)
        return started

    def can_undo(self, rt: Any) -> bool:
        """Gated (``dialled``): every host's reject rule has counted a packet, or ``bound`` s
        went by since the kill. Each host's first count is kept (to the supervisor's tick)."""
        if not self._rules or self._seen is None:
            return True
        assert self.etcd is not None
        for h, handle in self._rules.items():
            if h not in self._first and \
                    rt.net.rule_counters(self.etcd.host, handle).get("packets", 0) > 0:
                self._first[h] = round(rt.now(), 3)
        return len(self._first) == len(self._rules) or rt.now() - self._seen["t"] >= self.bound

    def undo(self, rt: Any) -> None:
        assert self.etcd is not None
        if self._rules:       # the gated restart of a wiped etcd
            assert self._seen is not None
            self._seen["dialled"] = {h: {"first": self._first.get(h),
                                         "packets": rt.net.rule_counters(
                                             self.etcd.host, hd).get("packets", 0)}
                                     for h, hd in self._rules.items()}
            for hd in self._rules.values():
                rt.net.remove_rule(self.etcd.host, hd)
            self._rules = {}
            self._start_again(rt)
            return
        self.etcd.generation += 1
        start_etcd(rt, self.etcd)

    def effect(self, rt: Any) -> Effect:
        """How the killed etcd ended (its exit status, reaped by the supervisor); wiped: its
        data directory gone and the new etcd that answered (gated: when each host first
        dialled the dead one)."""
        assert self._seen is not None
        seen = self._seen
        killed = seen["status"] == -signal.SIGKILL
        ended = "ended by SIGKILL" if killed else f"exit status {seen['status']}"
        summary = f"etcd (pid {seen['pid']}) {ended} at {seen['t']:.2f} s"
        ok = killed
        events = [{"t": seen["t"], "what": summary}]
        if self.wipe:
            ok = ok and not seen.get("data_left")
            summary += "; its data directory removed" if not seen.get("data_left") else \
                "; its data directory NOT removed"
            dialled = seen.get("dialled") or {}
            for h, d in sorted(dialled.items(), key=lambda x: x[1]["first"] or 1e9):
                if d["first"] is not None:
                    events.append({"t": d["first"], "what": f"host {h} dialled the dead etcd "
                                   f"({d['packets']} packets refused)"})
            never = [h for h, d in dialled.items() if d["first"] is None]
            if self.dialled and "new_pid" not in seen:
                ok = False
                summary += "; no new etcd: the run ended before every host had dialled it"
            elif "new_pid" in seen:
                if self.dialled:
                    summary += (f"; the new empty etcd (pid {seen['new_pid']}) started at "
                                f"{seen['restarted_at']:.2f} s, once "
                                + (", ".join(sorted(dialled)) + " had dialled the dead one"
                                   if not never else f"{self.bound:g} s went by without a "
                                   f"dial from {', '.join(never)}"))
                    ok = ok and not never
                else:
                    summary += f"; a new empty etcd (pid {seen['new_pid']}) answered"
                events.append({"t": seen["restarted_at"], "what": "the new empty etcd answers"})
        return Effect(acted=ok, summary=summary, numbers={"pid": seen["pid"]}, events=events)

    def describe(self) -> str:
        if self.wipe:
            return "etcd's data wiped (SIGKILL, data removed, started again empty" + (
                f" once {', '.join(self.dialled)} dialled it)" if self.dialled else ")")
        return "etcd killed (SIGKILL)"


@dataclass
class EtcdFreeze(Step):
    """etcd frozen: SIGSTOP to its group; SIGCONT heals (also at teardown). Its effect: the
    kernel saw it stopped, and what waited for it, read before the heal (else at the end of
    the run): requests unread on its client port's connections, connections not accepted."""

    etcd: Optional[EtcdPlan] = None
    _stopped: Optional[Dict[str, Any]] = field(default=None, init=False, repr=False,
                                               compare=False)
    _seen: Optional[Dict[str, Any]] = field(default=None, init=False, repr=False, compare=False)

    def do(self, rt: Any) -> Dict[str, Any]:
        assert self.etcd is not None
        svc = rt.service(self.etcd.service)
        svc.proc.signal_group(signal.SIGSTOP)
        # a signal is delivered when the process is next scheduled: on a loaded machine etcd
        # answered a request after kill() had returned (watched once in the real test), so
        # the step is done when the kernel says the process is stopped (bounded)
        stopped = _wait_state(svc.pid, "T", STOP_WAIT)
        self._stopped = {"t": round(rt.now(), 3), "pid": svc.pid, "stopped": stopped}
        return {"pid": svc.pid, "signal": "SIGSTOP", "stopped": stopped}

    def undo(self, rt: Any) -> None:
        assert self.etcd is not None
        if self._seen is None:
            try:
                self._seen = _waiting(rt, self.etcd)
            except OSError:
                pass
        rt.service(self.etcd.service).proc.signal_group(signal.SIGCONT)

    def effect(self, rt: Any) -> Effect:
        assert self.etcd is not None and self._stopped is not None
        st = self._stopped
        seen = self._seen if self._seen is not None else _waiting(rt, self.etcd)
        when = "when healed" if self._seen is not None else "at the end of the run"
        n = seen["unread_connections"] + seen["not_accepted"]
        events = [{"t": st["t"], "what": f"SIGSTOP to etcd (pid {st['pid']}): "
                   + ("the kernel says stopped" if st["stopped"] else
                      "NOT seen stopped within 2 s")},
                  {"t": seen["t"], "what": f"its client port {when}: {_waiting_text(seen)}"}]
        if not st["stopped"]:
            summary = f"etcd (pid {st['pid']}) was not seen stopped after SIGSTOP"
        elif n:
            summary = f"etcd stopped from {st['t']:.2f} s; {when}: {_waiting_text(seen)}"
        else:
            summary = (f"etcd stopped from {st['t']:.2f} s, but no request waited on its "
                       f"client port {when}")
        return Effect(acted=bool(st["stopped"]) and n > 0, summary=summary,
                      numbers={k: seen[k] for k in ("unread_connections", "unread_bytes",
                                                   "not_accepted")}, events=events)

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
    _cycles: Optional[Dict[str, Any]] = field(default=None, init=False, repr=False,
                                              compare=False)

    def do(self, rt: Any) -> Dict[str, Any]:
        import threading

        assert self.etcd is not None
        etcd = self.etcd
        proc = rt.service(etcd.service).proc
        stop = threading.Event()
        self._cycles = cycles = {"stops": 0, "waited": 0, "first": None, "max_bytes": 0,
                                 "from": round(rt.now(), 3)}

        def cycle() -> None:
            while not stop.is_set():
                proc.signal_group(signal.SIGSTOP)
                cycles["stops"] += 1
                if stop.wait(self.stopped_ms / 1000.0):
                    break
                # at the end of each stop: did a request wait for etcd? (the kernel's count)
                try:
                    w = _waiting(rt, etcd)
                except OSError:
                    w = None
                if w is not None and (w["unread_bytes"] or w["not_accepted"]):
                    cycles["waited"] += 1
                    cycles["max_bytes"] = max(cycles["max_bytes"], w["unread_bytes"])
                    if cycles["first"] is None:
                        cycles["first"] = w["t"]
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

    def effect(self, rt: Any) -> Effect:
        """The stops delivered, and in how many a request was waiting for etcd at the stop's
        end (unread bytes on its client port's connections, or a connection not accepted)."""
        c = dict(self._cycles or {})
        n, w = int(c.get("stops") or 0), int(c.get("waited") or 0)
        summary = (f"{n} stop{'s' * (n != 1)} of {self.stopped_ms} ms from "
                   f"{c.get('from', 0.0):.2f} s; a request waited for etcd in {w} of them")
        events = [{"t": c.get("from", 0.0), "what": "duty cycle of SIGSTOP/SIGCONT begins"}]
        if c.get("first") is not None:
            events.append({"t": c["first"], "what": "first stop with a request waiting "
                           f"(largest unread: {c.get('max_bytes', 0)} bytes)"})
        return Effect(acted=w > 0, summary=summary,
                      numbers={"stops": n, "stops_with_requests": w}, events=events)

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
    _seen: Optional[Dict[str, Any]] = field(default=None, init=False, repr=False, compare=False)

    def _host(self, rt: Any) -> str:
        assert self.etcd is not None
        return self.etcd.host or rt.plan.ranks[0].host

    def do(self, rt: Any) -> Dict[str, Any]:
        assert self.etcd is not None
        peers: List[Optional[str]] = list(self.peers) or [None]   # None: from everyone
        self._handles = [rt.net.filter_rule(self._host(rt), action="drop", direction="in",
                                            ports=[self.etcd.client_port], peer=p,
                                            counter=True)
                         for p in peers]
        return {"rules": list(self._handles), "port": self.etcd.client_port}

    def undo(self, rt: Any) -> None:
        if self._handles:
            self._seen = self._read(rt)   # the counters go with the rules
        for h in self._handles:
            rt.net.remove_rule(self._host(rt), h)
        self._handles = []

    def _read(self, rt: Any) -> Dict[str, Any]:
        packets = bytes_ = 0
        for h in self._handles:
            c = rt.net.rule_counters(self._host(rt), h)
            packets, bytes_ = packets + c["packets"], bytes_ + c["bytes"]
        return {"t": round(rt.now(), 3), "packets": packets, "bytes": bytes_}

    def effect(self, rt: Any) -> Effect:
        """The packets to etcd's client port the rules dropped (their counters, read before
        the heal removes them, else at the end of the run)."""
        seen = self._seen if self._seen is not None else self._read(rt)
        n, b = seen["packets"], seen["bytes"]
        when = "when healed" if self._seen is not None else "at the end of the run"
        return Effect(acted=n > 0,
                      summary=f"{n} packet{'s' * (n != 1)} ({b} bytes) to etcd's client port "
                              "dropped",
                      numbers={"packets": n, "bytes": b},
                      events=[{"t": seen["t"], "what": f"rule counters read {when}: {n} "
                               f"packets, {b} bytes"}])

    def describe(self) -> str:
        assert self.etcd is not None
        return f"etcd's client port {self.etcd.client_port} dropped on its host" + (
            f" (from {', '.join(self.peers)} only)" if self.peers else "")


__all__ = ["EtcdAbsent", "EtcdDrop", "EtcdFreeze", "EtcdKill", "EtcdPlan", "EtcdUp", "plan_etcd",
           "start_etcd"]

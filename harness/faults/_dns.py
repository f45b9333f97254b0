"""The run's own name server, planned and faulted (its set-up and fault steps): Debian's
dnsmasq on a host of its own in the topology, owned by the run like any service
(harness.services.dns: the service itself), for a scenario with a ``dns:`` block.

* Where: a namespace host named ``dns`` (``dns.host``) on the run's bridge, with the last
  addresses of the run's networks (``.254`` / ``::fe``: :class:`harness.net.topology.Topology`'s
  ``service_hosts``), no ranks. Every scenario host's resolver view then says ``hosts: files
  dns`` and ``nameserver <that address>`` (+ ``search``, ``options timeout attempts``): the
  only name server any rank can ask is the run's own, and it has no upstream.
* What it runs: ``dnsmasq --conf-file=<run>/dns/dnsmasq.conf`` (that file only; nothing of
  /etc is read: ``no-resolv``, ``no-hosts``, ``no-poll``), in the foreground, bound to its
  namespace address, as root (``user=root``: the run directory is root's; it never writes
  outside the run directory: pid file, log on stderr, no DHCP). Each record is one file in
  ``<run>/dns/records/``, read by inotify (``hostsdir``): a file written or removed while the
  run goes on is seen at the next query (measured on 2.90: added, changed and removed files
  all are), so a late record is a file a step writes. ``cache-size=0`` and ``no-negcache``:
  nothing is remembered between queries. dnsmasq answers A, AAAA and PTR (PTR from the
  hosts-file lines) for records, NXDOMAIN for other names in the search domain and the run's
  reverse zones (``local=``), REFUSED for any other name ("no upstream"). ``ptr: false``:
  no hosts-file lines at all (they always make a PTR); every name is answered by the
  responder, A and AAAA only, so every PTR lookup is NXDOMAIN.
* Faulted names (harness.faults.dns_name: SERVFAIL, no answer, a dead address first) are
  forwarded by dnsmasq to the harness's responder (harness.services.dns_responder) on the
  server's own loopback (``server=/NAME/127.0.0.1#PORT``): the ranks still ask dnsmasq only.
* Ready: the supervisor asks a real query from inside a scenario host's namespace (a socket
  made there: :meth:`harness.net.topology.Topology.socket`) until an answer comes back; never a
  sleep.
"""

from __future__ import annotations

import ipaddress
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional

from ..services.dns import DNSMASQ, RESPONDER, SERVICE, DnsAnswers, ask  # noqa: F401
from . import _probe
from ._probe import json_lines
from .steps import RUN, Effect, Step


@dataclass
class DnsPlan:
    """The name server of a run (pure data; faults edit it while the plan is made)."""

    host: str
    addr: str                                   # what resolv.conf names (v4 unless ip: 6)
    addrs: List[str]                            # every address it listens on
    directory: str                              # <run>/dns
    domain: Optional[str] = None
    ptr: bool = True
    timeout: int = 5
    attempts: int = 2
    records: Dict[str, List[str]] = field(default_factory=dict)      # fqdn -> addresses
    forwarded: Dict[str, List[str]] = field(default_factory=dict)    # fqdn -> live addresses
    responder_port: int = 0
    reverse_zones: List[str] = field(default_factory=list)
    clients: List[str] = field(default_factory=list)                 # scenario hosts
    dead4: str = ""                             # an address of the run where no host is
    dead6: str = ""
    add_subnet: bool = False                    # forwarded queries carry the asker's address
    # scenario host -> its link addresses (v4, v6): who asked, for a fault of some hosts
    host_addrs: Dict[str, List[str]] = field(default_factory=dict)

    def config(self) -> str:
        d = Path(self.directory)
        lines = ["# torchdist-harness: the run's own name server; no upstream, no /etc",
                 "no-resolv", "no-hosts", "no-poll", "keep-in-foreground", "bind-interfaces",
                 "port=53", "user=root", "group=root", "cache-size=0", "no-negcache",
                 "log-queries", "log-facility=-", f"pid-file={d / 'dnsmasq.pid'}",
                 f"hostsdir={d / 'records'}"]
        lines += [f"listen-address={a}" for a in self.addrs]
        if self.domain:
            lines.append(f"local=/{self.domain}/")
        lines += [f"local=/{z}/" for z in self.reverse_zones]
        lines += [f"server=/{n}/127.0.0.1#{self.responder_port}" for n in self.forwarded]
        if self.add_subnet:   # the responder answers per asking host (dns_name hosts:)
            lines.append("add-subnet=32,128")
        return "".join(f"{ln}\n" for ln in lines)

    def record_text(self, name: str, addrs: List[str]) -> str:
        short = name.split(".", 1)[0] if self.domain and name.endswith("." + self.domain) \
            else ""
        return "".join(f"{a} {name}{' ' + short if short else ''}\n" for a in addrs)

    def record_path(self, name: str) -> Path:
        return Path(self.directory) / "records" / name

    def resolve(self, fqdn_or_short: str) -> str:
        if "." not in fqdn_or_short and self.domain:
            return f"{fqdn_or_short}.{self.domain}"
        return fqdn_or_short


def target_addresses(target: str, plan: Any, topo: Any, dead: str) -> List[str]:
    """A record's target in addresses: a host (by the run's families; ``host/4`` or
    ``host/6`` for one family, an IPv6 one even on an IPv4 run: it exists nowhere there),
    ``dead``, or a loopback literal."""
    if target == "dead":
        return [dead]
    name, _, fam = target.partition("/")
    if name in topo.hosts:
        h = topo.hosts[name]
        if fam == "4":
            return [h.addr4]
        if fam == "6":
            return [h.addr6]
        return [a for a, on in ((h.addr4, plan.ip in ("4", "dual")),
                                (h.addr6, plan.ip in ("6", "dual"))) if on]
    return [str(ipaddress.ip_address(target))]


def plan_dns(plan: Any, scn: Any) -> DnsPlan:
    """The server's plan from the scenario's ``dns:`` block; adds its set-up step and points
    the ranks at the master's name. Pure."""
    from ..net.topology import Topology

    spec = scn.dns
    names = [h.name for h in plan.hosts]
    topo = Topology(plan.run_id, names, link=True, ip="dual", service_hosts=[spec.host])
    own = topo.hosts[spec.host]
    addrs = [a for a, on in ((own.addr4, plan.ip in ("4", "dual")),
                             (own.addr6, plan.ip in ("6", "dual"))) if on]
    dead4 = str(topo.network.network_address + len(names) + 1)
    dead6 = str(topo.network6.network_address + len(names) + 1)
    dns = DnsPlan(host=spec.host, addr=addrs[0], addrs=addrs,
                  directory=str(Path(plan.run_dir) / "dns"), domain=spec.domain,
                  ptr=spec.ptr, timeout=spec.timeout, attempts=spec.attempts,
                  clients=names, dead4=dead4, dead6=dead6,
                  host_addrs={n: [topo.hosts[n].addr4, topo.hosts[n].addr6] for n in names},
                  reverse_zones=[_zone(topo.network), _zone6(topo.network6)])
    for rec, targets in spec.records.items():
        out: List[str] = []
        for t in [targets] if isinstance(targets, str) else targets:
            dead = dead6 if plan.ip == "6" else dead4
            out += target_addresses(t, plan, topo, dead)
        dns.records[spec.fqdn(rec)] = out
    if not spec.ptr:
        # a hosts-file line always gives dnsmasq a PTR too (filter-rr=PTR does not remove it:
        # tried on 2.90), so every name goes to the responder, which answers A/AAAA only; the
        # reverse zones stay local= (NXDOMAIN)
        dns.forwarded.update(dns.records)
        dns.records.clear()
        dns.responder_port = plan.new_port()
    plan.dns = dns
    if spec.master:
        from ..core.protocol import url_host

        for r in plan.ranks:
            if "MASTER_ADDR" in r.env:
                r.env["MASTER_ADDR"] = spec.master
            if r.init.method == "tcp" and r.init.url:
                from ..core.jobstore import url_endpoint

                port = url_endpoint(r.init.url)[1] or plan.master_port   # the URL's own port
                r.init = r.init.with_url(f"tcp://{url_host(spec.master)}:{port}")
    plan.add_step(RUN, DnsUp(dns=dns, target=f"host {spec.host}"))
    plan.notes.append(f"dns: dnsmasq on host {spec.host} ({', '.join(addrs)}), records "
                      + "; ".join(f"{n} -> {', '.join(a)}" for n, a in dns.records.items())
                      + (f"; MASTER_ADDR={spec.master}" if spec.master else ""))
    return dns


def _zone(net: ipaddress.IPv4Network) -> str:
    return ".".join(reversed(str(net.network_address).split(".")[:3])) + ".in-addr.arpa"


def _zone6(net: ipaddress.IPv6Network) -> str:
    nibbles = net.network_address.exploded.replace(":", "")[:16]
    return ".".join(reversed(nibbles)) + ".ip6.arpa"


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


@dataclass
class DnsUp(Step):
    """Set-up: write the server's config and records, start the responder (if a name is
    forwarded to it) and dnsmasq as services, wait until dnsmasq answers a query asked from a
    scenario host, then point every scenario host's resolver view at it."""

    UNDO_AT_TEARDOWN: ClassVar[bool] = False   # stopped with the run; files go with it
    dns: Optional[DnsPlan] = None

    def do(self, rt: Any) -> Dict[str, Any]:
        from ..machine.requirement import _which
        from ..net import resolver
        from ..services import Answers, ServiceSpec

        dns = self.dns
        assert dns is not None
        d = Path(dns.directory)
        (d / "records").mkdir(parents=True, exist_ok=True)
        for name, addrs in dns.records.items():
            _write(dns.record_path(name), dns.record_text(name, addrs))
        conf = d / "dnsmasq.conf"
        conf.write_text(dns.config())
        info: Dict[str, Any] = {}
        if dns.forwarded:
            control = str(rt.run_dir / "dns-responder.sock")
            argv = rt.python("harness.services.dns_responder", "--control",
                             "dns-responder.sock", "--port", str(dns.responder_port))
            for n, addrs in dns.forwarded.items():
                argv += ["--name", f"{n}=answer:{','.join(addrs)}",
                         "--live", f"{n}={','.join(addrs)}"]
            svc = rt.start_service(ServiceSpec(RESPONDER, argv, dns.host, ready=Answers(),
                                               control=control))
            info["responder_pid"] = svc.pid
        # not a harness program: it gets its death signal from the exec wrapper, so that a
        # SIGKILLed supervisor takes it along (the next run's sweep is the second net)
        argv = rt.python("harness.machine.procs", "--exec", "--", _which("dnsmasq") or "dnsmasq",
                         f"--conf-file={conf}")
        probe = ipaddress.ip_address(dns.addr).reverse_pointer
        svc = rt.start_service(ServiceSpec(SERVICE, argv, dns.host, ready=DnsAnswers(
            rt.net, dns.clients[0], dns.addr, probe)))
        info.update(pid=svc.pid, ready_after=svc.ready_after)
        lines = resolver.dns_resolv_conf_lines(dns.addr, dns.domain, dns.timeout, dns.attempts)
        nss = resolver.nsswitch_text(dns=True)
        for host in dns.clients:
            rt.net.set_resolv_conf(host, lines)
            rt.net.set_nsswitch(host, nss)
        return info

    def describe(self) -> str:
        dns = self.dns
        assert dns is not None
        return (f"start dnsmasq on {dns.host} ({dns.addr}), {len(dns.records)} records"
                + (f", {len(dns.forwarded)} names through the responder" if dns.forwarded
                   else "") + "; hosts resolve through it")


def nxdomain_answers(lines: List[str], name: str) -> Dict[str, int]:
    """dnsmasq's log lines (``log-queries``): per client address, the queries for ``name``
    it answered NXDOMAIN from its own records (``query[A] NAME from ADDR`` then ``config NAME
    is NXDOMAIN``)."""
    key = name.lower().rstrip(".")
    out: Dict[str, int] = {}
    asked: Optional[str] = None
    for ln in lines:
        msg = ln.split(": ", 1)[-1].split()
        if len(msg) >= 4 and msg[0].startswith("query[") and msg[2] == "from":
            asked = msg[3] if msg[1].lower().rstrip(".") == key else None
        elif len(msg) >= 4 and msg[0] == "config" and msg[2:4] == ["is", "NXDOMAIN"]:
            if asked is not None and msg[1].lower().rstrip(".") == key:
                out[asked] = out.get(asked, 0) + 1
            asked = None
    return out


@dataclass
class RecordFile(Step):
    """A record's file in the server's records folder: removed by ``do`` (the name is then
    NXDOMAIN), written back by ``undo`` (dnsmasq sees either at its next query). Its effect:
    the queries for the name dnsmasq answered NXDOMAIN while the file was gone (its own log,
    ``log-queries``, between the two moments: which client asked, how often)."""

    UNDO_AT_TEARDOWN: ClassVar[bool] = False
    dns: Optional[DnsPlan] = None
    name: str = ""
    _window: List[Any] = field(default_factory=list, init=False, repr=False, compare=False)

    def do(self, rt: Any) -> Dict[str, Any]:
        assert self.dns is not None
        log = rt.service(SERVICE).stderr_path
        self._window = [_probe.size(log), None, round(rt.now(), 3), None]
        self.dns.record_path(self.name).unlink(missing_ok=True)
        return {"name": self.name, "answer": "NXDOMAIN"}

    def undo(self, rt: Any) -> None:
        assert self.dns is not None
        if self._window:
            self._window[1] = _probe.size(rt.service(SERVICE).stderr_path)
            self._window[3] = round(rt.now(), 3)
        _write(self.dns.record_path(self.name),
               self.dns.record_text(self.name, self.dns.records[self.name]))

    def effect(self, rt: Any) -> Effect:
        start, end, t0, t1 = self._window
        log = rt.service(SERVICE).stderr_path
        lines = _probe.text_lines(log, (start, -1 if end is None else end))
        gone = any("inotify:" in ln and ln.rstrip().endswith(f"/{self.name} removed")
                   for ln in lines)
        by = nxdomain_answers(lines, self.name)
        n = sum(by.values())
        until = f"until {t1:.2f} s (healed)" if t1 is not None else "until the end of the run"
        events = [{"t": t0, "what": f"record file of {self.name} removed"
                   + ("; dnsmasq saw it go (inotify)" if gone else "")}]
        if n:
            events.append({"t": t1 if t1 is not None else round(rt.now(), 3),
                           "what": f"{n} NXDOMAIN answers for {self.name} from {t0:.2f} s "
                                   f"{until}: " + ", ".join(f"{a} x{c}" for a, c in by.items())})
        who = f" (from {', '.join(f'{a} x{c}' for a, c in by.items())})" if by else ""
        return Effect(acted=n > 0,
                      summary=f"{n} quer{'ies' if n != 1 else 'y'} for {self.name} answered "
                              f"NXDOMAIN by dnsmasq{who}, from {t0:.2f} s {until}",
                      numbers={"queries": n, "clients": len(by)}, events=events)

    def describe(self) -> str:
        return f"dns: {self.name} is NXDOMAIN (its record is gone)"


def faulted_answers(log: Any, name: str, mode: str, addrs: List[str], start_line: float
                    ) -> List[Dict[str, Any]]:
    """The responder's log lines (JSON, wall-clock ``t``) of queries for ``name`` answered while
    it was set to ``mode`` with ``addrs`` (by the fault): when (seconds after the start line,
    ``start_line`` on the wall clock) and which record type."""
    key = name.lower().rstrip(".")
    holds = False
    out: List[Dict[str, Any]] = []
    for rec in json_lines(log):
        if str(rec.get("name", "")).lower().rstrip(".") != key:
            continue
        if rec.get("event") == "set":
            holds = rec.get("mode") == mode and list(rec.get("addrs") or []) == list(addrs)
        elif rec.get("event") == "query" and holds and rec.get("mode") == mode \
                and rec.get("held", True):
            rtype: Any = rec.get("type")
            qtype = {1: "A", 28: "AAAA", 12: "PTR"}.get(rtype, str(rtype))
            client = rec.get("client")
            out.append({"t": round(float(rec.get("t") or 0.0) - start_line, 3), "type": qtype,
                        **({"client": client} if client else {}),
                        "what": f"{qtype} query for {name} answered the faulted way"
                                + (f" (asked from {client})" if client else "")})
    return out


@dataclass
class ResponderMode(Step):
    """The responder's answer for one forwarded name: ``mode`` (servfail, silent, answer
    with ``addrs``) by ``do``, the live addresses again by ``undo``."""

    UNDO_AT_TEARDOWN: ClassVar[bool] = False
    name: str = ""
    mode: str = "servfail"
    addrs: List[str] = field(default_factory=list)
    live: List[str] = field(default_factory=list)
    hosts: List[str] = field(default_factory=list)   # only the queries of these hosts
    only: Optional[List[str]] = None                 # their addresses (None: every client)

    def do(self, rt: Any) -> None:
        rt.service(RESPONDER).request({"op": "set", "name": self.name, "mode": self.mode,
                                       "addrs": self.addrs, "only": self.only})

    def undo(self, rt: Any) -> None:
        rt.service(RESPONDER).request({"op": "set", "name": self.name, "mode": "answer",
                                       "addrs": self.live})

    def effect(self, rt: Any) -> Effect:
        """The queries for the name the responder answered the faulted way (its log: one line
        per query, with the mode it answered in), while the fault held."""
        path = rt.service(RESPONDER).stderr_path
        events = faulted_answers(path, self.name, self.mode, self.addrs,
                                 time.time() - rt.now())
        n = len(events)
        what = self.describe().split(" -> ", 1)[-1]
        if self.mode == "answer":     # dead_first: "answered with 10.0.0.9, 10.0.0.1"
            what = "with " + ", ".join(self.addrs)
        return Effect(acted=n > 0,
                      summary=f"{n} quer{'ies' if n != 1 else 'y'} for {self.name} answered "
                              f"{what}",
                      numbers={"queries": n}, events=events[:50])

    def describe(self) -> str:
        what = {"servfail": "SERVFAIL", "silent": "no answer", "nxdomain": "NXDOMAIN",
                "answer": "answers " + ", ".join(self.addrs)}[self.mode]
        return f"dns: {self.name} -> {what}" + (
            f" (asked from {', '.join(self.hosts)} only)" if self.hosts else "")


@dataclass
class ServerFault(Step):
    """The whole server stops answering: ``frozen`` (SIGSTOP to dnsmasq, SIGCONT to heal),
    ``dropped`` (an nftables drop of port 53 on its host, removed to heal) or ``rejected`` (the
    same rule with reject: ICMP port unreachable for UDP, a reset for TCP). Its effect, read
    before the heal (else at the end of the run): frozen, the kernel's state of dnsmasq (T,
    stopped) and the queries waiting unread in its port-53 sockets (the bytes the kernel holds
    for them, and datagrams dropped on a full queue); dropped and rejected, the packets the
    rules matched."""

    mode: str = "frozen"
    host: str = ""
    handles: List[str] = field(default_factory=list)
    _seen: Optional[Dict[str, Any]] = field(default=None, init=False, repr=False, compare=False)
    _stopped: Optional[Dict[str, Any]] = field(default=None, init=False, repr=False,
                                               compare=False)

    def do(self, rt: Any) -> Dict[str, Any]:
        import signal

        from ._etcd import STOP_WAIT, _wait_state

        if self.mode == "frozen":
            svc = rt.service(SERVICE)
            svc.proc.signal_group(signal.SIGSTOP)
            stopped = _wait_state(svc.pid, "T", STOP_WAIT)
            self._stopped = {"pid": svc.pid, "stopped": stopped, "t": round(rt.now(), 3)}
            return {"pid": svc.pid, "signal": "SIGSTOP", "stopped": stopped}
        action = "reject" if self.mode == "rejected" else "drop"
        self.handles = [rt.net.filter_rule(self.host, action=action, direction="in",
                                           ports=[53], proto=p, counter=True)
                        for p in ("udp", "tcp")]
        return {"rules": self.handles}

    def undo(self, rt: Any) -> None:
        import signal

        self._seen = self._read(rt)
        if self.mode == "frozen":
            rt.service(SERVICE).proc.signal_group(signal.SIGCONT)
            return
        for h in self.handles:
            rt.net.remove_rule(self.host, h)
        self.handles = []

    def _read(self, rt: Any) -> Dict[str, Any]:
        t = round(rt.now(), 3)
        if self.mode == "frozen":
            pid = rt.service(SERVICE).pid
            socks = _probe.sockets(pid, 53, "udp") + _probe.sockets(pid, 53, "tcp")
            udp = [s for s in socks if s["state"] == "UDP"]
            tcp = [s for s in socks if s["state"] != "UDP"]
            return {"t": t, "state": _probe.process_state(pid),
                    "udp_bytes": sum(s["rx"] for s in udp),
                    "udp_drops": sum(s.get("drops", 0) for s in udp),
                    "tcp_waiting": sum(s["rx"] for s in tcp if s["state"] == "LISTEN"),
                    "tcp_bytes": sum(s["rx"] for s in tcp if s["state"] != "LISTEN")}
        packets = bytes_ = 0
        for h in self.handles:
            c = rt.net.rule_counters(self.host, h)
            packets, bytes_ = packets + c["packets"], bytes_ + c["bytes"]
        return {"t": t, "packets": packets, "bytes": bytes_}

    def effect(self, rt: Any) -> Effect:
        seen = self._seen if self._seen is not None else self._read(rt)
        when = "when healed" if self._seen is not None else "at the end of the run"
        if self.mode in ("dropped", "rejected"):
            n, b = seen["packets"], seen["bytes"]
            return Effect(acted=n > 0,
                          summary=f"{n} packet{'s' * (n != 1)} ({b} bytes) to port 53 "
                          f"{self.mode}",
                          numbers={"packets": n, "bytes": b},
                          events=[{"t": seen["t"], "what": f"rule counters read {when}: {n} "
                                   f"packets, {b} bytes"}])
        st = self._stopped or {}
        waiting = seen["udp_bytes"] + seen["tcp_bytes"] + seen["tcp_waiting"] \
            + seen["udp_drops"]
        nums = {k: seen[k] for k in ("udp_bytes", "udp_drops", "tcp_waiting", "tcp_bytes")}
        events = [{"t": st.get("t", 0.0), "what": f"SIGSTOP to dnsmasq (pid {st.get('pid')}): "
                   + ("the kernel says stopped" if st.get("stopped") else
                      "NOT seen stopped within 2 s")},
                  {"t": seen["t"], "what": f"its port-53 sockets read {when}: "
                   f"{seen['udp_bytes']} bytes of UDP queries unread, {seen['udp_drops']} "
                   f"dropped, {seen['tcp_waiting']} TCP connections not accepted"}]
        acted = bool(st.get("stopped")) and waiting > 0
        if not st.get("stopped"):
            summary = f"dnsmasq (pid {st.get('pid')}) was not seen stopped after SIGSTOP"
        elif waiting:
            summary = (f"dnsmasq stopped from {st['t']:.2f} s; {when}, its sockets held "
                       f"{seen['udp_bytes']} bytes of unread UDP queries"
                       + (f", {seen['udp_drops']} dropped" if seen["udp_drops"] else "")
                       + (f", {seen['tcp_waiting']} TCP connections waiting"
                          if seen["tcp_waiting"] else ""))
        else:
            summary = (f"dnsmasq stopped from {st['t']:.2f} s, but no query waited in its "
                       f"sockets {when}")
        return Effect(acted=acted, summary=summary, numbers=nums, events=events)

    def describe(self) -> str:
        return "dns: the server is frozen (SIGSTOP)" if self.mode == "frozen" else \
            f"dns: port 53 of the server {self.mode}"


__all__ = ["DNSMASQ", "DnsAnswers", "DnsPlan", "DnsUp", "RecordFile", "ResponderMode",
           "ServerFault", "ask", "plan_dns", "target_addresses"]

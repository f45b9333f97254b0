"""Helpers and patterns that rules of more than one module read (the diagnosis's own; a
helper that one module alone reads stays in it)."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..observation import RankObservation
from ._core import RankContext

CONNECT_TIMEOUT = re.compile(r"timed out after \d+ms while trying to connect to \(([^,]+), "
                             r"(\d+)\)", re.I)
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def _argv_opt(argv: Sequence[str], name: str) -> str:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return str(argv[i + 1])
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return ""


def _argv_of(c: RankContext, label: str) -> List[str]:
    """A row's command line: as planned, else as the process itself said (an agent srun
    started)."""
    argv = list(c.plan_rank(label).get("argv") or [])
    if not argv:
        o = c.obs_of(label)
        argv = [str(a) for a in ((o.info or {}).get("argv") or [])] if o is not None else []
    return argv


def _endpoint(c: RankContext, label: str) -> Optional[Tuple[str, int]]:
    """An agent's rendezvous endpoint from its command line (--rdzv-endpoint, or the static
    --master-addr/--master-port); None when it does not say."""
    argv = _argv_of(c, label)
    ep = _argv_opt(argv, "--rdzv-endpoint") or _argv_opt(argv, "--rdzv_endpoint")
    if ep:
        host, _, port = ep.rpartition(":") if ep.count(":") == 1 or ep.startswith("[") \
            else (ep, "", "")
        host = host.strip("[]") or ep
        if not port.isdigit():
            return None
        return host, int(port)
    addr, port = _argv_opt(argv, "--master-addr"), _argv_opt(argv, "--master-port")
    return (addr, int(port)) if addr and port.isdigit() else None


def _job(label: str) -> str:
    """The job prefix of a row ("job2:" of "job2:agent:local" and "job2:0"; "" for the first)."""
    if "agent:" in label:
        return label.split("agent:", 1)[0]
    return label.rsplit(":", 1)[0] + ":" if ":" in label else ""


def _is_ip(addr: str) -> bool:
    try:
        ipaddress.ip_address(addr)
    except ValueError:
        return False
    return True


def _is_loopback(addr: str) -> bool:
    return addr in LOOPBACK_NAMES or addr.startswith("127.") or addr == "::1"


def _listens(o: Optional[RankObservation], port: int) -> Optional[bool]:
    """Whether ``o``'s sockets (when they were taken) had a listener on ``port``; None when
    its sockets were never taken."""
    if o is None or not o.sockets:
        return None
    return any(s.state == "LISTEN" and s.local_port == port for s in o.sockets)


def _unreachable_master(c: RankContext, label: str) -> str:
    """A worker handed a MASTER_ADDR that names its own host (loopback) while its job's store
    is on another host: why, in words; "" when that is not the case."""
    o = c.obs_of(label)
    if o is None or o.role != "worker":
        return ""
    addr, port = str(o.info.get("master_addr") or ""), str(o.info.get("master_port") or "")
    if not _is_loopback(addr):
        return ""
    hosts = [a for a in c.run.ranks if a.role == "agent" and _job(a.label) == _job(label)]
    store = next((a for a in hosts for e in a.events if e.ev == "rendezvous_done"
                  and e.data.get("group_rank") == 0
                  and str(e.data.get("master_port")) == port), None)
    if store is None or store.host == o.host:
        return ""
    return (f"it was handed MASTER_ADDR={addr}:{port}, which on host {o.host} is {o.host} "
            f"itself, while the store is on {store.host} ({store.label}'s)")


def _starved(c: RankContext, label: str) -> Optional[Any]:
    """The step of the scenario's cpu_contention fault on the row ``label``, if it has one."""
    return next((st for st in c.run.step_log if st.fault == "cpu_contention"
                 and st.action == "do" and st.target == f"rank {label}"), None)


COUNTER = re.compile(r"\s*\bcounter packets \d+ bytes \d+")   # a fault's rule counts (evidence)


def _dropping_rule(rules: Dict[str, str], port: int) -> Optional[Tuple[str, str]]:
    """(host, rule line) of an nft rule that drops ``port`` (or drops everything new); the
    rule's counter (a firewall fault's evidence, harness.judge.effects) is left out of the
    line."""
    for host, text in rules.items():
        for ln in text.splitlines():
            ln = COUNTER.sub("", ln.strip())
            if not re.search(r"\b(?:drop|reject)\b", ln):
                continue
            if re.search(rf"dport\s*!=\s*{port}\b", ln):
                continue   # it drops every port but this one
            if re.search(rf"dport {port}\b", ln) or re.search(rf"\b{port}\b", ln):
                return host, ln
    return None


def _host_addrs(c: RankContext) -> Dict[str, str]:
    return {str(h.get("name")): str(h.get("addr")) for h in c.run.plan.get("hosts") or []
            if h.get("addr")}


def _dead_address(c: RankContext, addr: str) -> bool:
    """``addr`` lies in the run's own subnet (its hosts' /24, or /64 with ip: 6), and no host
    of the run has it: nobody on the link answers for it."""
    own = list(_host_addrs(c).values())
    if not own or not _is_ip(addr) or addr in own:
        return False
    nets = {ipaddress.ip_interface(f"{a}/{64 if ':' in a else 24}").network for a in own
            if _is_ip(a)}
    return any(ipaddress.ip_address(addr) in n for n in nets)


def _name_unknown_here(c: RankContext, name: str) -> str:
    """The rank dialled a host name that its own host's hosts file does not list while the run
    has no name server (the harness's resolver view: files only): why, in words; "" else."""
    try:
        ipaddress.ip_address(name.strip("[]"))
        return ""
    except ValueError:
        pass
    if c.run.plan.get("dns") or name in ("localhost",):
        return ""
    host = next((h for h in c.run.plan.get("hosts") or [] if h.get("name") == c.verdict.host),
                None)
    machine = (host or {}).get("machine") or {}
    entries = machine.get("entries")
    if host is None or not isinstance(entries, dict) or name in entries \
            or name == machine.get("hostname"):
        return ""
    return (f"it dialled {name}, a name host {c.verdict.host}'s hosts file does not list (it "
            f"knows {', '.join(sorted(entries)) or 'no name'}; the run has no name server): the "
            "name did not resolve there")


def _first_failed_child(c: RankContext, node: str) -> Optional[RankObservation]:
    """The child whose failure its agent or parent collected first (reaped, not SIGTERMed by
    it, not status 0)."""
    ao = c.obs_of(node)
    if ao is None:
        return None
    for e in ao.events:
        if e.ev == "reaped" and e.data.get("returncode") not in (0, -15, None):
            w = next((w for w in c.run.ranks if w.node == node
                      and (w.pid or w.info.get("pid")) == e.data.get("pid")), None)
            if w is not None:
                return w
    return None


CLOSED = re.compile(r"Failed to recv|Connection was likely closed|Connection reset|Broken pipe",
                    re.I)


def _proxied(c: RankContext) -> Optional[Tuple[str, str, str, float]]:
    """(fault, the ports it redirected in words, what the proxy did, since) of the run's fault
    proxy, from the step log; None when no proxy ran."""
    redirect = next((s for s in c.run.step_log if (s.what or "").startswith("start the fault "
                                                                           "proxy; redirect")),
                    None)
    doing = [s for s in c.run.step_log if (s.what or "").startswith("proxy: ")
             and s.action == "do"]
    front = next((s for s in c.run.step_log if (s.what or "").startswith("start the fault "
                                                                        "proxy at ")), None)
    if redirect is None and front is not None and doing:
        # placement: front (no namespaces): only the ranks told the proxy's port go through it
        fm = re.search(r"proxy at (\S+):(\d+) in front of (\S+):(\d+)", front.what)
        mine = c.env(c.verdict.label).get("MASTER_PORT")
        if fm is None or mine != fm.group(2):
            return None
        ports = f"port {fm.group(4)}" + (" (the store's)" if fm.group(4) == str(c.master_port)
                                         else "") + f", dialled at the proxy's {fm.group(2)}"
        last = doing[-1]
        return last.fault, ports, last.what.removeprefix("proxy: "), float(last.t or 0.0)
    if redirect is None or not doing:
        return None
    m = re.search(r"redirect (\{'except': \[([\d, ]+)\]\}|\[([\d, ]+)\])", redirect.what)
    if m is None:
        return None
    if m.group(2):
        ports = f"every port but {m.group(2)} (gloo's data ports)"
    else:
        ports = f"port {m.group(3)}" + (" (the store's)" if m.group(3) == str(c.master_port)
                                         else "")
    last = doing[-1]
    return last.fault, ports, last.what.removeprefix("proxy: "), float(last.t or 0.0)

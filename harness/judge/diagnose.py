"""Diagnosis: what was observed of a run + its verdicts -> one line of cause per failed row (pure).

It sits above observe and classify, below expect and report: it reads the evidence (each
rank's exception, its TCP sockets at the deadline or at its end (harness.sockets), who held the
master port, the nft rules and kernel counters per host, the step log, stderr tails) and writes
``Verdict.cause`` and ``Verdict.cause_evidence``: the cause in words and the evidence lines it
rests on. A row that ended ``ok`` or ``absent`` gets none.

The causes come from ``RULES``, an ordered table like the classifier's: the first rule that
returns a :class:`Cause` for a row decides; when none does, the cause is ``UNKNOWN``, said as
such (never a guess). A rule is a small function of a :class:`RankContext`; to add one, write
it next to the others and put it in the table where it should win over the ones after it.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..core.protocol import Label, parse_label
from ..net.safety import as_meant
from ..net.sockets import SocketRecord
from .classify import Verdict, mro_names, signal_name
from .observation import RankObservation, RunObservation
from .pyspy import functions

UNKNOWN = "unknown: no rule of harness.diagnose explains it (see the evidence below)"
EADDRINUSE = re.compile(r"EADDRINUSE|address already in use", re.I)
JOINED = re.compile(r"(\d+)/(\d+) clients joined", re.I)
CONNECT_TIMEOUT = re.compile(r"timed out after \d+ms while trying to connect to \(([^,]+), "
                             r"(\d+)\)", re.I)
GAI = re.compile(r".*(?:gai error|getaddrinfo|Name or service not known|"
                 r"Temporary failure in name resolution|No address associated).*", re.I)


@dataclass
class Cause:
    text: str                              # one line: why the row ended as it did
    evidence: List[str] = field(default_factory=list)   # the lines it rests on
    rule: str = ""                         # the rule that gave it (its function's name)


@dataclass
class RankContext:
    """What a rule sees of one row: its verdict and observation, and the whole run."""

    verdict: Verdict
    obs: Optional[RankObservation]
    run: RunObservation
    verdicts: Sequence[Verdict]
    within: Tuple[str, ...] = ()   # the rows whose causes are being worked out around this one

    def about(self, other: Verdict) -> Optional[RankContext]:
        """The context of another row, to borrow its cause; None when that row is already being
        explained further up (two rows never explain each other in a circle)."""
        if other.label in self.within or other.label == self.verdict.label:
            return None
        return RankContext(other, self.obs_of(other.label), self.run, self.verdicts,
                           self.within + (self.verdict.label,))

    @property
    def master_port(self) -> int:
        """The job's store port (harness.jobstore: the port the launch gives it, which may not
        be the run's lease); the lease for a plan written before the store was planned."""
        store = self.run.plan.get("store") or {}
        if store.get("kind", "tcp") == "tcp" and isinstance(store.get("port"), int):
            return int(store["port"])
        if store:
            return 0   # no port known before the run: name none
        return int(self.run.plan.get("master_port") or 0)

    @property
    def sockets(self) -> List[SocketRecord]:
        return list(self.obs.sockets) if self.obs is not None else []

    def stderr(self) -> str:
        """What a rule reads of the row's stderr: torch's warning, error and errno lines of the
        whole of it (harness.stderrlines: stack frames cannot push them out), then the tail."""
        if self.obs is None:
            return ""
        return "\n".join(x for x in (self.obs.stderr_key, self.obs.stderr_tail) if x)

    def plan_rank(self, label: str) -> Dict[str, Any]:
        return next((r for r in self.run.plan.get("ranks", []) if str(r.get("label")) == label),
                    {})

    def env(self, label: str) -> Dict[str, str]:
        return dict(self.plan_rank(label).get("env") or {})

    def verdict_of(self, label: Optional[str]) -> Optional[Verdict]:
        return next((v for v in self.verdicts if v.label == label), None)

    def obs_of(self, label: Optional[str]) -> Optional[RankObservation]:
        return next((o for o in self.run.ranks if o.label == label), None)

    def t(self, e: Any) -> float:
        """An event's time in seconds after the start line, rounded to 10 ms: for text. Compare
        times with :meth:`at`: two events under 10 ms apart can round to either order."""
        return round(self.at(e), 2)

    def at(self, e: Any) -> float:
        """An event's time in seconds after the start line, unrounded: for comparisons."""
        return float(e.t) - float(self.run.t0 or 0.0)

    def port_in_use(self) -> Optional[Verdict]:
        """The row whose store could not listen: EADDRINUSE."""
        return next((v for v in self.verdicts if v.outcome == "error"
                     and EADDRINUSE.search(v.message or "")), None)

    def holder(self) -> str:
        """Who held the master port before the ranks started (the port owners seen then)."""
        owners = [o for o in self.run.port_owners if o.get("status") == "LISTEN"] or \
            list(self.run.port_owners)
        if not owners:
            return ""
        o = owners[0]
        return f"pid {o.get('pid')} ({o.get('cmdline') or 'command line unknown'})"


def _first_line(s: str) -> str:
    return (s or "").strip().splitlines()[0] if (s or "").strip() else ""


def _exc_line(v: Verdict) -> str:
    return f"rank {v.label}: {v.exception}: {_first_line(v.message)}"


INNER = re.compile(r"^([\w.]+): (.+)$\n\nThe above exception was the direct cause", re.M)
WAIT_KEYS = re.compile(r"wait timeout after (\d+)ms, keys: (\S+)", re.I)
PG_KEY = re.compile(r"^/default_pg/.*/(\d+)$")   # the process group's key of a rank (gloo's mesh)
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def _inner(c: RankContext, label: str) -> str:
    """The exception under ``label``'s own (torchelastic's "See inner exception"), one line."""
    o = c.obs_of(label)
    res = o.result() if o is not None else None
    tb = str(((res.data.get("exc") or {}) if res is not None else {}).get("traceback") or "")
    m = INNER.search(tb)
    return f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2).strip()}" if m else ""


def _argv_opt(argv: Sequence[str], name: str) -> str:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return str(argv[i + 1])
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return ""


def _workers_of(c: RankContext, agent: str) -> List[RankObservation]:
    """An agent's workers: by the node they were told, or (an agent srun started, whose
    workers were not told) by their parent's pid."""
    ao = c.obs_of(agent)
    pid = ao.pid if ao is not None else None
    return [w for w in c.run.ranks if w.role == "worker" and
            (w.node == agent or (pid is not None and (w.info or {}).get("ppid") == pid))]


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


# -- the rules ---------------------------------------------------------------------------------
def store_port_in_use(c: RankContext) -> Optional[Cause]:
    """The rank meant to host the store could not listen: the port was taken."""
    v = c.verdict
    if v.outcome != "error" or not EADDRINUSE.search(v.message or ""):
        return None
    held = c.holder()
    m = re.search(r"port: (\d+)", v.message or "")
    port = int(m.group(1)) if m else c.master_port
    if port != c.master_port:
        held = ""   # the port owners were looked up for the master port only
    text = f"could not start the store: port {port} was already in use" + \
        (f" by {held}" if held else "")
    ev = [_exc_line(v)]
    if held:
        ev.append(f"master port {c.master_port} held before the start line by {held}")
    mine = c.env(v.label).get("RANK")
    twins = [o.label for o in c.verdicts if o.label != v.label and o.role == "rank"
             and mine is not None and c.env(o.label).get("RANK") == mine
             and (o.duration is None or v.duration is None or o.duration >= v.duration)]
    if mine == "0" and twins and not held:
        text += f": rank {twins[0]} also claimed RANK=0 and hosts the store there"
    return Cause(text, ev)


def world_size_disagrees(c: RankContext) -> Optional[Cause]:
    """The ranks were told different WORLD_SIZEs: what this row waited for that cannot come."""
    v = c.verdict
    if v.role != "rank" or v.outcome not in ("timeout", "error", "hang"):
        return None
    sizes = {str(r.get("label")): dict(r.get("env") or {}).get("WORLD_SIZE")
             for r in c.run.plan.get("ranks", []) if r.get("role", "rank") == "rank"}
    if None in sizes.values() or len(set(sizes.values())) < 2:
        return None
    told = ", ".join(f"rank {label} WORLD_SIZE={w}" for label, w in sizes.items())
    text = f"the ranks disagree on the world size ({told})"
    m, k = JOINED.search(v.message or ""), WAIT_KEYS.search(v.message or "")
    n = len(sizes)
    if m is not None and int(m.group(2)) > n - 1:
        text += f": this rank waited for {m.group(2)} clients and only {n - 1} other " + \
            ("rank exists" if n == 2 else "ranks exist")
    elif k is not None:
        pg = PG_KEY.match(k.group(2).split(",")[0])
        if pg is not None and int(pg.group(1)) >= n:
            text += f": this rank waited for rank {pg.group(1)}'s key, and there is no " \
                f"rank {pg.group(1)}"
    return Cause(text, [_exc_line(v)] if v.exception else [v.reason])


def nobody_claimed_rank_0(c: RankContext) -> Optional[Cause]:
    """Clients of a store nobody started: no row of the run claimed RANK=0."""
    if not CONNECT_TIMEOUT.search(c.verdict.message or ""):
        return None
    ranks = [r for r in c.run.plan.get("ranks", []) if r.get("role", "rank") == "rank"]
    claims = {str(r.get("label")): dict(r.get("env") or {}).get("RANK") for r in ranks}
    if not claims or any(v is None for v in claims.values()) or "0" in claims.values():
        return None
    dup: Dict[str, List[str]] = {}
    for label, rank in claims.items():
        dup.setdefault(str(rank), []).append(label)
    twice = "; ".join(f"ranks {', '.join(ls)} {'both' if len(ls) == 2 else 'all'} claimed "
                      f"RANK={r}"
                      for r, ls in dup.items() if len(ls) > 1)
    if not twice:
        return None   # no rank claimed twice: the plan may not list every process
    return Cause("no process claimed RANK=0, so no store was started"
                 + (f" ({twice})" if twice else "") + "; connects were retried until the "
                 "client's timeout", [_exc_line(c.verdict)])


def connected_to_a_non_store(c: RankContext) -> Optional[Cause]:
    """Connected to the master port, and the other end is a process that is no rank (a port
    squatter): the client waits for an answer that never comes."""
    if c.verdict.outcome not in ("hang", "timeout", "error"):
        return None
    for s in c.sockets:
        if s.state != "ESTABLISHED" or s.remote_port != c.master_port or s.peer_pid is None:
            continue
        if s.peer.startswith(("rank ", "agent", "worker ", "parent")) or ":agent:" in s.peer \
                or ":parent:" in s.peer:
            continue
        how = "never accepting: the connection waits in its listen backlog" \
            if s.peer_accepted is False else "accepting and never answering"
        text = f"connected to a process that is not a torch store: {s.peer}, {how}"
        ev = [f"socket: {s.line()}"]
        failed = c.port_in_use()
        if failed is not None:
            at = f" at {failed.duration:g} s" if failed.duration is not None else ""
            text += f"; the real store never started: rank {failed.label} failed with " \
                f"EADDRINUSE{at}"
            ev.append(_exc_line(failed))
        return Cause(text, ev)
    return None


def syn_unanswered(c: RankContext) -> Optional[Cause]:
    """A SYN sent and never answered: dropped (the nft rule that drops it, when one does)."""
    syn = [s for s in c.sockets if s.state == "SYN_SENT"]
    target: Optional[Tuple[str, int]] = None
    ev: List[str] = []
    if syn:
        s = syn[0]
        target = (s.remote.rsplit(":", 1)[0], s.remote_port)
        ev.append(f"socket: {s.line()}")
    else:
        m = CONNECT_TIMEOUT.search(c.verdict.message or "")
        if m is None:
            return None
        target = (m.group(1).strip(), int(m.group(2)))
    rule = _dropping_rule(c.run.rules, target[1])
    if rule is not None and re.search(r"\breject\b", rule[1]):
        return Cause(f"its connects to {target[0]}:{target[1]} were refused by the nft rule on "
                     f"host {rule[0]} and retried until the client's timeout: {rule[1]}",
                     [_exc_line(c.verdict), f"nft on {rule[0]}: {rule[1]}"])
    retrans = {h: n.get("TCPSynRetrans", 0) for h, n in c.run.counters.items()
               if n.get("TCPSynRetrans", 0)}
    if not syn and rule is None:
        return None
    text = f"its SYN to {target[0]}:{target[1]} was never answered"
    ip = as_meant(target[0])
    if rule is not None:
        text += f": dropped by the nft rule on host {rule[0]}: {rule[1]}"
        ev.append(f"nft on {rule[0]}: {rule[1]}")
    elif _dead_address(c, ip):
        # the connect waits for ARP, which nobody answers; it ends in No route to host
        text += (f": {ip} is an address where no host of the run answers (nobody on the link "
                 "has it)")
    if retrans:
        ev.append("TCPSynRetrans: " + ", ".join(f"{h} {n}" for h, n in retrans.items()))
    if c.verdict.exception:
        ev.insert(0, _exc_line(c.verdict))
    return Cause(text, ev)


COUNTER = re.compile(r"\s*\bcounter packets \d+ bytes \d+")   # a fault's rule counts (evidence)


def _dropping_rule(rules: Dict[str, str], port: int) -> Optional[Tuple[str, str]]:
    """(host, rule line) of an nft rule that drops ``port`` (or drops everything new); the
    rule's counter (a firewall fault's evidence, harness.effects) is left out of the line."""
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


def _blanket_rule(rules: Dict[str, str]) -> Optional[Tuple[str, str]]:
    """(host, rule line) of an nft rule that drops or rejects new connections to every port
    but a few (``dport != P``) or to any port."""
    for host, text in rules.items():
        for ln in text.splitlines():
            ln = COUNTER.sub("", ln.strip())
            if re.search(r"\b(?:drop|reject)\b", ln) and "policy" not in ln and (
                    re.search(r"dport\s*!=", ln) or "dport" not in ln):
                return host, ln
    return None


def gloo_mesh_blocked(c: RankContext) -> Optional[Cause]:
    """gloo's full mesh could not connect (rank to rank, on ports other than the store's)
    because an nft rule drops or rejects new connections to every port but the store's."""
    msg = c.verdict.message or ""
    if "connectFullMesh" not in msg or not re.search(r"timeout|timed out|refused", msg, re.I):
        return None
    rule = _blanket_rule(c.run.rules)
    if rule is None:
        return None
    host, ln = rule
    how = "refused" if re.search(r"\breject\b", ln) else "dropped"
    verb = "rejects" if how == "refused" else "drops"
    keep = re.search(r"dport\s*!=\s*(\S+)", ln)
    but = f" but {keep.group(1)}" + (" (the store's)" if keep.group(1) == str(c.master_port)
                                     else "") if keep else ""
    own = c.obs is not None and c.obs.host == host
    remote = re.search(r"remote=\[([^\]]+)\]:(\d+)", msg)
    where = "its own host" if own else "host"
    text = f"gloo's full mesh could not connect: the nft rule on {where} " \
        f"{host} {verb} new connections to every port{but}, so the ranks' pair connections " \
        f"to {host} were {how}"
    ev = [_exc_line(c.verdict), f"nft on {host}: {ln}"]
    if remote:
        ev.append(f"its connect to {remote.group(1)}:{remote.group(2)} was {how}")
    return Cause(text, ev)


REMOTE = re.compile(r"remote=\[([^\]]+)\]:(\d+)")


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


def _ifname(c: RankContext, label: str) -> str:
    """The rank's GLOO_SOCKET_IFNAME in words: as planned, else as the process said at its
    start (a task srun started, a worker of an agent)."""
    env = c.env(label)
    name = env.get("GLOO_SOCKET_IFNAME")
    if name is None and not env:
        o = c.obs_of(label)
        if o is None or "gloo_socket_ifname" not in (o.info or {}):
            return "GLOO_SOCKET_IFNAME as its launcher set it"
        name = o.info.get("gloo_socket_ifname")
    return "GLOO_SOCKET_IFNAME unset" if name is None else f"GLOO_SOCKET_IFNAME={name}"


SPARE_STEP = re.compile(r"^add (\S+) \((up|down)(, link-local only)?\) on (\S+)$")


def _spare_cards(c: RankContext) -> List[Tuple[str, str, str, bool]]:
    """(address, host, interface, link-local only) of every second card a fault gave a host
    (second_nic, wrong_interface list_down): the step's own record of the address it got."""
    out = []
    for st in c.run.step_log:
        m = SPARE_STEP.match(st.what or "")
        addr = (st.info or {}).get("addr") if st.action == "do" else None
        if m is not None and addr:
            out.append((str(addr), m.group(4), m.group(1), m.group(3) is not None))
    return out


def _second_cards(c: RankContext) -> Dict[str, Tuple[str, str]]:
    """Address -> (host, interface) of every second card with an address of its own subnet."""
    return {a: (h, i) for a, h, i, link_local in _spare_cards(c) if not link_local}


def gloo_pair_to_a_second_card(c: RankContext) -> Optional[Cause]:
    """A gloo pair dialled the address of a host's second card, on a network no other host is
    on (GLOO_SOCKET_IFNAME named it: each rank advertised its own there): no route; the rank
    on that card's host waits for the pair until gloo's connect timeout."""
    v = c.verdict
    if "connectFullMesh" not in (v.message or ""):
        return None
    cards = _second_cards(c)
    if not cards:
        return None
    m = REMOTE.search(v.message or "")
    if m is not None and m.group(1) in cards:
        host, ifname = cards[m.group(1)]
        who = [o.label for o in c.verdicts if o.host == host and o.label != v.label
               and o.role == v.role]
        said = re.search(r"SO_ERROR: ([^,]+)", v.message or "")
        return Cause(f"its gloo pair dialled {m.group(1)}:{m.group(2)}, the address of host "
                     f"{host}'s second card {ifname}, on a network no other host is on"
                     + (f" ({said.group(1)})" if said else "") + ": "
                     + (f"rank {who[0]} advertised it ({_ifname(c, who[0])})" if who
                        else "its rank advertised it"),
                     [_exc_line(v), f"{host} {ifname}: {m.group(1)}"])
    mine = {a: hi for a, hi in cards.items() if hi[0] == v.host}
    for o in c.verdicts:
        om = REMOTE.search(o.message or "") if o.label != v.label else None
        if om is not None and om.group(1) in mine:
            host, ifname = mine[om.group(1)]
            return Cause(f"gloo's full mesh never connected: rank {o.label} dialled "
                         f"{om.group(1)}:{om.group(2)}, the address this rank advertised on "
                         f"{host}'s second card {ifname} ({_ifname(c, v.label)}), on a network "
                         f"no other host is on, and gave up at {o.duration:g} s; this rank "
                         "waited for the pair until gloo's connect timeout",
                         [_exc_line(v), _exc_line(o), f"{host} {ifname}: {om.group(1)}"])
    return None


def gloo_on_a_link_local_card(c: RankContext) -> Optional[Cause]:
    """GLOO_SOCKET_IFNAME names a card whose only address is IPv6 link-local (second_nic
    address: link_local): gloo advertises that address, a peer's pair dials it out of its own
    card of that name, on a network where no other host is (a link-local address is good only
    on its own link), and gloo's connect times out."""
    v = c.verdict
    if "connectFullMesh" not in (v.message or ""):
        return None
    names = [n.strip() for n in c.env(v.label).get("GLOO_SOCKET_IFNAME", "").split(",")]
    for addr, host, ifname, link_local in _spare_cards(c):
        if not link_local or host != v.host or ifname not in names:
            continue
        return Cause(f"GLOO_SOCKET_IFNAME={','.join(n for n in names if n)} names "
                     f"{ifname}, whose only address on host {v.host} is the IPv6 "
                     f"link-local {addr}: gloo advertised it, but a link-local address is "
                     "good only on its own link, and each host's "
                     f"{ifname} is on a network no other host is on: no pair connected "
                     "until gloo's connect timeout",
                     [_exc_line(v), f"{v.host} {ifname}: {addr} (link-local only)"])
    return None


def gloo_pair_to_no_host(c: RankContext) -> Optional[Cause]:
    """A gloo pair dialled an address no host of the run has (a peer advertised 127.0.0.1: on
    namespace hosts that is the dialler's own namespace): the dialler is refused, the peer
    waits for the pair until gloo's connect timeout."""
    v = c.verdict
    if "connectFullMesh" not in (v.message or ""):
        return None
    addrs = _host_addrs(c)
    if len(addrs) < 2:
        return None   # one machine: 127.0.0.1 is everybody's
    hosts = ", ".join(f"{h} {a}" for h, a in addrs.items())
    m = REMOTE.search(v.message or "")
    if m is not None and m.group(1) not in addrs.values() and _is_loopback(m.group(1)):
        peers = [o.label for o in c.verdicts if o.label != v.label and o.role == v.role]
        return Cause(f"its gloo pair dialled {m.group(1)}:{m.group(2)}, an address no host of "
                     f"the run has ({hosts}): the peer{'s' * (len(peers) > 1)} advertised it "
                     f"({_ifname(c, peers[0]) if peers else ''}), so it dialled its own "
                     "namespace, where nothing listened, and was refused",
                     [_exc_line(v), f"hosts: {hosts}"])
    for o in c.verdicts:
        om = REMOTE.search(o.message or "") if o.label != v.label else None
        if om is not None and om.group(1) not in addrs.values() and _is_loopback(om.group(1)):
            return Cause(f"gloo's full mesh never connected: rank {o.label} dialled "
                         f"{om.group(1)}:{om.group(2)}, the address this rank advertised "
                         f"({_ifname(c, v.label)}), which no host of the run has ({hosts}), "
                         f"and gave up at {o.duration:g} s; this rank waited for the pair "
                         "until gloo's connect timeout",
                         [_exc_line(v), _exc_line(o), f"hosts: {hosts}"])
    return None


def gloo_interface_missing(c: RankContext) -> Optional[Cause]:
    """GLOO_SOCKET_IFNAME names an interface the rank's host does not have."""
    m = re.search(r"Unable to find address for: (\S+)", c.verdict.message or "")
    if m is None:
        return None
    host = c.obs.host if c.obs is not None else "its host"
    return Cause(f"{_ifname(c, c.verdict.label)} names interface {m.group(1)}, which host "
                 f"{host} does not have", [_exc_line(c.verdict)])


NCCL_NO_IFACE = re.compile(r"Bootstrap : no socket interface found")
NCCL_DUP_GPU = re.compile(r"Duplicate GPU detected : rank (\d+) and rank (\d+) both on CUDA "
                          r"device (\w+)")


def nccl_interface_missing(c: RankContext) -> Optional[Cause]:
    """NCCL's bootstrap found no interface NCCL_SOCKET_IFNAME allows (watched on an H200,
    torch 2.11.0+cu130, NCCL 2.28.9: DistBackendError ncclInvalidUsage at the first
    collective: NCCL makes its communicator there, not in init_process_group)."""
    m = NCCL_NO_IFACE.search(c.verdict.message or "")
    if m is None:
        return None
    name = c.env(c.verdict.label).get("NCCL_SOCKET_IFNAME")
    host = c.obs.host if c.obs is not None else ""
    where = "this machine's" if host in ("", "local") else f"host {host}'s"
    said = f"NCCL_SOCKET_IFNAME={name} matches" if name is not None else \
        "NCCL_SOCKET_IFNAME unset: NCCL's default choice matched"
    return Cause(f"NCCL found no network interface to bootstrap on in {c.verdict.phase}: {said} "
                 f"none of {where} interfaces",
                 [_exc_line(c.verdict), f"NCCL's last error: {m.group(0)}"])


def nccl_ranks_share_a_gpu(c: RankContext) -> Optional[Cause]:
    """Two ranks of one communicator on one CUDA device: NCCL refuses it (ncclInvalidUsage,
    "Duplicate GPU detected"), where a program does not give each rank its own device, or
    omits the backend (torch then takes cpu:gloo,cuda:nccl and runs barrier on the current
    CUDA device: watched on an H200 with 2 ranks and no set_device)."""
    m = NCCL_DUP_GPU.search(c.verdict.message or "")
    if m is None:
        return None
    a, b, dev = m.groups()
    a, b = sorted((a, b), key=int)
    locals_ = {c.env(r).get("LOCAL_RANK") for r in (a, b)}
    how = f" (both were given LOCAL_RANK={locals_.pop()})" if len(locals_) == 1 and \
        None not in locals_ else ""
    return Cause(f"ranks {a} and {b} are both on CUDA device {dev}{how}: NCCL needs one GPU per "
                 "rank: each rank sets its own (torch.cuda.set_device(LOCAL_RANK), or "
                 "init_process_group(device_id=...)) before its first collective",
                 [_exc_line(c.verdict), f"NCCL's last error: {m.group(0)}"])


def name_unresolved(c: RankContext) -> Optional[Cause]:
    """A name the rank had to resolve did not resolve (the resolver's words in its stderr)."""
    if c.obs is None:
        return None
    m = GAI.search(c.stderr())
    if m is None:
        return None
    addr = c.env(c.verdict.label).get("MASTER_ADDR", "")
    line = m.group(0).strip()[:300]
    ev = [f"stderr: {line}"] + ([_exc_line(c.verdict)] if c.verdict.exception else [])
    try:
        literal = ipaddress.ip_address(addr.strip("[]")) if addr else None
    except ValueError:
        literal = None
    if literal is not None:
        hosts = [h for h in c.run.plan.get("hosts") or [] if h.get("name") == c.verdict.host]
        host: Dict[str, Any] = hosts[0] if hosts else {}
        off = {k: v for k, v in ((host.get("machine") or {}).get("sysctl") or {}).items()
               if "disable_ipv6" in k and str(v) == "1"}
        if off and literal.version == 6:
            said = ", ".join(f"{k}={v}" for k, v in off.items())
            return Cause(f"MASTER_ADDR={addr} is an IPv6 address, and its lookup failed on "
                         f"this host: host {c.verdict.host} has IPv6 off ({said}): the resolver "
                         "gives no address of a family the host lacks", ev)
    end = c.verdict.duration if c.verdict.duration is not None else float("inf")
    server: List[str] = []
    for st in c.run.step_log:   # what the scenario's name-server faults did by this rank's end
        if st.action != "do" or not st.fault.startswith("dns") or st.t > end:
            continue
        healed = next((u.t for u in c.run.step_log if u.step == st.step and u.action == "undo"),
                      None)
        if healed is not None and healed <= end:
            continue
        server.append(f"{st.what.removeprefix('dns: ')} (the scenario's {st.fault} fault, from "
                    f"{st.t:g} s)")
    return Cause(f"a name did not resolve{f' (MASTER_ADDR={addr})' if addr else ''}"
                 + (": the run's name server: " + "; ".join(server) if server else ""), ev)


NO_PEER_NAME = re.compile(r"The hostname of the client socket cannot be retrieved\. err=-?\d+")
RESOLVER_FAULTS = ("dns_server",)


def reverse_lookup_stalled(c: RankContext) -> Optional[Cause]:
    """A store connect that timed out while the name server the scenario's fault silenced held
    c10d's reverse lookup of the peer (its "hostname of the client socket cannot be retrieved"
    comes only after the resolver's own timeouts, past torch's)."""
    v = c.verdict
    if v.outcome not in ("timeout", "hang") or c.obs is None:
        return None
    m = NO_PEER_NAME.search(c.stderr())
    dns = [st for st in c.run.step_log if st.fault in RESOLVER_FAULTS and st.action == "do"]
    if m is None or not dns:
        return None
    return Cause(f"c10d's reverse lookup of its store peer hung on the name server that the "
                 f"scenario's dns_server fault silenced ({dns[0].what}, from "
                 f"{float(dns[0].t or 0):g} s): the connection was up, but the lookup outlasted "
                 "the timeout, though MASTER_ADDR needs no name",
                 [f"stderr: {m.group(0)}"] + ([_exc_line(v)] if v.exception else []))


_NOT_A_RANK = Label("other", "")


def _other_attempt(a: str, b: str) -> bool:
    """Two rows of one rank from different restart attempts (``0`` and ``0@1``): a rank's
    new attempt never waits for its own earlier one."""
    la, lb = parse_label(a), parse_label(b)
    return la is not None and lb is not None and la.kind == lb.kind == "rank" and \
        la.job == lb.job and la.rank == lb.rank and la.attempt != lb.attempt


def waiting_for_ranks(c: RankContext) -> Optional[Cause]:
    """The store's host timed out waiting for clients: which ranks never joined, and why."""
    m = JOINED.search(c.verdict.message or "")
    if m is None:
        return None
    mine = c.env(c.verdict.label)
    why: List[str] = []
    planned = [rp for rp in c.run.plan.get("ranks", []) if rp.get("role", "rank") == "rank"]
    # ranks a launcher started (srun's tasks, an agent's workers) are not in the plan: their
    # rows still say how they ended
    known = {str(rp.get("label")) for rp in c.run.plan.get("ranks", [])}
    found = [{"label": v.label} for v in c.verdicts if v.label not in known
             and (parse_label(v.label) or _NOT_A_RANK).kind == "rank"]
    for rp in planned + found:
        label = str(rp.get("label"))
        if label == c.verdict.label or _other_attempt(label, c.verdict.label):
            continue
        env = dict(rp.get("env") or {})
        other = next((v for v in c.verdicts if v.label == label), None)
        obs = next((o for o in c.run.ranks if o.label == label), None)
        if rp.get("absent") or other is not None and other.outcome == "absent":
            why.append(f"rank {label} never started")
        elif env.get("MASTER_PORT") and mine.get("MASTER_PORT") and \
                env["MASTER_PORT"] != mine["MASTER_PORT"]:
            why.append(f"rank {label} dialled port {env['MASTER_PORT']}, not "
                       f"{mine['MASTER_PORT']}")
        elif env.get("MASTER_ADDR") and mine.get("MASTER_ADDR") and \
                env["MASTER_ADDR"] != mine["MASTER_ADDR"]:
            ctx = c.about(other) if other is not None and other.outcome != "ok" else None
            own = diagnose(ctx, [r for r in RULES if r is not waiting_for_ranks]) \
                if ctx is not None else None
            why.append(f"rank {label} dialled {env['MASTER_ADDR']}, not {mine['MASTER_ADDR']}"
                       + (f": {own.text}" if own is not None and own.text != UNKNOWN
                          else ""))
        elif obs is not None and obs.released_at and c.verdict.duration is not None and \
                obs.released_at >= c.verdict.duration:
            why.append(f"rank {label} was started only at {obs.released_at:g} s, after this "
                       f"rank gave up at {c.verdict.duration:g} s")
        elif other is not None and env.get("RANK") is not None and \
                env.get("RANK") == mine.get("RANK"):
            why.append(f"rank {label} also claimed RANK={mine.get('RANK')}")
        elif other is not None and other.outcome != "ok" and \
                (starved := _starved(c, label)) is not None:
            why.append(f"rank {label} never reached it: it was starved of CPU (the scenario's "
                       f"cpu_contention fault: {starved.what})")
        elif other is not None and other.outcome != "ok":
            ctx = c.about(other)
            own = diagnose(ctx, [r for r in RULES if r is not waiting_for_ranks]) \
                if ctx is not None else None
            if own is not None and own.text != UNKNOWN:
                why.append(f"rank {label} never reached it: {own.text}")
    if not why:
        return None
    text = f"waited for {int(m.group(2)) - int(m.group(1))} of {m.group(2)} clients: " + \
        "; ".join(why)
    return Cause(text, [_exc_line(c.verdict)])


def store_host_failed(c: RankContext) -> Optional[Cause]:
    """A client of a store whose host had already failed (the store went away or never came)."""
    if c.verdict.outcome not in ("timeout", "hang", "error"):
        return None
    if not CONNECT_TIMEOUT.search(c.verdict.message or "") and c.verdict.outcome != "hang":
        return None
    failed = [v for v in c.verdicts if v.label != c.verdict.label and v.outcome == "error"
              and v.duration is not None and (c.verdict.duration is None
                                              or v.duration < c.verdict.duration)
              and EADDRINUSE.search(v.message or "")]
    if not failed:
        return None
    f = failed[0]
    return Cause(f"the store never started: rank {f.label} failed with EADDRINUSE at "
                 f"{f.duration:g} s; this rank retried until its timeout",
                 [_exc_line(c.verdict), _exc_line(f)])


def starved_in_init(c: RankContext) -> Optional[Cause]:
    """A rank the scenario starved of CPU (cpu_contention) that failed or hung before it was
    through init: it came to the store too late; what it met there follows."""
    v = c.verdict
    st = _starved(c, v.label)
    if st is None or v.outcome not in ("timeout", "error", "hang") or v.phase != "init":
        return None
    then = diagnose(c, [r for r in RULES if r is not starved_in_init])
    return Cause(f"starved of CPU by the scenario's cpu_contention fault ({st.what}), it was "
                 "still in init when the others had given up"
                 + (f": {then.text}" if then is not None and then.text != UNKNOWN else ""),
                 [_exc_line(v) if v.exception else v.reason])


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


def no_store_there(c: RankContext) -> Optional[Cause]:
    """A client that timed out connecting to a port where no store listened: not the run's
    master port, or the store's host had already ended."""
    m = CONNECT_TIMEOUT.search(c.verdict.message or "")
    if m is None:
        return None
    port = int(m.group(2))
    unknown_name = _name_unknown_here(c, m.group(1).strip())
    if unknown_name:
        return Cause(f"{unknown_name}; connects were retried until the client's timeout",
                     [_exc_line(c.verdict)])
    unreachable = _unreachable_master(c, c.verdict.label)
    if unreachable:
        return Cause(f"{unreachable}; connects were retried until the client's timeout",
                     [_exc_line(c.verdict)])
    info = (c.obs.info or {}) if c.obs is not None else {}
    agent_port = str(info.get("master_port") or "")
    if c.obs is not None and c.obs.role == "worker" and agent_port.isdigit() and \
            int(agent_port) != port and str(info.get("use_agent_store")) == "True":
        # torchrun's worker (TORCHELASTIC_USE_AGENT_STORE=True): torch makes it, rank 0 too,
        # a client of a store it expects its agent to host; a port the program named itself
        # (init_method tcp://...:PORT) is hosted by nobody (torch < 2.14 applies the flag to
        # any address; 2.14 only to the agent's own)
        return Cause(f"dialled port {port}, where no store listened: under torchrun "
                     "(TORCHELASTIC_USE_AGENT_STORE=True) torch made this worker a client of "
                     f"its agent's store, which is at MASTER_PORT={agent_port}, not at the "
                     f"port {port} the program named; connects were retried until the "
                     "client's timeout",
                     [_exc_line(c.verdict), f"{c.verdict.label}: MASTER_PORT={agent_port}, "
                      "TORCHELASTIC_USE_AGENT_STORE=True"])
    if c.master_port and port != c.master_port:
        return Cause(f"dialled port {port}, where no store listened (the store's port is "
                     f"{c.master_port}); connects were retried until the client's timeout",
                     [_exc_line(c.verdict)])
    host = next((v for v in c.verdicts if v.label != c.verdict.label
                 and v.role in ("rank", "worker")
                 and c.env(v.label).get("RANK", v.label) == "0"), None)
    dialled = m.group(1).strip("[]")
    there = next((v.host for v in c.verdicts if dialled in (v.host, v.addr)), None)
    if host is not None and there is not None and there != host.host and \
            dialled not in (host.host, host.addr):
        return Cause(f"dialled {dialled} (host {there}), where no store listened: the store's "
                     f"host is rank 0's, {host.host} ({host.addr}); connects were retried "
                     "until the client's timeout", [_exc_line(c.verdict)])
    if host is not None and host.outcome != "ok" and host.duration is not None and \
            c.verdict.duration is not None and host.duration < c.verdict.duration:
        return Cause(f"the store's host, rank 0, had ended ({host.outcome}) at "
                     f"{host.duration:g} s; connects to port {port} were retried until the "
                     "client's timeout", [_exc_line(c.verdict), _exc_line(host)])
    if host is not None and host.outcome == "ok" and host.duration is not None and \
            c.verdict.duration is not None and host.duration < c.verdict.duration:
        joined = sorted(v.label for v in c.verdicts if v.outcome == "ok" and v.role in
                        ("rank", "worker"))
        return Cause(f"the store's host, rank 0, had finished its job (ok at "
                     f"{host.duration:g} s, with ranks {', '.join(joined)}) and its store was "
                     f"gone; connects to port {port} were retried until the client's timeout",
                     [_exc_line(c.verdict), f"rank 0: {host.reason}"])
    return None


def refused_and_retried(c: RankContext) -> Optional[Cause]:
    """Connects refused (no listener) and retried silently by the store client until its
    timeout (the kernel's AttemptFails counts the refusals)."""
    m = CONNECT_TIMEOUT.search(c.verdict.message or "")
    if m is None:
        return None
    fails = {h: n.get("AttemptFails", 0) for h, n in c.run.counters.items()
             if n.get("AttemptFails", 0)}
    if not fails:
        return None
    return Cause(f"nothing listened on {m.group(1)}:{m.group(2)}: connects were refused and "
                 "retried until the client's timeout",
                 [_exc_line(c.verdict),
                  "AttemptFails: " + ", ".join(f"{h} {n}" for h, n in fails.items())])


# -- signals the scenario sent, and what the peers saw of them -----------------------------------
GLOO_SAYS = re.compile(r"gloo", re.I)
PEER_CLOSED = re.compile(r"closed by peer|reset by peer|connection closed|connection reset|"
                         r"timed out connecting: SO_ERROR: Connection refused", re.I)


def killed_by_the_fault(c: RankContext) -> Optional[Cause]:
    """A row the scenario's fault killed (SIGKILL, SIGTERM...): said with the fault and time."""
    v, o = c.verdict, c.obs
    if o is None or v.outcome != "crash" or v.returncode is None or v.returncode >= 0:
        return None
    sent = [s for s in o.signals
            if "SIG" + s.signal.removeprefix("SIG") == signal_name(v.returncode)]
    if not sent:
        return None
    s = sent[0]
    return Cause(f"killed by SIG{s.signal.removeprefix('SIG')}, sent by the scenario's fault"
                 f"{f' ({s.why})' if s.why else ''} at {s.t:g} s"
                 + (f", in {v.phase}" if v.phase else ""), [v.reason])


def frozen_by_the_fault(c: RankContext) -> Optional[Cause]:
    """A hung row the scenario's fault had stopped (SIGSTOP) and nobody resumed."""
    o = c.obs
    if o is None or c.verdict.outcome != "hang":
        return None
    stops = [s for s in o.signals if s.signal.removeprefix("SIG") == "STOP"]
    if not stops or any(s.signal.removeprefix("SIG") == "CONT" and s.t > stops[-1].t
                        for s in o.signals):
        return None
    return Cause(f"frozen by SIGSTOP, sent by the scenario's fault at {stops[-1].t:g} s, and "
                 "never resumed: alive but not running at the deadline", [c.verdict.reason])


def a_peer_was_frozen(c: RankContext) -> Optional[Cause]:
    """A row that timed out (or hung) while another rank of its job sat frozen by SIGSTOP."""
    v = c.verdict
    if v.outcome not in ("timeout", "hang") or v.role not in ("rank", "worker"):
        return None
    frozen = []
    for o in c.run.ranks:
        if o.label == v.label or _job(o.label) != _job(v.label):
            continue
        stops = [x for x in o.signals if x.signal.removeprefix("SIG") == "STOP"]
        if stops and (v.duration is None or stops[-1].t <= v.duration) and not any(
                x.signal.removeprefix("SIG") == "CONT" and x.t > stops[-1].t for x in o.signals):
            frozen.append((o.label, stops[-1].t))
    if len(frozen) != 1:
        return None
    label, t = frozen[0]
    return Cause(f"waited in {v.phase} for rank {label}, frozen by SIGSTOP (sent by the "
                 f"scenario's fault at {t:g} s) and never resumed",
                 [_exc_line(v)] if v.exception else [v.reason])


# a peer's end is recorded after its sockets closed (the supervisor's poll, an agent's reaping
# loop, its own result event written after the raise): a rank that saw the connection close may
# have raised up to this much before its closer's recorded end
END_SLACK = 0.25


def _ended_at(c: RankContext, v: Verdict) -> float:
    """When a row ended: its duration, or earlier the time the scenario's fault sent the signal
    that killed it (the supervisor notices an exit on its next poll, after the peer that saw
    the connection close may already have raised)."""
    end = float(v.duration if v.duration is not None else 1e9)
    o = c.obs_of(v.label)
    if o is not None and v.outcome == "crash" and v.returncode is not None and v.returncode < 0:
        fatal = [x.t for x in o.signals
                 if "SIG" + x.signal.removeprefix("SIG") == signal_name(v.returncode)]
        if fatal:
            end = min(end, float(fatal[0]))
        # a worker its agent stopped: the agent reaped it before the supervisor saw it end
        for a in c.run.ranks:
            if a.role == "agent" and o.pid:
                reaped = next((e for e in a.events if e.ev == "reaped"
                               and e.data.get("pid") == o.pid), None)
                if reaped is not None:
                    end = min(end, c.t(reaped))
    return end


def joined_another_jobs_store(c: RankContext) -> Optional[Cause]:
    """A rank of a second job on the same MASTER_PORT whose own rank 0 could not start a store
    (EADDRINUSE): its init went to the first job's store there and returned, and it then waited
    for peers that are not in its job."""
    v = c.verdict
    if v.outcome not in ("error", "timeout", "hang") or v.phase in ("init", "import", "start") \
            or not _job(v.label):
        return None
    own0 = next((o for o in c.verdicts if o.label != v.label and _job(o.label) == _job(v.label)
                 and c.env(o.label).get("RANK") == "0" and EADDRINUSE.search(o.message or "")),
                None)
    if own0 is None:
        return None
    port = c.env(v.label).get("MASTER_PORT", "")
    return Cause(f"it joined another job's store: its own rank 0 ({own0.label}) could not start "
                 f"one on port {port} (EADDRINUSE at {own0.duration:g} s), so this rank's init "
                 "reached the store the first job's rank 0 hosts there and returned; it then "
                 f"waited in {v.phase} for peers that are not in its job",
                 [_exc_line(v) if v.exception else v.reason, _exc_line(own0)])


def peer_died(c: RankContext) -> Optional[Cause]:
    """gloo's connection to a peer closed or reset: the one other rank that had ended before it
    (killed, or failed on its own)."""
    msg = c.verdict.message or ""
    # gloo's own words (its pair.cc, or "Gloo connectFullMesh failed"): the same reset on the
    # store's socket (a DistNetworkError from TCPStore) is not a gloo pair, and not this rule's
    if not PEER_CLOSED.search(msg) or not GLOO_SAYS.search(msg) or c.verdict.duration is None:
        return None
    at = re.search(r"\[([^\]]+)\]:(\d+)", msg)
    own_end = c.verdict.duration
    # a restart's workers mesh only with each other: the earlier attempt's were stopped first
    peers = [v for v in c.verdicts if v.label != c.verdict.label and v.role in ("rank", "worker")
             and v.duration is not None and (at is None or v.addr in (at.group(1), ""))
             and v.attempt == c.verdict.attempt]
    dead = [v for v in peers if v.outcome in ("crash", "error", "timeout")
            and _ended_at(c, v) <= own_end + END_SLACK]
    if len(dead) > 1:   # one killed, the others failing after it: the killed one is the cause
        crashed = [v for v in dead if v.outcome == "crash"]
        dead = crashed if len(crashed) == 1 else dead
    if len(dead) > 1:   # a peer that ended before this rank raised, over one inside the slack
        before = [v for v in dead if _ended_at(c, v) <= own_end]
        dead = before if len(before) == 1 else dead
    # a peer that finished its work and exited (ok) before this rank raised, while no failed
    # peer had ended yet: its exit closed the pair (a rank-dependent branch that skips work)
    finished = [v for v in peers if v.outcome == "ok" and _job(v.label) == _job(c.verdict.label)
                and float(v.duration or 0.0) <= own_end]
    if len(finished) == 1 and not any(_ended_at(c, v) <= own_end for v in dead):
        f = finished[0]
        where = f" ([{at.group(1)}]:{at.group(2)})" if at else ""
        return Cause(f"its gloo connection to rank {f.label}{where} was closed: rank {f.label} "
                     f"had finished its work and exited (ok) at {f.duration:g} s while this "
                     f"rank was still in {c.verdict.phase}", [_exc_line(c.verdict),
                                                              f"rank {f.label}: {f.reason}"])
    if len(dead) != 1:
        return None
    d = dead[0]
    where = f" ([{at.group(1)}]:{at.group(2)})" if at else ""
    return Cause(f"its gloo connection to rank {d.label}{where} was closed: "
                 f"{_how_it_ended(c, d, peer_died)}",
                 [_exc_line(c.verdict), f"rank {d.label}: {d.reason}"])


def _how_it_ended(c: RankContext, d: Verdict, rule: Rule) -> str:
    """"rank L had died at T s: its own cause" (or "had ended (error)"): a peer's end as the
    cause of this row; its own cause leaves ``rule`` out, so the two never explain each other."""
    own = _cause_of(c, d.label, [rule]) or (_exc_line(d) if d.exception else d.reason)
    how = "died" if d.outcome == "crash" else f"ended ({d.outcome})"
    return f"rank {d.label} had {how} at {round(_ended_at(c, d), 3):g} s: {own}"


BARRIER_FAILED = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier in (\d+) ms")


def barrier_peer_died(c: RankContext) -> Optional[Cause]:
    """monitored_barrier (wait_all_ranks) on rank 0 names the ranks that failed to pass it in
    the same words whether they never came within its timeout or had died: gloo's recv from a
    dead peer fails at once, and torch drops that error. A named rank that had ended (killed,
    or failed) before this rank raised is the cause, not a wait."""
    v = c.verdict
    m = BARRIER_FAILED.search(v.message or "")
    if m is None or v.duration is None:
        return None
    named = {n.strip() for n in m.group(1).split(",") if n.strip()}
    dead = [o for o in c.verdicts
            if o.label != v.label and o.role in ("rank", "worker") and o.duration is not None
            and _job(o.label) == _job(v.label)
            and c.env(o.label).get("RANK", o.label.rsplit(":", 1)[-1]) in named
            and o.outcome in ("crash", "error", "timeout")
            and _ended_at(c, o) <= v.duration + END_SLACK]
    if not dead:
        return None
    said = "; ".join(_how_it_ended(c, d, barrier_peer_died) for d in dead)
    return Cause(f"its monitored_barrier failed before its {int(m.group(2)) / 1000:g} s were "
                 f"up, on a rank that could no longer come: {said}",
                 [_exc_line(v)] + [f"rank {d.label}: {d.reason}" for d in dead])


def peer_reinitialised(c: RankContext) -> Optional[Cause]:
    """gloo's connection to a peer closed while that peer, alive, had entered a ``reinit`` step:
    it destroyed the process group this rank still used."""
    msg = c.verdict.message or ""
    if not PEER_CLOSED.search(msg) or not GLOO_SAYS.search(msg) or c.verdict.duration is None or (
            c.obs is not None and any(e.ev == "phase" and str(e.data.get("step") or "")
                                      .startswith("reinit") for e in c.obs.events)):
        return None   # (this rank re-initialised too: its new group is not the old one)
    end = c.verdict.duration
    for o in c.run.ranks:
        if o.label == c.verdict.label or o.role not in ("rank", "worker"):
            continue
        step = next((e for e in o.events if e.ev == "phase" and e.data.get("step")
                     == "reinit" and c.at(e) <= end), None)
        if step is not None:
            return Cause(f"its gloo connection to rank {o.label} was closed: rank {o.label} "
                         f"destroyed the process group to initialise a new one ({step.phase}, "
                         f"reinit, at {c.t(step):g} s) while this rank still used the old one",
                         [_exc_line(c.verdict)])
    return None


def program_exited(c: RankContext) -> Optional[Cause]:
    """A program that ended with a non-zero status of its own accord (sys.exit, no exception
    from torch): the program is the cause."""
    v, o = c.verdict, c.obs
    if o is None or v.outcome != "error" or v.exception or not o.info \
            or not re.match(r"exited with status \d+$", v.reason or ""):
        return None
    return Cause(f"the program itself {v.reason} in {v.phase or 'its own code'} (it raised no "
                 "exception through torch)", [v.reason])


def ddp_params_differ(c: RankContext) -> Optional[Cause]:
    """DDP's check at construction: this process's parameters differ from rank 0's."""
    m = re.search(r"params\[\d+\] in this process with sizes \[[^\]]*\] appears not to match "
                  r"sizes of the same param in process \d+", c.verdict.message or "")
    if m is None:
        n = re.search(r"Rank (\d+) has (\d+) params, while rank (\d+) has inconsistent (\d+) "
                      r"params", c.verdict.message or "")
        if n is None:
            return None
        return Cause(f"the model differs between ranks: rank {n.group(1)} has {n.group(2)} "
                     f"parameters, rank {n.group(3)} has {n.group(4)} (DDP's check at "
                     "construction)", [_exc_line(c.verdict)])
    return Cause(f"the model differs between ranks: {m.group(0)}", [_exc_line(c.verdict)])

def ddp_unused_parameters(c: RankContext) -> Optional[Cause]:
    """DDP's reducer found that the previous step's reduction never finished: some parameters
    took no part in this rank's loss (a module skipped in forward) without
    find_unused_parameters=True."""
    msg = c.verdict.message or ""
    if "Expected to have finished reduction in the prior iteration" not in msg:
        return None
    idx = re.search(r"Parameter indices which did not receive grad for rank (\d+): ([\d ]+)", msg)
    which = f" (parameters {idx.group(2).strip()} got no gradient on rank {idx.group(1)})" \
        if idx else ""
    return Cause("DDP's previous step never finished its reduction: some parameters took no "
                 f"part in this rank's loss{which}, a module its forward skipped, and the model "
                 "was wrapped without find_unused_parameters=True", [_exc_line(c.verdict)])


OWN_CODE = "it was in the program's own code"


def not_started_by_the_deadline(c: RankContext) -> Optional[Cause]:
    """A hung row whose release had not come by the deadline: it never started its work."""
    o = c.obs
    if o is None or c.verdict.outcome != "hang" or o.released_at is not None:
        return None
    when = c.plan_rank(c.verdict.label).get("released") or ""
    return Cause("not started before the harness's deadline"
                 + (f": its release ({when}) was still to come" if when else ""),
                 [c.verdict.reason])


def waiting_for_a_stuck_rank(c: RankContext) -> Optional[Cause]:
    """A hung row in a torch call while the other hung rows are not started yet or sit in the
    program's own code (not in any torch call): it waits for them."""
    v = c.verdict
    if v.outcome != "hang" or OWN_CODE in v.reason or v.role not in ("rank", "worker"):
        return None
    others = [o for o in c.verdicts if o.label != v.label and o.role in ("rank", "worker")
              and _job(o.label) == _job(v.label) and o.outcome != "ok"]
    if not others or any(o.outcome != "hang" for o in others):
        return None
    why = []
    for o in others:
        ob = c.obs_of(o.label)
        if ob is not None and ob.released_at is None:
            why.append(f"rank {o.label} was not started before the deadline")
        elif ob is not None and any(x.signal.removeprefix("SIG") == "STOP" for x in ob.signals):
            why.append(f"rank {o.label} was frozen by SIGSTOP")
        elif OWN_CODE in o.reason:
            why.append(f"rank {o.label} was in the program's own code after {o.phase} "
                       "returned, in no torch call")
        else:
            return None
    return Cause(f"waiting in {v.phase} for the other ranks: " + "; ".join(why),
                 [v.reason] + [f"rank {o.label}: {o.reason}" for o in others])


def in_its_own_code(c: RankContext) -> Optional[Cause]:
    """A hung row in the program's own code while the others wait in a torch call."""
    v = c.verdict
    if v.outcome != "hang" or OWN_CODE not in v.reason:
        return None
    waiting = [o for o in c.verdicts if o.label != v.label and o.role in ("rank", "worker")
               and _job(o.label) == _job(v.label) and o.outcome == "hang"
               and OWN_CODE not in o.reason]
    return Cause(f"in the program's own code after {v.phase} returned, in no torch call, at the "
                 "deadline" + (": " + ", ".join(f"rank {o.label} waits for it in {o.phase}"
                                                for o in waiting) if waiting else "")
                 + " (its stack shows where)", [v.reason])


def agent_waiting_for_workers(c: RankContext) -> Optional[Cause]:
    """A hung agent or parent whose workers were alive at the deadline: it waits for them."""
    v = c.verdict
    if v.outcome != "hang" or v.role not in ("agent", "parent"):
        return None
    workers = [w for w in c.verdicts if w.node == v.label and w.outcome == "hang"]
    if not workers:
        return None
    return Cause(f"waiting for its workers, alive at the deadline: ranks "
                 f"{', '.join(w.label for w in workers)}", [v.reason])

def agent_after_its_workers(c: RankContext) -> Optional[Cause]:
    """An agent that failed or hung although every worker it started had ended ok: the job
    failed after the training succeeded (its rendezvous service went away while it watched
    its workers, say). The faults' steps done by then are named."""
    v = c.verdict
    if v.role != "agent" or v.outcome in ("ok", "absent"):
        return None
    workers = [w for w in c.verdicts if w.node == v.label]
    if not workers or any(w.outcome != "ok" for w in workers):
        return None
    done = [o.ended_at for o in c.run.ranks if o.node == v.label and o.ended_at is not None]
    by = f" (the last by {max(done):g} s)" if done else ""
    end = v.duration if v.duration is not None else float("inf")
    steps = [s for s in c.run.step_log if s.action == "do" and s.fault != "run" and s.t <= end]
    what = "hung" if v.outcome == "hang" else f"{v.outcome} ({v.exception})" \
        if v.exception else v.outcome
    text = f"{what} after all its workers had ended ok{by}: ranks " \
        f"{', '.join(w.label for w in workers)}"
    if steps:
        text += "; the faults did: " + "; ".join(f"{s.what} at {s.t:g} s" for s in steps[:3])
    return Cause(text, [v.reason] + [f"rank {w.label}: {w.reason}" for w in workers])


RDZV_SERVICE_BACKENDS = ("etcd", "etcd-v2")   # torchrun backends whose store is a service


def rendezvous_service_faulted(c: RankContext) -> Optional[Cause]:
    """An agent on a rendezvous service (``--rdzv-backend etcd|etcd-v2``) that failed (not for
    a failed worker: no ChildFailedError) or hung, after the faults did something to the run's
    services (a step whose target is no process): the service's fault is the cause."""
    v = c.verdict
    if v.role != "agent" or v.outcome in ("ok", "absent"):
        return None
    argv = list(c.plan_rank(v.label).get("argv") or [])
    backend = _argv_opt(argv, "--rdzv-backend")
    if backend not in RDZV_SERVICE_BACKENDS:
        return None
    if "ChildFailedError" in (v.exception or ""):
        return None   # it ended for a worker that failed: agent_child_failed says it
    end = v.duration if v.duration is not None else float("inf")
    steps = [s for s in c.run.step_log if s.action == "do" and s.fault != "run" and s.t <= end
             and not s.target.startswith(("rank ", "agent", "worker", "parent"))]
    if not steps:
        return None
    what = "hung" if v.outcome == "hang" else (v.exception or v.outcome)
    ep = _argv_opt(argv, "--rdzv-endpoint")
    return Cause(f"{what}: its rendezvous service ({backend} at {ep}) was faulted: "
                 + "; ".join(f"{s.what} at {s.t:g} s" for s in steps[:3]),
                 [v.reason] + [f"step {s.step}: {s.what} at {s.t:g} s" for s in steps[:3]])


# -- launchers: agents, their workers ------------------------------------------------------------
def _cause_of(c: RankContext, label: str, skip: Sequence[Rule]) -> str:
    """Another row's own cause (its rules minus ``skip``, so two rows never explain each other
    in a circle); "" when it has none or only unknown."""
    other = c.verdict_of(label)
    if other is None or other.outcome in ("ok", "absent"):
        return ""
    ctx = c.about(other)
    if ctx is None:
        return ""
    own = diagnose(ctx, [r for r in RULES if r not in skip])
    return own.text if own is not None and own.text != UNKNOWN else ""


def stopped_by_agent(c: RankContext) -> Optional[Cause]:
    """A worker SIGTERMed by its own agent (not by a fault): because another worker failed, to
    restart its workers, or because the agent itself failed; the agent's reaped event says it
    collected this worker's SIGTERM."""
    v, o = c.verdict, c.obs
    if o is None or o.role != "worker" or v.outcome != "crash" or v.returncode != -15 \
            or any(s.signal in ("TERM", "SIGTERM") for s in o.signals) or not o.node:
        return None
    agent, ao = c.verdict_of(o.node), c.obs_of(o.node)
    if agent is None or ao is None:
        return None
    pid = o.pid or o.info.get("pid")
    reaped = next((e for e in ao.events if e.ev == "reaped" and e.data.get("pid") == pid
                   and e.data.get("returncode") == -15), None)
    if reaped is None:
        return None
    when = c.t(reaped)
    ev = [f"{agent.label}: reaped pid {pid} (SIGTERM) at {when:g} s"]
    where = f" in {v.phase}" if v.phase else ""
    unreachable = _unreachable_master(c, v.label) if v.phase in ("init", "import", "start") \
        else ""
    tail = f"; {unreachable}" if unreachable else ""
    if agent.root_cause is not None and str(agent.root_cause) != str(o.info.get("rank")):
        failed = _worker_of(c, o.node, agent.root_cause, o.attempt)
        why = ""
        if failed is not None:
            fv = c.verdict_of(failed.label)
            why = _cause_of(c, failed.label, [stopped_by_agent]) or \
                (_exc_line(fv) if fv is not None and fv.exception else
                 (fv.reason if fv is not None else ""))
        return Cause(f"stopped by its agent {o.node} after rank {agent.root_cause} failed"
                     + (f": {why}" if why else "") + tail, ev + [agent.reason])
    first = _first_failed_child(c, o.node)
    if first is not None and first.label != v.label and agent.role == "parent":
        why = _cause_of(c, first.label, [stopped_by_agent]) or \
            (c.verdict_of(first.label) or v).reason
        return Cause(f"stopped by its parent {o.node} after rank {first.label} failed: {why}"
                     + tail, ev)
    # unrounded: the restart event follows the reap by under 1 ms
    restarts = [e for e in ao.events if e.ev == "restart" and c.at(e) <= c.at(reaped) + 0.01]
    if restarts:
        r = restarts[-1]
        mine = [w for w in c.run.ranks if w.role == "worker" and w.node == o.node
                and w.label != v.label and (c.verdict_of(w.label) or v).outcome != "ok"
                and (w.ended_at or 1e9) <= c.at(r) + 0.01]
        text = f"stopped by its agent {o.node}{where} to restart its workers (restart " \
            f"{r.data.get('attempt')} at {c.t(r):g} s)"
        if mine:
            f = mine[0]
            why = _cause_of(c, f.label, [stopped_by_agent]) or (c.verdict_of(f.label) or v).reason
            text += f" after rank {f.info.get('rank', f.label)} failed: {why}"
        else:
            joined = [a for a in c.run.ranks if a.role == "agent" and a.label != o.node
                      and a.released_at is not None and a.released_at <= c.at(r) + 0.01
                      and a.released_at > (o.released_at or 0)]
            text += "; none of its workers had failed: the rendezvous's membership changed" + \
                (f" ({', '.join(a.label for a in joined)} joined at "
                 f"{', '.join(f'{a.released_at:g} s' for a in joined)})" if joined else "")
        return Cause(text + tail, ev)
    if agent.outcome in ("error", "timeout") and agent.duration is not None \
            and agent.duration >= when:
        why = _cause_of(c, agent.label, [stopped_by_agent]) or _exc_line(agent)
        return Cause(f"stopped by its agent {o.node}{where} when the agent failed: {why}" + tail,
                     ev + [_exc_line(agent)])
    return None


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


SRUN_ROW = "parent:srun"
SLURM_STOPS = re.compile(r"srun: (?:launch/slurm: _step_signal: Terminating StepId=\S+|"
                         r"error: Node failure on \S+|Force Terminated StepId=\S+)")


def _first_failed_task(c: RankContext) -> Optional[Verdict]:
    """The task of a Slurm job that ended first without being stopped by Slurm (srun's own
    lines are on the parent:srun row)."""
    tasks = [v for v in c.verdicts if v.label != SRUN_ROW and v.role in ("worker", "agent")
             and v.outcome not in ("ok", "absent") and v.returncode != -15
             and "Node failure" not in v.reason and v.duration is not None]
    return min(tasks, key=lambda v: v.duration or 0.0) if tasks else None


def srun_failed(c: RankContext) -> Optional[Cause]:
    """The Slurm job script: srun's status, and the task that failed first with its cause."""
    v = c.verdict
    if v.label != SRUN_ROW or v.exception != "SrunFailed":
        return None
    head = _first_line(v.message)
    stop = SLURM_STOPS.search(v.message or "")
    first = _first_failed_task(c)
    if first is None:
        return Cause(head + (f" ({stop.group(0)})" if stop else ""), [head])
    why = _cause_of(c, first.label, [srun_failed, stopped_by_slurm]) or first.reason
    return Cause(f"{head.split(';')[0]}: task {first.label} failed first: {why}",
                 [head] + ([stop.group(0)] if stop else []))


def stopped_by_slurm(c: RankContext) -> Optional[Cause]:
    """A task Slurm stopped: SIGTERM from srun's --kill-on-bad-exit, or a node set DOWN; srun's
    own line says which, and the task that failed first is named."""
    v = c.verdict
    srun = c.verdict_of(SRUN_ROW)
    if srun is None or v.label == SRUN_ROW or v.outcome != "crash" or \
            not (v.returncode == -15 or "Node failure" in v.reason):
        return None
    stop = SLURM_STOPS.search(srun.message or "")
    if stop is None:
        return None
    what = "the node failed" if "Node failure" in stop.group(0) else "Slurm terminated the step"
    first = _first_failed_task(c)
    after = ""
    if first is not None and first.label != v.label:
        after = f" after task {first.label} failed ({first.reason})"
    return Cause(f"stopped by Slurm: {what}{after}", [stop.group(0)])


def parent_child_failed(c: RankContext) -> Optional[Cause]:
    """A spawning parent's ProcessExitedException/ProcessRaisedException: the child it collected
    failing first, and that child's own cause."""
    v = c.verdict
    if v.role != "parent" or not re.search(r"Process(Exited|Raised)Exception", v.exception or ""):
        return None
    first = _first_failed_child(c, v.label)
    if first is None:
        return None
    why = _cause_of(c, first.label, [parent_child_failed, stopped_by_agent]) or \
        (c.verdict_of(first.label) or v).reason
    return Cause(f"its child rank {first.label} failed first: {why}", [_exc_line(v)])


def _worker_of(c: RankContext, node: str, rank: Any, attempt: Optional[int] = None
               ) -> Optional[RankObservation]:
    """The worker of ``node`` that had global rank ``rank``: of restart ``attempt`` when given
    and there, else of the last attempt (an agent's root cause names a rank of its last
    round; rank 0 of the first round is another process than 0@1)."""
    ws = [w for w in c.run.ranks if w.role == "worker" and w.node == node
          and str(w.info.get("rank")) == str(rank)]
    same = [w for w in ws if attempt is not None and w.attempt == attempt]
    if same:
        return same[0]
    return max(ws, key=lambda w: w.attempt, default=None)


def agent_child_failed(c: RankContext) -> Optional[Cause]:
    """An agent's ChildFailedError: its first failed worker, and that worker's own cause."""
    v = c.verdict
    if v.role != "agent" or v.root_cause is None:
        return None
    failed = _worker_of(c, v.label, v.root_cause)
    if failed is None:
        return None
    fv = c.verdict_of(failed.label)
    why = _cause_of(c, failed.label, [agent_child_failed, stopped_by_agent]) or \
        (_exc_line(fv) if fv is not None and fv.exception else (fv.reason if fv else ""))
    # torchrun names the failure it observed first; two workers reaped in one monitor pass
    # tie, and it names the lower rank. When that worker's own cause is another worker of
    # this agent's that had ended before it and closed its pair, that one failed first.
    m = re.match(r"its gloo connection to rank (\S+) .*?was closed: rank \S+ had (?:died|ended "
                 r"\((?:error|crash|timeout)\))", why)
    peer = next((w for w in c.run.ranks if m is not None and w.label == m.group(1)
                 and w.role == "worker" and w.node == v.label and w.attempt == failed.attempt),
                None)
    pv = c.verdict_of(peer.label) if peer is not None else None
    if peer is not None and pv is not None and pv.duration is not None and fv is not None \
            and fv.duration is not None and pv.duration <= fv.duration:
        pwhy = _cause_of(c, peer.label, [agent_child_failed, stopped_by_agent]) or \
            (_exc_line(pv) if pv.exception else pv.reason)
        return Cause(f"its worker rank {peer.info.get('rank', peer.label)} failed first"
                     + (f": {pwhy}" if pwhy else "") + f" (torchrun's report names rank "
                     f"{v.root_cause}, which failed {fv.duration - pv.duration:.3f} s later "
                     f"when that end closed its gloo pair)",
                     [v.reason] + ([_exc_line(pv)] if pv.exception else [pv.reason]))
    return Cause(f"its worker rank {v.root_cause} failed first" + (f": {why}" if why else ""),
                 [v.reason] + ([_exc_line(fv)] if fv is not None and fv.exception else []))


CLOSED = re.compile(r"Failed to recv|Connection was likely closed|Connection reset|Broken pipe",
                    re.I)


def rendezvous_store_lost(c: RankContext) -> Optional[Cause]:
    """An agent's RendezvousConnectionError, by its inner exception: a connect that timed out
    (nobody hosted the store, or its host had ended before this agent came) or a connection the
    store closed (its host ended, or finished its own job: another job on the same endpoint)."""
    v, o = c.verdict, c.obs
    if v.role != "agent" or o is None or "RendezvousConnectionError" not in (v.exception or ""):
        return None
    ep, inner = _endpoint(c, v.label), _inner(c, v.label)
    if ep is None or not inner:
        return None
    ip, port = ep
    ev = [_exc_line(v), f"inner: {inner}"]
    hosts = [a for a in c.run.ranks if a.role == "agent" and a.label != v.label
             and (a.addr == ip or a.host == ip or (_is_loopback(ip) and a.host == o.host))]
    if len(hosts) > 1:   # several agents on that host (srun --ntasks-per-node 2): the listener
        listening = [a for a in hosts if _listens(a, port)]
        hosts = listening if len(listening) == 1 else hosts
    timed_out = CONNECT_TIMEOUT.search(inner)
    if timed_out is not None and (timed_out.group(1).strip(), int(timed_out.group(2))) == ep:
        if _dropping_rule(c.run.rules, port) is not None:
            return None   # a firewall's doing: syn_unanswered says it
        if o.addr == ip and not hosts:
            return Cause(f"nobody hosted the rendezvous store at {ip}:{port}: this agent, on "
                         "that address, timed out connecting to it (torch's c10d rendezvous "
                         "hosts the store only on the agent whose hostname matches the "
                         "endpoint, or with is_host=true)", ev)
        if len(hosts) != 1:
            return None
        h, hv = hosts[0], c.verdict_of(hosts[0].label)
        if hv is None:
            return None
        h_inner = CONNECT_TIMEOUT.search(_inner(c, h.label))
        if h_inner is not None and (h_inner.group(1).strip(), int(h_inner.group(2))) == ep:
            return Cause(f"nobody hosted the rendezvous store at {ip}:{port}: {h.label}, on "
                         "that address, timed out connecting to it too"
                         + (f" (at {hv.duration:g} s)" if hv.duration is not None else ""),
                         ev + [_exc_line(hv)])
        how = hv.outcome + (f", {hv.reason}" if hv.outcome == "crash" else "")
        if hv.duration is not None and o.released_at is not None \
                and hv.duration <= o.released_at:
            return Cause(f"nothing listened at {ip}:{port} when this agent started "
                         f"({o.released_at:g} s): {h.label}, the agent on that address, had "
                         f"ended ({how}) at {hv.duration:g} s", ev + [hv.reason])
        # its host: a listener in its sockets, or, when it ended before any were taken, a
        # rendezvous it completed on that endpoint (an agent on the endpoint's address hosts it)
        hosted = _listens(h, port)
        if hosted is None:
            hosted = any(e.ev == "rendezvous_done" for e in h.events)
        if hosted and hv.duration is not None and v.duration is not None \
                and hv.duration <= v.duration:
            dialled = next((c.at(e) for e in o.events if e.ev == "phase"
                            and e.data.get("phase") == "rendezvous"), None)
            ending = next((c.at(e) for e in h.events if e.ev == "phase"
                           and e.data.get("phase") == "exit"), None)
            when = f" (it was in exit from {round(ending, 2):g} s, when this agent dialled " \
                f"at {round(dialled, 2):g} s)" if dialled is not None and ending is not None \
                and ending <= dialled < hv.duration + 0.001 else ""
            return Cause(f"lost the rendezvous store at {ip}:{port}: its host, {h.label}, had "
                         f"ended ({how}) at {hv.duration:g} s{when}", ev + [hv.reason])
        return None
    if not CLOSED.search(inner) or len(hosts) != 1:
        return None
    h, hv = hosts[0], c.verdict_of(hosts[0].label)
    if hv is None or hv.duration is None or v.duration is None:
        return None
    how = hv.outcome + (f", {hv.reason}" if hv.outcome == "crash" else "")
    if hv.duration <= v.duration:
        listened = " (listening on it when it raised)" if _listens(h, port) else ""
        return Cause(f"lost the rendezvous store at {ip}:{port}: its host, {h.label}{listened}, "
                     f"had ended ({how}) at {hv.duration:g} s and closed the connection",
                     ev + [hv.reason])
    done = [w.ended_at for w in c.run.ranks if w.node == h.label and w.ended_at]
    if hv.outcome == "ok" and done and max(done) <= v.duration \
            and (_listens(o, port) is False or (_listens(o, port) is None and o.addr
                                                 and o.addr != ip)) \
            and (h.released_at or 0.0) < (o.released_at or 0.0):
        return Cause(f"lost the rendezvous store at {ip}:{port}, which it did not host: "
                     f"{h.label}, on the same endpoint and started first, hosted it and closed "
                     f"it when its own job finished (its workers ended by {max(done):g} s)",
                     ev + [f"{v.label}: no listener on port {port} among its sockets"
                           if _listens(o, port) is False else
                           f"{v.label}: on {o.addr}, not the endpoint's address {ip}"])
    return None


def rendezvous_already_closed(c: RankContext) -> Optional[Cause]:
    """An agent's RendezvousClosedError: another agent of its job had finished its workers and
    closed the rendezvous before this one joined (a late node of an elastic job)."""
    v, o = c.verdict, c.obs
    if v.role != "agent" or o is None or "RendezvousClosedError" not in (v.exception or ""):
        return None
    done = []
    for a in c.run.ranks:
        av = c.verdict_of(a.label)
        if a.role != "agent" or a.label == v.label or _job(a.label) != _job(v.label) \
                or av is None or av.outcome != "ok":
            continue
        ended = [w.ended_at for w in c.run.ranks if w.node == a.label and w.ended_at]
        if ended and v.duration is not None and max(ended) <= v.duration:
            done.append((a.label, max(ended)))
    if len(done) != 1:
        return None
    label, t = done[0]
    started = f" (this agent started at {o.released_at:g} s)" if o.released_at else ""
    return Cause(f"the rendezvous was already closed: {label} had run its job to the end (its "
                 f"workers ended by {t:g} s) and closed it before this agent joined{started}",
                 [_exc_line(v)])


def rendezvous_join_timeout(c: RankContext) -> Optional[Cause]:
    """An agent's RendezvousTimeoutError: the agents of its job that had not started by then."""
    v = c.verdict
    if v.role != "agent" or "RendezvousTimeoutError" not in (v.exception or "") \
            or v.duration is None:
        return None
    late = [a for a in c.run.ranks if a.role == "agent" and a.label != v.label
            and _job(a.label) == _job(v.label) and _endpoint(c, a.label) == _endpoint(c, v.label)
            and (a.released_at is None or a.released_at >= v.duration)]
    if not late:
        return None
    who = "; ".join(f"{a.label} was started only at {a.released_at:g} s" if a.released_at
                    is not None else f"{a.label} never started" for a in late)
    return Cause(f"the rendezvous's join timeout ran out before every node came: {who}, "
                 f"after this agent gave up at {v.duration:g} s", [_exc_line(v)])


RDZV_KEY = re.compile(r"/torch\.rendezvous\.([^/\s,]+)\.(\d+)/(MASTER_ADDR|MASTER_PORT|"
                      r"torchelastic/role_info/\d+)")


def elastic_round_deadlock(c: RankContext) -> Optional[Cause]:
    """Two agents of one c10d rendezvous wait for each other's key in a later round: torch
    shares the rendezvous TCPStore (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE`` unset) and its
    rank-0 agent builds the bootstrap store info (``MASTER_ADDR``/``MASTER_PORT`` keys under the
    round's prefix) only in the first round it joins; a node new in round R >= 1 waits for
    round R's ``MASTER_ADDR`` before it writes its ``torchelastic/role_info/<rank>``, which the
    rank-0 agent waits for (torch 2.13 ``dynamic_rendezvous.next_rendezvous`` and
    ``agent.server.api._assign_worker_ranks``)."""
    v = c.verdict
    if v.role != "agent" or "wait timeout" not in (v.message or ""):
        return None
    mine = {m.group(3) for m in RDZV_KEY.finditer(v.message or "")}
    rounds = {m.group(2) for m in RDZV_KEY.finditer(v.message or "")}
    if not mine or rounds == {"0"}:
        return None
    others = [(a, {m.group(3) for m in RDZV_KEY.finditer(a.message or "")})
              for a in c.verdicts if a.role == "agent" and a.label != v.label
              and _job(a.label) == _job(v.label)]
    rnd = sorted(rounds)[-1]
    if any(k.startswith("MASTER_") for k in mine):
        peer = next((a for a, ks in others if any(k.startswith("torchelastic/role_info/")
                                                  for k in ks)), None)
        if peer is None:
            return None
        return Cause(f"rendezvous round {rnd}: this agent, new in that round, waited for the "
                     f"round's MASTER_ADDR, which the rank-0 agent {peer.label} never writes "
                     "after its first round (it keeps that round's store: torch shares the "
                     f"rendezvous TCPStore); {peer.label} waited for this agent's role info in "
                     "turn: a deadlock of torch's elastic scale-up, until the store's read "
                     "timeout", [_exc_line(v), _exc_line(peer)])
    peer = next((a for a, ks in others if any(k.startswith("MASTER_") for k in ks)), None)
    if peer is None:
        return None
    return Cause(f"rendezvous round {rnd}: this rank-0 agent waited for the role info of "
                 f"{peer.label}, which waited for the round's MASTER_ADDR that this agent "
                 "never writes after its first round (it keeps that round's store: torch "
                 "shares the rendezvous TCPStore): a deadlock of torch's elastic scale-up, "
                 "until the store's read timeout", [_exc_line(v), _exc_line(peer)])


def restart_read_stale_keys(c: RankContext) -> Optional[Cause]:
    """A worker of a restart (attempt >= 1) whose gloo mesh failed in init while the agent's
    store, kept across restarts, held the previous attempt's keys: gloo dialled a pair address
    that attempt published (pytorch#135712; TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 avoids it)."""
    v, o = c.verdict, c.obs
    if o is None or o.attempt < 1 or v.outcome not in ("error", "timeout") or \
            "connectFullMesh" not in (v.message or "") or \
            str((o.info or {}).get("use_agent_store")) != "True":
        return None
    return Cause(f"a worker of restart {o.attempt}: its gloo mesh dialled a pair address the "
                 "previous attempt published in the agent's store, which keeps its keys across "
                 "restarts (pytorch#135712; the workers' own store, "
                 "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, avoids it)", [_exc_line(v)])


def redundant_agent_left(c: RankContext) -> Optional[Cause]:
    """An agent beyond --nnodes's maximum waits in the rendezvous's redundancy list; when the job
    ends and the rendezvous closes, torch raises RendezvousGracefulExitError for it, which
    ``agent.run()`` swallows (it returns None), and ``launch_agent`` then fails on the None
    result (torch 2.13 ``launcher/api.py``: ``result.is_failed()``)."""
    v = c.verdict
    if v.role != "agent":
        return None
    agents = [a for a in c.verdicts if a.role == "agent" and _job(a.label) == _job(v.label)]
    done = [a.label for a in agents if a.outcome == "ok"]
    if "RendezvousConnectionError" in (v.exception or ""):
        nn = _argv_opt(_argv_of(c, v.label), "--nnodes").rpartition(":")[2]
        mine = _workers_of(c, v.label)
        theirs = [w for a in done for w in _workers_of(c, a)]
        if not nn.isdigit() or len(agents) <= int(nn) or mine or not theirs or \
                any((c.verdict_of(w.label) or v).outcome != "ok" for w in theirs):
            return None
        return Cause(f"one of {len(agents)} agents of a rendezvous that admits {nn}: it waited "
                     f"as a redundant node, and when the job ({', '.join(done)}) finished, its "
                     "rendezvous store went away under it", [_exc_line(v)])
    if "'NoneType' object has no attribute 'is_failed'" not in (v.message or ""):
        return None
    return Cause(f"one of {len(agents)} agents of a rendezvous that admits fewer: it waited as a "
                 "redundant node, and when the job "
                 + (f"({', '.join(done)}) " if done else "")
                 + "closed the rendezvous torch let it exit gracefully "
                 "(RendezvousGracefulExitError) but its launcher read the None result: "
                 "AttributeError, a bug of torch's launch_agent, not of the job", [_exc_line(v)])


def waiting_for_a_rank_key(c: RankContext) -> Optional[Cause]:
    """A rank's store wait timed out on another rank's process-group key: that rank never
    wrote it (and why, from that rank's own cause)."""
    m = WAIT_KEYS.search(c.verdict.message or "")
    if m is None:
        return None
    keys = [k for k in m.group(2).split(",") if k]
    ranks = {PG_KEY.match(k).group(1) for k in keys if PG_KEY.match(k)}  # type: ignore[union-attr]
    mine = str((c.obs.info.get("rank") if c.obs is not None and c.obs.info else None)
               if c.obs is not None and c.obs.role == "worker" else c.verdict.label)
    ranks.discard(mine)
    if len(ranks) != 1:
        return None
    (r,) = ranks
    job = _job(c.verdict.label)
    other = next((o for o in c.run.ranks if _job(o.label) == job and (
        str(o.info.get("rank")) == r if o.role == "worker" else o.label == r)), None)
    text = f"waited {int(m.group(1)) / 1000:g} s for rank {r}'s key {keys[0]}, which rank {r} " \
        "never set"
    if other is not None:
        why = _unreachable_master(c, other.label) or \
            _cause_of(c, other.label, [waiting_for_a_rank_key, stopped_by_agent])
        if why:
            text += f": {why}"
    return Cause(text, [_exc_line(c.verdict)])


# -- what the rank itself was told or did -----------------------------------------------------
CONFIG_EXC = ("ValueError", "AssertionError", "TypeError", "KeyError")
CONFIG_MSG = re.compile(r"doesn't have \w+ built in|No rendezvous handler|"
                        r"Unknown (?:c10d )?backend|enforce fail at \S*gloo/context\.cc|"
                        r"must have value from|cannot be 0|"
                        r"Duplicate device type|No device associated", re.I)
ENV_MISSING = re.compile(r"environment variable (\w+) expected, but not set")
NOT_INT = re.compile(r"invalid literal for int\(\) with base 10: '([^']*)'")
GLOO_RANK_CHECK = re.compile(r"gloo/context\.cc:\d+\] (rank [<>]=? ?\w+)\. (-?\d+) vs (-?\d+)")


def torch_refused_the_setup(c: RankContext) -> Optional[Cause]:
    """init_process_group (or importing torch.distributed) refused what the rank was given: a
    missing or malformed variable, an unknown backend or scheme, a rank out of range. torch's
    own message says which; the rule names the variable when it can."""
    v = c.verdict
    if v.outcome != "error" or v.phase not in ("import", "init") or v.role not in (
            "rank", "worker"):
        return None
    cls = (v.exception or "").rsplit(".", 1)[-1]
    if cls not in CONFIG_EXC and not CONFIG_MSG.search(v.message or ""):
        return None
    msg = _first_line(v.message)
    env = c.env(v.label)
    text = f"torch refused the set-up in {v.phase}: {msg}"
    m = ENV_MISSING.search(msg)
    n = NOT_INT.search(msg)
    g = GLOO_RANK_CHECK.search(v.message or "")
    if m is not None:
        text = f"torch refused the set-up: {m.group(1)} was not set for this rank " \
            f"(init_method env:// needs MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE)"
    elif n is not None:
        which = [k for k, val in env.items() if val == n.group(1)]
        if which:
            text = f"torch refused the set-up: {which[0]}={n.group(1)!r} is not a number"
    elif g is not None:
        text = f"torch refused the set-up: gloo's check {g.group(1)} failed ({g.group(2)} vs " \
            f"{g.group(3)}): RANK={env.get('RANK', g.group(2))} is outside WORLD_SIZE=" \
            f"{env.get('WORLD_SIZE', g.group(3) if 'size' in g.group(1) else '?')}"
    return Cause(text, [_exc_line(v)])


def raised_by_the_fault(c: RankContext) -> Optional[Cause]:
    """The scenario's raise_exception fault made this rank raise where it did."""
    v = c.verdict
    var = (c.plan_rank(v.label).get("variation") or {}).get("raise_at") or {}
    if v.outcome != "error" or not var or var.get("phase") != v.phase:
        return None
    exc = str(var.get("exception") or "")
    if exc and exc.rsplit(".", 1)[-1] != (v.exception or "").rsplit(".", 1)[-1]:
        return None
    return Cause(f"raised {exc or v.exception} in {v.phase}: the scenario's raise_exception fault "
                 f"(a bug in the rank's own code)", [_exc_line(v)])


FILE_STORE_FAIL = re.compile(r"Operation not permitted|Read-only file system|Permission denied|"
                             r"No such file or directory|Is a directory", re.I)


def file_store_unusable(c: RankContext) -> Optional[Cause]:
    """init_method file://: the file store's file could not be made or opened there."""
    v = c.verdict
    init = c.plan_rank(v.label).get("init") or {}
    if v.outcome != "error" or init.get("method") != "file" or \
            not FILE_STORE_FAIL.search(v.message or ""):
        return None
    return Cause(f"the file store's file {init.get('url') or ''} could not be made or opened: "
                 f"{_first_line(v.message)}", [_exc_line(v)])


def file_store_never_opened(c: RankContext) -> Optional[Cause]:
    """init_method file://, hung or timed out inside FileStore's constructor: torch retries
    open() of the file until it can be made, and its loop does not honour the group's timeout
    (a folder that does not exist, a share not mounted on this node)."""
    v = c.verdict
    init = c.plan_rank(v.label).get("init") or {}
    stacks = (c.obs.stacks or "") if c.obs is not None else ""
    if v.outcome not in ("hang", "timeout") or init.get("method") != "file" or \
            "_file_rendezvous_handler" not in stacks:
        return None
    url = str(init.get("url") or "")
    folder = url.removeprefix("file://").rsplit("/", 1)[0]
    made = [st for st in c.run.step_log if (st.what or "").startswith("make the directory")]
    said = "" if any(folder == (st.what or "").removeprefix("make the directory ").strip()
                     for st in made) else f": nobody made its folder {folder}"
    return Cause(f"stuck opening the file store {url}{said}; torch's FileStore retries open() "
                 "and never honours the group's timeout", [v.reason])


def file_store_paths_differ(c: RankContext) -> Optional[Cause]:
    """init_method file:// with a different path per rank: each waits alone in its own file."""
    v = c.verdict
    init = c.plan_rank(v.label).get("init") or {}
    if v.outcome not in ("timeout", "hang") or init.get("method") != "file":
        return None
    urls = {str(r.get("label")): (r.get("init") or {}).get("url")
            for r in c.run.plan.get("ranks", []) if r.get("role", "rank") == "rank"}
    if len(set(urls.values())) < 2:
        return None
    told = ", ".join(f"rank {k} {u}" for k, u in urls.items())
    return Cause(f"the ranks were given different file:// paths ({told}): each waited for the "
                 f"others in a file nobody else opened", [_exc_line(v) if v.exception
                                                           else v.reason])


COLLECTIVE_TIMEOUT = re.compile(r"Timed out waiting (\d+)ms for (recv|send) operation|"
                                r"Application timeout caused pair closure|"
                                r"failed to pass monitoredBarrier|received errors while waiting "
                                r"for send/recv from rank", re.I)


def a_peer_missed_the_collective(c: RankContext) -> Optional[Cause]:
    """A collective timed out in gloo (or in monitored_barrier) while a peer, by the scenario's
    own faults, was sleeping in that step or skipped it."""
    v = c.verdict
    if v.outcome not in ("timeout", "error") or not COLLECTIVE_TIMEOUT.search(v.message or ""):
        return None
    why = []
    for rp in c.run.plan.get("ranks", []):
        label = str(rp.get("label"))
        if label == v.label or rp.get("role", "rank") not in ("rank", "worker"):
            continue
        var = rp.get("variation") or {}
        slow = (var.get("slow_at") or {}).get(v.phase)
        if slow:
            why.append(f"rank {label} slept {float(slow):g} s in {v.phase} (the scenario's "
                       "slow_rank fault)")
        elif v.phase in (var.get("skip") or []):
            why.append(f"rank {label} skipped this collective (the scenario's skip_collective "
                       "fault)")
        elif var.get("skip"):
            why.append(f"rank {label} skipped its collective in {', '.join(var['skip'])} (the "
                       "scenario's skip_collective fault): from there on the ranks' "
                       "collectives paired out of step")
        else:
            starved = next((st for st in c.run.step_log if st.fault == "cpu_contention"
                            and st.target == f"rank {label}"), None)
            if starved is not None:
                why.append(f"rank {label} was starved of CPU (the scenario's cpu_contention "
                           f"fault: {starved.what})")
    own = (c.plan_rank(v.label).get("variation") or {}).get("skip")
    if not why and (starved := _starved(c, v.label)) is not None:
        why.append(f"this rank was starved of CPU (the scenario's cpu_contention fault: "
                   f"{starved.what})")
    if not why and own:
        why.append(f"this rank skipped its collective in {', '.join(own)} (the scenario's "
                   "skip_collective fault): its later collectives paired with the others' "
                   "earlier ones")
    if not why:
        return None
    m = re.search(r"(\d+)ms", v.message or "")
    waited = f" after {int(m.group(1)) / 1000:g} s" if m else ""
    if not m and re.search(r"Application timeout caused pair closure", v.message or "") and \
            c.run.plan.get("timeout"):
        # gloo's other wording of the same wait: the pair's own timeout, the group's
        waited = f" after {float(c.run.plan['timeout']):g} s"
    return Cause(f"its collective in {v.phase} timed out{waited}: " + "; ".join(why),
                 [_exc_line(v)])


def _collective_ops(o: Optional[RankObservation]) -> Dict[int, str]:
    """A program's collectives as the observer saw them: their number -> the call's name."""
    out: Dict[int, str] = {}
    for e in (o.events if o is not None else []):
        m = re.fullmatch(r"collective (\d+)", str(e.data.get("phase") or "")) \
            if e.ev == "phase" else None
        if m and e.data.get("op"):
            out[int(m.group(1))] = str(e.data["op"])
    return out


def collectives_out_of_step(c: RankContext) -> Optional[Cause]:
    """A program whose ranks called different collectives at the same point (a rank-dependent
    branch: ``if rank == 0: dist.barrier()``): gloo pairs them out of step, and the one left
    waiting times out or hangs."""
    v = c.verdict
    m = re.fullmatch(r"collective (\d+)", v.phase or "")
    if m is None or v.outcome not in ("timeout", "hang", "error"):
        return None
    n = int(m.group(1))
    mine = _collective_ops(c.obs)
    for k in range(1, n + 1):
        calls = {}
        for o in c.run.ranks:
            if o.role in ("rank", "worker") and _job(o.label) == _job(v.label):
                op = _collective_ops(o).get(k)
                if op is not None:
                    calls[o.label] = op
        if len(set(calls.values())) > 1 and v.label in calls:
            said = ", ".join(f"rank {lb} {op}" for lb, op in sorted(calls.items()))
            return Cause(f"the ranks called different collectives at their collective {k} "
                         f"({said}: a rank-dependent branch in the program): gloo paired them out "
                         f"of step, and this rank's {mine.get(n, 'collective')} in collective "
                         f"{n} {'hung' if v.outcome == 'hang' else 'never completed'}",
                         [_exc_line(v) if v.exception else v.reason])
    return None


def interrupted_by_the_fault(c: RankContext) -> Optional[Cause]:
    """KeyboardInterrupt from a SIGINT the scenario's fault sent."""
    v, o = c.verdict, c.obs
    if o is None or v.outcome != "error" or "KeyboardInterrupt" not in (v.exception or ""):
        return None
    sent = [s for s in o.signals if s.signal.removeprefix("SIG") == "INT"]
    if not sent:
        return None
    return Cause(f"interrupted: SIGINT, sent by the scenario's fault at {sent[0].t:g} s, became "
                 f"KeyboardInterrupt when control came back to Python in {v.phase}",
                 [_exc_line(v)])


MEMORY = re.compile(r"OOM killer|can't allocate memory|Cannot allocate memory|MemoryError", re.I)


def out_of_memory(c: RankContext) -> Optional[Cause]:
    """Killed by the OOM killer (a cgroup's limit), or an allocation refused (RLIMIT_AS)."""
    v = c.verdict
    said = (v.reason or "") + " " + (v.message or "")
    if v.outcome not in ("crash", "error") or not MEMORY.search(said):
        return None
    if v.outcome == "crash":
        return Cause(f"out of memory in {v.phase}: {v.reason}", [v.reason])
    return Cause(f"out of memory in {v.phase}: an allocation was refused "
                 f"({_first_line(v.message)[:160]})", [_exc_line(v)])


# -- the network the scenario's faults shaped (late in the table: only where nothing else spoke) --
NO_ROUTE = re.compile(r"connect to (\S+?):(\d+) \(errno: 113 - No route to host\)")
NET_UNREACHABLE = re.compile(r"Network is unreachable", re.I)
DOWN_STEP = re.compile(r"add (\S+) \(down\) on (\S+)")


def no_route(c: RankContext) -> Optional[Cause]:
    """A connect the kernel failed at once: nobody on the link answers for the address (113,
    No route to host), or no route at all (Network is unreachable)."""
    v = c.verdict
    msg = v.message or ""
    m = NO_ROUTE.search(msg)
    addrs = _host_addrs(c)
    if m is not None:
        ip, port = m.group(1).strip("[]"), m.group(2)
        if ip in addrs.values():
            return None
        hosts = ", ".join(f"{h} {a}" for h, a in addrs.items())
        return Cause(f"no host answers for {ip} (No route to host): it dialled {ip}:{port}, "
                     f"an address in no host of the run{f' ({hosts})' if hosts else ''}",
                     [_exc_line(v)])
    if not NET_UNREACHABLE.search(msg):
        return None
    names = c.env(v.label).get("GLOO_SOCKET_IFNAME", "")
    host = c.obs.host if c.obs is not None else ""
    down = [m for m in (DOWN_STEP.search(st.what or "") for st in c.run.step_log)
            if m is not None and (not host or m.group(2) == host)]
    listed = [d for d in down if d.group(1) in names.split(",")]
    if listed:
        d = listed[0]
        return Cause(f"GLOO_SOCKET_IFNAME={names} lists {d.group(1)}, which is down on host "
                     f"{d.group(2)}: a gloo pair's connect over it found no route (Network is "
                     "unreachable)", [_exc_line(v), f"step: {d.group(0)}"])
    return Cause("a connect found no route to its address (Network is unreachable)",
                 [_exc_line(v)])


def mesh_peer_failed(c: RankContext) -> Optional[Cause]:
    """gloo's connect timeout in init while the peer of the pair had already failed in init."""
    v = c.verdict
    if "connectFullMesh" not in (v.message or "") or not re.search(r"Connect timeout|timed out",
                                                                   v.message or "", re.I):
        return None
    ended = [o for o in c.verdicts if o.label != v.label and o.role == v.role
             and _job(o.label) == _job(v.label) and o.outcome in ("error", "crash", "timeout")
             and o.phase == "init" and o.duration is not None and v.duration is not None
             and o.duration < v.duration]
    # a peer that failed first; else one that gave up in init waiting in the store for this
    # rank's own key (this rank came late to it: the peer left, its pair never came up), when
    # no fault step of the scenario acted on the run (a proxy's delay, say: its rule speaks)
    failed = [o for o in ended if o.outcome != "timeout"]
    if not failed and not any(st.fault for st in c.run.step_log):
        failed = [o for o in ended
                  if re.match(rf"waited [\d.]+ s for rank {re.escape(v.label)}'s key",
                              _cause_of(c, o.label, [mesh_peer_failed]))]
    if not failed:
        return None
    f = failed[0]
    why = _cause_of(c, f.label, [mesh_peer_failed]) or _exc_line(f)
    how = "gave up (timeout)" if f.outcome == "timeout" else "failed"
    return Cause(f"gloo's full mesh never connected: rank {f.label} {how} in init at "
                 f"{f.duration:g} s ({why}); this rank waited for the pair until gloo's connect "
                 "timeout", [_exc_line(v), _exc_line(f)])


def _last_step(o: Optional[RankObservation]) -> Tuple[str, str]:
    """(phase, workload step) of a row's last phase event: ("workload step 3", "reinit")."""
    if o is None:
        return "", ""
    ph = [e for e in o.events if e.ev == "phase"]
    if not ph:
        return "", ""
    return str(ph[-1].data.get("phase") or ""), str(ph[-1].data.get("step") or "")


def reinit_on_the_old_store(c: RankContext) -> Optional[Cause]:
    """A rank that failed in its ``reinit`` step (destroy_process_group, then
    init_process_group on the same MASTER_PORT): its new client reached the old store as it went
    away, or the new group read the old group's keys from a store the program kept."""
    v = c.verdict
    phase, step = _last_step(c.obs)
    phases = [e.data for e in (c.obs.events if c.obs else []) if e.ev == "phase"]
    steps = [str(d.get("step") or "") for d in phases]
    port = c.env(v.label).get("MASTER_PORT", "")
    if not step.startswith("reinit") and len(steps) >= 2 and steps[-2] == "reinit" \
            and v.outcome == "error" and CLOSED.search(v.message or ""):
        # its re-init went through at once: on the old store (or the one the program kept),
        # the old group's keys, and pairs to the peer's old group, still open until the peer's
        # destroy closed them, while the peer stayed in its own re-init
        stuck = [o for o in c.run.ranks if o.label != v.label
                 and _last_step(o)[1] == "reinit"
                 and (c.verdict_of(o.label) or v).outcome in ("timeout", "hang")]
        if stuck:
            who = f"rank {stuck[0].label}" if stuck[0].label.isdigit() else stuck[0].label
            before = str(phases[-2].get("phase") or "")
            if "keep_store" in steps:
                return Cause(f"in its re-init ({before}) the new group read the old group's "
                             "gloo addresses from the store the program kept across the "
                             f"destroy (keep_store): its pairs joined {who}'s old group, "
                             f"which {who}'s destroy closed, so its next collective ({phase}) "
                             f"failed, while {who} stayed in its own re-init", [_exc_line(v)])
            return Cause(f"in its re-init ({before}) its client reached the old store on "
                         f"MASTER_PORT {port} before {who}'s destroy closed it, and the new "
                         "group read the old group's gloo addresses there: its pairs joined "
                         f"{who}'s old group, whose destroy closed them, so its next "
                         f"collective ({phase}) failed, while {who}'s new store waited for it",
                         [_exc_line(v)])
    if not step.startswith("reinit") or "new_port" in step:
        return None
    if "keep_store" in steps and re.search(r"connect ?timeout|connection refused|"
                                           r"connectFullMesh", v.message or "", re.I):
        return Cause(f"in its re-init ({phase}) the new group read the old group's gloo "
                     "addresses from the store the program kept across the destroy "
                     "(keep_store): it dialled pairs nobody listens on any more",
                     [_exc_line(v)])
    peers_reinit = any(_last_step(o)[1].startswith("reinit") for o in c.run.ranks
                       if o.label != v.label)
    if peers_reinit and re.search(r"connect ?timeout|connection refused|connectFullMesh",
                                  v.message or "", re.I):
        # no store kept, every rank re-initialising: the new client still reached the old store
        # (rank 0's destroy had not yet closed it), whose keys under the reset group prefix
        # are the old group's (a rank that re-initialises alone is out of step instead)
        return Cause(f"in its re-init ({phase}) its client reached the old store on "
                     f"MASTER_PORT {port} before rank 0's destroy closed it, and the new group "
                     "read the old group's gloo addresses there: it dialled pairs nobody "
                     "listens on any more", [_exc_line(v)])
    if v.outcome == "error" and CLOSED.search(v.message or ""):
        return Cause(f"in its re-init ({phase}) it dialled MASTER_PORT {port} again while the "
                     "old store on that port was going away (rank 0's destroy of the old "
                     "group): the connection was closed under it", [_exc_line(v)])
    return None



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


def through_the_fault_proxy(c: RankContext) -> Optional[Cause]:
    """The scenario's proxy fault (black hole, delay...) sat on the ranks' traffic."""
    v = c.verdict
    if v.outcome not in ("hang", "timeout", "error"):
        return None
    got = _proxied(c)
    if got is None:
        return None
    fault, ports, what, t = got
    return Cause(f"the traffic of {ports} went through the harness's fault proxy: {what} (the "
                 f"scenario's {fault} fault, from {t:g} s)",
                 [_exc_line(v) if v.exception else v.reason])


SADDR_DROP = re.compile(r"ip6? saddr (\S+) (drop|reject)")


def partitioned(c: RankContext) -> Optional[Cause]:
    """nft rules that drop everything from another host of the run: a partition."""
    v = c.verdict
    if v.outcome not in ("hang", "timeout", "error"):
        return None
    names = {a: h for h, a in _host_addrs(c).items()}
    cuts = []
    for host, text in c.run.rules.items():
        for ln in text.splitlines():
            ln = COUNTER.sub("", ln)
            m = SADDR_DROP.search(ln)
            if m is not None and m.group(1) in names:
                cuts.append((host, names[m.group(1)], ln.strip()))
    if not cuts:
        return None
    said = "; ".join(f"{h} drops every packet from {o}" for h, o, _ in cuts)
    return Cause(f"the hosts were partitioned by nft rules ({said}): the ranks on either side "
                 "could not reach each other", [_exc_line(v) if v.exception else v.reason]
                 + [f"nft on {h}: {ln}" for h, _, ln in cuts])


def cut_after_init(c: RankContext) -> Optional[Cause]:
    """A rule added by the scenario's firewall after init cut the ranks' established pairs."""
    v = c.verdict
    if v.outcome not in ("hang", "timeout", "error") or not (v.phase or "").startswith(
            ("workload step", "train step", "ddp")):
        return None
    rule = _blanket_rule(c.run.rules)
    added = next((s for s in c.run.step_log if s.fault == "firewall" and s.action == "do"
                  and float(s.t or 0) > 0), None)
    if rule is None or added is None:
        return None
    host, ln = rule
    how = "rejects (a reset)" if re.search(r"\breject\b", ln) else "drops"
    return Cause(f"an nft rule added at {float(added.t):g} s on host {host} {how} all of its "
                 f"TCP traffic: gloo's pairs, made in init, were cut in {v.phase}",
                 [_exc_line(v) if v.exception else v.reason, f"nft on {host}: {ln}"])


def out_of_descriptors(c: RankContext) -> Optional[Cause]:
    """A rank that ran out of file descriptors (a socket, a file)."""
    v = c.verdict
    if v.outcome not in ("error", "crash") or not re.search(r"Too many open files",
                                                           v.message or "", re.I):
        return None
    limit = next((st for st in c.run.step_log if st.fault == "open_files_limit"
                  and st.target == f"rank {v.label}"), None)
    return Cause(f"ran out of file descriptors in {v.phase} (Too many open files)"
                 + (f": the scenario's open_files_limit fault ({limit.what})" if limit else ""),
                 [_exc_line(v)])


LINK_FAULTS = ("packet_loss", "bandwidth", "latency")


def a_link_fault_in_force(c: RankContext) -> Optional[Cause]:
    """A timeout or hang while the scenario's fault shaped a host's link (packet loss, a
    bandwidth limit, a delay): said with what the fault did."""
    v = c.verdict
    if v.outcome not in ("hang", "timeout"):
        return None
    shaped = [st for st in c.run.step_log if st.fault in LINK_FAULTS and st.action == "do"
              and not (st.what or "").startswith(("start the fault proxy", "proxy: "))]
    if not shaped:
        return None
    said = "; ".join(f"{st.target}: {st.what} (from {float(st.t or 0):g} s)" for st in shaped[:3])
    return Cause(f"the scenario's {shaped[0].fault} fault shaped the link ({said})",
                 [_exc_line(v) if v.exception else v.reason])


def groups_disagree(c: RankContext) -> Optional[Cause]:
    """A hang in a workload step (new_group, a collective) while another rank, by the
    scenario's fault, never calls that step or makes its steps in another order: a deadlock."""
    v = c.verdict
    if v.outcome not in ("hang", "timeout") or not (v.phase or "").startswith("workload step"):
        return None
    plan_steps = list(c.run.plan.get("workload") or [])
    why = []
    own = (c.plan_rank(v.label).get("variation") or {}).get("steps")
    if own and list(own) != plan_steps:
        return Cause(f"this rank makes its steps in another order ({', '.join(map(str, own))} "
                     f"against {', '.join(map(str, plan_steps))}: the scenario's rank_workload "
                     f"fault): in {v.phase} it waits for ranks that are in another step",
                     [v.reason if not v.exception else _exc_line(v)])
    for rp in c.run.plan.get("ranks", []):
        label = str(rp.get("label"))
        if label == v.label or rp.get("role", "rank") not in ("rank", "worker"):
            continue
        var = rp.get("variation") or {}
        if v.phase in (var.get("skip") or []):
            n = int(v.phase.rsplit(" ", 1)[1])
            step = plan_steps[n - 1] if 0 < n <= len(plan_steps) else v.phase
            why.append(f"rank {label} never called {step} (the scenario's skip_collective "
                       "fault)")
        elif var.get("steps") and list(var["steps"]) != plan_steps:
            mine, theirs = ", ".join(map(str, var["steps"])), ", ".join(map(str, plan_steps))
            why.append(f"rank {label} makes its steps in another order ({mine} against "
                       f"{theirs}: the scenario's rank_workload fault)")
    if not why:
        return None
    return Cause(f"waiting in {v.phase} for a peer that will not come: " + "; ".join(why),
                 [v.reason if not v.exception else _exc_line(v)])


def torch_refused_the_call(c: RankContext) -> Optional[Cause]:
    """torch refused a call of the workload (split_group without a device, ...) at once."""
    v = c.verdict
    if v.outcome != "error" or not (v.phase or "").startswith("workload step") or \
            not CONFIG_MSG.search(v.message or ""):
        return None
    return Cause(f"torch refused the call in {v.phase}: {_first_line(v.message)}",
                 [_exc_line(v)])


def store_host_gone(c: RankContext) -> Optional[Cause]:
    """A store client in init whose connection was reset or closed after the store's host
    (rank 0) had ended: the store went with it."""
    v = c.verdict
    if v.outcome != "error" or not re.search(
            r"Connection reset by peer|Failed to recv|Connection was likely closed",
            v.message or "", re.I) or _proxied(c) is not None:
        return None
    if v.phase != "init" and "DistNetworkError" not in mro_names(v.exception_mro):
        return None   # after init only the store client's own error: gloo's pairs say the same
    # torchrun's workers host their own store (rank 0 of their attempt) only with
    # share_store: false; else the agents' rendezvous store serves them (rendezvous_store_lost)
    launcher = c.run.plan.get("launcher") or {}
    roles = ("rank", "worker") if launcher.get("kind") == "torchrun" and \
        launcher.get("share_store") is False else ("rank",)
    host = next((o for o in c.verdicts if o.label != v.label and o.role in roles
                 and c.env(o.label).get("RANK", o.label.split("@")[0]) == "0"
                 and o.label.partition("@")[2] == v.label.partition("@")[2]), None)
    if host is None or host.outcome == "ok" and host.duration is None or host.duration is None \
            or v.duration is None or host.duration > v.duration:
        return None
    own = _cause_of(c, host.label, [store_host_gone]) or \
        (_exc_line(host) if host.exception else host.reason)
    return Cause(f"the store's host, rank {host.label}, had ended ({host.outcome}) at "
                 f"{host.duration:g} s and its store with it: {own}",
                 [_exc_line(v), _exc_line(host) if host.exception else host.reason])


def stale_file_store(c: RankContext) -> Optional[Cause]:
    """init_method file:// on a file a killed job left (the scenario's ``file_init:
    stale_file``): it still holds that job's rank-0 gloo address, and a rank that reads it
    before the new rank 0 writes its own dials the dead job and is refused."""
    v = c.verdict
    init = c.plan_rank(v.label).get("init") or {}
    stale = next((st for st in c.run.step_log
                  if (st.what or "").startswith("leave a stale FileStore")), None)
    m = re.search(r"Connection refused, remote=(\[[^\]]+\]:\d+)", v.message or "")
    if v.outcome not in ("error", "timeout") or v.phase != "init" \
            or init.get("method") != "file" or stale is None:
        return None
    if m is None:
        if "connectFullMesh" not in (v.message or "") or \
                not re.search(r"Connect timeout|timed out connecting", v.message or ""):
            return None
        return Cause("gloo's full mesh never connected (gloo's connect timeout): the file store "
                     f"{init.get('url') or ''} was left by a killed earlier job (the scenario's "
                     "file_init stale_file fault) and still held that job's gloo addresses: "
                     "the new ranks' mesh dialled the dead job's instead of each other's until "
                     "gloo gave up",
                     [_exc_line(v), stale.what])
    return Cause(f"gloo's full mesh dialled {m.group(1)} and was refused: the file store "
                 f"{init.get('url') or ''} was left by a killed earlier job (the scenario's "
                 "file_init stale_file fault) and still held that job's rank-0 address; this "
                 "rank read it before the new rank 0 wrote its own", [_exc_line(v), stale.what])


LISTEN_SYSCTLS = ("net.core.somaxconn", "net.ipv4.tcp_max_syn_backlog",
                  "net.ipv4.tcp_abort_on_overflow")
NET_FAILURE = re.compile(r"reset by peer|closed by peer|Connect timeout|timed out connecting|"
                         r"Timed out waiting \d+ms for (?:recv|send)|Failed to recv|"
                         r"clients joined", re.I)


def listen_queue_overflowed(c: RankContext) -> Optional[Cause]:
    """A network failure in a run where a host the scenario gave a small listen backlog
    (``sysctl: net.core.somaxconn``, ``tcp_abort_on_overflow``) counted listen overflows: the
    kernel dropped or reset connections to its listeners (the store's and rank 0's gloo
    listener share that backlog)."""
    v = c.verdict
    if v.outcome not in ("error", "timeout") or not NET_FAILURE.search(v.message or ""):
        return None
    for h in c.run.plan.get("hosts", []):
        sysctl = (h.get("machine") or {}).get("sysctl") or {}
        set_ = {k: sysctl[k] for k in LISTEN_SYSCTLS if k in sysctl}
        counts = (c.run.counters or {}).get(h.get("name"), {})
        over = counts.get("TcpExt.ListenOverflows", 0)
        if not set_ or not over:
            continue
        said = ", ".join(f"{k}={val}" for k, val in set_.items())
        return Cause(f"{h.get('name')}'s listen queue overflowed (TcpExt.ListenOverflows "
                     f"{over}, ListenDrops {counts.get('TcpExt.ListenDrops', 0)}; the "
                     f"scenario's sysctl {said}): the kernel dropped or reset connections to "
                     "its listeners (the store and rank 0's gloo listener), and gloo's mesh "
                     f"broke: this rank {'timed out' if v.outcome == 'timeout' else 'failed'} "
                     f"in {v.phase}", [_exc_line(v), f"{h.get('name')} counters: "
                                       + ", ".join(f"{k} {n}" for k, n in counts.items())])
    return None


def hung_with_a_dead_peer(c: RankContext) -> Optional[Cause]:
    """A rank hung in a collective after the one peer of its job that failed had died: the
    collective never completes, and torch's timeout did not end it."""
    v = c.verdict
    if v.outcome != "hang" or v.role not in ("rank", "worker") or v.phase in ("init", "import"):
        return None
    dead = [o for o in c.verdicts if o.label != v.label and o.role in ("rank", "worker")
            and _job(o.label) == _job(v.label) and o.outcome in ("crash", "error")
            and o.duration is not None]
    if len(dead) != 1:
        return None
    d = dead[0]
    how = _cause_of(c, d.label, [hung_with_a_dead_peer]) or d.reason
    lazy = c.env(v.label).get("TORCH_GLOO_LAZY_INIT", "") in ("1", "true", "True")
    return Cause(f"waited in {v.phase} for rank {d.label}, which had ended ({d.outcome}) at "
                 f"{_ended_at(c, d):g} s ({how}): the collective never completed and torch's "
                 "timeout did not end it"
                 + (" (TORCH_GLOO_LAZY_INIT=1: this group's pairs connect at its first "
                    "collective, and a pair to a dead peer does not always fail)" if lazy else ""),
                 [v.reason, f"rank {d.label}: {d.reason}"])


def teardown_gil_deadlock(c: RankContext) -> Optional[Cause]:
    """A hang in torch's own teardown, read from the native stacks: the main thread destroys a
    ProcessGroupGloo (freeing a DDP Reducer, say) and joins its worker thread while holding the
    GIL; the worker thread waits for the GIL to free its last work."""
    v, o = c.verdict, c.obs
    if v.outcome != "hang" or o is None or not o.native_threads:
        return None
    threads = [" | ".join(functions(t)) for t in o.native_threads]
    joining = [t for t in threads if "~ProcessGroupGloo" in t and "thread::join" in t]
    waiting = [t for t in threads if "gil_scoped_acquire" in t and "~AsyncWork" in t]
    if not joining or not waiting:
        return None
    freeing = "a DDP Reducer" if "Reducer::~Reducer" in joining[0] else "a process group"
    return Cause(f"deadlocked in torch's teardown ({v.phase}): the main thread, freeing {freeing}"
                 ", joins ProcessGroupGloo's worker thread while holding the GIL, and that "
                 "thread waits for the GIL to free its last work (gil_scoped_acquire in "
                 "~AsyncWork): a torch bug, not the network",
                 ["native stack: main thread in ~ProcessGroupGloo -> std::thread::join",
                  "native stack: a worker thread in ~AsyncWork -> gil_scoped_acquire"])


def the_store_shows_who_is_missing(c: RankContext) -> Optional[Cause]:
    """What the store held at the deadline (harness.storeprobe) says whom a hung rank in init
    waits for: the ranks whose gloo address never reached the store, or a published address
    that no host of the run has. Last in the table: it speaks only where nothing else did."""
    v = c.verdict
    if v.outcome not in ("hang", "timeout") or v.role not in ("rank", "worker") or \
            not c.run.store or _job(v.label):
        return None
    from ..net.storeprobe import StoreSnapshot

    snap = StoreSnapshot.from_dict(c.run.store)
    if not snap.answered:
        return None
    # the store asked is the first rank's (its host, its MASTER_PORT): it speaks for this row
    # only when this row was told the same store, or is that rank
    ranks = c.run.plan.get("ranks") or []
    first = dict(ranks[0]) if ranks else {}
    told, host_told = c.env(v.label), dict(first.get("env") or {})
    same = str(first.get("label")) == v.label or (
        bool(told.get("MASTER_PORT")) and all(told.get(k) == host_told.get(k)
                                              for k in ("MASTER_ADDR", "MASTER_PORT")))
    if not same:
        return None
    world = int(c.run.plan.get("world_size") or 0)
    ev = snap.lines()
    if world and snap.joined is not None and snap.joined < world and not snap.gloo:
        return Cause(f"the store counted {snap.joined} of {world} clients joined: "
                     f"{world - snap.joined} of the ranks never connected to it", ev)
    if not snap.listed or not world:
        return None
    missing = [r for r in range(world) if str(r) not in snap.gloo]
    mine = v.label if v.role == "rank" else str((c.obs.info or {}).get("rank", "")) \
        if c.obs is not None else ""
    if missing and mine.isdigit() and int(mine) not in missing:
        why = []
        for r in missing[:8]:
            own = _cause_of(c, str(r), [the_store_shows_who_is_missing])
            why.append(f"rank {r}" + (f": {own}" if own else ""))
        return Cause(f"waiting in gloo's rendezvous for the address of rank"
                     f"{'s' * (len(missing) > 1)} {', '.join(map(str, missing))}, never "
                     f"published in the store ({'; '.join(why)})", ev)
    addrs = _host_addrs(c)
    if not missing and len(addrs) > 1:
        odd = {r: a for r, a in snap.gloo.items()
               if a.rsplit(":", 1)[0].strip("[]") not in addrs.values()}
        if odd:
            who, a = sorted(odd.items())[0]
            return Cause(f"every rank published its gloo address, and rank {who}'s ({a}) is an "
                         f"address no host of the run has: its peers cannot reach it", ev)
    return None


# -- the hang path: what a row alive at the deadline was doing (its native stack, its sockets) --
# torch's default timeouts (30 min) outlast any deadline: no exception says why a row waits, so
# these rules read the live evidence the supervisor took there: the main thread's native stack
# (py-spy), the row's TCP sockets, what the store held, the plan's env and command lines.
DIALLING = ("SocketConnectOp::tryConnect", "TCPClient::connect")   # a store client's connect loop
HOSTING = "TCPStore::waitForWorkers"        # a store's host waiting for its clients to connect
GLOO_WAIT = ("PrefixStore::wait", "connectFullMesh")   # gloo's rendezvous: a peer's key
RETRYING = re.compile(r"TCP client failed to connect/validate to host (\S+):(\d+) - retrying "
                      r"\(try=\d+, timeout=(\d+)ms")
GAI_OF = re.compile(r"The (?:IPv\d )?network addresses of \(([^,]+), (\d+)\) cannot be retrieved "
                    r"\(gai error: ([^)]*)\)")
PROGRESS_WINDOW = 2.0    # a step entered this close to the deadline: the row was still stepping
# torch's warning for one failed try of a store client's connect: nobody on the link answered
NO_ROUTE_TRY = re.compile(r"failed to connect to (\S+?):(\d+) \(errno: 113 - No route to host\)")


def _no_route_try(c: RankContext, port: int) -> Optional[re.Match]:
    """torch's last line of a connect try to ``port`` that found no host (errno 113) at an
    address (not a name: the line that names the address the name led to)."""
    found = None
    for m in NO_ROUTE_TRY.finditer(c.stderr()):
        if int(m.group(2)) == port and _is_ip(as_meant(m.group(1))):
            found = m
    return found


def _main_frames(o: Optional[RankObservation]) -> List[str]:
    """The function names of the main thread's native stack (innermost first); [] when none
    was taken."""
    if o is None:
        return []
    for t in o.native_threads:
        if t.get("name") == "MainThread" or (o.pid is not None and t.get("thread") == o.pid):
            return functions(t)
    return []


def _blocked_in(o: Optional[RankObservation], *names: str) -> bool:
    """Every name in ``names`` is a frame of the row's main thread (a substring of one)."""
    frames = _main_frames(o)
    return bool(frames) and all(any(n in f for f in frames) for n in names)


SLEEPING = ("nanosleep", "clock_nanosleep", "__nanosleep", "sleep_for")


def _dialling(o: Optional[RankObservation]) -> bool:
    """The row's main thread is in a store client's connect loop: in a connect
    (TCPClient::connect), or between two tries, asleep in the TCPStore constructor's retry
    loop (no frame deeper than the sleep; a refused connect fails at once, so a stack read
    then mostly finds the sleep), never in a store's host waiting for its clients."""
    frames = _main_frames(o)
    if not frames or any(HOSTING in f for f in frames):
        return False
    if any(DIALLING[1] in f for f in frames):
        return True
    inner = [f for f in frames if not any(s in f for s in SLEEPING)]
    return len(inner) < len(frames) and bool(inner) and "TCPStore::TCPStore" in inner[0]


def _who(label: str) -> str:
    return label if "agent:" in label or label.startswith("parent") else f"rank {label}"


def _dials(c: RankContext, label: str) -> Optional[Tuple[str, int, str]]:
    """(address, port, where it was told) of the store a row dials: an agent's command line,
    a worker's MASTER_ADDR/MASTER_PORT as its agent handed them, a rank's env:// variables."""
    o = c.obs_of(label)
    if o is not None and o.role == "agent":
        ep = _endpoint(c, label)
        if ep is None:
            return None
        argv = _argv_of(c, label)
        said = "--rdzv-endpoint" if (_argv_opt(argv, "--rdzv-endpoint")
                                     or _argv_opt(argv, "--rdzv_endpoint")) else "--master-port"
        return ep[0], ep[1], f"its {said}"
    if o is not None and o.role == "worker":
        addr, port = str(o.info.get("master_addr") or ""), str(o.info.get("master_port") or "")
        return (addr, int(port), "the MASTER_PORT its agent handed it") \
            if addr and port.isdigit() else None
    init = c.plan_rank(label).get("init") or {}
    if init.get("method") not in (None, "env"):
        return None
    env = c.env(label)
    addr, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    return (addr, int(port), "its MASTER_PORT") if addr and port.isdigit() else None


def _listening(c: RankContext, port: int) -> List[RankObservation]:
    """The rows whose sockets, read at the deadline, had a listener on ``port``."""
    return [o for o in c.run.ranks if _listens(o, port)]


def _retry_line(c: RankContext, label: str) -> Optional[re.Match]:
    """torch's own line of a store client retrying its connect (host, port, timeout)."""
    return RETRYING.search(c.stderr()) if c.obs is not None and c.obs.label == label else None


def dialling_a_store_nobody_hosts(c: RankContext) -> Optional[Cause]:
    """A row alive at the deadline in a store client's connect loop (its native stack:
    TCPClient::connect, tryConnect, or asleep between two tries in TCPStore's constructor,
    :func:`_dialling`): its connects fail and torch retries them until the
    client's timeout, which torch's default (30 min) puts past any deadline. Why nothing
    answers, from what it was told and what listened: a name its host cannot resolve, a port
    where no store listens, or a store nobody hosts (no rank claimed RANK=0; no agent takes
    the c10d endpoint as its own)."""
    v, o = c.verdict, c.obs
    if v.outcome != "hang" or o is None or not _dialling(o):
        return None
    if any(s.state == "SYN_SENT" for s in o.sockets):
        return None   # unanswered SYNs: the network's doing (syn_unanswered)
    dials = _dials(c, v.label)
    if dials is None:
        return None
    addr, port, said = dials
    line = _retry_line(c, v.label)
    if line is not None and (line.group(1).strip("[]"), int(line.group(2))) != (addr, port) \
            and line.group(1) != addr:
        return None   # torch says it dials another store than the rule would name
    ev = [v.reason, "native stack: main thread in " + " <- ".join(
        f for f in _main_frames(o) if any(d in f for d in DIALLING) or "TCPStore::" in f)]
    until = f" ({int(line.group(3)) / 1000:g} s, torch's line says)" if line is not None else ""
    if line is not None:
        ev.append(f"stderr: {line.group(0)}")
    tail = f"; it retries until the client's timeout{until}"
    # a name its host cannot resolve: its hosts file, or the resolver's words (a worker's are in
    # its agent's stderr: torchrun passes them through)
    unknown = _name_unknown_here(c, addr)
    seen = [GAI_OF.search(x.stderr_key + "\n" + x.stderr_tail) for x in
            (o, c.obs_of(o.node or "")) if x is not None]
    gai = next((m for m in seen if m is not None and m.group(1) == addr
                and int(m.group(2)) == port), None)
    if unknown or gai is not None:
        if gai is not None:
            ev.append(f"stderr: {gai.group(0)}")
        why = unknown or f"it dials {addr}:{port}, a name that does not resolve on host " \
            f"{v.host} ({gai.group(3)})"  # type: ignore[union-attr]
        return Cause(why + tail, ev)
    # an address where no host answers (ARP found nobody: a node that is gone, a names: entry
    # "dead"): torch's own lines name the address each try led to
    dead = _no_route_try(c, port)
    if dead is not None and _dead_address(c, as_meant(dead.group(1))):
        ip = as_meant(dead.group(1))
        ev.append(f"stderr: {dead.group(0)}")
        via = "" if ip == addr else f"; {addr} leads to {ip} on host {v.host}"
        return Cause(f"it dials {addr}:{port}{via}, an address where no host of the run answers "
                     f"(No route to host: nobody on the link has it){tail}", ev)
    listeners = [x for x in _listening(c, port)
                 if x.host == v.host or addr in (x.addr, x.host) or _is_loopback(addr)
                 and x.host == v.host]
    if listeners:
        return None   # something listens there: not a store nobody hosts
    store = c.master_port
    if store and port != store:
        host = [x for x in _listening(c, store)]
        there = f": {_who(host[0].label)} listens there" if host else ""
        return Cause(f"dials port {port} ({said}), where no store listens (the store's port is "
                     f"{store}{there}){tail}", ev)
    snap = c.run.store or {}
    refused = not snap.get("answered") and "refused" in str(snap.get("error") or "")
    if refused:
        ev.append(f"store {snap.get('addr')} at {snap.get('t')} s: no answer "
                  f"({snap.get('error')})")
    if o.role == "rank":
        claims = {str(r.get("label")): dict(r.get("env") or {}).get("RANK")
                  for r in c.run.plan.get("ranks", []) if r.get("role", "rank") == "rank"}
        if not claims or None in claims.values() or "0" in claims.values():
            return None
        dup: Dict[str, List[str]] = {}
        for label, rank in claims.items():
            dup.setdefault(str(rank), []).append(label)
        twice = "; ".join(f"ranks {', '.join(ls)} {'both' if len(ls) == 2 else 'all'} claimed "
                          f"RANK={r}" for r, ls in dup.items() if len(ls) > 1)
        return Cause("no process claimed RANK=0, so no store was started"
                     + (f" ({twice})" if twice else "") + f": every rank dials {addr}:{port} "
                     f"as a client, where nothing listens{tail}", ev)
    if o.role == "agent" and refused:
        agents = [a for a in c.run.ranks if a.role == "agent" and _job(a.label) == _job(v.label)]
        if any("is_host=true" in _argv_opt(_argv_of(c, a.label), "--rdzv-conf").lower()
               for a in agents) or not all(_dialling(a) for a in agents):
            return None
        on = [a.label for a in agents if a.addr == addr or a.host == addr]
        return Cause(f"nobody hosted the rendezvous store at {addr}:{port}: every agent dials "
                     "it as a client"
                     + (f", even {on[0]}, whose address it is" if on else "")
                     + " (torch's c10d rendezvous hosts the store only on the agent whose "
                     "hostname matches the endpoint, or with is_host=true, which none was "
                     f"given){tail}", ev)
    return None


def hosting_a_store_nobody_joins(c: RankContext) -> Optional[Cause]:
    """A row alive at the deadline that hosts the store and waits for its clients to connect
    (its native stack: TCPStore::waitForWorkers): who of the job has not joined, and why (it
    dials another port or address, it was not started yet). The words of waiting_for_ranks,
    which reads torch's "1/2 clients joined" when the timeout is short."""
    v, o = c.verdict, c.obs
    if v.outcome != "hang" or o is None or not _blocked_in(o, HOSTING):
        return None
    dials = _dials(c, v.label)
    if dials is None:
        return None
    addr, port, _ = dials
    if not _listens(o, port):
        return None
    pids = {x.pid: x for x in c.run.ranks if x.pid is not None}
    joined = {pids[s.peer_pid].label for s in o.sockets if s.state == "ESTABLISHED"
              and s.local_port == port and s.peer_pid in pids}
    if o.role == "agent":
        n = _argv_opt(_argv_of(c, v.label), "--nnodes").rpartition(":")[2]
        peers = [x for x in c.run.ranks if x.role == "agent" and _job(x.label) == _job(v.label)]
    else:
        n = c.env(v.label).get("WORLD_SIZE", "")
        peers = [x for x in c.run.ranks if x.role == "rank" and _job(x.label) == _job(v.label)]
    if not n.isdigit() or len(joined) >= int(n):
        return None
    why = []
    for x in peers:
        if x.label in joined or x.label == v.label:
            continue
        theirs = _dials(c, x.label)
        if x.released_at is None:
            when = c.plan_rank(x.label).get("released") or ""
            why.append(f"{_who(x.label)} was not started before the deadline"
                       + (f" (its release, {when}, was still to come)" if when else ""))
        elif theirs is not None and theirs[1] != port:
            why.append(f"{_who(x.label)} dials port {theirs[1]} ({theirs[2]}), not {port}")
        elif theirs is not None and theirs[0] != addr and not (
                _is_loopback(theirs[0]) and _is_loopback(addr)):
            why.append(f"{_who(x.label)} dials {theirs[0]}, not {addr}")
    if len(why) != int(n) - len(joined):
        return None   # not every missing client is accounted for: say nothing
    return Cause(f"waiting for {int(n) - len(joined)} of {n} clients at the deadline: "
                 + "; ".join(why),
                 [v.reason, f"native stack: main thread in {HOSTING}",
                  f"its store on port {port}: {len(joined)} of {n} clients connected "
                  f"({', '.join(sorted(joined)) or 'none'})"])


def _gloo_rank(c: RankContext, label: str) -> str:
    o = c.obs_of(label)
    if o is not None and o.role == "worker":
        return str((o.info or {}).get("rank", ""))
    return c.env(label).get("RANK", label)


def claimed_the_same_rank(c: RankContext) -> Optional[Cause]:
    """Two ranks that claimed the same RANK, both through the store, alive at the deadline in
    gloo's rendezvous (its native stack: PrefixStore::wait in connectFullMesh): each published
    its address as that rank, and each waits for a rank nobody claimed."""
    v, o = c.verdict, c.obs
    if v.outcome != "hang" or v.role != "rank" or not _blocked_in(o, *GLOO_WAIT):
        return None
    claims = {str(r.get("label")): dict(r.get("env") or {}).get("RANK")
              for r in c.run.plan.get("ranks", []) if r.get("role", "rank") == "rank"
              and _job(str(r.get("label"))) == _job(v.label)}
    mine = claims.get(v.label)
    twins = sorted(label for label, r in claims.items() if r == mine)
    n = c.env(v.label).get("WORLD_SIZE", "")
    if mine is None or len(twins) < 2 or not n.isdigit():
        return None
    missing = [str(r) for r in range(int(n)) if str(r) not in claims.values()]
    snap = c.run.store or {}
    published = set((snap.get("gloo") or {}).keys()) if snap.get("answered") else set()
    if not missing or published & set(missing):
        return None
    acted = [f"{t.get('target')} {t.get('summary')}" for e in c.run.effects
             if e.get("kind") == "rank_collision" for t in e.get("targets") or []
             if t.get("status") == "acted" and t.get("summary")]
    by = f" (the scenario's rank_collision fault: {'; '.join(acted)})" if acted else ""
    ev = [v.reason, "native stack: main thread in gloo's rendezvous (PrefixStore::wait in "
          "connectFullMesh)"]
    if published:
        ev.append(f"store {snap.get('addr')}: gloo addresses of ranks "
                  f"{', '.join(sorted(published))} published")
    return Cause(f"ranks {' and '.join(twins)} both claimed RANK={mine}{by}: both joined the store "
                 f"as rank {mine}, and gloo's rendezvous waits for the address of rank"
                 f"{'s' * (len(missing) > 1)} {', '.join(missing)}, which no process claimed",
                 ev)


def waiting_for_a_peer_stuck_dialling(c: RankContext) -> Optional[Cause]:
    """A row alive at the deadline in gloo's rendezvous (PrefixStore::wait in connectFullMesh),
    waiting for peers that never reached the store: each of them is alive in its own store
    connect loop, with a cause of its own (dialling_a_store_nobody_hosts)."""
    v, o = c.verdict, c.obs
    if v.outcome != "hang" or v.role not in ("rank", "worker") or \
            not _blocked_in(o, *GLOO_WAIT):
        return None
    peers = [x for x in c.run.ranks if x.label != v.label and x.role == v.role
             and _job(x.label) == _job(v.label) and x.attempt == (o.attempt if o else 0)
             and (c.verdict_of(x.label) or v).outcome == "hang"]
    stuck = [x for x in peers if _dialling(x)]
    if not stuck:
        return None
    why = []
    for x in stuck:
        own = _cause_of(c, x.label, [waiting_for_a_peer_stuck_dialling])
        if not own:
            return None
        why.append(f"rank {_gloo_rank(c, x.label)}: {own}")
    ranks = [_gloo_rank(c, x.label) for x in stuck]
    return Cause(f"waiting in gloo's rendezvous for the address of rank"
                 f"{'s' * (len(ranks) > 1)} {', '.join(ranks)}, never published in the store "
                 f"({'; '.join(why)})",
                 [v.reason, "native stack: main thread in gloo's rendezvous (PrefixStore::wait "
                  "in connectFullMesh)"])


def sigint_held_in_torch(c: RankContext) -> Optional[Cause]:
    """A hung row the scenario's fault sent SIGINT to while it blocked in torch's C++ (its
    native stack at the deadline): the signal only set Python's flag, torch's loop retried
    through the interruption (EINTR), and KeyboardInterrupt waits for control to come back to
    Python, which it never did. What it blocked in follows (the other rules' cause)."""
    v, o = c.verdict, c.obs
    if v.outcome != "hang" or o is None:
        return None
    sent = [x for x in o.signals if x.signal.removeprefix("SIG") == "INT"]
    frames = _main_frames(o)
    native = [f for f in frames if "::" in f and not f.startswith(("pybind11", "std::"))]
    if not sent or not native:
        return None
    then = diagnose(c, [r for r in RULES if r is not sigint_held_in_torch])
    return Cause(f"SIGINT, sent by the scenario's fault at {sent[0].t:g} s, did not end it: it "
                 f"blocks in torch's C++ ({native[0]}, in {v.phase}), which retries through "
                 "the interruption, and Python raises KeyboardInterrupt only when control "
                 "comes back to it"
                 + (f"; {'it ' * then.text.startswith('dials ')}{then.text}"
                    if then is not None and then.text != UNKNOWN else ""),
                 [v.reason, f"native stack: main thread in {native[0]}"]
                 + (then.evidence[1:] if then is not None else []))


def still_progressing(c: RankContext) -> Optional[Cause]:
    """A row cut by the deadline while it was still at work, not stuck: it entered a new step
    of its workload shortly before the deadline (after others since init), or its CPU time rose
    between the supervisor's two reads near the deadline. A slow run, not a hang."""
    v, o = c.verdict, c.obs
    if v.outcome != "hang" or o is None or v.role not in ("rank", "worker"):
        return None
    deadline = float(c.run.plan.get("deadline") or 0.0)
    steps = [e for e in o.events if e.ev == "phase"
             and str(e.data.get("phase") or "") not in ("start", "import", "init", "exit")]
    if len(steps) < 2 or not deadline:
        return None
    # the deadline as the supervisor met it (its last CPU read): a loaded machine is late
    deadline = max([deadline] + [t for t, _ in o.cpu_samples])
    last = steps[-1]
    ago = max(0.0, deadline - c.at(last))
    recent = [e for e in steps if deadline - c.at(e) <= 5 * PROGRESS_WINDOW]
    cpu = ""
    if len(o.cpu_samples) >= 2:
        (t0, u0), (t1, u1) = o.cpu_samples[0], o.cpu_samples[-1]
        if t1 > t0 and u1 - u0 >= 0.1 * (t1 - t0):
            cpu = f"; its CPU time rose from {u0:g} to {u1:g} s between {t0:g} and {t1:g} s"
    if ago > PROGRESS_WINDOW or not (cpu or len(recent) >= 2):
        return None
    said = str(last.data.get("phase") or "")
    step = str(last.data.get("step") or "")
    return Cause(f"still progressing at the deadline ({round(deadline, 2):g} s): its last "
                 f"step, {said}"
                 + (f" ({step})" if step and step != said else "")
                 + f", began {ago:.2f} s before it; {len(recent)} steps in its last "
                 f"{5 * PROGRESS_WINDOW:g} s{cpu}: slow, not stuck",
                 [v.reason] + [f"cpu: {u:g} s used at {t:g} s" for t, u in o.cpu_samples])


Rule = Callable[[RankContext], Optional[Cause]]

# ordered: the first that gives a cause decides
RULES: List[Rule] = [
    teardown_gil_deadlock,
    store_port_in_use,
    torch_refused_the_setup,
    raised_by_the_fault,
    interrupted_by_the_fault,
    sigint_held_in_torch,
    out_of_memory,
    file_store_unusable,
    file_store_never_opened,
    stale_file_store,
    killed_by_the_fault,
    world_size_disagrees,
    frozen_by_the_fault,
    stopped_by_agent,
    agent_child_failed,
    parent_child_failed,
    srun_failed,
    stopped_by_slurm,
    elastic_round_deadlock,   # before agent_after_its_workers: a round-0 worker may end ok
    agent_after_its_workers,
    rendezvous_service_faulted,
    redundant_agent_left,   # before rendezvous_store_lost: why the store's host went away
    rendezvous_store_lost,
    rendezvous_join_timeout,
    rendezvous_already_closed,
    restart_read_stale_keys,
    connected_to_a_non_store,
    joined_another_jobs_store,
    peer_reinitialised,   # before peer_died: a peer that re-initialised closed it, then failed
    peer_died,
    barrier_peer_died,
    reinit_on_the_old_store,
    nobody_claimed_rank_0,
    program_exited,
    ddp_params_differ,
    ddp_unused_parameters,
    still_progressing,   # a row at work at the deadline: slow, not stuck (before any wait)
    not_started_by_the_deadline,
    in_its_own_code,
    agent_waiting_for_workers,
    store_host_failed,
    name_unresolved,
    reverse_lookup_stalled,
    gloo_interface_missing,
    nccl_interface_missing,
    nccl_ranks_share_a_gpu,
    gloo_mesh_blocked,
    gloo_on_a_link_local_card,
    gloo_pair_to_a_second_card,
    gloo_pair_to_no_host,
    syn_unanswered,
    starved_in_init,
    waiting_for_ranks,
    waiting_for_a_rank_key,
    a_peer_was_frozen,
    hung_with_a_dead_peer,
    no_store_there,
    refused_and_retried,
    a_peer_missed_the_collective,
    collectives_out_of_step,
    file_store_paths_differ,
    out_of_descriptors,
    torch_refused_the_call,
    groups_disagree,
    store_host_gone,
    no_route,
    listen_queue_overflowed,
    mesh_peer_failed,
    cut_after_init,
    partitioned,
    through_the_fault_proxy,
    a_link_fault_in_force,
    dialling_a_store_nobody_hosts,   # the hang path: live stacks and sockets at the deadline
    claimed_the_same_rank,
    waiting_for_a_peer_stuck_dialling,
    waiting_for_a_stuck_rank,   # only when nothing on the network explains the wait
    hosting_a_store_nobody_joins,   # after it: a peer not started reads as it always did
    the_store_shows_who_is_missing,   # last: what the store held, where nothing else spoke
]


def diagnose(ctx: RankContext, rules: Sequence[Rule] = RULES) -> Optional[Cause]:
    """The cause of one row (None for a row that ended ok or was absent)."""
    if ctx.verdict.outcome in ("ok", "absent"):
        return None
    for rule in rules:
        cause = rule(ctx)
        if cause is not None:
            cause.rule = rule.__name__
            return cause
    ev = [_exc_line(ctx.verdict)] if ctx.verdict.exception else [ctx.verdict.reason]
    ev += [f"socket: {s.line()}" for s in ctx.sockets[:4]]
    return Cause(UNKNOWN, ev, rule="")


def explain_run(run: RunObservation, verdicts: Sequence[Verdict]) -> List[Verdict]:
    """Write each verdict's ``cause`` and ``cause_evidence`` (in place; returns them)."""
    by_label = {o.label: o for o in run.ranks}
    for v in verdicts:
        try:
            cause = diagnose(RankContext(v, by_label.get(v.label), run, verdicts))
        except Exception as e:  # noqa: BLE001 - a diagnosis never fails a run
            cause = Cause(f"unknown: harness.diagnose failed on this row ({type(e).__name__}: "
                          f"{str(e)[:200]})", [v.reason])
        if cause is not None:
            v.cause, v.cause_evidence = cause.text, list(cause.evidence)
            v.cause_rule = cause.rule   # which rule spoke: tests/data/diagnosis pins it
    return list(verdicts)

"""Rules of the hang path: what a row alive at the deadline was doing.

torch's default timeouts (30 min) outlast any deadline: no exception says why a row waits, so
these rules read the live evidence the supervisor took there: the main thread's native stack
(py-spy), the row's TCP sockets, what the store held, the plan's env and command lines. Also
the rows cut by the deadline that were still progressing, not started, or in their own code,
and a deadlock in torch's teardown."""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

from ...net.safety import as_meant
from ..observation import RankObservation
from ..pyspy import functions
from ._core import RULES, UNKNOWN, Cause, RankContext, _cause_of, diagnose, rule
from ._shared import (
    _argv_of,
    _argv_opt,
    _dead_address,
    _endpoint,
    _host_addrs,
    _is_ip,
    _is_loopback,
    _job,
    _listens,
    _name_unknown_here,
)

OWN_CODE = "it was in the program's own code"


@rule(order=380, evidence=("events", "plan"))
def not_started_by_the_deadline(c: RankContext) -> Optional[Cause]:
    """A hung row whose release had not come by the deadline: it never started its work."""
    o = c.obs
    if o is None or c.verdict.outcome != "hang" or o.released_at is not None:
        return None
    when = c.plan_rank(c.verdict.label).get("released") or ""
    return Cause("not started before the harness's deadline"
                 + (f": its release ({when}) was still to come" if when else ""),
                 [c.verdict.reason])


# only when nothing on the network explains the wait
@rule(order=760, evidence=("verdicts", "events", "signals"))
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


@rule(order=390, evidence=("verdicts",))
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


@rule(order=10, evidence=("native",))
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


# last: what the store held, where nothing else spoke
@rule(order=780, evidence=("store", "plan", "causes"))
def the_store_shows_who_is_missing(c: RankContext) -> Optional[Cause]:
    """What the store held at the deadline (harness.net.storeprobe) says whom a hung rank in
    init waits for: the ranks whose gloo address never reached the store, or a published address
    that no host of the run has. Last in the table: it speaks only where nothing else did."""
    v = c.verdict
    if v.outcome not in ("hang", "timeout") or v.role not in ("rank", "worker") or \
            not c.run.store or _job(v.label):
        return None
    from ...net.storeprobe import StoreSnapshot

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


# the hang path: live stacks and sockets at the deadline
@rule(order=730, evidence=("native", "sockets", "plan", "info", "stderr", "store"))
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
    unreachable = _unreachable_store(c, o, addr, port, ev, tail)
    if unreachable is not None:
        return unreachable
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
    return _nobody_hosts(c, o, addr, port, ev, tail)


def _unreachable_store(c: RankContext, o: RankObservation, addr: str, port: int,
                       ev: List[str], tail: str) -> Optional[Cause]:
    """dialling_a_store_nobody_hosts when the store's address cannot be reached at all: a name
    the row's host cannot resolve, or an address where no host of the run answers; None when
    neither is so."""
    v = c.verdict
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
    return None


def _nobody_hosts(c: RankContext, o: RankObservation, addr: str, port: int, ev: List[str],
                  tail: str) -> Optional[Cause]:
    """dialling_a_store_nobody_hosts when nothing listens at the store's address and port, the
    run's own: no rank claimed RANK=0, or no agent takes the c10d endpoint as its own (the
    store probe refused); None when the evidence says neither."""
    v = c.verdict
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


# after waiting_for_a_stuck_rank: a peer not started reads as it always did
@rule(order=770, evidence=("native", "sockets", "plan", "info", "events"))
def hosting_a_store_nobody_joins(c: RankContext) -> Optional[Cause]:
    """A row alive at the deadline that hosts the store and waits for its clients to connect
    (its native stack: TCPStore::waitForWorkers): who of the job has not joined, and why (it
    dials another port or address, it was not started yet, it had already ended: its own
    cause). The words of waiting_for_ranks,
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
        xv = c.verdict_of(x.label)
        if x.released_at is None:
            when = c.plan_rank(x.label).get("released") or ""
            why.append(f"{_who(x.label)} was not started before the deadline"
                       + (f" (its release, {when}, was still to come)" if when else ""))
        elif xv is not None and xv.outcome not in ("hang", "ok", "absent") \
                and xv.duration is not None:
            # it had ended before the deadline, and holds no connection to the store
            own = _cause_of(c, x.label, [hosting_a_store_nobody_joins])
            why.append(f"{_who(x.label)} had ended ({xv.outcome}) at {xv.duration:g} s"
                       + (f": {own}" if own else ""))
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


@rule(order=740, evidence=("native", "plan", "store", "effects"))
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


@rule(order=750, evidence=("native", "causes"))
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


@rule(order=60, evidence=("signals", "native", "causes"))
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


# a row at work at the deadline: slow, not stuck (before any wait)
@rule(order=370, evidence=("events", "cpu", "plan"))
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

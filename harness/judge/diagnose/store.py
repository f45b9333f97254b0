"""Rules of the TCP store and its port: a port already taken, a store nobody started or
that went away, clients that never joined, the ranks told different world sizes or ports, a
second job that reached the first job's store, a rank's key that never came."""

from __future__ import annotations

import re
from typing import Dict, List, Optional

from ...core.protocol import Label, parse_label
from ..classify import mro_names
from ._core import (
    EADDRINUSE,
    RULES,
    UNKNOWN,
    Cause,
    RankContext,
    _cause_of,
    _exc_line,
    diagnose,
    rule,
)
from ._shared import (
    CONNECT_TIMEOUT,
    _job,
    _name_unknown_here,
    _proxied,
    _starved,
    _unreachable_master,
)
from .agents import stopped_by_agent

JOINED = re.compile(r"(\d+)/(\d+) clients joined", re.I)
WAIT_KEYS = re.compile(r"wait timeout after (\d+)ms, keys: (\S+)", re.I)
PG_KEY = re.compile(r"^/default_pg/.*/(\d+)$")   # the process group's key of a rank (gloo's mesh)


@rule(order=20, evidence=("exception", "port_owners", "plan", "verdicts"))
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


@rule(order=120, evidence=("exception", "plan"))
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


@rule(order=330, evidence=("exception", "plan"))
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


@rule(order=270, evidence=("sockets", "verdicts"))
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


_NOT_A_RANK = Label("other", "")


def _other_attempt(a: str, b: str) -> bool:
    """Two rows of one rank from different restart attempts (``0`` and ``0@1``): a rank's
    new attempt never waits for its own earlier one."""
    la, lb = parse_label(a), parse_label(b)
    return la is not None and lb is not None and la.kind == lb.kind == "rank" and \
        la.job == lb.job and la.rank == lb.rank and la.attempt != lb.attempt


@rule(order=530, evidence=("exception", "plan", "verdicts", "events", "steps", "causes"))
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
        elif other is not None and other.outcome != "ok" and other.duration is not None and \
                c.obs is not None and c.obs.released_at and \
                c.obs.released_at >= other.duration:
            # it ended before this rank (the store's host) was even started
            ctx = c.about(other)
            own = diagnose(ctx, [r for r in RULES if r is not waiting_for_ranks]) \
                if ctx is not None else None
            why.append(f"rank {label} had ended ({other.outcome}) at {other.duration:g} s, "
                       f"before this rank was started at {c.obs.released_at:g} s"
                       + (f": {own.text}" if own is not None and own.text != UNKNOWN else ""))
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


@rule(order=410, evidence=("exception", "verdicts"))
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


@rule(order=570, evidence=("exception", "plan", "info", "events", "verdicts"))
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
                     "client's timeout", [_exc_line(c.verdict), _exc_line(host)],
                     blames=(host.label,))
    if host is not None and host.outcome == "ok" and host.duration is not None and \
            c.verdict.duration is not None and host.duration < c.verdict.duration:
        joined = sorted(v.label for v in c.verdicts if v.outcome == "ok" and v.role in
                        ("rank", "worker"))
        return Cause(f"the store's host, rank 0, had finished its job (ok at "
                     f"{host.duration:g} s, with ranks {', '.join(joined)}) and its store was "
                     f"gone; connects to port {port} were retried until the client's timeout",
                     [_exc_line(c.verdict), f"rank 0: {host.reason}"])
    return None


@rule(order=580, evidence=("exception", "counters", "plan", "events"))
def refused_and_retried(c: RankContext) -> Optional[Cause]:
    """Connects refused (no listener) and retried silently by the store client until its
    timeout (the kernel's AttemptFails counts the refusals)."""
    m = CONNECT_TIMEOUT.search(c.verdict.message or "")
    if m is None:
        return None
    # the counters as harness.net.hostspec.COUNTERS names them ("Tcp.AttemptFails")
    fails = {h: n.get("Tcp.AttemptFails", 0) for h, n in c.run.counters.items()
             if n.get("Tcp.AttemptFails", 0)}
    if not fails:
        return None
    # why nothing listened: the store's host was not started yet when this rank gave up
    v = c.verdict
    host = next((x for x in c.run.ranks if x.label != v.label and x.role == "rank"
                 and _job(x.label) == _job(v.label) and c.env(x.label).get("RANK") == "0"), None)
    late = ""
    if v.role == "rank" and host is not None and v.duration is not None and \
            (host.released_at is None or host.released_at >= v.duration):
        late = (f" (the store's host, rank {host.label}, was started only at "
                f"{host.released_at:g} s, after this rank gave up at {v.duration:g} s)"
                if host.released_at is not None else
                f" (the store's host, rank {host.label}, was never started)")
    return Cause(f"nothing listened on {m.group(1)}:{m.group(2)}{late}: connects were refused "
                 "and retried until the client's timeout",
                 [_exc_line(c.verdict),
                  "AttemptFails: " + ", ".join(f"{h} {n}" for h, n in fails.items())])


@rule(order=280, evidence=("exception", "plan", "verdicts"))
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


@rule(order=540, evidence=("exception", "info", "events", "causes"))
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


@rule(order=650, evidence=("exception", "plan", "verdicts", "steps", "causes"))
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
    # torchrun's workers host their own store (rank 0 of their attempt) only where the agents
    # ran with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (share_store: false, or the environment's);
    # else the agents' rendezvous store serves them (rendezvous_store_lost)
    launcher = c.run.plan.get("launcher") or {}
    own = launcher.get("kind") == "torchrun" and any(
        c.env(a.label).get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") == "1"
        for a in c.verdicts if a.role == "agent")
    roles = ("rank", "worker") if own else ("rank",)
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
                 [_exc_line(v), _exc_line(host) if host.exception else host.reason],
                 blames=(host.label,))

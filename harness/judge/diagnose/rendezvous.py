"""Rules of torchrun's rendezvous: a store lost or nobody hosted, a join timeout, a
rendezvous already closed, a faulted rendezvous service, a redundant agent, a deadlock of
elastic scale-up."""

from __future__ import annotations

import re
from typing import List, Optional, Tuple

from ..observation import RankObservation
from ._core import Cause, RankContext, _exc_line, rule
from ._shared import (
    CLOSED,
    CONNECT_TIMEOUT,
    _argv_of,
    _argv_opt,
    _dropping_rule,
    _endpoint,
    _is_loopback,
    _job,
    _listens,
)

INNER = re.compile(r"^([\w.]+): (.+)$\n\nThe above exception was the direct cause", re.M)


def _inner(c: RankContext, label: str) -> str:
    """The exception under ``label``'s own (torchelastic's "See inner exception"), one line."""
    o = c.obs_of(label)
    res = o.result() if o is not None else None
    tb = str(((res.data.get("exc") or {}) if res is not None else {}).get("traceback") or "")
    m = INNER.search(tb)
    return f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2).strip()}" if m else ""


def _workers_of(c: RankContext, agent: str) -> List[RankObservation]:
    """An agent's workers: by the node they were told, or (an agent srun started, whose
    workers were not told) by their parent's pid."""
    ao = c.obs_of(agent)
    pid = ao.pid if ao is not None else None
    return [w for w in c.run.ranks if w.role == "worker" and
            (w.node == agent or (pid is not None and (w.info or {}).get("ppid") == pid))]


RDZV_SERVICE_BACKENDS = ("etcd", "etcd-v2")   # torchrun backends whose store is a service


@rule(order=210, evidence=("exception", "plan", "steps"))
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


@rule(order=230, evidence=("exception", "plan", "info", "events", "sockets", "nft", "verdicts"))
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
        return _store_never_reached(c, o, ep, hosts, ev)
    if not CLOSED.search(inner) or len(hosts) != 1:
        return None
    return _store_closed(c, o, ep, hosts[0], ev)


def _store_never_reached(c: RankContext, o: RankObservation, ep: Tuple[str, int],
                         hosts: List[RankObservation], ev: List[str]) -> Optional[Cause]:
    """rendezvous_store_lost when the agent's connect to the endpoint timed out: nobody hosted
    the store there, or its host (one of ``hosts``, the agents on the endpoint's address) had
    ended before this agent came or before it raised."""
    v = c.verdict
    ip, port = ep
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


def _store_closed(c: RankContext, o: RankObservation, ep: Tuple[str, int], h: RankObservation,
                  ev: List[str]) -> Optional[Cause]:
    """rendezvous_store_lost when the store closed the agent's connection: its host ``h`` had
    ended, or finished its own job (another job on the same endpoint)."""
    v = c.verdict
    ip, port = ep
    hv = c.verdict_of(h.label)
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


@rule(order=250, evidence=("exception", "events", "verdicts"))
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


@rule(order=240, evidence=("exception", "plan", "events"))
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


# before agent_after_its_workers: a round-0 worker may end ok
@rule(order=190, evidence=("exception", "verdicts"))
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


# before rendezvous_store_lost: why the store's host went away
@rule(order=220, evidence=("exception", "plan", "info", "verdicts"))
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


@rule(order=395, evidence=("events", "verdicts"))
def restart_waits_for_a_round(c: RankContext) -> Optional[Cause]:
    """A restarted agent (kill_rank's restart_after) hung in its rendezvous while every other
    agent of its job stayed where it was (its workers phase, an exit barrier) and never came
    to a new round: the new node joins only a round that the others open."""
    v, o = c.verdict, c.obs
    if o is None or v.role != "agent" or v.outcome != "hang" or v.phase != "rendezvous" \
            or not o.restart_of:
        return None
    job = o.info.get("job") or ""
    others = [w for w in c.verdicts if w.role == "agent" and w.label not in (v.label,
              o.restart_of) and ((c.obs_of(w.label) or o).info.get("job") or "") == job
              and not any(x.restart_of == w.label for x in c.verdicts)]
    if not others or any(w.phase == "rendezvous" for w in others):
        return None
    when = f" at {o.released_at:g} s" if o.released_at is not None else ""
    return Cause(f"started again{when} (a restart of {o.restart_of}), it waited in the "
                 "rendezvous for a new round that no other agent opened: "
                 + "; ".join(f"{w.label} stayed in {w.phase} ({w.outcome})" for w in others),
                 [v.reason] + [f"{w.label}: {w.reason}" for w in others])

"""Rules of torchrun's agents and their workers: a worker its agent stopped, an agent's
ChildFailedError by the worker that really failed first, an agent that failed after its
workers ended ok or waits for live ones, a restart that read the previous attempt's keys."""

from __future__ import annotations

import re
import signal
from typing import Any, Optional

from ..observation import RankObservation
from ._core import Cause, RankContext, _cause_of, _exc_line, rule
from ._shared import _first_failed_child, _unreachable_master


@rule(order=400, evidence=("verdicts",))
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


@rule(order=200, evidence=("verdicts", "steps"))
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


@rule(order=135, evidence=("signals", "exception", "verdicts"))
def signal_passed_on_by_agent(c: RankContext) -> Optional[Cause]:
    """A worker that ended by the signal its agent passed on: torchrun's agent, signalled by
    the scenario's fault (SIGINT, SIGTERM), stops its workers with that same signal
    (KeyboardInterrupt in the worker for SIGINT)."""
    v, o = c.verdict, c.obs
    if o is None or o.role != "worker" or not o.node or o.signals:
        return None
    agent, ao = c.verdict_of(o.node), c.obs_of(o.node)
    if agent is None or ao is None or not ao.signals \
            or "SignalException" not in (agent.exception or ""):
        return None
    s = ao.signals[0]
    name = s.signal.removeprefix("SIG")
    if name == "INT" and v.outcome == "error" and "KeyboardInterrupt" in (v.exception or ""):
        how = "KeyboardInterrupt"
    elif v.outcome == "crash" and v.returncode is not None \
            and v.returncode == -int(getattr(signal, "SIG" + name, 0)):
        how = f"killed by SIG{name}"
    else:
        return None
    if o.ended_at is not None and o.ended_at + 0.01 < s.t:
        return None
    where = f" in {v.phase}" if v.phase else ""
    return Cause(f"stopped by its agent {o.node}{where} with the SIG{name} the scenario's "
                 f"fault sent the agent at {s.t:g} s (torchrun passes it on to its workers): "
                 f"{how}", [f"{agent.label}: {_exc_line(agent)}", v.reason])


@rule(order=140, evidence=("signals", "events", "info", "verdicts", "causes"))
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


@rule(order=150, evidence=("verdicts", "info", "causes"))
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


@rule(order=260, evidence=("exception", "info"))
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

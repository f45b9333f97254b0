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

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .classify import Verdict
from .observe import RankObservation, RunObservation
from .sockets import SocketRecord

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

    @property
    def master_port(self) -> int:
        return int(self.run.plan.get("master_port") or 0)

    @property
    def sockets(self) -> List[SocketRecord]:
        return list(self.obs.sockets) if self.obs is not None else []

    def plan_rank(self, label: str) -> Dict[str, Any]:
        return next((r for r in self.run.plan.get("ranks", []) if str(r.get("label")) == label),
                    {})

    def env(self, label: str) -> Dict[str, str]:
        return dict(self.plan_rank(label).get("env") or {})

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


# -- the rules ---------------------------------------------------------------------------------
def store_port_in_use(c: RankContext) -> Optional[Cause]:
    """The rank meant to host the store could not listen: the port was taken."""
    v = c.verdict
    if v.outcome != "error" or not EADDRINUSE.search(v.message or ""):
        return None
    held = c.holder()
    text = f"could not start the store: port {c.master_port} was already in use" + \
        (f" by {held}" if held else "")
    ev = [_exc_line(v)]
    if held:
        ev.append(f"master port {c.master_port} held before the start line by {held}")
    return Cause(text, ev)


def connected_to_a_non_store(c: RankContext) -> Optional[Cause]:
    """Connected to the master port, and the other end is a process that is no rank (a port
    squatter): the client waits for an answer that never comes."""
    if c.verdict.outcome not in ("hang", "timeout", "error"):
        return None
    for s in c.sockets:
        if s.state != "ESTABLISHED" or s.remote_port != c.master_port or s.peer_pid is None:
            continue
        if s.peer.startswith(("rank ", "agent ", "worker ", "parent ")):
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
    if rule is not None and re.search(r"\breject\b", rule[1]) and not syn:
        return Cause(f"its connects to {target[0]}:{target[1]} were refused by the nft rule on "
                     f"host {rule[0]} and retried until the client's timeout: {rule[1]}",
                     [_exc_line(c.verdict), f"nft on {rule[0]}: {rule[1]}"])
    retrans = {h: n.get("TCPSynRetrans", 0) for h, n in c.run.counters.items()
               if n.get("TCPSynRetrans", 0)}
    if not syn and rule is None:
        return None
    text = f"its SYN to {target[0]}:{target[1]} was never answered"
    if rule is not None:
        text += f": dropped by the nft rule on host {rule[0]}: {rule[1]}"
        ev.append(f"nft on {rule[0]}: {rule[1]}")
    if retrans:
        ev.append("TCPSynRetrans: " + ", ".join(f"{h} {n}" for h, n in retrans.items()))
    if c.verdict.exception:
        ev.insert(0, _exc_line(c.verdict))
    return Cause(text, ev)


def _dropping_rule(rules: Dict[str, str], port: int) -> Optional[Tuple[str, str]]:
    """(host, rule line) of an nft rule that drops ``port`` (or drops everything new)."""
    for host, text in rules.items():
        for ln in text.splitlines():
            ln = ln.strip()
            if not re.search(r"\b(?:drop|reject)\b", ln):
                continue
            if re.search(rf"dport {port}\b", ln) or re.search(rf"\b{port}\b", ln):
                return host, ln
    return None


def name_unresolved(c: RankContext) -> Optional[Cause]:
    """A name the rank had to resolve did not resolve (the resolver's words in its stderr)."""
    if c.obs is None:
        return None
    m = GAI.search(c.obs.stderr_tail or "")
    if m is None:
        return None
    addr = c.env(c.verdict.label).get("MASTER_ADDR", "")
    line = m.group(0).strip()[:300]
    return Cause(f"a name did not resolve{f' (MASTER_ADDR={addr})' if addr else ''}",
                 [f"stderr: {line}"] + ([_exc_line(c.verdict)] if c.verdict.exception else []))


def waiting_for_ranks(c: RankContext) -> Optional[Cause]:
    """The store's host timed out waiting for clients: which ranks never joined, and why."""
    m = JOINED.search(c.verdict.message or "")
    if m is None:
        return None
    mine = c.env(c.verdict.label)
    why: List[str] = []
    for rp in c.run.plan.get("ranks", []):
        label = str(rp.get("label"))
        if label == c.verdict.label or rp.get("role", "rank") != "rank":
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
            why.append(f"rank {label} dialled {env['MASTER_ADDR']}, not {mine['MASTER_ADDR']}")
        elif obs is not None and obs.released_at and c.verdict.duration is not None and \
                obs.released_at >= c.verdict.duration:
            why.append(f"rank {label} was started only at {obs.released_at:g} s, after this "
                       f"rank gave up at {c.verdict.duration:g} s")
        elif other is not None and env.get("RANK") == mine.get("RANK"):
            why.append(f"rank {label} also claimed RANK={mine.get('RANK')}")
        elif other is not None and other.outcome != "ok":
            own = diagnose(RankContext(other, obs, c.run, c.verdicts),
                           [r for r in RULES if r is not waiting_for_ranks])
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


def no_store_there(c: RankContext) -> Optional[Cause]:
    """A client that timed out connecting to a port where no store listened: not the run's
    master port, or the store's host had already ended."""
    m = CONNECT_TIMEOUT.search(c.verdict.message or "")
    if m is None:
        return None
    port = int(m.group(2))
    if c.master_port and port != c.master_port:
        return Cause(f"dialled port {port}, where no store listened (the store's port is "
                     f"{c.master_port}); connects were retried until the client's timeout",
                     [_exc_line(c.verdict)])
    host = next((v for v in c.verdicts if v.label == "0" and v.label != c.verdict.label), None)
    if host is not None and host.outcome != "ok" and host.duration is not None and \
            c.verdict.duration is not None and host.duration < c.verdict.duration:
        return Cause(f"the store's host, rank 0, had ended ({host.outcome}) at "
                     f"{host.duration:g} s; connects to port {port} were retried until the "
                     "client's timeout", [_exc_line(c.verdict), _exc_line(host)])
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


Rule = Callable[[RankContext], Optional[Cause]]

# ordered: the first that gives a cause decides
RULES: List[Rule] = [
    store_port_in_use,
    connected_to_a_non_store,
    store_host_failed,
    name_unresolved,
    syn_unanswered,
    waiting_for_ranks,
    no_store_there,
    refused_and_retried,
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
        cause = diagnose(RankContext(v, by_label.get(v.label), run, verdicts))
        if cause is not None:
            v.cause, v.cause_evidence = cause.text, list(cause.evidence)
    return list(verdicts)

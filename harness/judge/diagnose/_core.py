"""The diagnosis's core: the types every rule speaks in, the registry that finds the rules, and
the two entry points.

* :class:`Cause` (what a rule returns) and :class:`RankContext` (what a rule sees of one row);
* :func:`rule`, the decorator that registers a rule function with its place in the table (an
  explicit ``order`` key: the lower key is asked first) and the evidence it reads (names of
  :data:`EVIDENCE`); :data:`REGISTRY` (name -> :class:`RuleSpec`) and :data:`RULES`, the
  functions in their order, which :func:`diagnose` walks: the first rule that returns a cause
  decides;
* :func:`diagnose` (one row) and :func:`explain_run` (every row of a run: it never raises);
* :func:`_cause_of`, another row's own cause for a rule that borrows it (never in a circle:
  :meth:`RankContext.about`).

The rule modules beside this one register themselves when the package imports them
(:func:`load_rules`: every module of the package whose name does not start with ``_``).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ...core.registry import package_modules
from ...net.sockets import SocketRecord
from ..classify import Verdict
from ..observation import RankObservation, RunObservation

UNKNOWN = "unknown: no rule of harness.diagnose explains it (see the evidence below)"
EADDRINUSE = re.compile(r"EADDRINUSE|address already in use", re.I)


@dataclass
class Cause:
    text: str                              # one line: why the row ended as it did
    evidence: List[str] = field(default_factory=list)   # the lines it rests on
    rule: str = ""                         # the rule that gave it (its function's name)
    # the rows whose END the cause names as the reason (a peer that died, the store's host
    # that had ended): borrowed into one of those rows' own causes it would explain that row by
    # itself, so ``diagnose`` passes over it there (RankContext.within)
    blames: Tuple[str, ...] = ()


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
        """The job's store port (harness.core.jobstore: the port the launch gives it, which may
        not be the run's lease); the lease for a plan written before the store was planned."""
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
        whole of it (harness.judge.stderrlines: stack frames cannot push them out), then the
        tail."""
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


# -- the registry ---------------------------------------------------------------------------------
Rule = Callable[[RankContext], Optional[Cause]]

# what a rule may declare that it reads (beyond its own row's outcome, phase and reason)
EVIDENCE: Dict[str, str] = {
    "exception": "the row's exception: its class and torch's message",
    "verdicts": "the other rows' verdicts: outcome, phase, duration, exception",
    "causes": "a row's own cause as the other rules give it (RankContext.about, _cause_of)",
    "plan": "the run's plan: the ranks' env, argv, init and variations, the hosts, the launcher",
    "steps": "the faults' step log: what each step did, to whom, when",
    "signals": "the signals the faults sent to a row",
    "events": "a row's events and times: phases, release, end, an agent's reaped, restart and "
              "rendezvous events",
    "info": "what an observed process said of itself first: argv, MASTER_ADDR, rank, ppid",
    "sockets": "a row's TCP sockets at the deadline or when it raised (harness.net.sockets)",
    "nft": "the nft rules of each host at the run's end",
    "counters": "each host's kernel TCP counters",
    "port_owners": "who held the master port before the start line",
    "stderr": "a row's stderr: torch's key lines and the tail (harness.judge.stderrlines)",
    "stacks": "a hung row's Python stacks (faulthandler)",
    "native": "a hung row's native stacks at the deadline (py-spy: harness.judge.pyspy)",
    "cpu": "two reads of a live row's CPU seconds near the deadline",
    "store": "what the job's store held (harness.net.storeprobe)",
    "effects": "what each fault proved it did (harness.judge.effects)",
}


@dataclass(frozen=True)
class RuleSpec:
    """A registered rule: its function, its place in the table, what it reads."""

    name: str
    func: Rule
    order: int                  # the lower is asked first
    evidence: Tuple[str, ...]   # names of EVIDENCE
    module: str                 # the module that defines it


REGISTRY: Dict[str, RuleSpec] = {}
# the rules in their order: the first that gives a cause decides (one list, kept in place)
RULES: List[Rule] = []


def rule(order: int, evidence: Sequence[str]) -> Callable[[Rule], Rule]:
    """Register a rule function: ``order`` places it in :data:`RULES` (a key no other rule
    has: the lower is asked first), ``evidence`` says what it reads (names of
    :data:`EVIDENCE`). The function is returned unchanged."""

    def register(func: Rule) -> Rule:
        name, module = func.__name__, func.__module__
        where = f"rule {name} ({module})"
        unknown = [e for e in evidence if e not in EVIDENCE]
        if not evidence or unknown:
            raise ValueError(f"{where}: evidence must name what it reads, from "
                             f"{', '.join(EVIDENCE)}" + (f"; unknown: {unknown}" if unknown
                                                         else ""))
        had = REGISTRY.get(name)
        if had is not None and had.module != module:
            raise ValueError(f"{where}: {had.module} already registered a rule of that name")
        clash = next((s for s in REGISTRY.values() if s.order == order and s.name != name), None)
        if clash is not None:
            raise ValueError(f"{where}: order {order} is {clash.name}'s ({clash.module}): "
                             "give it a key no other rule has")
        REGISTRY[name] = RuleSpec(name, func, int(order), tuple(evidence), module)
        RULES[:] = [s.func for s in sorted(REGISTRY.values(), key=lambda s: s.order)]
        return func

    return register


def load_rules() -> List[Rule]:
    """Import every rule module of this package (each registers its rules): no hand-kept list
    of modules. Returns :data:`RULES`."""
    package = __name__.rpartition(".")[0]
    package_modules(package, importlib.import_module(package).__path__)
    return RULES


# -- the entry points -----------------------------------------------------------------------------
def diagnose(ctx: RankContext, rules: Sequence[Rule] = RULES) -> Optional[Cause]:
    """The cause of one row (None for a row that ended ok or was absent)."""
    if ctx.verdict.outcome in ("ok", "absent"):
        return None
    for r in rules:
        cause = r(ctx)
        if cause is not None and set(cause.blames) & set(ctx.within):
            # asked while explaining a row this cause blames: that row ended first, so this
            # row's end cannot explain it (rank 3 timed out waiting for rank 0's key; rank 0
            # failed later because rank 3 had gone): the next rule, or unknown
            continue
        if cause is not None:
            cause.rule = r.__name__
            return cause
    ev = [_exc_line(ctx.verdict)] if ctx.verdict.exception else [ctx.verdict.reason]
    ev += [f"socket: {s.line()}" for s in ctx.sockets[:4]]
    return Cause(UNKNOWN, ev, rule="")


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

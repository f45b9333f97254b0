"""Behaviour changes between two session reports (pure): e.g. the same catalog on two images.

Cases are matched by id (pytest node id), ranks by label. A change is one of ``KINDS``; the
environment's differences are context, not changes. It exits 1 on a change left after --ignore.

Ranks are compared as their scenario's expectation allows them. Where the expectation declares
a race (several outcomes, or several phases: torch itself takes one path or the other), one
run of each report is one draw of that race: a move between the declared outcomes/phases, and
the exception, message and duration that come with the other path, is listed as variation
within the declared race, not counted as a change; leaving the declared set is a change. A row
that exists on one path of a declared race only (a restarted worker, a late node's), spoken of
by a wildcard key that declares the race, or by a wildcard key at all when a named rank of the
case moved inside its own declared race (rank 1 killed at destroy, the restart's "*@1" rows;
or rank 1 ended ok first and no restart came), is variation when it comes or goes; so are the
durations of the case's other rows then (the agent ends seconds sooner with no restart). An
expectation may also name what varies with the same outcome and phase (``varies: [message]``:
gloo says "recv" or "send" by which side notices first): changes of those are variation too.
In a case whose fault draws at random while it runs (packet loss), one run's durations are one
draw and are not compared. Message families are derived again from the messages by today's rules
(``report.message_family``), so a report written by an older harness compares as a new one would.

Durations. A rank's duration (start line to its end) moved when the difference exceeds BOTH the
relative tolerance (``rel_tol`` of the shorter duration, default 50%) and an absolute allowance
that the case itself sets (:func:`duration_allowance`; the note of a duration change spells
out its parts, so you can say why a move is or is not a change). The allowance is the sum of:

* ``abs_tol`` (default 2 s): the scheduling noise of any run on a loaded machine.
* start-up: the largest change, over the case's ranks, of the time a rank spent after the start
  line starting its interpreter and importing torch (its ``start``/``import`` phases, from the
  timeline). That time is the machine's load, not what torch.distributed did: ranks that a
  launcher starts fresh (torchrun, launch, spawn, ``program:``) import torch after the start
  line, 1-6 s on a busy 2-core machine, and every rank of the job waits for the slowest one in
  rendezvous and init, so the largest change counts for every rank of the case (a directly
  started or forked rank imports before the start line: 0 there).
* the rank's own mechanism, when its end is drawn by a retry loop of torch's whose give-up time
  is spread over a band of the case's torch timeout T: when both durations (less each run's
  own start-up) lie inside the band, widened by the two allowances above, the move is the
  loop's draw, not a change; outside it they are compared as any other duration. A store
  client (the message starts "the client socket has ...": timed out, failed to connect)
  gives up 1.15-2.3 T on a quiet machine (FIELD_NOTES: a random backoff between tries) and
  1.2-2.8 T in this catalog under load (busy_port bound: 9-14 s at T = 5; the fork
  fidelity runs 5.96 and 14.0 s): band 1-3 T. gloo's full-mesh connect ("connectfullmesh")
  gives up after up to about 5 T whatever the timeout (FIELD_NOTES: 25 s): band 1-5 T. Any
  other ``timeout`` outcome (a store wait, a collective's wait: they end about T after a wait
  that began at a moment the diff does not know) adds 1.5 T to the allowance instead. T is the
  timeout torch's own message names ("timed out after 10000ms") where it names one, else the
  case's ``timeout:``: a program passes its own timeout, which the case does not know (a
  torchrun script's 10 s store client, its case's ``timeout:`` unset, read as 30 s gave a band
  of 28-92 s against runs of 14.7 and 23.3 s). Where the two sides' messages name different
  timeouts there is no common band and the move is compared as any other duration (and the
  two timeouts are a ``settings`` change of the rank).
* the machine's load: in the slower run, the largest time any rank of the case spent runnable
  and waiting for a CPU after the start line (``cpu_wait``: the kernel's per-thread runqueue
  wait, summed over a rank's live threads, harness.machine.procs.runqueue_wait). A CPU-bound step
  stretches by that much under load and by nothing on an idle machine; a timeout, a sleep or a
  retry's backoff is blocked time and does not count, so a changed timeout is still a change.
  On a 2-core machine running the catalog at ``-n 4`` an ok DDP case took 0.4-4.2 s, a 256 MB
  DDP broadcast 0.9-11.4 s, over nine catalog runs of one image.
* a rank whose end follows another row's (an agent or spawning parent ends with its workers; a
  rank that reads "closed/reset by peer" ends when its peer does) also carries the largest
  move of the case's other ranks (those whose end is their own).
* an agent's monitor interval: a torchrun agent sees its workers' end on its monitor's next
  tick, so with ``--monitor-interval 5`` its end falls on a 5 s grid (program_ddp
  crash_in_step_3_torchrun: 5.1-5.3 s or 10.3-10.4 s over six catalog runs of one image, its
  workers ending at 4.1-6.9 s).
* the fault's firing: where a fault step was done before the row ended in both runs, how much
  later or earlier it was done (``fault_moved``, from the effects' ``done_at``). A fault fired
  by the ranks' progress ("when every rank has entered workload step 3") fires when they get
  there: under torchrun that is after a rendezvous, a start and an import, 2.8-10.3 s into
  the same etcd case over seven catalog runs of one image, while its ranks ended 0.4-2.4 s
  after the fault every time. What the fault did is compared from when it fired; the ranks'
  progress up to there is the healthy cases' to compare.

Repeated cases (both sides ran N times) compare each rank's outcome frequencies and what it
said (``families``: exception and message family, counted over the runs) with Fisher's exact
test (a change only at p < ``ALPHA`` once all the diff's tests are counted, by Holm's
step-down; the note says how sure); an outcome or family that was
the same on every run of each side and differs between the sides is a change however few the
runs (no race was seen; Fisher's test alone cannot count 3/3 against 0/3), and the new runs' median
against the old runs' own spread (min..max) widened by the same tolerances, within each branch
both sides took at least ``BRANCH_RUNS`` times where the case's rows race (a branch: every row's
outcome in one run; torchrun_restarts one_restart's agent took 6-17 s over ten runs whose
restarted workers failed at once and 56-69 s in the four of ten of another run whose workers
timed out: a change of the branches' frequencies, which the outcome counts judge). Not used: the
expectation's ``within:`` window. It is an acceptance bound written to pass on any machine
(busy_port bound: 3-35 s for a 5 s timeout), far wider than a case's spread; the diff is there
to see moves the test lets pass.

A changed setting is a change (``settings``): the case ran with another torch timeout,
deadline, world size or backend, e.g. the same catalog file with ``timeout:`` 5 -> 10. The
durations are still compared (against the allowance of the old setting); a doubled timeout
often moves a retrying rank less than its own band, so the setting is what makes that run
certain to be counted. The start method (``--start fresh|fork``) is not a setting: the fork
start must give the same behaviour, and the fidelity test diffs the two.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..core.rows import key_for
from .allowance import (
    DEFAULT_ABS_TOL,
    Allowance,
    _follows,
    _in_band,
    duration_allowance,
    torch_said_timeout,
)

KINDS: Dict[str, str] = {
    "added": "a scenario case only in the new report",
    "removed": "a scenario case only in the old report",
    "skipped": "ran before, skipped now",
    "unskipped": "skipped before, runs now",
    "status": "test status changed (passed / failed / error)",
    "job": "the job's outcome changed",
    "rank_added": "a rank only in the new run",
    "rank_removed": "a rank only in the old run",
    "outcome": "a rank's outcome changed (ok, error, timeout, hang, crash)",
    "exception": "a rank raised another exception class",
    "family": "a rank's message says something else (not only other numbers, ports, paths)",
    "phase": "a rank ended in another phase",
    "duration": "a rank's duration moved beyond the tolerance",
    "settings": "the case ran with another torch timeout, deadline, world size or backend, or a "
                "rank's message names another timeout than before",
    "frequency": "repeated runs: a rank's outcome frequencies differ beyond what the repeats "
                 "can tell apart (Fisher's exact test)",
}
ALPHA = 0.05     # a frequency change is counted when chance explains it less often than this
ENV_KEYS = ("torch", "torch_git", "cuda", "gloo", "nccl", "nccl_version", "mpi",
            "libuv_store_default", "python", "kernel", "platform", "hostname", "harness")
DEFAULT_REL_TOL = 0.5
SETTINGS = ("timeout", "deadline", "world_size", "backend")   # a case's settings: ``settings``


@dataclass
class Change:
    case: str                   # case id
    rank: Optional[str]         # rank label; None for a case-level change
    kind: str                   # one of KINDS
    old: Any
    new: Any
    note: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass
class DiffResult:
    changes: List[Change] = field(default_factory=list)
    within: List[Change] = field(default_factory=list)   # variation inside a declared race
    # every Fisher test made (its p-value) and the changes that passed ALPHA alone: only
    # those that still pass once all the diff's tests are counted (Holm) are changes
    tests: List[float] = field(default_factory=list)
    candidates: List[tuple] = field(default_factory=list)    # (p, [Change, ...]) per row
    environment: List[Dict[str, Any]] = field(default_factory=list)   # {key, old, new}
    compared: int = 0           # cases in both reports
    ignored: int = 0            # changes dropped by ``ignore``
    rel_tol: float = DEFAULT_REL_TOL
    abs_tol: float = DEFAULT_ABS_TOL

    @property
    def changed_cases(self) -> List[str]:
        return sorted({c.case for c in self.changes})

    def to_dict(self) -> Dict[str, Any]:
        kinds: Dict[str, int] = {}
        for c in self.changes:
            kinds[c.kind] = kinds.get(c.kind, 0) + 1
        return {
            "format": 1,
            "summary": {"changes": len(self.changes), "cases_changed": len(self.changed_cases),
                        "cases_compared": self.compared, "ignored": self.ignored,
                        "within_declared_races": len(self.within), "by_kind": kinds},
            "tolerance": {"relative": self.rel_tol, "absolute": self.abs_tol},
            "environment": self.environment,
            "changes": [c.to_dict() for c in self.changes],
            "within": [c.to_dict() for c in self.within],
        }


def duration_changed(old: Optional[float], new: Optional[float], rel_tol: float = DEFAULT_REL_TOL,
                     abs_tol: float = DEFAULT_ABS_TOL) -> bool:
    """Beyond tolerance: the difference exceeds BOTH ``abs_tol`` seconds and ``rel_tol`` of the
    shorter of the two durations (symmetric: 7 s -> 13 s and 13 s -> 7 s are changes, 0.05 s ->
    0.9 s is noise)."""
    if old is None or new is None:
        return False
    d = abs(float(new) - float(old))
    return d > abs_tol and d > rel_tol * min(abs(float(old)), abs(float(new)))


def _fmt(x: Any) -> str:
    return "-" if x is None or x == "" else str(x)


def environment_changes(old: Dict[str, Any], new: Dict[str, Any]) -> List[Dict[str, Any]]:
    out = []
    for k in ENV_KEYS:
        if old.get(k) != new.get(k):
            out.append({"key": k, "old": old.get(k), "new": new.get(k)})
    oe, ne = old.get("env") or {}, new.get("env") or {}
    for k in sorted(set(oe) | set(ne)):
        if oe.get(k) != ne.get(k):
            out.append({"key": f"env {k}", "old": oe.get(k), "new": ne.get(k)})
    return out


def fisher_exact(a: int, n1: int, b: int, n2: int) -> float:
    """Two-sided p-value of Fisher's exact test that ``a`` of ``n1`` and ``b`` of ``n2`` come
    from one frequency (the 2x2 table [[a, n1-a], [b, n2-b]]): the probability, if both runs
    drew from the same frequency, of a split at least this uneven."""
    from math import comb

    total, k = n1 + n2, a + b
    if n1 == 0 or n2 == 0:
        return 1.0

    def p(x: int) -> float:
        return comb(n1, x) * comb(n2, k - x) / comb(total, k)

    observed = p(a)
    lo, hi = max(0, k - n2), min(k, n1)
    return min(1.0, sum(q for q in (p(x) for x in range(lo, hi + 1))
                        if q <= observed * (1 + 1e-9)))


def _steady_change(cid: str, label: str, kind: str, oc: Dict[str, int], nc: Dict[str, int]
                   ) -> Optional[Change]:
    """Every run of each side the same, and the two sides differ: a change however few the
    runs (no race was seen to tell apart; Fisher's test needs 4 runs a side before even 4/4
    against 0/4 counts)."""
    if len(oc) != 1 or len(nc) != 1 or set(oc) == set(nc):
        return None
    (a, n1), (b, n2) = next(iter(oc.items())), next(iter(nc.items()))
    return Change(cid, label, kind, f"{n1}/{n1}: {a or '(nothing raised)'}",
                  f"{n2}/{n2}: {b or '(nothing raised)'}",
                  "the same on every run of each side: no race seen to tell apart")


def _counted_changes(cid: str, label: str, kind: str, steady_kind: str, oc: Dict[str, int],
                     nc: Dict[str, int], show: Callable[[str, int, int], str],
                     res: DiffResult) -> List[Change]:
    """Counts over repeated runs on both sides (outcomes, or message families): the steady
    change when each side was the same on every run, else one test for the row: Fisher's test
    of each value's share, the smallest p times (values - 1) (two values, ok and error, are one
    question asked twice). The row's test is counted in ``res.tests``; below ``ALPHA`` alone
    it is a candidate (``res.candidates``, with each value whose share moved) that ``_holm``
    keeps or not once every test of the diff is in."""
    n1, n2 = sum(oc.values()), sum(nc.values())
    steady = _steady_change(cid, label, steady_kind, oc, nc)
    if steady is not None:
        return [steady]
    values = sorted(set(oc) | set(nc))
    scale = max(1, len(values) - 1)
    moved: List[Change] = []
    row_p = 1.0
    for value in values:
        a, b = int(oc.get(value, 0)), int(nc.get(value, 0))
        pv = min(1.0, fisher_exact(a, n1, b, n2) * scale)
        row_p = min(row_p, pv)
        if pv < ALPHA:
            moved.append(Change(cid, label, kind, show(value, a, n1), show(value, b, n2)))
    res.tests.append(row_p)
    if moved:
        res.candidates.append((row_p, moved))
    return []


def _holm(res: DiffResult) -> List[Change]:
    """The frequency candidates that are changes once all the diff's Fisher tests are counted
    (Holm's step-down: the i-th smallest p of m tests, one per row, against ALPHA / (m - i));
    at 5% each, 40 rows of unchanged races would flag two changes by chance alone. The others go to
    ``res.within``, their note saying why they are not counted."""
    m = len(res.tests)
    kept: List[Change] = []
    passing = True
    for i, (pv, moved) in enumerate(sorted(res.candidates, key=lambda pc: pc[0])):
        passing = passing and pv <= ALPHA / (m - i)
        for c in moved:
            if passing:
                c.note = (f"p = {pv:.3g}: {100 * (1 - pv):.1f}% sure it changed "
                          f"(Holm, over the diff's {m} frequency test{'s' * (m != 1)})")
                kept.append(c)
            else:
                c.note = (f"p = {pv:.3g} alone, not beyond chance over the diff's {m} "
                          "frequency tests (Holm)")
                res.within.append(c)
    return kept


def _frequency_changes(cid: str, label: str, o: Dict[str, Any], n: Dict[str, Any],
                       res: DiffResult) -> List[Change]:
    """Repeated runs on both sides: a change for each outcome whose share differs beyond what
    the repeats can tell apart."""
    return _counted_changes(cid, label, "frequency", "outcome", o.get("outcomes") or {},
                            n.get("outcomes") or {}, lambda v, k, t: f"{v} {k}/{t}", res)


def _family_frequency_changes(cid: str, label: str, o: Dict[str, Any], n: Dict[str, Any],
                              res: DiffResult) -> List[Change]:
    """Repeated runs on both sides: what the rank said (exception and message family, counted
    over the runs) differs beyond what the repeats can tell apart. Families are derived again
    by today's rules only where a report kept them (older reports have none: nothing compared).
    """
    of, nf = o.get("families"), n.get("families")
    if not isinstance(of, dict) or not isinstance(nf, dict):
        return []
    return _counted_changes(cid, label, "family", "family", of, nf,
                            lambda v, k, t: f"{k}/{t}: {v or '(nothing raised)'}", res)


BRANCH_RUNS = 3    # runs a branch needs on each side before its durations are compared


def _branches(case: Dict[str, Any], label: str, rank: Dict[str, Any]
              ) -> Dict[Tuple[Tuple[str, str], ...], List[float]]:
    """A repeated row's durations by the branch its run took (every row's outcome in that run):
    a race case's branches take their own times (a restarted worker that times out keeps its
    agent a minute, one that fails at once does not). One group where the report kept no
    runs or they cannot be lined up with the durations."""
    durs = rank.get("durations") or []
    runs = [r for r in case.get("runs") or [] if label in (r.get("ranks") or {})]
    if len(runs) != len(durs):
        return {(): [float(x) for x in durs if x is not None]}
    out: Dict[Tuple[Tuple[str, str], ...], List[float]] = {}
    for r, d in zip(runs, durs):
        if d is not None:
            out.setdefault(tuple(sorted(r["ranks"].items())), []).append(float(d))
    return out


def _repeated_duration_change(cid: str, label: str, o: Dict[str, Any], n: Dict[str, Any],
                              orank: Dict[str, Any], nrank: Dict[str, Any],
                              rel_tol: float, allow: Allowance) -> List[Change]:
    """Repeated runs: the new median against the old runs' own spread, widened by the
    tolerances, within each branch both sides took (:func:`_branches`). A branch one side never
    took is a change of outcome frequencies, which the outcome counts judge, not a duration."""
    abs_tol = allow.seconds
    ob, nb = _branches(o, label, orank), _branches(n, label, nrank)
    if (() in ob) != (() in nb):    # one side's runs cannot be lined up: one group each
        ob = {(): [x for v in ob.values() for x in v]}
        nb = {(): [x for v in nb.values() for x in v]}
    out = []
    for key in sorted(set(ob) & set(nb)):
        od, nd = ob[key], nb[key]
        # a branch taken once or twice is no spread to measure a median against
        if min(len(od), len(nd)) < (BRANCH_RUNS if len(ob) > 1 or len(nb) > 1 else 1):
            continue
        lo, hi = min(od), max(od)
        med = sorted(nd)[len(nd) // 2]
        if duration_changed(lo, med, rel_tol, abs_tol) and med < lo or \
                duration_changed(hi, med, rel_tol, abs_tol) and med > hi:
            branch = "" if key == () or len(ob) == len(nb) == 1 else \
                " taking one branch (" + ", ".join(f"{k} {v}" for k, v in key) + ")"
            out.append(Change(cid, label, "duration", f"{lo:g}..{hi:g}", med,
                              f"median of {len(nd)} runs{branch} against the old runs' "
                              f"spread; {allow.note()}"))
    return out


def _wildcard_key(case: Dict[str, Any], label: str) -> bool:
    """Whether the expectation speaks of ``label`` through a wildcard key ("*", "agent:*"):
    a row it does not name, which may or may not exist."""
    ranks = (case.get("expectation") or {}).get("ranks") or {}
    return label not in ranks and key_for(ranks, label) is not None


def rank_expectation(case: Dict[str, Any], label: str) -> Dict[str, Any]:
    """The rank's expectation as the report keeps it: the key that speaks of the row, as the
    verdicts are checked (the label, ``R@*``, ``*@A``, ``*``; :func:`harness.core.rows.key_for`)."""
    ranks = (case.get("expectation") or {}).get("ranks") or {}
    key = key_for(ranks, label)
    exp = ranks.get(key) if key is not None else None
    return exp if isinstance(exp, dict) else {}


def _as_set(v: Any) -> List[Any]:
    return list(v) if isinstance(v, list) else ([] if v is None else [v])


def _declared_race(exp: Dict[str, Any]) -> bool:
    return len(_as_set(exp.get("outcome"))) > 1 or len(_as_set(exp.get("phase"))) > 1 \
        or bool(exp.get("varies"))


VARIES_KINDS = {"exception": ("exception",), "message": ("family",),
                "duration": ("duration",)}


def _varying(exp: Dict[str, Any], c: Change) -> bool:
    """Whether a change is inside what the expectation declares may vary: any change that
    comes with a move between declared outcomes/phases, else the kinds ``varies`` names."""
    if len(_as_set(exp.get("outcome"))) > 1 or len(_as_set(exp.get("phase"))) > 1:
        return True
    return any(c.kind in VARIES_KINDS[v] for v in _as_set(exp.get("varies"))
               if v in VARIES_KINDS)


def _to_within(changes: List[Change], res: DiffResult, chosen: List[Change],
               note: str) -> None:
    """Move ``chosen`` from ``changes`` into ``res.within``, saying why."""
    for c in chosen:
        changes.remove(c)
        c.note = (c.note + "; " if c.note else "") + note
        res.within.append(c)


def _within_race(exp: Dict[str, Any], r: Dict[str, Any]) -> bool:
    outcomes, phases = _as_set(exp.get("outcome")), _as_set(exp.get("phase"))
    return (not outcomes or r.get("outcome") in outcomes) and \
        (not phases or r.get("phase") in phases)


def _refamily(r: Dict[str, Any]) -> Dict[str, Any]:
    """The rank with its message family derived again by today's rules (a report written by an
    older harness compares as a new one would); a rank without a message keeps its own."""
    if not r.get("message"):
        return r
    from .report import message_family

    return {**r, "family": message_family(r["message"])}


def _rank_changes(cid: str, o: Dict[str, Any], n: Dict[str, Any], rel_tol: float,
                  allow: Allowance, in_band: bool = False) -> List[Change]:
    label = str(n.get("label"))
    out: List[Change] = []
    if o.get("outcome") != n.get("outcome"):
        def what(r: Dict[str, Any]) -> str:
            bits = [r.get("exception") or "", r.get("family") or ""]
            return ": ".join(b for b in bits if b)
        note = "; ".join(f"{side} {w}" for side, w in (("was", what(o)), ("now", what(n))) if w)
        out.append(Change(cid, label, "outcome", o.get("outcome"), n.get("outcome"), note))
        return out
    if o.get("exception") != n.get("exception"):
        out.append(Change(cid, label, "exception", o.get("exception"), n.get("exception")))
    if (o.get("family") or "") != (n.get("family") or ""):
        out.append(Change(cid, label, "family", o.get("family") or "", n.get("family") or "",
                          f"now: {(n.get('message') or '').strip().splitlines()[0][:200]}"
                          if n.get("message") else ""))
    if o.get("phase") != n.get("phase"):
        out.append(Change(cid, label, "phase", o.get("phase"), n.get("phase")))
    said = torch_said_timeout(o), torch_said_timeout(n)
    if None not in said and said[0] != said[1]:
        out.append(Change(cid, label, "settings", f"torch's timeout {said[0]:g} s",
                          f"torch's timeout {said[1]:g} s", "as its message names it"))
    if not in_band and duration_changed(o.get("duration"), n.get("duration"), rel_tol,
                                        allow.seconds):
        d = float(n["duration"]) - float(o["duration"])
        out.append(Change(cid, label, "duration", o.get("duration"), n.get("duration"),
                          f"{d:+.2f} s; {allow.note()}"))
    return out


def _file_case(cid: str) -> str:
    """``FILE.yaml::CASE`` of a case id, without the folders before the file."""
    path, sep, rest = cid.partition("::")
    return path.rsplit("/", 1)[-1] + sep + rest


def moved_cases(old_ids: Sequence[str], new_ids: Sequence[str]) -> List[tuple]:
    """(old id, new id) of cases whose ids differ only in the folders before the file, paired
    where that is unambiguous on both sides: the same catalog run from a checkout
    (``scenarios/healthy.yaml::healthy``) and from an installed package (``healthy.yaml::
    healthy``), or from another working folder."""
    only_old = [i for i in old_ids if i not in set(new_ids)]
    only_new = [i for i in new_ids if i not in set(old_ids)]
    by_old: Dict[str, List[str]] = {}
    by_new: Dict[str, List[str]] = {}
    for i in only_old:
        by_old.setdefault(_file_case(i), []).append(i)
    for i in only_new:
        by_new.setdefault(_file_case(i), []).append(i)
    return [(by_old[k][0], v[0]) for k, v in by_new.items()
            if len(v) == 1 and len(by_old.get(k, [])) == 1]


def diff_reports(old: Dict[str, Any], new: Dict[str, Any], rel_tol: float = DEFAULT_REL_TOL,
                 abs_tol: float = DEFAULT_ABS_TOL, ignore: Sequence[str] = ()) -> DiffResult:
    """Every behaviour change from ``old`` to ``new`` (both session reports as dicts)."""
    unknown = set(ignore) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown change kind(s) {sorted(unknown)}; known: {', '.join(KINDS)}")
    res = DiffResult(rel_tol=rel_tol, abs_tol=abs_tol,
                     environment=environment_changes(old.get("environment") or {},
                                                     new.get("environment") or {}))
    ocases = {c["id"]: c for c in old.get("cases", [])}
    ncases = {c["id"]: c for c in new.get("cases", [])}
    for oid, nid in moved_cases(list(ocases), list(ncases)):
        ncases[oid] = ncases.pop(nid)
    changes: List[Change] = []
    for cid in list(ocases) + [c for c in ncases if c not in ocases]:
        o, n = ocases.get(cid), ncases.get(cid)
        if o is None:
            changes.append(Change(cid, None, "added", None, n.get("status") if n else None))
            continue
        if n is None:
            changes.append(Change(cid, None, "removed", o.get("status"), None))
            continue
        res.compared += 1
        changes += _case_changes(cid, o, n, res, rel_tol, abs_tol)
    changes += _holm(res)
    res.changes = [c for c in changes if c.kind not in ignore]
    res.ignored = len(changes) - len(res.changes)
    return res


def _case_changes(cid: str, o: Dict[str, Any], n: Dict[str, Any], res: DiffResult,
                  rel_tol: float, abs_tol: float) -> List[Change]:
    """The changes of a case both reports ran; what moved only within a declared race goes
    to ``res.within``."""
    os_, ns = o.get("status"), n.get("status")
    if ns == "skipped" and os_ != "skipped":
        return [Change(cid, None, "skipped", os_, ns, n.get("reason") or "")]
    if os_ == "skipped" and ns != "skipped":
        return [Change(cid, None, "unskipped", os_, ns, o.get("reason") or "")]
    if os_ == "skipped":
        return []
    changes: List[Change] = []
    repeated = (o.get("repeat") or 1) > 1 and (n.get("repeat") or 1) > 1
    if os_ != ns:
        changes.append(Change(cid, None, "status", os_, ns, n.get("reason") or ""))
    if o.get("job") != n.get("job") and not repeated:
        changes.append(Change(cid, None, "job", o.get("job"), n.get("job")))
    for k in SETTINGS:
        if o.get(k) is not None and n.get(k) is not None and o.get(k) != n.get(k):
            changes.append(Change(cid, None, "settings", f"{k}: {o.get(k)}",
                                  f"{k}: {n.get(k)}", "the case ran with another setting; "
                                  "durations are compared against the old one's allowance"))
    oranks = {str(r.get("label")): _refamily(r) for r in o.get("ranks", [])}
    nranks = {str(r.get("label")): _refamily(r) for r in n.get("ranks", [])}
    # the largest move of the rows whose end is their own: carried by the rows that follow
    own = [abs(float(nranks[lb]["duration"]) - float(r["duration"]))
           for lb, r in oranks.items() if lb in nranks and r.get("duration") is not None
           and nranks[lb].get("duration") is not None
           and not _follows(lb, r, nranks[lb])]
    others_moved = max(own or [0.0])
    job_race = False
    for label in list(oranks) + [x for x in nranks if x not in oranks]:
        moved = _row_changes(cid, label, o, n, oranks.get(label), nranks.get(label), res,
                             changes, rel_tol, abs_tol, others_moved)
        job_race = job_race or moved
    if job_race:
        # a rank moved inside its declared race: the case took another path. The rows a
        # wildcard speaks of ("*@1": a restart's workers) that come or go, and the other
        # rows' durations (an agent that restarted no workers ends seconds sooner), are
        # that path's; with no such move they count
        _to_within(changes, res, [
            c for c in changes if c.case == cid and (
                c.kind == "duration" or c.kind in ("rank_added", "rank_removed")
                and (_wildcard_key(n, str(c.rank)) or _wildcard_key(o, str(c.rank))))],
            "the case took another path of a rank's declared race")
        # a job outcome that moved only because a rank moved inside its declared race
        if o.get("job") != n.get("job") and o.get("status") == n.get("status"):
            _to_within(changes, res,
                       [c for c in changes if c.case == cid and c.kind == "job"],
                       "a rank moved within its declared race")
    return changes


def _row_changes(cid: str, label: str, o: Dict[str, Any], n: Dict[str, Any],
                 orank: Optional[Dict[str, Any]], nrank: Optional[Dict[str, Any]],
                 res: DiffResult, changes: List[Change], rel_tol: float, abs_tol: float,
                 others_moved: float) -> bool:
    """One row's changes, added to ``changes`` (or to ``res.within`` where its declared race
    allows them); whether it moved inside its declared race with its outcome (the case took
    another path of the race)."""
    if orank is None or nrank is None:
        ch = Change(cid, label, "rank_added", None, nrank.get("outcome")) \
            if orank is None and nrank is not None else \
            Change(cid, label, "rank_removed", (orank or {}).get("outcome"), None)
        # a row that exists on one path of a declared race only (a restart's workers,
        # a late node's): matched by a wildcard key that declares the race
        exp = rank_expectation(n, label) or rank_expectation(o, label)
        if _declared_race(exp) and _wildcard_key(n, label):
            ch.note = "a row of one path of the declared race"
            res.within.append(ch)
        else:
            changes.append(ch)
    elif (o.get("repeat") or 1) > 1 and (n.get("repeat") or 1) > 1:
        # repeated on both sides: frequencies and spreads, not single draws
        before = len(res.candidates)
        freq = _frequency_changes(cid, label, orank, nrank, res)
        changes += freq
        # an outcome that changed (steady, or a candidate) says it already: no family test
        if not any(c.kind == "outcome" for c in freq) and len(res.candidates) == before:
            changes += _family_frequency_changes(cid, label, orank, nrank, res)
        allow = duration_allowance(o, n, label, orank, nrank, abs_tol)
        changes += _repeated_duration_change(cid, label, o, n, orank, nrank, rel_tol, allow)
    else:
        allow = duration_allowance(o, n, label, orank, nrank, abs_tol, others_moved)
        found = _rank_changes(cid, orank, nrank, rel_tol, allow,
                              _in_band(allow, o, n, label, orank.get("duration"),
                                       nrank.get("duration")))
        if o.get("random") or n.get("random"):   # a fault draws at random: one run
            drawn = [c for c in found if c.kind == "duration"]   # is one draw
            for c in drawn:
                c.note += "; the case's fault draws at random (compare repeats)"
                found.remove(c)
            res.within += drawn
        exp = rank_expectation(o, label)
        if not _declared_race(exp):   # a race declared since the old report
            exp = rank_expectation(n, label)
        if found and _declared_race(exp) and _within_race(exp, orank) \
                and _within_race(exp, nrank):
            inside = [c for c in found if _varying(exp, c)]
            for c in inside:
                c.note = (c.note + "; " if c.note else "") + "within the declared race"
            res.within += inside
            changes += [c for c in found if c not in inside]
            return any(c.kind == "outcome" for c in inside)
        else:
            changes += found
    return False


def render_table(res: DiffResult, old_name: str = "old", new_name: str = "new",
                 old_env: Optional[Dict[str, Any]] = None,
                 new_env: Optional[Dict[str, Any]] = None, console: Any = None) -> None:
    """Print the diff as rich tables (environment context, then the changes, then a summary)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    con = console or Console()
    oe, ne = old_env or {}, new_env or {}
    con.print(Text(f"old: {old_name} (torch {oe.get('torch', '?')})"))
    con.print(Text(f"new: {new_name} (torch {ne.get('torch', '?')})"))
    if res.environment:
        con.print(Text("environment differences (context, not counted as changes):"))
        t = Table()
        for col in ("", "old", "new"):
            t.add_column(col, overflow="fold")
        for e in res.environment:
            t.add_row(Text(e["key"]), Text(_fmt(e["old"])), Text(_fmt(e["new"])))
        con.print(t)
    if res.changes:
        styles = {"outcome": "bold red", "removed": "red", "added": "green", "skipped": "yellow",
                  "unskipped": "yellow", "duration": "yellow", "status": "bold red",
                  "job": "bold red", "exception": "red", "family": "magenta", "phase": "red"}
        con.print(Text("behaviour changes:", style="bold"))
        t = Table(show_lines=False)
        for col in ("case", "rank", "change", "old", "new", "note"):
            t.add_column(col, overflow="fold")
        last = None
        for c in res.changes:
            t.add_row(Text("" if c.case == last else c.case), Text(_fmt(c.rank)),
                      Text(c.kind, style=styles.get(c.kind, "")), Text(_fmt(c.old)),
                      Text(_fmt(c.new)), Text(c.note))
            last = c.case
        con.print(t)
    if res.within:
        races = sorted({c.case for c in res.within})
        con.print(Text(f"not counted: {len(res.within)} difference"
                       f"{'s' * (len(res.within) != 1)} in {len(races)} case"
                       f"{'s' * (len(races) != 1)} inside what the scenario declares may vary (a "
                       "race of torch's, a fault that draws at random): "
                       + ", ".join(races), style="dim"))
    n, k = len(res.changes), len(res.changed_cases)
    tail = f" ({res.ignored} ignored)" if res.ignored else ""
    if n:
        con.print(Text(f"{n} behaviour change{'s' * (n != 1)} in {k} case{'s' * (k != 1)} "
                       f"({res.compared} compared){tail}", style="bold red"))
    else:
        con.print(Text(f"no behaviour change ({res.compared} cases compared, duration tolerance "
                       f"{res.rel_tol:.0%} and {res.abs_tol:g} s plus each case's own allowance)"
                       f"{tail}", style="bold green"))

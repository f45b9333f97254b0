"""The session report: one JSON file per test session, from pytest or from ``harness run``.

It owns the report's format (``FORMAT``), the environment fingerprint, the per-case and per-rank
records built from a run's observation and verdicts, the message families that let ``harness
diff`` tell "same error, different port" from a real change, and the pytest plugin part that
collects those records (also under pytest-xdist: each worker attaches a case's record to its test
report, the controller gathers them and writes the file once at the end of the session).

A report (``"format": 2``) is one object: the session's fields, its ``cases`` (``case_record``
per scenario case), each with its ``ranks`` (``rank_record`` per row) and its ``timeline``.
What every field of each record means is in ``harness.reports.fields``, one mapping per record
kind (docs/reference/report.md is rendered from it; tests/test_report.py fails when a record
has a field without a meaning there, or a meaning outlives its field).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

import pytest

from ..core.protocol import ExceptionRecord, entered, ready_event, result_of
from ..judge.classify import Verdict, job_outcome
from ..judge.observation import RankObservation, RunObservation

FORMAT = 2   # 2: the timeline draws the faults' steps (format 1's holders/net_log are gone);
#              a format-1 report is still read (diff compares cases and ranks, not timelines)
STATUSES = ("passed", "failed", "skipped", "error")
ENV_PREFIXES = ("TORCH", "PYTORCH_", "NCCL_", "GLOO_", "MASTER_", "TP_SOCKET", "CUDA_", "HARNESS_",
                "USE_LIBUV", "OMP_NUM_THREADS", "FI_", "UCX_", "NVIDIA_")
ENV_EXACT = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


class ReportError(ValueError):
    """A file that is not a usable session report (missing, not JSON, wrong format)."""


# -- environment ---------------------------------------------------------------------------------

def relevant_env(environ: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment variables that change how torch.distributed starts (sorted)."""
    env = os.environ if environ is None else environ
    return {k: env[k] for k in sorted(env)
            if k.startswith(ENV_PREFIXES) or k in ENV_EXACT}


def environment(python: Optional[str] = None) -> Dict[str, Any]:
    """The fingerprint of this machine and image: torch (version, git hash, backends), Python,
    kernel, the libuv store default and the relevant environment variables. ``python``: the
    interpreter the ranks ran with when it is not the harness's own (``--harness-python``):
    torch, Python and the store default are that interpreter's."""
    from .. import __version__
    from ..machine.torch_probe import probe

    info = dict(probe(python))
    return {
        "torch": info.get("torch"),
        "torch_git": info.get("torch_git"),
        "cuda": info.get("cuda"),
        "gpus": info.get("gpus", 0),
        "distributed": info.get("distributed"),
        "gloo": info.get("gloo"),
        "nccl": info.get("nccl"),
        "nccl_version": info.get("nccl_version"),
        "mpi": info.get("mpi"),
        "libuv_store_default": info.get("libuv_store_default"),
        "probe_error": info.get("error"),
        "python": info.get("python") or platform.python_version(),
        "python_executable": python or sys.executable,
        "kernel": platform.release(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "hostname": platform.node(),
        "cpus": os.cpu_count(),
        "euid": os.geteuid(),
        "harness": __version__,
        "env": relevant_env(),
    }


def torch_seen(run: Any) -> List[Dict[str, str]]:
    """What the processes of a run said from inside about their torch (protocol's ready
    event: version, the folder it was imported from, the interpreter), one entry per distinct
    answer."""
    from ..core.protocol import ready_event

    seen: List[Dict[str, str]] = []
    for r in getattr(run, "ranks", None) or []:
        e = ready_event(r.events)
        if e is None or not e.data.get("torch_path"):
            continue
        one = {"torch": str(e.data.get("torch")), "torch_path": str(e.data["torch_path"]),
               "python": str(e.data.get("python") or "")}
        if one not in seen:
            seen.append(one)
    return seen


def ranks_environment(env: Dict[str, Any], cases: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """The session's environment with torch as its ranks said it (``torch_seen`` of every
    case): ``ranks_torch`` lists each distinct answer; where they agree on one version, that is
    the report's ``torch`` (the probe of the interpreter is what was expected, the ranks' word
    is what ran: the supervisor refuses a run where the two differ)."""
    seen: List[Dict[str, str]] = []
    for c in cases:
        for one in c.get("torch_seen") or []:
            if one not in seen:
                seen.append(one)
    if not seen:
        return env
    env = dict(env, ranks_torch=seen)
    versions = {one["torch"] for one in seen}
    if len(versions) == 1:
        env["torch"] = versions.pop()
    return env


# -- message families ----------------------------------------------------------------------------

_FAMILY_RULES = [
    (re.compile(r"\[enforce fail at [^\]]*\]", re.I), "[enforce fail]"),
    (re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.I), "<url>"),
    (re.compile(r"(?<![\w/])(?:[A-Za-z]:)?(?:/[\w.@+-]*){2,}(?::\d+)?"), "<path>"),
    # IPv6, bracketed or not: a "::" form ("::1", "fd00::1", IPv4-mapped "::ffff:127.0.0.1")
    # or all eight groups; not a "host]:port:" run or a C++ "ns::name"
    (re.compile(r"\[?(?<![\w:.])(?:"
                r"(?:[0-9a-f]{1,4}(?::[0-9a-f]{1,4}){0,5})?::(?:[0-9a-f]{1,4}:){0,5}"
                r"\d{1,3}(?:\.\d{1,3}){3}"
                r"|(?:[0-9a-f]{1,4}(?::[0-9a-f]{1,4}){0,6})?::(?:[0-9a-f]{1,4}(?::[0-9a-f]{1,4}){0,6})?"
                r"|[0-9a-f]{1,4}(?::[0-9a-f]{1,4}){7})(?![\w:.])\]?", re.I), "<addr>"),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b"), "<addr>"),
    (re.compile(r"\b0x[0-9a-f]+\b", re.I), "<hex>"),
    (re.compile(r"(?<![A-Za-z_])\d+(?:\.\d+)?"), "<n>"),
    (re.compile(r"'[^']*'|\"[^\"]*\""), "<str>"),
    (re.compile(r"^\[(?:<path>|<n>)\]\s*"), ""),
    # gloo's "Connect timeout PEER" of a pair that never learnt its peer prints the pair's
    # uninitialised address: "[none]" where that memory held no address family (fresh pages:
    # every fresh interpreter seen), anything where it held one (a forked rank's reused heap:
    # "[efd0:0:a00:200:ffff:ffff:ffff:0]:1"); what it says is the timeout, not a peer
    (re.compile(r"(connect timeout )(?:\[[^\]\s]*\]|<addr>)(?::<n>)?", re.I), r"\1<peer>"),
]
FAMILY_MAX = 160


def message_family(message: Optional[str]) -> str:
    """A short key for what a message says, without what varies between runs.

    The first line with a letter or digit in it, with URLs, paths, addresses, hex and numbers
    replaced, quoted strings replaced, lower-cased and cut at ``FAMILY_MAX`` characters::

        "The client socket has timed out after 5000ms while trying to connect to
         (127.0.0.1, 29500)."  ->
        "the client socket has timed out after <n>ms while trying to connect to (<addr>, <n>)."
    """
    if not message:
        return ""
    # the first line that says something: not a banner of "=" or "-" (torchrun's ChildFailedError
    # opens with one as wide as its widest line, which holds a pid: the width varies by run)
    first = next((ln.strip() for ln in message.splitlines() if re.search(r"\w", ln)), "")
    for pattern, repl in _FAMILY_RULES:
        first = pattern.sub(repl, first)
    first = re.sub(r"\s+", " ", first).strip().lower()
    return first[:FAMILY_MAX]


# -- records -------------------------------------------------------------------------------------

_EVENT_KEEP = ("phase", "step", "rank", "world_size", "status")


def _rel(t: Optional[float], t0: float) -> Optional[float]:
    return None if t is None or not t0 else round(t - t0, 4)


def rank_record(verdict: Verdict, obs: Optional[RankObservation], t0: float) -> Dict[str, Any]:
    """One rank: its verdict, message family, and the evidence worth keeping in a report."""
    events = obs.events if obs is not None else []
    result = result_of(events)
    exc = ExceptionRecord.from_dict(result.data.get("exc") or {}) if result is not None else None
    start = entered(events, "start")
    ready = ready_event(events)
    rec: Dict[str, Any] = {
        "label": verdict.label,
        "outcome": verdict.outcome,
        "phase": verdict.phase,
        "duration": verdict.duration,
        "exception": verdict.exception,
        "exception_mro": list(verdict.exception_mro),
        "message": verdict.message,
        "family": message_family(verdict.message),
        "reason": verdict.reason,
        "cause": verdict.cause,              # the diagnosis (harness.judge.diagnose); "" when ok
        "cause_evidence": list(verdict.cause_evidence),
        "cause_rule": verdict.cause_rule,    # the RULES entry that gave it; "" when unknown
        "returncode": verdict.returncode,
        "host": verdict.host,
        "addr": verdict.addr or (obs.addr if obs is not None else ""),
        "pid": obs.pid if obs is not None else None,
        "import_s": round(ready.t - start, 3) if start is not None and ready is not None
        else None,
        # seconds its threads waited for a CPU after the start line (the load's share of its
        # duration, at most): the diff's allowance (harness.reports.diff)
        "cpu_wait": obs.cpu_wait() if obs is not None else None,
    }
    if verdict.claims is not None:   # it told torch another rank than its row's
        rec["claims"] = verdict.claims
    if verdict.restart_of:   # a process started again after a kill (restart_after)
        rec["restart_of"] = verdict.restart_of
    if verdict.role != "rank":   # a launcher's row: agent, parent, worker (docs/launchers.md)
        rec.update(role=verdict.role, attempt=verdict.attempt, node=verdict.node)
        if verdict.restarts is not None:
            rec["restarts"] = verdict.restarts
        if verdict.root_cause is not None:
            rec["root_cause"] = verdict.root_cause
    for key, value in (("traceback", exc.traceback if exc is not None else ""),
                       ("stacks", (obs.stacks if obs is not None else "") or verdict.stacks),
                       ("native_stacks", obs.native_stacks if obs is not None else ""),
                       ("stdout_tail", obs.stdout_tail if obs is not None else ""),
                       ("stderr_tail", obs.stderr_tail if obs is not None else ""),
                       ("stderr_key", obs.stderr_key if obs is not None else "")):
        if value:
            rec[key] = value
    return rec


def step_periods(run: RunObservation) -> List[Dict[str, Any]]:
    """Every fault step of the run as the timeline draws it, from its declaration in the plan
    and the step log: what, on what, when it was done (``on``) and undone (``off``; None: it
    lasted to the end), in seconds from the start line."""
    log = {(r.step, r.action): r for r in run.step_log}
    out = []
    for st in run.plan.get("steps", []):
        done, undone = log.get((st.get("id"), "do")), log.get((st.get("id"), "undo"))
        out.append({"id": st.get("id"), "fault": st.get("fault"), "what": st.get("what"),
                    "target": st.get("target"), "when": st.get("when"),
                    "undo_when": st.get("undo_when"),
                    "on": None if done is None else done.t,
                    "off": None if undone is None else undone.t,
                    "info": dict(done.info) if done is not None else {}})
    return out


def timeline(run: RunObservation) -> Dict[str, Any]:
    """What the HTML chart draws: phases, signals and the faults' steps, in seconds from the
    start line."""
    t0 = run.t0 or 0.0
    plan = run.plan
    ranks = []
    for r in run.ranks:
        events = []
        for e in r.events:
            ev: Dict[str, Any] = {"ev": e.ev, "t": _rel(e.t, t0)}
            ev.update({k: e.data[k] for k in _EVENT_KEEP if k in e.data})
            events.append(ev)
        ranks.append({
            "label": r.label,
            "host": r.host,
            "released_at": r.released_at,
            "ended_at": r.ended_at,
            "killed_at_deadline": r.killed_at_deadline,
            "signals": [x.to_dict() for x in r.signals],
            "events": events,
        })
    return {
        "deadline": plan.get("deadline"),
        "timeout": plan.get("timeout"),
        "wall": run.wall,
        "master_port": plan.get("master_port"),
        "store": plan.get("store"),
        "ranks": ranks,
        "steps": step_periods(run),
    }


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


def _started(plan: Dict[str, Any], servers: Sequence[Dict[str, Any]] = ()) -> Dict[str, Any]:
    """How the run's processes started: counts of fresh and forked, and each fresh one's
    reason where the run asked for fork; its fork servers per host, ``warm`` (forked from the
    session's zygote) or ``fresh``, and a fresh server's reason."""
    ranks = plan.get("ranks", []) or []
    out: Dict[str, Any] = {"fresh": sum(1 for r in ranks if r.get("start", "fresh") == "fresh"),
                           "fork": sum(1 for r in ranks if r.get("start") == "fork")}
    notes = {r["label"]: r["start_note"] for r in ranks if r.get("start_note")}
    if notes:
        out["fresh_because"] = notes
    if servers:
        out["servers"] = {str(s.get("host")): "warm" if s.get("warm") else "fresh"
                          for s in servers}
        why = {str(s.get("host")): str(s["note"]) for s in servers if s.get("note")}
        if why:
            out["server_fresh_because"] = why
    return out


def case_record(*, nodeid: str, file: str, name: str, scenario: Any = None,
                run: Optional[RunObservation] = None, verdicts: Sequence[Verdict] = (),
                expectation: Any = None, mismatches: Sequence[Any] = (),
                evidence: Optional[str] = None) -> Dict[str, Any]:
    """A scenario case as far as it got: static facts, then the run's ranks if it ran (the JSON
    edge of the observation and the verdicts).

    ``status``, ``reason``, ``failure`` and ``duration`` are filled in from pytest's reports.
    """
    plan = run.plan if run is not None else {}
    by_label = {r.label: r for r in run.ranks} if run is not None else {}
    rec: Dict[str, Any] = {
        "id": nodeid, "file": file, "name": name,
        "scenario": getattr(scenario, "name", None),
        "case": getattr(scenario, "case", None),
        "test_id": getattr(scenario, "test_id", name),
        "about": (getattr(scenario, "about", "") or "").strip(),
        "marks": list(getattr(scenario, "marks", []) or []),
        "faults": [f.kind for f in getattr(scenario, "faults", []) or []],
        "random": any(f.is_random() for f in getattr(scenario, "faults", []) or []),
        "backend": getattr(scenario, "backend", None),
        "world_size": getattr(scenario, "world_size", None),
        "notes": list(plan.get("notes", [])),
        "start": plan.get("start", getattr(scenario, "start", None)),
        "started": _started(plan, run.servers if run is not None else ()),
        "harness_memory": run.harness_memory if run is not None else {},
        "admission": plan.get("admission"),
        "status": None, "reason": "", "failure": "",
        "mismatches": [m if isinstance(m, dict) else
                       {"label": m.label, "field": m.field, "expected": m.expected,
                        "observed": m.observed, "line": m.line} for m in mismatches],
        "job": job_outcome(verdicts) if verdicts else None,
        "expectation": _expectation_dict(expectation),
        "torch_version": run.torch_version if run is not None else None,
        "torch_seen": torch_seen(run),
        "duration": None,
        "wall": run.wall if run is not None else None,
        "deadline": plan.get("deadline", getattr(scenario, "deadline", None)),
        "timeout": plan.get("timeout", getattr(scenario, "timeout", None)),
        "evidence": evidence,
        "port_owners": run.port_owners if run is not None else [],
        "rules": run.rules if run is not None else {},
        "counters": run.counters if run is not None else {},
        # what each fault did, per target, with its evidence and times (harness.judge.effects)
        "effects": run.effects if run is not None else [],
        "store": run.store if run is not None else {},
        "stores": run.stores if run is not None else [],
        "ranks": [rank_record(v, by_label.get(v.label), run.t0 if run is not None else 0.0)
                  for v in verdicts],
        "timeline": timeline(run) if run is not None else None,
    }
    return _jsonable(rec)


def summarize(cases: Iterable[Dict[str, Any]], collect_errors: Sequence[Any] = ()
              ) -> Dict[str, int]:
    out = {s: 0 for s in STATUSES}
    total = 0
    for c in cases:
        total += 1
        if c.get("status") in out:
            out[c["status"]] += 1
    return {"total": total, **out, "collect_errors": len(collect_errors)}


def build(cases: Sequence[Dict[str, Any]], *, env: Optional[Dict[str, Any]] = None,
          collect_errors: Sequence[Dict[str, str]] = (), source: str = "pytest",
          argv: Optional[Sequence[str]] = None, duration: Optional[float] = None,
          evidence: Optional[str] = None, interrupted: Optional[str] = None,
          workers: int = 1) -> Dict[str, Any]:
    """The whole report (cases in the order given)."""
    from .. import __version__

    return {
        "format": FORMAT,
        "tool": f"torchdist-harness {__version__}",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "source": source,
        "argv": list(argv if argv is not None else sys.argv),
        "duration": None if duration is None else round(duration, 3),
        "evidence": evidence,
        "interrupted": interrupted,
        "environment": ranks_environment(env if env is not None else environment(), cases),
        "summary": summarize(cases, collect_errors),
        "time": time_budget(cases, duration, workers),
        "collect_errors": list(collect_errors),
        "cases": list(cases),
    }


def time_budget(cases: Sequence[Dict[str, Any]], duration: Optional[float], workers: int
                ) -> Dict[str, Any]:
    """How the session's time compares with what its scenarios ask for: ``inherent`` is the
    sum of every run's own time from its start line to its end (the timeouts, delays and
    deadlines the scenarios wait out), ``ratio`` the session's duration over ``inherent /
    workers`` (1.0: no time beyond the waits; the rest is starting interpreters, importing
    torch, namespaces, stacks and cleanup)."""
    inherent = 0.0
    for c in cases:
        walls = c.get("walls") or ([c["wall"]] if c.get("wall") is not None else [])
        inherent += sum(float(w) for w in walls if w is not None)
    workers = max(1, int(workers or 1))
    ratio = None
    if duration and inherent > 0:
        ratio = round(float(duration) / (inherent / workers), 2)
    return {"duration": None if duration is None else round(float(duration), 3),
            "inherent": round(inherent, 3), "workers": workers, "ratio": ratio}


def with_floor(budget: Dict[str, Any], cases: Sequence[Dict[str, Any]], cpu_s: float,
               cores: int) -> Dict[str, Any]:
    """``budget`` (``time_budget``'s) with the floor no scheduler can beat on this machine:
    the longest case (its runs together: one worker runs them in turn; not its waits at the
    admission gate) or the CPU seconds the
    session's processes used (the harness, its workers, every rank, fork server and service,
    as the kernel accounted them) spread over the cores, whichever is larger; ``over_floor``
    is the session's duration over it (1.0: nothing left to gain by running more at once)."""
    longest = max((float(c["duration"]) - float(c.get("admission_waited") or 0.0)
                   for c in cases if c.get("duration") is not None), default=0.0)
    cores = max(1, int(cores))
    floor = max(longest, cpu_s / cores)
    out = dict(budget, longest_case=round(longest, 3), cpu_s=round(cpu_s, 3), cores=cores,
               floor=round(floor, 3))
    dur = budget.get("duration")
    out["over_floor"] = round(float(dur) / floor, 2) if dur and floor > 0 else None
    return out


def write(report: Dict[str, Any], path: Union[str, Path]) -> Path:
    """Write atomically (a reader never sees half a file)."""
    p = Path(path)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, p)
    return p


def read(path: Union[str, Path]) -> Dict[str, Any]:
    """Load a report, or raise ReportError saying what is wrong with the file."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ReportError(f"{p}: cannot read: {e}") from None
    except ValueError as e:
        raise ReportError(f"{p}: not JSON: {e}") from None
    if not isinstance(data, dict) or "format" not in data or not isinstance(
            data.get("cases"), list):
        raise ReportError(f"{p}: not a harness session report (no 'format' and 'cases'; write "
                          "one with `harness run --report` or `pytest --harness-report`)")
    if not isinstance(data["format"], int) or data["format"] > FORMAT:
        raise ReportError(f"{p}: report format {data['format']!r} is newer than this harness "
                          f"reads (format {FORMAT}); upgrade torchdist-harness")
    for i, c in enumerate(data["cases"]):
        if not isinstance(c, dict) or "id" not in c or not isinstance(c.get("ranks", []), list):
            raise ReportError(f"{p}: cases[{i}] is not a case record (needs 'id' and 'ranks')")
    return data


# -- the pytest side -----------------------------------------------------------------------------

def _expectation_dict(expectation: Any) -> Any:
    if not hasattr(expectation, "model_dump"):
        return expectation
    d = expectation.model_dump(exclude_none=True)
    for key in ("counters", "effects", "tally"):
        if not d.get(key):
            d.pop(key, None)
    return d


def _evidence_of(item: Any) -> Optional[str]:
    """The item's evidence directory (absolute), where the plugin kept it."""
    v = getattr(item, "evidence", None)
    return os.path.abspath(str(v)) if v else None


def item_record(item: Any) -> Dict[str, Any]:
    """The case record of a ScenarioItem (duck-typed: no import of the plugin), with the
    seconds its runs waited at the admission gate before their start lines
    (harness.machine.admission; in ``duration``, which is pytest's, but not in any run's own
    times)."""
    rec = _item_record(item)
    runs = list(getattr(item, "runs", []) or [])
    rec["admission_waited"] = round(sum(
        float(((getattr(r, "plan", None) or {}).get("admission") or {}).get("waited") or 0.0)
        for r, _ in runs), 3)
    return rec


def _item_record(item: Any) -> Dict[str, Any]:
    from ..scenario.expect import check, check_repeated

    expectation = getattr(item, "expectation", None)
    verdicts = list(getattr(item, "verdicts", []) or [])
    runs = list(getattr(item, "runs", []) or [])
    if len(runs) > 1 and expectation is not None:
        return repeated_record(item, runs, expectation,
                               check_repeated(expectation, [v for _, v in runs],
                                              [getattr(r, "counters", {}) for r, _ in runs],
                                              [getattr(r, "effects", []) for r, _ in runs]))
    run = getattr(item, "run", None)
    mismatches = check(expectation, verdicts, getattr(run, "counters", None),
                       getattr(run, "effects", None)) \
        if expectation is not None and verdicts else []
    nodeid = item.nodeid
    return case_record(
        nodeid=nodeid, file=nodeid.split("::", 1)[0], name=item.name,
        scenario=item.scenario, run=getattr(item, "run", None), verdicts=verdicts,
        expectation=expectation, mismatches=mismatches, evidence=_evidence_of(item))


def repeated_record(item: Any, runs: Sequence[Any], expectation: Any, res: Any
                    ) -> Dict[str, Any]:
    """A case run N times: the first run's record (its ranks, timeline, evidence) plus every
    run's outcomes, each rank's outcome counts and durations, and what the repeats found
    (frequency bounds that failed, flaky ranks)."""
    first_run, first_verdicts = runs[0]
    nodeid = item.nodeid
    mismatches = [{"run": i, "label": m.label, "field": m.field, "expected": m.expected,
                   "observed": m.observed, "line": m.line} for i, m in res.mismatches]
    mismatches += [{"run": None, "label": m.label, "field": m.field, "expected": m.expected,
                    "observed": m.observed, "line": m.line} for m in res.bounds]
    rec = case_record(nodeid=nodeid, file=nodeid.split("::", 1)[0], name=item.name,
                      scenario=item.scenario, run=first_run, verdicts=first_verdicts,
                      expectation=expectation, mismatches=mismatches,
                      evidence=_evidence_of(item))
    durations: Dict[str, List[Optional[float]]] = {}
    families: Dict[str, Dict[str, int]] = {}
    for _, verdicts in runs:
        for v in verdicts:
            durations.setdefault(v.label, []).append(v.duration)
            fam = families.setdefault(v.label, {})
            key = family_key(v.exception, v.message)
            fam[key] = fam.get(key, 0) + 1
    for r in rec["ranks"]:
        r["outcomes"] = dict(res.counts.get(r["label"], {}))
        r["durations"] = durations.get(r["label"], [])
        r["families"] = families.get(r["label"], {})
    rec.update(repeat=len(runs), flaky=list(res.flaky),
               runs=[{"job": job_outcome(verdicts), "wall": run.wall,
                      "ranks": {v.label: v.outcome for v in verdicts}}
                     for run, verdicts in runs],
               walls=[run.wall for run, _ in runs],
               job_outcomes=_count(job_outcome(verdicts)
                                   for _, verdicts in runs))
    return _jsonable(rec)


def _count(items: Iterable[Any]) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for x in items:
        out[str(x)] = out.get(str(x), 0) + 1
    return out


def _workers(config: Any) -> int:
    """How many processes ran cases at once (pytest-xdist's -n, resolved; 1 without it)."""
    tx = getattr(config.option, "tx", None) or []
    dist = getattr(config.option, "dist", "no")
    return max(1, len(tx)) if dist != "no" and tx else 1


def _skip_reason(rep: Any) -> str:
    lr = rep.longrepr
    if isinstance(lr, (tuple, list)) and len(lr) == 3:
        msg = str(lr[2])
    else:
        msg = getattr(rep, "longreprtext", "") or str(lr or "")
    return msg[len("Skipped: "):] if msg.startswith("Skipped: ") else msg


def family_key(exception: Optional[str], message: Optional[str]) -> str:
    """What a repeated rank said, as counted over its runs (``families`` of a repeated case's
    rank): ``Exception: family``, or "" for a rank that raised nothing."""
    fam = message_family(message)
    return ": ".join(x for x in (exception or "", fam) if x)


class SessionRecorder:
    """pytest plugin object (registered by ``harness.pytest_plugin`` when ``--harness-report``
    or ``--harness-html`` is given). On an xdist worker it only attaches records to reports;
    the controller (or a plain session) gathers them and writes the files."""

    def __init__(self, config: Any, report_path: Optional[str], html_path: Optional[str]):
        self.config = config
        self.report_path, self.html_path = report_path, html_path
        self.is_worker = hasattr(config, "workerinput")
        self.cases: Dict[str, Dict[str, Any]] = {}
        self.durations: Dict[str, float] = {}
        self.collect_errors: List[Dict[str, str]] = []
        self.started = time.monotonic()
        self.written: List[Path] = []

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: Any, call: Any):  # type: ignore[no-untyped-def]
        outcome = yield
        if getattr(item, "scenario", None) is None:
            return
        rep = outcome.get_result()
        if rep.when == "call" or (rep.when == "setup" and not rep.passed):
            rep.harness_case = item_record(item)

    def pytest_runtest_logreport(self, report: Any) -> None:
        if self.is_worker:
            return
        data = getattr(report, "harness_case", None)
        nid = report.nodeid
        self.durations[nid] = self.durations.get(nid, 0.0) + (report.duration or 0.0)
        if data is None and nid not in self.cases:
            return
        rec = self.cases.setdefault(nid, {})
        if data is not None:
            keep = {k: rec[k] for k in ("status", "reason", "failure") if k in rec}
            rec.update(data)
            rec.update({k: v for k, v in keep.items() if v not in (None, "")})
        rec["duration"] = round(self.durations[nid], 3)
        if report.skipped and report.when in ("setup", "call"):
            rec["status"] = "skipped"
            rec["reason"] = _skip_reason(report)
        elif report.failed:
            text = getattr(report, "longreprtext", "") or ""
            if report.when == "call":
                rec["status"] = "failed"
                rec["failure"] = text
                rec["reason"] = "ranks did not end as expected" if rec.get("mismatches") \
                    else text.strip().splitlines()[-1][:300] if text.strip() else "failed"
            else:
                rec["status"] = "error"
                rec["failure"] = (rec.get("failure", "") + "\n" + text).strip()
                rec["reason"] = f"error in {report.when}: " + (
                    text.strip().splitlines()[-1][:300] if text.strip() else "")
        elif report.when == "call" and report.passed and rec.get("status") is None:
            rec["status"] = "passed"

    def pytest_collectreport(self, report: Any) -> None:
        if self.is_worker or not report.failed:
            return
        nid = report.nodeid or ""
        if nid.endswith((".yaml", ".yml")):
            self.collect_errors.append({"file": nid,
                                        "message": getattr(report, "longreprtext", "")})

    def pytest_sessionfinish(self, session: Any) -> None:
        if self.is_worker:
            return
        cases = list(self.cases.values())
        for c in cases:
            if c.get("status") is None:  # e.g. interrupted between setup and call
                c["status"] = "error"
                c["reason"] = c.get("reason") or "did not finish"
        from ..machine import interrupts
        from .evidence import SESSION_KEY

        session = self.config.stash.get(SESSION_KEY, None)
        sig = interrupts.interrupted()
        python = self.config.getoption("harness_python", None)
        if python:
            from ..machine.interpreters import resolve
            python = resolve(python)
        rep = build(cases, collect_errors=self.collect_errors, source="pytest",
                    env=environment(python) if python else None,
                    argv=list(self.config.invocation_params.args),
                    duration=time.monotonic() - self.started,
                    workers=_workers(self.config),
                    evidence=str(session.path) if session is not None and session.path.is_dir()
                    else None,
                    interrupted=None if sig is None else signal.Signals(sig).name)
        if self.report_path:
            self.written.append(write(rep, self.report_path))
        if self.html_path:
            from .html import write_html
            self.written.append(write_html(rep, self.html_path))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for p in self.written:
            terminalreporter.write_line(f"harness: wrote {p}")

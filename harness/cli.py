"""The command line front door: ``harness COMMAND`` (also ``python -m harness``). Thin: the
rooms do the work, and ``harness run`` is pytest with the harness plugin, so the CLI and
``pytest`` collect, run and report scenarios the same way.

Commands: run, validate, list, show, diff, html, doctor, schema, new. Exit codes: 0 fine,
1 something found (a failing scenario, an invalid file, a behaviour change), 2 bad input
(a missing file, a bad option), 3 the harness itself failed (one line). ``harness run`` returns
pytest's own exit code, except after a signal: SIGINT (Ctrl-C) and SIGTERM clean up like one
Ctrl-C (``harness.interrupts``), print a last line saying so, and end the process by that
signal (exit status 130 and 143).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from .core.errors import UsageError


def _console(stderr: bool = False) -> Any:
    from rich.console import Console
    con = Console(stderr=stderr, highlight=False, soft_wrap=False)
    if not con.is_terminal and "COLUMNS" not in os.environ:
        con.width = 160   # a log file or a pipe: wide tables rather than wrapped ids
    return con


def _text(s: str, style: str = "") -> Any:
    from rich.text import Text
    return Text(s, style=style)


# -- finding scenario files ----------------------------------------------------------------------

def find_scenarios(paths: Sequence[str], skipped: Optional[List[Path]] = None) -> List[Path]:
    """Scenario files among the paths named, by the rule pytest's collection uses
    (harness.discovery); an entry that is not a regular file goes to ``skipped``."""
    from .scenario.discovery import explain_none
    from .scenario.discovery import find_scenarios as discover

    try:
        files = discover(paths, skipped=skipped)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    if not files and not (skipped or []):
        raise UsageError(explain_none(paths))
    return files


def scenario_paths(args: argparse.Namespace) -> List[str]:
    """The paths a command was given, with the built-in catalog first under ``--builtin``."""
    paths = list(getattr(args, "paths", None) or [])
    if getattr(args, "builtin", False):
        from .scenario.catalog import require_builtin

        try:
            paths.insert(0, str(require_builtin()))
        except FileNotFoundError as e:
            raise UsageError(str(e)) from None
    if not paths:
        raise UsageError("give scenario files or folders, or --builtin for the built-in catalog")
    return paths


# -- validate ------------------------------------------------------------------------------------

def cmd_validate(args: argparse.Namespace) -> int:
    from .scenario.determinism import widenings
    from .scenario.loader import Problem, ScenarioFileError, item_name, load_file, one_line

    skipped: List[Path] = []
    paths = scenario_paths(args)
    files = find_scenarios(paths, skipped)
    if not files:
        raise UsageError(f"no scenario files (*.yaml, *.yml) under {' '.join(paths)}")
    con = _console()

    def line(text: str, style: str = "") -> None:   # one line each, whatever the width
        con.print(_text(one_line(text), style), soft_wrap=True)

    for f in skipped:
        line(f"- {f}: skipped: not a regular file (pytest does not collect it either)", "yellow")
    bad = problems = cases = widened = 0
    for f in files:
        try:
            loaded = load_file(f)
        except ScenarioFileError as e:
            bad += 1
            problems += len(e.problems)
            line(f"✗ {f}: {len(e.problems)} problem{'s' * (len(e.problems) > 1)}", "bold red")
            for p in e.problems:
                line(f"  {p}")
            continue
        cases += len(loaded)
        found = [(scn, w) for scn in loaded for w in widenings(scn)]
        widened += len({id(scn) for scn, _ in found})
        if found and args.strict:
            bad += 1
            problems += len(found)
            line(f"✗ {f}: {len(found)} expectation{'s' * (len(found) > 1)} no run can "
                 "contradict", "bold red")
        elif not args.quiet:
            line(f"✓ {f} ({len(loaded)} case{'s' * (len(loaded) != 1)})", "green")
        if args.strict:
            for scn, w in found:
                line(f"  {Problem(str(f), w.line, w.field, f'{item_name(scn)}: {w.message}')}")
    summary = (f"{len(files)} file{'s' * (len(files) != 1)}, {cases} case"
               f"{'s' * (cases != 1)}")
    if widened and not args.strict:
        con.print(_text(f"{widened} case{'s' * (widened != 1)} with an expectation no run can "
                        "contradict (harness validate --strict lists them)", "yellow"))
    if bad:
        con.print(_text(f"{bad} invalid file{'s' * (bad != 1)} ({problems} problems) of "
                        f"{summary}", "bold red"))
        return 1
    con.print(_text(f"all valid: {summary}", "bold green"))
    return 0


# -- list ----------------------------------------------------------------------------------------

def cmd_list(args: argparse.Namespace) -> int:
    from .scenario.loader import ScenarioFileError, item_name, load_file

    files = find_scenarios(scenario_paths(args))
    rows: List[Dict[str, Any]] = []
    broken: List[str] = []
    selected = _selected_cases(args, files) \
        if args.k or args.m or args.smoke else None
    catalog = None
    if getattr(args, "builtin", False):
        from .scenario.catalog import require_builtin

        catalog = require_builtin().resolve()
    for f in files:
        try:
            loaded = load_file(f)
        except ScenarioFileError as e:
            broken.append(e.short())
            continue
        # the built-in catalog's cases are named as `harness run --builtin` names them,
        # relative to the catalog (FILE.yaml::CASE), wherever the package is installed
        named = f.resolve().relative_to(catalog).as_posix() \
            if catalog is not None and catalog in f.resolve().parents else f.as_posix()
        for scn in loaded:
            if selected is not None and (str(f.resolve()), item_name(scn)) not in selected:
                continue
            rows.append({
                "id": f"{named}::{item_name(scn)}", "file": f.as_posix(),
                "scenario": scn.name, "case": scn.case, "marks": list(scn.marks),
                "faults": [x.kind for x in scn.faults], "backend": scn.backend,
                "world_size": scn.world_size, "deadline": scn.deadline,
                "expect": [b.summary() for b in scn.expect],
            })
    if args.json:
        print(json.dumps({"cases": rows, "invalid": broken}, indent=1))
        return 1 if broken else 0
    from rich.table import Table

    con = _console()
    t = Table(show_lines=False)
    for col in ("id", "marks", "faults", "backend", "world", "expect"):
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(_text(r["id"]), _text(" ".join(r["marks"])), _text(" ".join(r["faults"])),
                  _text(r["backend"] or "(default)"), _text(str(r["world_size"])),
                  _text("\n".join(r["expect"])))
    con.print(t)
    con.print(_text(f"{len(rows)} scenario cases in {len(files) - len(broken)} files"))
    for b in broken:
        con.print(_text(f"✗ {b}", "red"))
    return 1 if broken else 0


def _selected_cases(args: argparse.Namespace, files: List[Path]) -> set:
    """(file, case name) of every case that ``harness run`` with the same -k / -m / --smoke
    would run: pytest's own collection and deselection, with the arguments ``harness run``
    gives it (``_selection_args``), nothing run."""
    import contextlib
    import io

    import pytest

    class _Keep:
        def __init__(self) -> None:
            self.items: List[Any] = []

        def pytest_collection_finish(self, session: Any) -> None:
            self.items = list(session.items)

    keep = _Keep()
    pargs = _selection_args(args, files) + [
        "--collect-only", "-q", "--assert=plain", "-p", "no:cacheprovider",
        "--harness-order", "collected", "--harness-keep-sessions", str(10 ** 6)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = int(pytest.main(pargs, plugins=[keep]))
    if rc not in (0, 1, 5):   # 1: a broken file (listed below), 5: nothing selected
        raise UsageError(f"selecting cases failed (pytest exit {rc}): "
                         f"{out.getvalue().strip()[-800:]}")
    return {(str(Path(it.path).resolve()), it.name) for it in keep.items
            if getattr(it, "scenario", None) is not None}


# -- show ----------------------------------------------------------------------------------------

def plan_for_show(scn: Any) -> Dict[str, Any]:
    """The scenario's RunPlan as a dict, with real ports reserved (and released) from the
    harness's range and an example run directory."""
    from .machine.ports import PortLease
    from .machine.rundir import base_dir
    from .run.plan import make_plan

    base = base_dir()
    try:
        from .net import topology
        can_netns = not topology.missing()
    except ImportError:
        can_netns = False
    with PortLease() as lease:
        try:
            plan = make_plan(scn, str(base / "run-example0"), lease.take, netns=can_netns,
                             run_id="example0")
        except TypeError:   # a plan module without namespaces
            plan = make_plan(scn, str(base / "run-example0"), lease.take)
    return plan.to_dict()


def _kv(d: Dict[str, Any]) -> str:
    return "\n".join(f"{k}={v}" for k, v in d.items())


def cmd_show(args: argparse.Namespace) -> int:
    from .scenario.loader import ScenarioFileError, load_file

    path = Path(args.file)
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    try:
        cases = load_file(path)
    except ScenarioFileError as e:
        con = _console()
        for p in e.problems:
            con.print(_text(str(p), "red"))
        return 1
    if args.case is not None:
        chosen = [c for c in cases if c.case == args.case]
        if not chosen:
            ids = ", ".join(str(c.case) for c in cases)
            raise UsageError(f"{path}: no case {args.case!r} (cases: {ids})")
        cases = chosen
    plans = [(scn, plan_for_show(scn)) for scn in cases]
    if args.json:
        print(json.dumps([p for _, p in plans], indent=1, default=str))
        return 0
    for scn, plan in plans:
        show_plan(scn, plan)
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    """The diagnosis of a kept run: one line of cause per row and the evidence it rests on,
    then the stacks of the hung rows, identical ones once ('ranks 1-7, same stack')."""
    from .core.protocol import row_name
    from .judge.classify import classify_run
    from .judge.diagnose import explain_run
    from .judge.observation import RunObservation
    from .scenario.expect import innermost_frames, label_ranges, stack_groups

    d = Path(args.dir)
    found = sorted(d.glob("**/observation.json")) if d.is_dir() else []
    if not found:
        raise UsageError(f"{d}: no observation.json in it (give a case's evidence folder)")
    con = _console()
    for path in found:
        try:
            run = RunObservation.from_dict(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError) as e:
            raise UsageError(f"{path}: not an observation the harness wrote: {e}") from None
        verdicts = explain_run(run, classify_run(run))
        con.rule(_text(str(path.parent), "bold"))
        from .judge.effects import event_lines
        from .judge.effects import line as effect_line

        for eff in run.effects:   # what each fault did, with its evidence (harness.effects)
            con.print(_text(effect_line(eff), "bold"))
            for ln in event_lines(eff):
                con.print(_text(f"    {ln}", "dim"))
        # rows with the same outcome, phase and cause are said once ("ranks 1-7: ..."), with
        # the first one's evidence: an 8-rank hang reads on one screen
        alike: Dict[Any, List[Any]] = {}
        for v in verdicts:
            key = (v.outcome, v.phase, v.cause) if v.cause else (v.label,)
            alike.setdefault(key, []).append(v)
        for same in alike.values():
            v = same[0]
            durs = sorted(x.duration for x in same if x.duration is not None)
            dur = "?" if not durs else f"{durs[0]:.2f} s" if durs[-1] - durs[0] < 0.005 \
                else f"{durs[0]:.2f}-{durs[-1]:.2f} s"
            who = f"ranks {label_ranges([x.label for x in same])}" if len(same) > 1 \
                else f"rank {row_name(v.label, v.claims)}" if v.role in ("rank", "worker") \
                else v.label
            con.print(_text(f"{who}: {v.outcome} at {dur} in {v.phase or '-'}"
                            + (f" - {v.cause}" if v.cause else ""), "bold"))
            for ln in v.cause_evidence:
                con.print(_text(f"    {ln}", "dim"))
            if len(same) > 1:
                con.print(_text(f"    (evidence of rank {v.label}; ranks "
                                f"{label_ranges([x.label for x in same[1:]])} have the same "
                                "cause: their own lines are in the JSON report)", "dim"))
        if run.store:
            from .net.storeprobe import StoreSnapshot

            con.print(_text("what the store held:", "bold"))
            for ln in StoreSnapshot.from_dict(run.store).lines():
                con.print(_text(f"    {ln}", "dim"))
        for other in run.stores:
            from .net.storeprobe import StoreSnapshot

            con.print(_text("what a store the workers hosted themselves held:", "bold"))
            for ln in StoreSnapshot.from_dict(other).lines():
                con.print(_text(f"    {ln}", "dim"))
        groups = stack_groups({v.label: v.stacks for v in verdicts if v.outcome == "hang"})
        shown = set()
        for v in verdicts:
            group = groups.get(v.label)
            if not group or group[0] in shown:
                continue
            shown.add(group[0])
            who = f"ranks {label_ranges(group)}, same stack" if len(group) > 1 \
                else f"rank {v.label}"
            con.print(_text(f"stack ({who}), innermost frames:", "bold"))
            con.print(_text("    " + innermost_frames(v.stacks).replace("\n", "\n    ")))
    return 0


def _store_header(plan: Dict[str, Any]) -> str:
    """Where the job's store is (harness.jobstore), and the lease when the job does not use
    it: ``ports: master`` and the store probe mean the store's port."""
    from .core.jobstore import JobStore

    lease = f"{plan['master_addr']}:{plan['master_port']}"
    if not plan.get("store"):
        return f"master {lease}"
    st = JobStore.from_dict(plan["store"])
    text = st.describe()
    if st.kind == "file" or st.port != plan.get("master_port"):
        text += f" · the run's leased port {plan['master_port']} is not the store's"
    for other in (plan.get("stores") or {}).values():
        text += f" · {other.get('job')}: " + JobStore.from_dict(other).describe()
    return text


def show_plan(scn: Any, plan: Dict[str, Any]) -> None:
    from rich.table import Table

    con = _console()
    con.rule(_text(scn.test_id + ("" if scn.case is None else f"  (case {scn.case})"), "bold"))
    con.print(_text(scn.about.strip(), "dim"))
    launcher = plan.get("launcher") or {"kind": "direct"}
    program = plan.get("program") or {"worker": True}
    if program.get("worker"):
        own = "".join(f", rank {r} {t:g} s" for r, t in (plan.get("rank_timeouts") or {}).items())
        work = (f"init {scn.init} · torch timeout {plan['timeout']:g} s{own} · workload "
                f"{' → '.join(plan['workload']) or '(init only)'}"
                f"{' → destroy' if plan.get('destroy') else ''}")
    else:   # a user's program: its own init, timeout and work
        work = "program " + " ".join(str(a) for a in program.get("argv", []))
    con.print(_text(
        f"backend {plan['backend']} · world_size {plan['world_size']} · launcher "
        f"{launcher.get('kind', 'direct')} · {work} · deadline {plan['deadline']:g} s (from "
        "the start line)"))
    con.print(_text(_store_header(plan) + " · ports and the run directory are examples: every "
                    "run reserves its own", "dim"))
    if plan.get("hosts"):
        t = Table(title="hosts", title_justify="left")
        for col in ("host", "address", "interface", "namespace"):
            t.add_column(col)
        for h in plan["hosts"]:
            t.add_row(_text(h["name"]), _text(h["addr"]), _text(h["ifname"]),
                      _text(h.get("netns") or "(none: this machine's network)"))
        con.print(t)
    if plan.get("notes"):
        con.print(_text("plan notes (launcher, faults):", "bold"))
        for n in plan["notes"]:
            con.print(_text(f"  • {n}"))
    t = Table(title="ranks", title_justify="left", show_lines=True)
    for col in ("rank", "host", "released", "init", "env", "unset", "user"):
        t.add_column(col, overflow="fold")
    for r in plan["ranks"]:
        init = r["init"]
        how = init["method"] + (f" {init['url']}" if init.get("url") else "")
        if init.get("rank") is not None:
            how += f"\nrank={init['rank']} world_size={init['world_size']}"
        host = r.get("host", "local") + (f"\npython {r['python']}" if r.get("python") else "")
        released = "never (absent)" if r.get("absent") else "at start" \
            if r.get("release", {}) == {"at": 0.0} else str(r.get("released", ""))
        t.add_row(_text(r["label"]), _text(host), _text(released),
                  _text(how), _text(_kv(r["env"])), _text(" ".join(r.get("unset", []))),
                  _text(r.get("user") or ""))
    con.print(t)
    if plan.get("steps"):
        t = Table(title="steps (what the faults do, and when)", title_justify="left")
        for col in ("step", "does", "to", "when", "undone"):
            t.add_column(col, overflow="fold")
        for st in plan["steps"]:
            t.add_row(_text(st.get("id", "")), _text(st.get("what", "")),
                      _text(st.get("target", "")), _text(st.get("when", "")),
                      _text(st.get("undo_when") or ""))
        con.print(t)
    con.print(_text("expectations:", "bold"))
    for b in scn.expect:
        con.print(_text(f"  {b.summary()}"))


# -- run -----------------------------------------------------------------------------------------

class _Progress:
    """pytest plugin: a progress bar on a terminal, one line per case otherwise."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.total: Optional[int] = None
        self.done = 0
        self.counts: Dict[str, int] = {}
        self.status: Dict[str, str] = {}
        self.bar: Any = None
        self.task: Any = None
        self.con = _console(stderr=True)

    def _start(self) -> None:
        if not self.enabled or self.bar is not None or not self.con.is_terminal:
            return
        from rich import progress as rp
        self.bar = rp.Progress(rp.TextColumn("[bold]scenarios"), rp.BarColumn(),
                               rp.MofNCompleteColumn(), rp.TimeElapsedColumn(),
                               rp.TextColumn("{task.description}"), console=self.con,
                               transient=True, redirect_stdout=False, redirect_stderr=False)
        self.bar.start()
        self.task = self.bar.add_task("", total=self.total)

    def pytest_collection_finish(self, session: Any) -> None:
        if self.total is None and session.items:
            self.total = len(session.items)
        self._start()

    def pytest_xdist_node_collection_finished(self, node: Any, ids: Sequence[str]) -> None:
        """(an xdist hook; registered as optional in ``_progress_plugin``)"""
        if self.total is None:
            self.total = len(ids)
            self._start()
            if self.bar is not None:
                self.bar.update(self.task, total=self.total)


    def pytest_runtest_logreport(self, report: Any) -> None:
        nid = report.nodeid
        if report.when == "setup" and report.skipped:
            self.status[nid] = "skipped"
        elif report.failed:
            self.status[nid] = "failed" if report.when == "call" else "error"
        elif report.when == "call" and nid not in self.status:
            self.status[nid] = "passed"
        if report.when != "teardown":
            return
        self.done += 1
        st = self.status.get(nid, "passed")
        self.counts[st] = self.counts.get(st, 0) + 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=f"{st}: {nid}")
        else:
            total = self.total if self.total is not None else "?"
            self.con.print(_text(f"[{self.done}/{total}] {st:7} {nid}"))

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def _progress_plugin(enabled: bool) -> _Progress:
    import pytest

    # an xdist hook: optional, so that a session without xdist does not reject the plugin
    pytest.hookimpl(optionalhook=True)(_Progress.pytest_xdist_node_collection_finished)
    return _Progress(enabled)


def _ranks_cell(case: Dict[str, Any]) -> str:
    from .core.protocol import row_name

    parts = []
    if (case.get("repeat") or 1) > 1:   # repeated: each rank's outcome frequencies
        n = case["repeat"]
        for r in case.get("ranks", []):
            counts = sorted((r.get("outcomes") or {}).items(), key=lambda kv: (-kv[1], kv[0]))
            flaky = " (flaky)" if r.get("label") in (case.get("flaky") or []) else ""
            parts.append(f"{row_name(r.get('label'), r.get('claims'))}: "
                         + ", ".join(f"{o} {k}/{n}" for o, k in counts)
                         + flaky)
        return "\n".join(parts)
    for r in case.get("ranks", []):
        d = r.get("duration")
        parts.append(f"{row_name(r.get('label'), r.get('claims'))}: {r.get('outcome')}"
                     + ("" if d is None else f" {d:.2f}s" if d < 10 else f" {d:.1f}s")
                     + (f" {r['exception']}" if r.get("exception") else ""))
    return "\n".join(parts)


STATUS_STYLE = {"passed": "green", "failed": "bold red", "error": "bold magenta",
                "skipped": "yellow"}


def print_summary(rep: Dict[str, Any], con: Any, show_failures: bool = True) -> None:
    from rich.table import Table

    t = Table(title=f"torch {rep['environment'].get('torch')} · "
                    f"{rep['environment'].get('kernel')}", title_justify="left")
    for col in ("case", "status", "job", "ranks", "time"):
        t.add_column(col, overflow="fold")
    for c in rep["cases"]:
        st = c.get("status") or "?"
        t.add_row(_text(c["id"]), _text(st, STATUS_STYLE.get(st, "")), _text(c.get("job") or ""),
                  _text(_ranks_cell(c) or (c.get("reason") or "")),
                  _text("" if c.get("duration") is None else f"{c['duration']:.1f}s"))
    con.print(t)
    if show_failures:
        for c in rep["cases"]:
            if c.get("status") in ("failed", "error"):
                con.rule(_text(f"{c.get('status')}: {c['id']}", STATUS_STYLE[c["status"]]))
                text = c.get("failure") or c.get("reason") or ""
                text = "\n".join(ln for ln in text.splitlines() if not ln.startswith("[gw"))
                con.print(_text(text), soft_wrap=True)
                if c.get("evidence") and c["evidence"] not in text:
                    con.print(_text(f"evidence: {c['evidence']}", "dim"))
    for e in rep.get("collect_errors", []):
        con.rule(_text(f"invalid scenario file: {e.get('file')}", "bold red"))
        con.print(_text(e.get("message", "")))
    s = rep["summary"]
    parts = [f"{s[k]} {k}" for k in ("passed", "failed", "error", "skipped") if s.get(k)]
    if s.get("collect_errors"):
        parts.append(f"{s['collect_errors']} invalid files")
    bad = s.get("failed") or s.get("error") or s.get("collect_errors")
    con.print(_text(", ".join(parts) or "no scenario cases ran", "bold red" if bad else
                    "bold green"))
    started = [c.get("started") or {} for c in rep.get("cases", [])
               if c.get("start") == "fork"]
    if started:
        forked = sum(int(st.get("fork", 0)) for st in started)
        fresh = sum(len(st.get("fresh_because", {})) for st in started)
        servers = [w for st in started for w in (st.get("servers") or {}).values()]
        warm = sum(1 for w in servers if w == "warm")
        con.print(_text(f"start: fork in {len(started)} case{'s' * (len(started) != 1)}: "
                        f"{forked} ranks forked, {fresh} fresh with the reason in the report "
                        f"(started.fresh_because); fork servers: {warm} of {len(servers)} warm "
                        "(forked from the session's zygote; why not: "
                        "started.server_fresh_because)", "dim"))
    mem = [c["harness_memory"] for c in rep.get("cases", []) if c.get("harness_memory")]
    if mem:
        top = max(mem, key=lambda m: m.get("supervisor_mb", 0) + m.get("servers_mb", 0))
        con.print(_text(f"harness memory: {top['per_rank_mb']:.1f} MiB per rank (supervisor "
                        f"{top['supervisor_mb']:.0f} MiB + fork servers {top['servers_mb']:.0f}"
                        f" MiB over {top['ranks']} ranks, the largest case)", "dim"))
    tb = rep.get("time") or {}
    if tb.get("ratio"):
        con.print(_text(f"time: {tb['duration']:.0f} s for {tb['inherent']:.0f} s of the "
                        f"scenarios' own waits (each run from its start line to its end) over "
                        f"{tb['workers']} worker{'s' * (tb['workers'] != 1)}: "
                        f"{tb['ratio']:.2f}x", "dim"))
    if tb.get("over_floor"):
        con.print(_text(f"floor: {tb['floor']:.0f} s, the larger of the longest case "
                        f"({tb['longest_case']:.0f} s) and the CPU the session's processes "
                        f"used ({tb['cpu_s']:.0f} s over {tb['cores']} cores): wall / floor "
                        f"{tb['over_floor']:.2f}x", "dim"))


def _cpu_used() -> float:
    """CPU seconds (user and system) of this process and of every process it started and
    reaped, with theirs (pytest-xdist workers, ranks, fork servers, services)."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def cmd_run(args: argparse.Namespace) -> int:
    paths = scenario_paths(args)
    files = find_scenarios(paths)
    if not files:
        raise UsageError(f"no scenario files (*.yaml, *.yml) under {' '.join(paths)}")
    for f in files:
        if not f.is_file():   # named explicitly: pytest would only say "not found"
            raise UsageError(f"{f}: not a regular file (a FIFO, a device or a broken symlink?)")
    if args.n is not None:
        try:
            import xdist  # noqa: F401
        except ImportError:
            raise UsageError("-n needs pytest-xdist: pip install pytest-xdist") from None
    if args.report is not None:
        return _run_pytest(args, files, args.report, None)
    from .machine.rundir import own_folder

    # an owned folder in the state folder, not a bare temp dir: a SIGKILLed command (no
    # finally) leaves it to the next run's sweep
    with own_folder() as own:
        return _run_pytest(args, files, str(own / "report.json"), str(own))


def _selection_args(args: argparse.Namespace, files: List[Path]) -> List[str]:
    """The paths and the -k / -m / --smoke selection as ``harness run`` hands them to pytest;
    ``harness list -k`` collects with the same, so both select the same cases."""
    pargs: List[str] = [str(f) for f in files]
    if getattr(args, "builtin", False):
        # the catalog as a folder: its cases are named relative to it (FILE.yaml::CASE), as a
        # file named alone would be "::CASE" outside the rootdir; the current folder is the
        # rootdir: evidence goes there, never inside an installed package, and the user's
        # folders keep their ids
        from .scenario.catalog import require_builtin

        cat = require_builtin().resolve()
        pargs = [str(cat)] + [p for p in pargs if cat not in Path(p).resolve().parents]
        pargs += ["--rootdir", os.getcwd()]
    if getattr(args, "k", None):
        pargs += ["-k", args.k]
    if getattr(args, "m", None) or getattr(args, "smoke", False):
        # --smoke: the catalog's smoke tier (the cases marked smoke), within any -m given
        expr = " and ".join(f"({e})" for e in (args.m, "smoke" if getattr(args, "smoke", False)
                                               else None) if e)
        pargs += ["-m", expr]
    return pargs


def _run_pytest(args: argparse.Namespace, files: List[Path], report_path: str,
                tmpdir: Optional[str]) -> int:
    import contextlib
    import io

    import pytest

    from .machine import interrupts
    from .reports import report as report_mod

    pargs = _selection_args(args, files)
    # --assert=plain: scenario items assert nothing, and pytest would otherwise rewrite every
    # module of every pytest11 plugin's distribution (~200 here, 1-2 s of CPU per process and
    # per xdist worker, each time where bytecode is not written)
    # pytest's cache (what --lf, --ff and --sw read and every run writes) lives in the current
    # folder's .pytest_cache, whatever pytest takes as its rootdir: never inside an installed
    # package or beside scenario files of someone else's
    pargs += ["-o", f"cache_dir={os.path.join(os.getcwd(), '.pytest_cache')}",
              "--assert=plain", "--capture=sys", "--harness-report", report_path]
    if getattr(args, "lf", False):
        pargs += ["--lf"]
    if getattr(args, "ff", False):
        pargs += ["--ff"]
    if getattr(args, "sw", False):
        pargs += ["--sw"]
    if args.html:
        pargs += ["--harness-html", args.html]
    if args.keep:
        pargs += ["--harness-evidence", args.keep]
    if args.n is not None:
        pargs += ["-n", str(args.n)]
    if args.x:
        pargs += ["-x"]
    if args.repeat:
        pargs += ["--harness-repeat", str(args.repeat)]
    if getattr(args, "start", None):
        pargs += ["--harness-start", args.start]
    if getattr(args, "python", None):
        pargs += ["--harness-python", args.python]
    if getattr(args, "launcher", None):
        pargs += ["--harness-launcher", args.launcher]
    if getattr(args, "shared_dir", None):
        pargs += ["--harness-shared-dir", args.shared_dir]
    pargs += list(getattr(args, "pytest_args", None) or [])
    con = _console()
    progress = _progress_plugin(enabled=not args.no_progress and not args.verbose)
    out = io.StringIO()
    cpu0 = _cpu_used()
    try:
        if args.verbose:
            rc = pytest.main(pargs + ["-v"], plugins=[progress])
        else:
            with contextlib.redirect_stdout(out):
                rc = pytest.main(pargs + ["-q", "--no-header", "-rN"], plugins=[progress])
    finally:
        progress.stop()
    rc = int(rc)
    cpu = _cpu_used() - cpu0
    try:
        rep = report_mod.read(report_path)
    except report_mod.ReportError:
        rep = None
    if rep is not None and rep.get("time"):
        rep["time"] = report_mod.with_floor(rep["time"], rep.get("cases") or [], cpu,
                                            os.cpu_count() or 1)
        report_mod.write(rep, report_path)
    stepped = rc == 2 and getattr(args, "sw", False) and rep is not None \
        and interrupts.interrupted() is None and not rep.get("interrupted") \
        and not (rep.get("summary") or {}).get("collect_errors") \
        and (rep.get("summary") or {}).get("failed", 0) > 0
    if stepped:
        # pytest --sw ends with its "Interrupted" code 2 when it stops at a failing case: here
        # that is a failed run, as -x is, and not an interruption
        rc = 1
    if rep is None or rc in (2, 3, 4):
        # interrupted, internal error or a usage error: pytest's own words matter (but not the
        # report file in our temp folder, which is removed before we exit)
        text = out.getvalue()
        if tmpdir:
            text = "".join(ln for ln in text.splitlines(keepends=True) if tmpdir not in ln)
        sys.stdout.write(text[-6000:])
    if rep is not None and not rep.get("cases") and rep.get("interrupted"):
        pass   # interrupted before any case ended: no empty table
    elif rep is not None and not args.verbose:
        print_summary(rep, con)
    elif rep is not None:
        print_summary(rep, con, show_failures=False)
    if rc == 5:
        con.print(_text("no scenario case was selected (check -k / -m)", "yellow"))
    for label, p in (("report", args.report), ("html", args.html)):
        if p:
            con.print(_text(f"{label}: {p}", "dim"))
    if rep is not None and rep.get("evidence"):
        con.print(_text(f"evidence: {rep['evidence']}", "dim"))
    if interrupts.interrupted() is not None:
        return 130 if interrupts.interrupted() == signal.SIGINT else 143
    return rc


# -- diff and html -------------------------------------------------------------------------------

def _workers(s: str) -> Union[int, str]:
    """``-n``: a number of pytest-xdist workers, or ``auto`` / ``logical`` (xdist's own: as
    many as the machine's CPUs)."""
    if s in ("auto", "logical"):
        return s
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: give a number of workers, or auto") from None
    if v < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return v


def _fraction(s: str) -> float:
    try:
        v = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: give a fraction (0.5) or a percentage (50%)"
                                         ) from None
    if v < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return v


def _seconds(s: str) -> float:
    try:
        v = float(s[:-1]) if s.endswith("s") else float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: give seconds, e.g. 2 or 2s") from None
    if v < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return v


def cmd_diff(args: argparse.Namespace) -> int:
    from .reports import report as report_mod
    from .reports.diff import KINDS, diff_reports, render_table

    try:
        old, new = report_mod.read(args.old), report_mod.read(args.new)
    except report_mod.ReportError as e:
        raise UsageError(str(e)) from None
    ignore = [k.strip() for x in args.ignore for k in x.split(",") if k.strip()]
    bad = [k for k in ignore if k not in KINDS]
    if bad:
        raise UsageError(f"--ignore {','.join(bad)}: unknown change kind; known: "
                         f"{', '.join(KINDS)}")
    res = diff_reports(old, new, rel_tol=args.tolerance, abs_tol=args.abs_tolerance,
                       ignore=ignore)
    if args.json:
        d = res.to_dict()
        d["old"], d["new"] = str(args.old), str(args.new)
        print(json.dumps(d, indent=1, default=str))
    else:
        render_table(res, str(args.old), str(args.new), old.get("environment"),
                     new.get("environment"), console=_console())
    return 1 if res.changes else 0


def cmd_compare(args: argparse.Namespace) -> int:
    from .reports import compare as cmp
    from .reports import report as report_mod
    from .reports.diff import KINDS, diff_reports, render_table
    from .reports.html import write_compare_html

    ignore = [k.strip() for x in args.ignore for k in x.split(",") if k.strip()]
    bad = [k for k in ignore if k not in KINDS]
    if bad:
        raise UsageError(f"--ignore {','.join(bad)}: unknown change kind; known: "
                         f"{', '.join(KINDS)}")
    try:
        sides = [cmp.side("a", args.a, cmp.parse_env(args.env_a)),
                 cmp.side("b", args.b, cmp.parse_env(args.env_b))]
    except cmp.CompareError as e:
        raise UsageError(str(e)) from None
    runs = [s for s in sides if s.python is not None]
    paths: List[str] = []
    if runs:
        paths = list(args.paths)
        if not paths and not args.builtin:
            raise UsageError("an interpreter side runs scenarios: give scenario files or "
                             "folders, or --builtin for the built-in catalog")
        if args.builtin:
            scenario_paths(args)       # a clear error when this installation has no catalog
        if paths:
            find_scenarios(paths)      # a missing path is bad input before anything runs
    elif args.paths or args.builtin or args.repeat or args.smoke:
        raise UsageError("both sides are saved reports: nothing is run (no PATH, --builtin, "
                         "--smoke or --repeat)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    con = _console()
    reports: Dict[str, Dict[str, Any]] = {}
    for s in sides:
        if s.report is not None:
            try:
                reports[s.name] = report_mod.read(s.report)
            except report_mod.ReportError as e:
                raise UsageError(str(e)) from None
    saved = [reports[s.name] for s in sides if s.report is not None]
    if runs and saved and not args.repeat:   # run as often as the saved side ran
        args.repeat = cmp.repeat_of(saved[0]) or None
    for s in sides:
        if s.report is not None:
            continue
        argv = cmp.run_argv(s, paths, out.resolve(), builtin=args.builtin, k=args.k, m=args.m,
                            repeat=args.repeat, n=args.n, start=args.start, keep=None,
                            smoke=args.smoke)
        con.print(_text(f"side {s.name.upper()}: {s.describe()}", "bold"))
        echo = None if args.quiet else (lambda line: con.print(_text("  " + line),
                                                               soft_wrap=True))
        try:
            path = cmp.run_side(s, argv, out, echo=echo)
            reports[s.name] = report_mod.read(path)
        except (cmp.CompareError, report_mod.ReportError) as e:
            from .core.errors import HarnessError
            raise HarnessError(str(e)) from None
    old, new = reports["a"], reports["b"]
    res = diff_reports(old, new, rel_tol=args.tolerance, abs_tol=args.abs_tolerance,
                       ignore=ignore)
    how_sure = cmp.sureness(old, new)
    names = [s.describe() for s in sides]
    d = res.to_dict()
    d.update(a=names[0], b=names[1], how_sure=how_sure)
    cmp.write_json(out / "changes.json", d)
    html = write_compare_html(old, new, res, names[0], names[1], how_sure, out / "compare.html")
    if args.json:
        print(json.dumps(d, indent=1, default=str))
    else:
        render_table(res, "A: " + names[0], "B: " + names[1], old.get("environment"),
                     new.get("environment"), console=con)
        con.print(_text(how_sure, "dim"))
        for s in sides:
            if s.python is not None:
                con.print(_text(f"{s.name.upper()}: {out / (s.name + '.json')}, "
                                f"{out / (s.name + '.html')}", "dim"))
        con.print(_text(f"changes: {out / 'changes.json'}; side by side: {html}", "dim"))
    return 1 if res.changes else 0


def cmd_html(args: argparse.Namespace) -> int:
    from .reports import report as report_mod
    from .reports.html import write_html

    try:
        rep = report_mod.read(args.report)
    except report_mod.ReportError as e:
        raise UsageError(str(e)) from None
    out = args.output or str(Path(args.report).with_suffix(".html"))
    write_html(rep, out)
    _console().print(_text(f"wrote {out}"))
    return 0


# -- doctor --------------------------------------------------------------------------------------

def _free_ports() -> Dict[str, Any]:
    from .machine.ports import HIGH, LOW, ephemeral_range, port_is_free

    eph_lo, eph_hi = ephemeral_range()
    hi = min(HIGH, eph_lo - 1)
    free = sum(1 for p in range(LOW, hi + 1) if port_is_free(p)) if hi >= LOW else 0
    return {"range": [LOW, hi], "free": free, "size": max(0, hi - LOW + 1),
            "ephemeral": [eph_lo, eph_hi]}


def _ptrace_ok() -> Dict[str, Any]:
    try:
        scope = int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        scope = None
    caps = 0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                caps = int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    cap_ptrace = bool(caps >> 19 & 1)
    return {"ptrace_scope": scope, "cap_sys_ptrace": cap_ptrace,
            "allowed": cap_ptrace or os.geteuid() == 0 or scope in (0, None)}


REQUIREMENTS_OK: Dict[str, str] = {}   # what having a requirement means, for the doctor's lines


def doctor_facts() -> Dict[str, Any]:
    from .machine.rundir import leftovers
    from .machine.torch_probe import probe

    env = dict(probe())
    facts: Dict[str, Any] = {"torch": env, "root": os.geteuid() == 0, "euid": os.geteuid()}
    from .judge.pyspy import executable as _py_spy

    facts["tools"] = {t: shutil.which(t) for t in ("ip", "nft", "chromium")}
    facts["tools"]["py-spy"] = _py_spy()   # also the one beside this Python (a venv)
    try:
        from .net import topology
        facts["topology_missing"] = topology.missing()
        prefix = getattr(topology, "PREFIX", "thx-")
        try:
            names = topology._list_netns()
        except Exception:  # noqa: BLE001 - only a hint for the reader
            names = []
        facts["namespaces"] = [n for n in names if n.startswith(prefix)]
    except ImportError:
        facts["topology_missing"] = ["harness.net.topology is not installed"]
        facts["namespaces"] = []
    from .run.requirements import all_requirements

    reqs = all_requirements()
    facts["requirements"] = {r.name: r.missing() for r in reqs}
    facts["resolver_view_missing"] = facts["requirements"].get("resolver view")
    REQUIREMENTS_OK.update({r.name: r.ok for r in reqs if r.ok})
    facts["ptrace"] = _ptrace_ok()
    facts["ports"] = _free_ports()
    facts["leftovers"] = leftovers()
    from .machine import cgroups
    facts["cgroups"] = [str(p) for p in cgroups.run_cgroups()]
    try:
        import xdist  # noqa: F401
        facts["xdist"] = True
    except ImportError:
        facts["xdist"] = False
    return facts


def cmd_doctor(args: argparse.Namespace) -> int:
    con = _console()
    cleaned: Dict[str, List[str]] = {}
    if args.clean:
        from .machine import cgroups
        from .machine.rundir import sweep
        cleaned["cgroups"] = cgroups.sweep()   # while the run directories say which are dead
        cleaned["run directories"] = sweep()
        try:
            from .net import topology
            if not topology.missing():
                cleaned["namespaces"] = topology.sweep()
        except ImportError:
            pass
    facts = doctor_facts()
    if args.json:
        print(json.dumps({**facts, "cleaned": cleaned}, indent=1, default=str))
        return 0 if facts["torch"].get("torch") not in (None, "none") else 1
    t = facts["torch"]
    ok, warn, bad = "✓", "!", "✗"
    lines: List[tuple] = []
    if t.get("torch") in (None, "none"):
        lines.append((bad, "torch", f"not importable by {sys.executable}: {t.get('error', '')}"))
    else:
        lines.append((ok, "torch", f"{t['torch']} (git {str(t.get('torch_git'))[:12]}) · "
                      f"Python {t.get('python')}"))
        lines.append((ok if t.get("gloo") else bad, "gloo",
                      "available" if t.get("gloo") else "missing: gloo scenarios are skipped"))
        nccl = "available" + (f" (NCCL {t['nccl_version']})" if t.get("nccl_version") else "") \
            + f", {t.get('gpus', 0)} GPU(s)" if t.get("nccl") else \
            "missing (a CPU build): nccl scenarios are skipped"
        lines.append((ok if t.get("nccl") and t.get("gpus") else warn, "nccl", nccl))
        lines.append((ok if t.get("mpi") else warn, "mpi",
                      "available" if t.get("mpi") else "not built in (not used by scenarios)"))
        lines.append((ok, "libuv store", "default" if t.get("libuv_store_default") else
                      "not the default (torch < 2.4 or USE_LIBUV=0)"))
    lines.append((ok if facts["root"] else warn, "root", "yes" if facts["root"] else
                  f"no (euid {facts['euid']}): network scenarios are skipped"))
    for tool in ("ip", "nft"):
        p = facts["tools"][tool]
        lines.append((ok if p else warn, tool, p or "not found: apt-get install "
                      + ("nftables" if tool == "nft" else "iproute2")))
    miss = facts["topology_missing"]
    lines.append((ok if not miss else warn, "namespaces", "network scenarios can run" if not miss
                  else "network scenarios are skipped: " + "; ".join(miss)))
    # what the scenario kinds need (the faults declare it: harness.requirements)
    for name, why in facts["requirements"].items():
        if name == "namespaces":
            continue
        if name == "resolver view":
            text = why + ": scenarios that run in this machine's own network namespace are " \
                "skipped" if why else "ranks resolve names with the harness's hosts file, " \
                "never DNS"
        else:
            text = why + ": scenarios that need it are skipped" if why else \
                REQUIREMENTS_OK.get(name, "available")
        lines.append((ok if not why else warn, name, text))
    spy, pt = facts["tools"]["py-spy"], facts["ptrace"]
    if spy and pt["allowed"]:
        lines.append((ok, "py-spy", f"{spy}: native stacks of hung ranks are captured"))
    elif spy:
        lines.append((warn, "py-spy", f"{spy}, but ptrace is not permitted (ptrace_scope "
                      f"{pt['ptrace_scope']}, no CAP_SYS_PTRACE): no native stacks"))
    else:
        lines.append((warn, "py-spy", "not found (pip install py-spy): hung ranks get Python "
                      "stacks only"))
    lines.append((ok if facts["xdist"] else warn, "pytest-xdist", "installed (-n N works)"
                  if facts["xdist"] else "not installed: `harness run -n` is unavailable"))
    pr = facts["ports"]
    lines.append((ok if pr["free"] > 100 else bad, "ports",
                  f"{pr['free']} of {pr['size']} free in {pr['range'][0]}..{pr['range'][1]} "
                  f"(below the ephemeral range {pr['ephemeral'][0]}..{pr['ephemeral'][1]})"))
    left = facts["leftovers"]
    lines.append((ok if not left else warn, "leftovers",
                  "none" if not left else f"{len(left)} run directories of dead runs "
                  "(`harness doctor --clean` removes them)"))
    if facts["namespaces"]:
        lines.append((warn, "namespaces", f"{len(facts['namespaces'])} harness namespaces exist "
                      "(live runs keep theirs; --clean removes those of dead runs)"))
    if facts["cgroups"]:
        lines.append((warn, "cgroups", f"{len(facts['cgroups'])} harness cgroups exist (live "
                      "runs keep theirs; --clean removes those of dead runs)"))
    from rich.table import Table

    tab = Table(show_header=False, box=None)
    tab.add_column("")
    tab.add_column("", style="bold")
    tab.add_column("", overflow="fold")
    style = {ok: "green", warn: "yellow", bad: "bold red"}
    for mark, name, text in lines:
        tab.add_row(_text(mark, style[mark]), _text(name), _text(text))
    con.print(tab)
    for p in left:
        con.print(_text(f"  leftover: {p}", "dim"))
    for what, items in cleaned.items():
        con.print(_text(f"cleaned {what}: {', '.join(items) if items else 'nothing to clean'}"))
    return 0 if t.get("torch") not in (None, "none") else 1


# -- schema and new ------------------------------------------------------------------------------

def cmd_schema(args: argparse.Namespace) -> int:
    from .scenario.loader import json_schema

    text = json.dumps(json_schema(), indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n")
        _console(stderr=True).print(_text(f"wrote {args.output}"))
    else:
        print(text)
    return 0


def cmd_new(args: argparse.Namespace) -> int:
    import re

    from .scenario.templates import new_scenario

    if not re.match(r"^[A-Za-z0-9_.-]+$", args.name):
        raise UsageError(f"{args.name!r}: a scenario name may use letters, digits, . _ - only")
    text = new_scenario(args.name)
    if args.output in (None, "-"):
        sys.stdout.write(text)
        return 0
    out = Path(args.output)
    if out.exists() and not args.force:
        raise UsageError(f"{out} exists (use --force to overwrite)")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    _console(stderr=True).print(_text(f"wrote {out}: fill in the TODOs, then `harness validate "
                                      f"{out}` and `harness run {out}`"))
    return 0


# -- the parser ----------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .reports.diff import DEFAULT_ABS_TOL, DEFAULT_REL_TOL

    p = argparse.ArgumentParser(
        prog="harness", description="torchdist-harness: fault-injection scenarios for PyTorch "
        "distributed start-up. See docs/reports-and-cli.md.")
    p.add_argument("--version", action="version", version=f"torchdist-harness {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    r = sub.add_parser("run", help="run scenarios (pytest with the harness plugin)",
                       description="Run scenario files or folders; print a summary table. "
                       "Arguments after -- go to pytest unchanged. Exit code: pytest's.")
    r.add_argument("paths", nargs="*", metavar="PATH", help="scenario files or folders")
    r.add_argument("--builtin", action="store_true", help="run the built-in catalog (shipped "
                   "with the package), before any PATH given")
    r.add_argument("-k", metavar="EXPR", help="only cases whose id/keywords match (pytest -k); "
                   "fault kinds, backend and init method are keywords")
    r.add_argument("-m", metavar="MARKEXPR", help="only cases whose marks match (pytest -m)")
    r.add_argument("--smoke", action="store_true", help="only the smoke tier: the catalog's "
                   "cases marked smoke, every fault kind, launcher, init method, service and "
                   "workload step at least once (pytest -m smoke)")
    r.add_argument("--report", metavar="PATH", help="write the JSON session report here")
    r.add_argument("--html", metavar="PATH", help="write the self-contained HTML report here")
    r.add_argument("--keep", metavar="DIR", help="keep every run's evidence under DIR (default: "
                   ".harness/evidence under pytest's rootdir)")
    r.add_argument("-n", type=_workers, metavar="N", help="run N scenarios at a time "
                   "(pytest-xdist; auto: one per CPU)")
    r.add_argument("-x", action="store_true", help="stop at the first failing case")
    r.add_argument("--lf", "--last-failed", dest="lf", action="store_true", help="run only "
                   "the cases that failed last time (pytest --lf; the cache is ./.pytest_cache)")
    r.add_argument("--ff", "--failed-first", dest="ff", action="store_true", help="run the "
                   "cases that failed last time first, then the rest (pytest --ff)")
    r.add_argument("--sw", "--stepwise", dest="sw", action="store_true", help="stop at the "
                   "first failing case and start from it next time (pytest --sw; exit code 1 "
                   "when it stopped there, as -x)")
    r.add_argument("--start", choices=("fresh", "fork"), help="how ranks start, overriding "
                   "the scenarios' start: (fork: from a per-host server that imported torch)")
    r.add_argument("--repeat", type=int, metavar="N", help="run every case N times: outcome "
                   "frequencies per rank, frequency bounds checked, flaky cases named")
    r.add_argument("--python", metavar="PATH", help="run the ranks (and torchrun agents, "
                   "spawning parents) with this interpreter: another venv's or image's python")
    r.add_argument("--launcher", choices=("slurm",), help="slurm: inside a Slurm allocation, "
                   "start every case's ranks with srun across its nodes (host i = node i); "
                   "what needs root on the nodes is skipped with the reason")
    r.add_argument("--shared-dir", metavar="DIR", help="with --launcher slurm: where run "
                   "directories go, a folder every node of the allocation sees")
    r.add_argument("-v", "--verbose", action="store_true", help="show pytest's own output "
                   "live (no progress bar)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar or lines")
    r.set_defaults(func=cmd_run)

    v = sub.add_parser("validate", help="check scenario files; every problem with file:line",
                       description="Check scenario files without running them. Exit 1 if any "
                       "file is invalid.")
    v.add_argument("paths", nargs="*", metavar="PATH")
    v.add_argument("--builtin", action="store_true", help="the built-in catalog too")
    v.add_argument("-q", "--quiet", action="store_true", help="print only the problems")
    v.add_argument("--strict", action="store_true", help="also fail on expectations no run "
                   "can contradict outside a race case: several outcomes on a row, a job "
                   "allowing ok and a failure, a vacuous window, a failing row pinned only by "
                   "cause")
    v.set_defaults(func=cmd_validate)

    ls = sub.add_parser("list", help="list scenario cases: ids, marks, faults, expectations")
    ls.add_argument("paths", nargs="*", metavar="PATH")
    ls.add_argument("--builtin", action="store_true", help="the built-in catalog too")
    ls.add_argument("-k", metavar="EXPR", help="only cases whose id/keywords match, as "
                    "`harness run -k` selects them (pytest -k); fault kinds, backend and init "
                    "method are keywords")
    ls.add_argument("-m", metavar="MARKEXPR", help="only cases whose marks match (pytest -m)")
    ls.add_argument("--smoke", action="store_true", help="only the smoke tier (pytest -m "
                    "smoke), as `harness run --smoke`")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=cmd_list)

    sh = sub.add_parser("show", help="the expanded run plan of a scenario",
                        description="Hosts, ranks (env, init, start delay), faults, port "
                        "holders, timed actions, deadline and expectations, as the harness "
                        "would run it here. Ports are reserved briefly from the harness's range.")
    sh.add_argument("file", metavar="FILE")
    sh.add_argument("--case", metavar="ID", help="only this case of a file with cases:")
    sh.add_argument("--json", action="store_true", help="the plan(s) as JSON")
    sh.set_defaults(func=cmd_show)

    ex = sub.add_parser("explain", help="the diagnosis of a kept run: one line of cause per "
                        "rank, its evidence, identical stacks grouped")
    ex.add_argument("dir", help="a case's evidence folder (holding observation.json)")
    ex.set_defaults(func=cmd_explain)

    d = sub.add_parser("diff", help="behaviour changes between two JSON reports",
                       description="Compare two session reports case by case and rank by rank. "
                       "Exit 0: no behaviour change; 1: changes found; 2: bad input.")
    d.add_argument("old", metavar="OLD.json")
    d.add_argument("new", metavar="NEW.json")
    d.add_argument("--tolerance", type=_fraction, default=DEFAULT_REL_TOL, metavar="REL",
                   help="relative duration tolerance, e.g. 0.5 or 50%% (default 50%%)")
    d.add_argument("--abs-tolerance", type=_seconds, default=DEFAULT_ABS_TOL, metavar="SECONDS",
                   help=f"absolute duration tolerance (default {DEFAULT_ABS_TOL:g} s); a duration"
                   " changed only when beyond both")
    d.add_argument("--ignore", action="append", default=[], metavar="KIND[,KIND]",
                   help="do not count these change kinds (e.g. duration,family)")
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.set_defaults(func=cmd_diff)

    c = sub.add_parser("compare", help="the same scenarios under two interpreters/images (or "
                       "two saved reports): one table of behaviour changes",
                       description="A and B: each a saved JSON report, or an interpreter (a "
                       "python, a venv folder) to run the scenarios with. Both run the same "
                       "scenarios, selection and repeat count; writes a.json/a.html, b.json/"
                       "b.html, changes.json and compare.html (side by side) into --out. "
                       "Exit 0: no behaviour change; 1: changes; 2: bad input; 3: a side's run "
                       "failed.")
    c.add_argument("a", metavar="A", help="the accepted side: report.json, python or venv")
    c.add_argument("b", metavar="B", help="the candidate side: report.json, python or venv")
    c.add_argument("paths", nargs="*", metavar="PATH", help="scenario files or folders to run")
    c.add_argument("--builtin", action="store_true", help="run the built-in catalog too")
    c.add_argument("-k", metavar="EXPR", help="only cases whose id/keywords match (pytest -k)")
    c.add_argument("-m", metavar="MARKEXPR", help="only cases whose marks match (pytest -m)")
    c.add_argument("--smoke", action="store_true", help="only the smoke tier, on both sides "
                   "(as harness run --smoke)")
    c.add_argument("--repeat", type=int, metavar="N", help="run every case N times per side: "
                   "frequencies compared with Fisher's exact test instead of one draw each")
    c.add_argument("-n", type=_workers, metavar="N", help="N scenarios at a time "
                   "(pytest-xdist; auto: one per CPU)")
    c.add_argument("--start", choices=("fresh", "fork"), help="how ranks start on both sides "
                   "(an interpreter side runs its ranks fresh in any case)")
    c.add_argument("--env-a", action="append", default=[], metavar="KEY=VALUE",
                   help="an environment variable of side A's run (as an image's ENV would set)")
    c.add_argument("--env-b", action="append", default=[], metavar="KEY=VALUE",
                   help="an environment variable of side B's run")
    c.add_argument("--out", default="harness-compare", metavar="DIR",
                   help="where the reports, logs and compare.html go (default harness-compare)")
    c.add_argument("--tolerance", type=_fraction, default=DEFAULT_REL_TOL, metavar="REL",
                   help="relative duration tolerance (default 50%%)")
    c.add_argument("--abs-tolerance", type=_seconds, default=DEFAULT_ABS_TOL, metavar="SECONDS",
                   help=f"absolute duration tolerance (default {DEFAULT_ABS_TOL:g} s)")
    c.add_argument("--ignore", action="append", default=[], metavar="KIND[,KIND]",
                   help="do not count these change kinds (e.g. duration)")
    c.add_argument("-q", "--quiet", action="store_true", help="do not echo the sides' runs")
    c.add_argument("--json", action="store_true", help="the changes as JSON on stdout")
    c.set_defaults(func=cmd_compare)

    h = sub.add_parser("html", help="render the HTML report from a JSON report")
    h.add_argument("report", metavar="REPORT.json")
    h.add_argument("-o", "--output", metavar="OUT.html", help="default: REPORT.html")
    h.set_defaults(func=cmd_html)

    doc = sub.add_parser("doctor", help="what this machine can run; leftovers of killed runs")
    doc.add_argument("--clean", action="store_true", help="remove leftovers of dead runs "
                     "(run directories, their processes, network namespaces)")
    doc.add_argument("--json", action="store_true", help="machine-readable output")
    doc.set_defaults(func=cmd_doctor)

    s = sub.add_parser("schema", help="print the JSON Schema of scenario files")
    s.add_argument("-o", "--output", metavar="FILE", help="write it to FILE")
    s.set_defaults(func=cmd_schema)

    pf = sub.add_parser("preflight", help="check the nodes of a Slurm allocation before a job "
                        "(names, gloo's interface, reachability, versions, a real all_reduce)",
                        description="Run inside an allocation (salloc -N4 harness preflight): "
                        "starts one task per node with srun; or as that task (srun "
                        "--ntasks-per-node=1 harness preflight --task --dir SHARED). Exit 0 only "
                        "when every node passes.")
    from .tools import preflight as _pf

    _pf.add_arguments(pf)
    pf.set_defaults(func=cmd_preflight)

    n = sub.add_parser("new", help="a commented template scenario for reproducing a hang")
    n.add_argument("name", metavar="NAME", help="the scenario's name (letters, digits, . _ -)")
    n.add_argument("-o", "--output", metavar="FILE", help="write to FILE (default: stdout)")
    n.add_argument("--force", action="store_true", help="overwrite FILE")
    n.set_defaults(func=cmd_new)
    _add_capture(sub)

    from .tools import explore  # `harness explore`: parser and command in tools/explore
    explore.add_parser(sub)
    return p


# -- capture: a user's own launch command turned into a scenario (harness.capturelaunch) -------

def _add_capture(sub: Any) -> None:
    cp = sub.add_parser("capture", help="run your own launch command under observation and "
                        "write a scenario file that reproduces it",
                        description="harness capture -o FILE.yaml [--deadline S] -- COMMAND: "
                        "torchrun ..., python -m torch.distributed.run ..., python train.py "
                        "(NAME=VALUE prefixes allowed). Runs the launch as written, then the "
                        "scenario --runs times, each run in its own copy of the working folder, "
                        "and writes what was observed into its expect:. Exit 1: a replay does "
                        "not reproduce the launch (said why; no file written). Exit 2: a "
                        "command capture does not understand, or a folder too large to copy.")
    cp.add_argument("-o", "--output", required=True, metavar="FILE.yaml",
                    help="the scenario file to write (its folder: where paths are relative to)")
    cp.add_argument("--name", metavar="NAME", help="the scenario's name (default captured_SCRIPT)")
    cp.add_argument("--deadline", type=_seconds, default=60.0, metavar="S",
                    help="a rank alive S s after the start is a hang: its stacks are taken and "
                    "it is killed (default 60)")
    cp.add_argument("--runs", type=int, default=2, metavar="N",
                    help="runs: the first observes, the others check the written file and "
                    "widen it where torch raced (default 2)")
    cp.add_argument("--world-size", type=int, metavar="N", help="python SCRIPT.py: how many "
                    "ranks run it (default: WORLD_SIZE of the command, else 1)")
    cp.add_argument("--keep-env", action="append", default=[], metavar="NAME",
                    help="write this variable too (one not on the allow-list: your program's "
                    "own; never a secret). Without it, a variable set on the command line is "
                    "absent from every replay")
    cp.add_argument("-v", "--verbose", action="store_true", help="show each run's own output")
    cp.set_defaults(func=cmd_capture)


def cmd_capture(args: argparse.Namespace) -> int:
    from .tools.capture import capture

    command = list(args.pytest_args or [])
    if not command:
        raise UsageError("give the launch command after --: harness capture -o FILE.yaml -- "
                         "torchrun --nproc-per-node 2 train.py")
    if args.runs < 1 or (args.world_size is not None and args.world_size < 1):
        raise UsageError("--runs and --world-size: 1 or more")
    return capture(command, Path(args.output), name=args.name, deadline=args.deadline,
                   runs=args.runs, world_size=args.world_size, keep_env=tuple(args.keep_env),
                   verbose=args.verbose)


def cmd_preflight(args: argparse.Namespace) -> int:
    from .tools import preflight

    return preflight.run(args)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: List[str] = []
    if "--" in argv:   # `harness run PATHS -- PYTEST_ARGS`: the rest goes to pytest unchanged
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    args, rest = parser.parse_known_args(argv)
    if rest and getattr(args, "paths", None) is not None and \
            not any(r.startswith("-") for r in rest):
        args.paths = list(args.paths) + rest   # paths after an option (`compare A B --env-b X P`)
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if extra and args.command not in ("run", "capture"):   # capture: the user's command
        parser.error("arguments after -- are passed to pytest, only by `harness run`")
    args.pytest_args = extra
    from .core.errors import HarnessError
    from .machine import interrupts

    owner = interrupts.install()
    try:
        try:
            return int(args.func(args))
        except UsageError as e:
            _console(stderr=True).print(_text(f"harness {args.command}: {e}", "bold red"))
            return 2
        except HarnessError as e:
            _console(stderr=True).print(_text(f"harness {args.command}: harness error: {e}",
                                              "bold red"))
            return 3
        except KeyboardInterrupt:
            return 130
    finally:
        sig = interrupts.interrupted()
        if owner and sig is not None:
            print(interrupts.final_line() or interrupts.summary(), flush=True)
        if owner:
            interrupts.uninstall()
            if sig is not None:
                interrupts.reraise(sig)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""``harness run``: pytest with the harness plugin, the arguments it is handed, a progress bar
(or a line per case), and the summary table read back from the JSON report. SIGINT and SIGTERM
end it as one Ctrl-C would (exit status 130 and 143, ``main`` re-raises the signal)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ..core.errors import UsageError
from .common import _console, _selection_args, _text, _workers, find_scenarios, scenario_paths


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
    from ..core.protocol import row_name

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
    from ..machine.rundir import own_folder

    # an owned folder in the state folder, not a bare temp dir: a SIGKILLed command (no
    # finally) leaves it to the next run's sweep
    with own_folder() as own:
        return _run_pytest(args, files, str(own / "report.json"), str(own))


def add_run(sub: Any) -> None:
    """``harness run``: its options."""
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


def _pytest_args(args: argparse.Namespace, files: List[Path], report_path: str) -> List[str]:
    """pytest's command line for ``harness run``: the selection, the harness plugin's options
    and whatever came after ``--``."""
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
    return pargs


def _run_pytest(args: argparse.Namespace, files: List[Path], report_path: str,
                tmpdir: Optional[str]) -> int:
    import contextlib
    import io

    import pytest

    from ..machine import interrupts

    pargs = _pytest_args(args, files, report_path)
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
    rep = _report_with_floor(report_path, _cpu_used() - cpu0)
    if _stopped_stepwise(args, rc, rep):
        # pytest --sw ends with its "Interrupted" code 2 when it stops at a failing case: here
        # that is a failed run, as -x is, and not an interruption
        rc = 1
    _print_outcome(args, con, rep, rc, out.getvalue(), tmpdir)
    if interrupts.interrupted() is not None:
        return 130 if interrupts.interrupted() == signal.SIGINT else 143
    return rc


def _report_with_floor(report_path: str, cpu: float) -> Optional[Dict[str, Any]]:
    """The session's report as the plugin wrote it (None: none was written), its time given
    the floor the CPU the session used sets (written back)."""
    from ..reports import report as report_mod

    try:
        rep = report_mod.read(report_path)
    except report_mod.ReportError:
        rep = None
    if rep is not None and rep.get("time"):
        rep["time"] = report_mod.with_floor(rep["time"], rep.get("cases") or [], cpu,
                                            os.cpu_count() or 1)
        report_mod.write(rep, report_path)
    return rep


def _stopped_stepwise(args: argparse.Namespace, rc: int, rep: Optional[Dict[str, Any]]) -> bool:
    """Whether pytest's exit code 2 is ``--sw`` stopping at a failing case, not a signal."""
    from ..machine import interrupts

    return bool(rc == 2 and getattr(args, "sw", False) and rep is not None
                and interrupts.interrupted() is None and not rep.get("interrupted")
                and not (rep.get("summary") or {}).get("collect_errors")
                and (rep.get("summary") or {}).get("failed", 0) > 0)


def _print_outcome(args: argparse.Namespace, con: Any, rep: Optional[Dict[str, Any]], rc: int,
                   output: str, tmpdir: Optional[str]) -> None:
    """What ``harness run`` prints after pytest: pytest's own words where they matter, the
    summary table, and where the report, the HTML and the evidence are."""
    if rep is None or rc in (2, 3, 4):
        # interrupted, internal error or a usage error: pytest's own words matter (but not the
        # report file in our temp folder, which is removed before we exit)
        text = output
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

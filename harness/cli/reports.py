"""The commands over JSON reports: ``harness diff`` (behaviour changes between two reports),
``harness compare`` (the same scenarios under two interpreters, or two saved reports, side by
side: harness.reports.compare) and ``harness html`` (the HTML report of a JSON one)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Dict, List

from ..core.errors import UsageError
from .common import _console, _fraction, _seconds, _text, _workers, find_scenarios, scenario_paths


def _add_change_options(p: Any, *, more: bool) -> None:
    """What diff and compare count as a behaviour change: ``--tolerance``, ``--abs-tolerance``
    and ``--ignore`` (``more``: diff's help, which says a little more)."""
    from ..reports.diff import DEFAULT_ABS_TOL, DEFAULT_REL_TOL

    p.add_argument("--tolerance", type=_fraction, default=DEFAULT_REL_TOL, metavar="REL",
                   help="relative duration tolerance" + (", e.g. 0.5 or 50%%" if more else "")
                   + " (default 50%%)")
    p.add_argument("--abs-tolerance", type=_seconds, default=DEFAULT_ABS_TOL, metavar="SECONDS",
                   help=f"absolute duration tolerance (default {DEFAULT_ABS_TOL:g} s)"
                   + ("; a duration changed only when beyond both" if more else ""))
    p.add_argument("--ignore", action="append", default=[], metavar="KIND[,KIND]",
                   help="do not count these change kinds (e.g. duration"
                   + (",family" if more else "") + ")")


def _ignored(args: argparse.Namespace) -> List[str]:
    """The change kinds ``--ignore`` names (each option a comma-separated list); an unknown
    one is bad input."""
    from ..reports.diff import KINDS

    ignore = [k.strip() for x in args.ignore for k in x.split(",") if k.strip()]
    bad = [k for k in ignore if k not in KINDS]
    if bad:
        raise UsageError(f"--ignore {','.join(bad)}: unknown change kind; known: "
                         f"{', '.join(KINDS)}")
    return ignore


def cmd_diff(args: argparse.Namespace) -> int:
    from ..reports import report as report_mod
    from ..reports.diff import diff_reports, render_table

    try:
        old, new = report_mod.read(args.old), report_mod.read(args.new)
    except report_mod.ReportError as e:
        raise UsageError(str(e)) from None
    ignore = _ignored(args)
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


def add_diff(sub: Any) -> None:
    """``harness diff``: its options."""
    d = sub.add_parser("diff", help="behaviour changes between two JSON reports",
                       description="Compare two session reports case by case and rank by rank. "
                       "Exit 0: no behaviour change; 1: changes found; 2: bad input.")
    d.add_argument("old", metavar="OLD.json", help="the report of the accepted run")
    d.add_argument("new", metavar="NEW.json", help="the report of the candidate run")
    _add_change_options(d, more=True)
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.set_defaults(func=cmd_diff)


def cmd_compare(args: argparse.Namespace) -> int:
    from ..reports import compare as cmp
    from ..reports import report as report_mod
    from ..reports.diff import diff_reports, render_table
    from ..reports.html import write_compare_html

    ignore = _ignored(args)
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
            from ..core.errors import HarnessError
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


def add_compare(sub: Any) -> None:
    """``harness compare``: its options."""
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
    _add_change_options(c, more=False)
    c.add_argument("-q", "--quiet", action="store_true", help="do not echo the sides' runs")
    c.add_argument("--json", action="store_true", help="the changes as JSON on stdout")
    c.set_defaults(func=cmd_compare)


def cmd_html(args: argparse.Namespace) -> int:
    from ..reports import report as report_mod
    from ..reports.html import write_html

    try:
        rep = report_mod.read(args.report)
    except report_mod.ReportError as e:
        raise UsageError(str(e)) from None
    out = args.output or str(Path(args.report).with_suffix(".html"))
    write_html(rep, out)
    _console().print(_text(f"wrote {out}"))
    return 0


def add_html(sub: Any) -> None:
    """``harness html``: its options."""
    h = sub.add_parser("html", help="render the HTML report from a JSON report")
    h.add_argument("report", metavar="REPORT.json",
                   help="a JSON report (e.g. an artifact of CI)")
    h.add_argument("-o", "--output", metavar="OUT.html", help="default: REPORT.html")
    h.set_defaults(func=cmd_html)

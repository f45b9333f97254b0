"""The commands over scenario files that run nothing: ``harness validate`` (every problem with
file:line; ``--strict``: expectations no run can contradict), ``harness list`` (the cases, with
the selection ``harness run`` would make), ``harness schema`` (the JSON Schema of the format)
and ``harness new`` (a commented template)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List

from ..core.errors import UsageError
from .common import _console, _selection_args, _text, find_scenarios, scenario_paths


def cmd_validate(args: argparse.Namespace) -> int:
    from ..scenario.determinism import widenings
    from ..scenario.loader import Problem, ScenarioFileError, item_name, load_file, one_line

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
            line(f"✗ {f}: {_strict_heading(found)}", "bold red")
        elif not args.quiet:
            line(f"✓ {f} ({len(loaded)} case{'s' * (len(loaded) != 1)})", "green")
        if args.strict:
            for scn, w in found:
                line(f"  {Problem(str(f), w.line, w.field, f'{item_name(scn)}: {w.message}')}")
    summary = (f"{len(files)} file{'s' * (len(files) != 1)}, {cases} case"
               f"{'s' * (cases != 1)}")
    if widened and not args.strict:
        con.print(_text(f"{widened} case{'s' * (widened != 1)} with an expectation no run can "
                        "contradict or an about: that still holds the template's TODO "
                        "(harness validate --strict lists them)", "yellow"))
    if bad:
        con.print(_text(f"{bad} invalid file{'s' * (bad != 1)} ({problems} "
                        f"problem{'s' * (problems != 1)}) of "
                        f"{summary}", "bold red"))
        return 1
    con.print(_text(f"all valid: {summary}", "bold green"))
    return 0


def add_validate(sub: Any) -> None:
    """``harness validate``: its options."""
    v = sub.add_parser("validate", help="check scenario files; every problem with file:line",
                       description="Check scenario files without running them. Exit 1 if any "
                       "file is invalid.")
    v.add_argument("paths", nargs="*", metavar="PATH", help="scenario files or folders")
    v.add_argument("--builtin", action="store_true", help="the built-in catalog too")
    v.add_argument("-q", "--quiet", action="store_true", help="print only the problems")
    v.add_argument("--strict", action="store_true", help="also fail on expectations no run "
                   "can contradict outside a race case: several outcomes on a row, a job "
                   "allowing ok and a failure, a vacuous window, a failing row pinned only by "
                   "cause")
    v.set_defaults(func=cmd_validate)


def cmd_list(args: argparse.Namespace) -> int:
    from ..scenario.loader import ScenarioFileError, item_name, load_file

    files = find_scenarios(scenario_paths(args))
    rows: List[Dict[str, Any]] = []
    broken: List[str] = []
    selected = _selected_cases(args, files) \
        if args.k or args.m or args.smoke else None
    catalog = None
    if getattr(args, "builtin", False):
        from ..scenario.catalog import require_builtin

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


def add_list(sub: Any) -> None:
    """``harness list``: its options."""
    ls = sub.add_parser("list", help="list scenario cases: ids, marks, faults, expectations",
                        description="Every scenario case: id, marks, fault kinds, backend, "
                        "world size, expectations. With -k, -m or --smoke: exactly the cases "
                        "`harness run` would run with them.")
    ls.add_argument("paths", nargs="*", metavar="PATH", help="scenario files or folders")
    ls.add_argument("--builtin", action="store_true", help="the built-in catalog too")
    ls.add_argument("-k", metavar="EXPR", help="only cases whose id/keywords match, as "
                    "`harness run -k` selects them (pytest -k); fault kinds, backend and init "
                    "method are keywords")
    ls.add_argument("-m", metavar="MARKEXPR", help="only cases whose marks match (pytest -m)")
    ls.add_argument("--smoke", action="store_true", help="only the smoke tier (pytest -m "
                    "smoke), as `harness run --smoke`")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=cmd_list)


def cmd_schema(args: argparse.Namespace) -> int:
    from ..scenario.loader import json_schema

    text = json.dumps(json_schema(), indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n")
        _console(stderr=True).print(_text(f"wrote {args.output}"))
    else:
        print(text)
    return 0


def add_schema(sub: Any) -> None:
    """``harness schema``: its options."""
    s = sub.add_parser("schema", help="print the JSON Schema of scenario files (for "
                       "editors)")
    s.add_argument("-o", "--output", metavar="FILE", help="write it to FILE")
    s.set_defaults(func=cmd_schema)


def cmd_new(args: argparse.Namespace) -> int:
    import re

    from ..scenario.templates import new_scenario

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


def add_new(sub: Any) -> None:
    """``harness new``: its options."""
    n = sub.add_parser("new", help="a commented template scenario for reproducing a hang")
    n.add_argument("name", metavar="NAME", help="the scenario's name (letters, digits, . _ -)")
    n.add_argument("-o", "--output", metavar="FILE", help="write to FILE (default: stdout)")
    n.add_argument("--force", action="store_true", help="overwrite FILE")
    n.set_defaults(func=cmd_new)


def _strict_heading(found: list) -> str:
    """What --strict found in one file, in words: expectations no run can contradict, and
    about: texts that still hold the template's TODO."""
    todo = sum(1 for _, w in found if w.field == "about")
    wide = len(found) - todo
    parts = ([f"{wide} expectation{'s' * (wide > 1)} no run can contradict"] if wide else []) + \
        ([f"{todo} about: text{'s' * (todo > 1)} still holding the template's TODO"]
         if todo else [])
    return "; ".join(parts)

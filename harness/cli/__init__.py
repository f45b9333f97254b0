"""The command line front door: ``harness COMMAND`` (also ``python -m harness``). Thin: the
rooms do the work, and ``harness run`` is pytest with the harness plugin, so the CLI and
``pytest`` collect, run and report scenarios the same way.

Commands: run, validate, list, show, diff, html, doctor, schema, new. Exit codes: 0 fine,
1 something found (a failing scenario, an invalid file, a behaviour change), 2 bad input
(a missing file, a bad option), 3 the harness itself failed (one line). ``harness run`` returns
pytest's own exit code, except after a signal: SIGINT (Ctrl-C) and SIGTERM clean up like one
Ctrl-C (``harness.machine.interrupts``), print a last line saying so, and end the process by
that signal (exit status 130 and 143).

This package holds the parser and ``main``; each command is in a module of its own, with the
options it adds: ``run`` (harness run), ``scenarios`` (validate, list, schema, new), ``show``
(show, explain), ``reports`` (diff, compare, html), ``doctor``, ``tools`` (preflight, capture;
explore adds its own, harness.tools.explore); ``common`` is what they share.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional, Sequence

from ..core.errors import UsageError
from . import doctor, reports, run, scenarios, show, tools
from .common import _console, _text, find_scenarios, scenario_paths
from .doctor import doctor_facts
from .run import print_summary
from .show import _store_header, plan_for_show, show_plan

__all__ = ["build_parser", "doctor_facts", "find_scenarios", "main", "plan_for_show",
           "print_summary", "scenario_paths", "show_plan", "_store_header"]


def build_parser() -> argparse.ArgumentParser:
    """The ``harness`` command's parser: every command, in the order ``harness --help`` lists
    them."""
    from .. import __version__

    p = argparse.ArgumentParser(
        prog="harness", description="torchdist-harness: fault-injection scenarios for PyTorch "
        "distributed start-up. See docs/reports-and-cli.md.")
    p.add_argument("--version", action="version", version=f"torchdist-harness {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add in (run.add_run, scenarios.add_validate, scenarios.add_list, show.add_show,
                show.add_explain, reports.add_diff, reports.add_compare, reports.add_html,
                doctor.add_doctor, scenarios.add_schema, tools.add_preflight, scenarios.add_new,
                tools.add_capture):
        add(sub)

    from ..tools import explore  # `harness explore`: parser and command in tools/explore
    explore.add_parser(sub)
    return p


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
    from ..core.errors import HarnessError
    from ..machine import interrupts

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


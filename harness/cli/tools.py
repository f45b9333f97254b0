"""The commands whose work is in ``harness.tools``: ``harness preflight`` (a real Slurm
allocation's nodes checked before a job: harness.tools.preflight) and ``harness capture`` (a
user's own launch command turned into a scenario: harness.tools.capture). ``harness explore``
adds its own parser (harness.tools.explore)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..core.errors import UsageError
from .common import _seconds


def cmd_preflight(args: argparse.Namespace) -> int:
    from ..tools import preflight

    return preflight.run(args)


def add_preflight(sub: Any) -> None:
    """``harness preflight``: the command; its options are harness.tools.preflight's."""
    pf = sub.add_parser("preflight", help="check the nodes of a Slurm allocation before a job "
                        "(names, gloo's interface, reachability, versions, a real all_reduce)",
                        description="Run inside an allocation (salloc -N4 harness preflight): "
                        "starts one task per node with srun; or as that task (srun "
                        "--ntasks-per-node=1 harness preflight --task --dir SHARED). Prints a "
                        "per-node table and writes DIR/report.json. Exit 0 only when every "
                        "node passes.")
    from ..tools import preflight as _pf

    _pf.add_arguments(pf)
    pf.set_defaults(func=cmd_preflight)


def cmd_capture(args: argparse.Namespace) -> int:
    from ..tools.capture import capture

    command = list(args.pytest_args or [])
    if not command:
        raise UsageError("give the launch command after --: harness capture -o FILE.yaml -- "
                         "torchrun --nproc-per-node 2 train.py")
    if args.runs < 1 or (args.world_size is not None and args.world_size < 1):
        raise UsageError("--runs and --world-size: 1 or more")
    return capture(command, Path(args.output), name=args.name, deadline=args.deadline,
                   runs=args.runs, world_size=args.world_size, keep_env=tuple(args.keep_env),
                   verbose=args.verbose)


def add_capture(sub: Any) -> None:
    """``harness capture``: its options."""
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

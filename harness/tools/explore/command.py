"""``harness explore``: its options, the command, and the minimal scenario it found written
as an ordinary scenario file (its ``expect:`` from the runs watched)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List

import yaml

from ...scenario.loader import (
    ScenarioFileError,
    load_text,
)
from .engine import Exploration, Progress, _stderr_line, default_jobs
from .runs import prepare, run_batch
from .space import Space, load_space
from .strategy import short

MAX_JOBS = 32


def found_scenario(space: Space, seed: int, found: Dict[str, Any],
                   confirms: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The minimal scenario as an ordinary scenario file's data, its expect from the runs
    watched (the shrink's and the confirmations')."""
    runs = [found["result"]] + [c for c in confirms if "verdicts" in c]
    ranks: Dict[str, List[str]] = {}
    jobs: List[str] = []
    durs: Dict[str, List[float]] = {}
    for r in runs:
        if r["job"] not in jobs:
            jobs.append(r["job"])
        for v in r["verdicts"]:
            ranks.setdefault(v["label"], [])
            if v["outcome"] not in ranks[v["label"]]:
                ranks[v["label"]].append(v["outcome"])
            if v["duration"] is not None:
                durs.setdefault(v["label"], []).append(v["duration"])
    held = sum(1 for c in confirms if c.get("broken"))
    watched = "; ".join(
        f"rank {k}: {'/'.join(o)}" + (f" at {min(durs[k]):.1f}-{max(durs[k]):.1f} s"
                                       if k in durs else "")
        for k, o in ranks.items())
    about = (f"Found by `harness explore {space.file} --seed {seed}`: the smallest draw that "
             f"breaks the invariant {found['invariant']} ({found['why']}).\n"
             f"Watched on this machine in {len(runs)} run(s) (the shrink's and {len(confirms)} "
             f"confirmation(s), {held} of which broke it again): job "
             f"{'/'.join(jobs)}; {watched}.\n"
             "Run it at least 3 times and widen the expectation with what you see before adding "
             "it to the catalog.\n")
    import textwrap

    data = dict(found["scenario"])
    data["name"] = f"{space.name}-{found['invariant'].split('(')[0]}-seed{seed}"
    data["about"] = "".join(textwrap.fill(line, 96) + "\n" for line in about.splitlines())
    data["expect"] = {"job": jobs, "ranks": {k: o for k, o in ranks.items()}}
    return data


class _Dumper(yaml.SafeDumper):
    """Multi-line text (about:) as a literal block, as people write it by hand."""


_Dumper.add_representer(str, lambda d, s: d.represent_scalar(
    "tag:yaml.org,2002:str", s, style="|" if "\n" in s else None))


def write_scenario(data: Dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{data['name']}.yaml"
    ordered = {"name": data["name"], "about": data["about"]}
    ordered.update({k: v for k, v in data.items() if k not in ordered})
    path.write_text(yaml.dump(ordered, Dumper=_Dumper, sort_keys=False, width=100))
    load_text(path.read_text(), str(path))   # what we write loads
    return path


# -- the command -----------------------------------------------------------------------------

def add_parser(sub: Any) -> None:
    e = sub.add_parser("explore", help="draw scenarios from a declared fault space, run each, "
                       "shrink one that breaks an invariant to a minimal scenario file")
    e.add_argument("space", metavar="BASE.yaml", help="a scenario file with an explore: block")
    e.add_argument("--seed", type=int, default=0, help="the same seed gives the same draws")
    e.add_argument("--runs", type=int, default=20, metavar="K", help="draws at most (default 20)")
    e.add_argument("--jobs", "-j", type=int, default=None, metavar="N",
                   help="draws run at a time, on pytest-xdist's workers (default: the CPUs "
                        f"this process may use, at most 8; here {default_jobs()})")
    e.add_argument("--max-shrinks", type=int, default=20, metavar="N",
                   help="real runs spent shrinking a failing draw, at most (default 20)")
    e.add_argument("--confirm", type=int, default=1, metavar="N",
                   help="re-runs of the minimal scenario, uncached (default 1)")
    e.add_argument("--out", default="explore-found", metavar="DIR",
                   help="where the minimal scenario file goes (default explore-found/)")
    e.add_argument("--report", metavar="PATH", help="a JSON report of every draw and verdict")
    e.add_argument("--keep", metavar="DIR", help="keep every run's evidence there (events, "
                   "stacks, output; `harness explain` reads it); default: none kept")
    e.add_argument("--no-progress", action="store_true",
                   help="no live bar on a terminal (the lines stay)")
    e.set_defaults(func=cmd_explore)


def cmd_explore(args: Any) -> int:
    """0: every invariant held over every draw; 1: one broke (its minimal scenario written);
    2: a bad space file (located problems on stderr)."""
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        print("harness explore: needs Hypothesis: pip install 'torchdist-harness[explore]'",
              file=sys.stderr)
        return 2
    try:
        space = load_space(args.space)
    except ScenarioFileError as e:
        for p in e.problems:
            print(str(p), file=sys.stderr)
        return 2
    jobs = default_jobs() if args.jobs is None else args.jobs
    if args.runs < 1 or args.max_shrinks < 0 or args.confirm < 0 or not 1 <= jobs <= MAX_JOBS:
        print("harness explore: --runs is at least 1, --max-shrinks and --confirm at least 0, "
              f"--jobs from 1 to {MAX_JOBS}", file=sys.stderr)
        return 2
    keep = Path(args.keep).resolve() if args.keep else None
    if jobs > 1:
        try:
            import xdist  # noqa: F401
        except ImportError:
            print("harness explore: --jobs needs pytest-xdist (pip install "
                  "'torchdist-harness[explore]'): running one draw at a time", file=sys.stderr)
            jobs = 1

    def batch(draws: List[Dict[str, Any]], n: int,
              on_result: Callable[[int, Dict[str, Any]], None]) -> List[Dict[str, Any]]:
        return run_batch(draws, n, on_result, keep=keep)

    def one(draw: Dict[str, Any]) -> Dict[str, Any]:
        pre = prepare(draw)
        return pre if pre is not None else run_batch([draw], 1, keep=keep)[0]

    progress = Progress(_stderr_line, bar=not args.no_progress and sys.stderr.isatty())
    ex = Exploration(space, args.seed, args.runs, max_shrinks=args.max_shrinks,
                     confirm=args.confirm, jobs=jobs, runner=one, batch=batch,
                     progress=progress)
    try:
        found = ex.explore()
        confirms = ex.confirm_found(found) if found is not None else []
    finally:
        progress.stop()
    failures = [{"n": r["n"], "phase": r["phase"], "broken": r["broken"],
                 "scenario": short(r["scenario"], space)}
                for r in ex.records if r.get("broken")]
    report: Dict[str, Any] = {"space": args.space, "seed": args.seed, "runs": args.runs,
                              "jobs": jobs, "invariants": [i.label() for i in space.invariants],
                              "draws": ex.records, "failures": failures, "found": None}
    rc = 0
    said = ex.progress.say if ex.progress is not None else _stderr_line
    n_draws = sum(1 for r in ex.records if r["phase"] == "draw" and "verdicts" in r)
    broke = [f for f in failures if f["phase"] == "draw"]
    if found is None:
        said(f"explore: {n_draws} draws run, every invariant held")
    else:
        data = found_scenario(space, args.seed, found, confirms)
        path = write_scenario(data, Path(args.out))
        held = sum(1 for c in confirms if c.get("broken"))
        report["found"] = {"invariant": found["invariant"], "why": found["why"],
                           "scenario": found["scenario"], "file": str(path),
                           "shrink_steps": ex.shrinks_done,
                           "confirmed": f"{held}/{len(confirms)}"}
        note = (" (NOT confirmed: it broke only in the shrink's run, a race? its about says "
                "what each run did)" if confirms and not held else "")
        others = sorted({k for f in broke for k in f["broken"]} - {found["invariant"]})
        said(f"explore: {n_draws} draws run, {len(broke)} broke an invariant"
             + (f" (also broken, not shrunk: {', '.join(others)})" if others else "")
             + f"; {found['invariant']} broken: {found['why']}; minimal after "
             f"{ex.shrinks_done} shrink steps: {short(found['scenario'], space)}; confirmed "
             f"{held}/{len(confirms)}{note}; written to {path}")
        rc = 1
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=1) + "\n")
    return rc

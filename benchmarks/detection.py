"""Detection power of the catalog as a regression suite, measured (issue 40 item 5).

A cluster image changes; does `harness compare` notice? This benchmark plants known behaviour
changes into side B of `harness compare` and counts which are flagged, by which cases, and how
many false alarms unchanged pairs raise.

One round: side A is run once (this interpreter, the selection given), saved as a report; then
each planted change runs as side B against that saved report (`harness compare a.json B ...`:
B runs, A is read), and CONTROLS unchanged B runs do the same (every change they report is a false
alarm). Rounds repeat the whole (`--rounds`), because a flag that comes once in three rounds is a
weaker finding than one that always comes.

The planted changes are what an image really changes: an environment variable torch reads
(`--env-b`), a patch applied at interpreter start-up (a `sitecustomize` on PYTHONPATH that
wraps a torch function when torch is imported: the ranks, agents and programs all start through
it), or another torch (a venv with the 2.14.1 wheel on this machine's disk, `--other-python`).

Usage:
  python benchmarks/detection.py [--rounds 3] [--controls 3] [-n 4] [-k EXPR] [-m MARKEXPR]
                                 [--plus FILE ...] [--only NAME[,NAME]] [--other-python PY]
                                 [--out DIR] [PATH...]
  python benchmarks/detection.py --list
PATH defaults to scenarios/. `--plus FILE` adds whole scenario files to the selection that -k/-m
narrow (e.g. the smoke tier plus the files that hold a real change between two images): each is
its own `harness compare` beside the first, their changes counted together. The table (markdown)
is printed at the end and written to OUT/detection.md, each round's compare output kept under
OUT/round-<i>/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, cast

ROOT = Path(__file__).resolve().parent.parent

# A start-up patch: run in every interpreter of side B (PYTHONPATH), it waits for the module
# named and then calls patch(module). The harness's own sitecustomize chains to this one for
# the processes it observes; its own worker imports this one directly.
_HOOK = '''\
import importlib.abc, importlib.util, sys


class _Planted(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != {module!r}:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(mod):
            run(mod)
            patch(mod)
        spec.loader.exec_module = exec_module
        return spec


{patch}

sys.meta_path.insert(0, _Planted())
'''


@dataclass
class Planted:
    name: str
    what: str
    env: Dict[str, str] = field(default_factory=dict)
    module: Optional[str] = None       # a start-up patch: the module it waits for
    patch: str = ""                    # ... and `def patch(mod):`
    other_torch: bool = False          # side B is --other-python

    def site(self, out: Path) -> Optional[Path]:
        if self.module is None:
            return None
        d = out / "sites" / self.name
        d.mkdir(parents=True, exist_ok=True)
        (d / "sitecustomize.py").write_text(_HOOK.format(module=self.module,
                                                        patch=textwrap.dedent(self.patch)))
        return d


PLANTED = [
    Planted("use_libuv_0", "TCPStore's legacy backend (USE_LIBUV=0), as images before 2.4 had",
            env={"USE_LIBUV": "0"}),
    Planted("gloo_lazy_init", "gloo connects its pairs at the first collective, not in init",
            env={"TORCH_GLOO_LAZY_INIT": "1"}),
    Planted("no_shared_rdzv_store", "torchrun's workers host their own store again",
            env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}),
    Planted("init_barrier", "a barrier at the end of init_process_group",
            env={"TORCH_DIST_INIT_BARRIER": "1"}),
    Planted("debug_detail", "TORCH_DISTRIBUTED_DEBUG=DETAIL: collectives checked across ranks",
            env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}),
    Planted("gloo_ifname_lo", "the image pins gloo to the loopback card",
            env={"GLOO_SOCKET_IFNAME": "lo"}),
    Planted("timeout_doubled", "init_process_group's timeout doubled by a start-up patch",
            module="torch.distributed.distributed_c10d", patch='''
            def patch(mod):
                import datetime, functools
                orig = mod.init_process_group

                @functools.wraps(orig)
                def init_process_group(*a, **kw):
                    if isinstance(kw.get("timeout"), datetime.timedelta):
                        kw["timeout"] = kw["timeout"] * 2
                    return orig(*a, **kw)
                mod.init_process_group = init_process_group
                import torch.distributed as dist
                dist.init_process_group = init_process_group
            '''),
    Planted("default_timeout_5min", "the default process-group timeout cut to 5 minutes",
            module="torch.distributed.constants", patch='''
            def patch(mod):
                import datetime
                mod.default_pg_timeout = datetime.timedelta(minutes=5)
            '''),
    Planted("store_client_retry", "a store client that retries a failed connect once more",
            module="torch.distributed.rendezvous", patch='''
            def patch(mod):
                import functools
                orig = mod._create_c10d_store

                @functools.wraps(orig)
                def _create_c10d_store(*a, **kw):
                    try:
                        return orig(*a, **kw)
                    except Exception:
                        return orig(*a, **kw)
                mod._create_c10d_store = _create_c10d_store
            '''),
    Planted("torch_2_14_1", "the torch 2.14.1 wheel on this machine against 2.13.0",
            other_torch=True),
]


@dataclass
class Selection:
    """What one `harness run`/`harness compare` runs: paths, narrowed by -k/-m or not."""
    paths: List[str]
    k: Optional[str] = None
    m: Optional[str] = None

    def argv(self) -> List[str]:
        return [*self.paths, *(["-k", self.k] if self.k else []),
                *(["-m", self.m] if self.m else [])]


def compare(a_reports: List[Path], python: str, env: Dict[str, str], sels: List[Selection],
            args: argparse.Namespace, out: Path) -> Dict[str, object]:
    """Side B against each selection's saved side A; the changes of all selections together."""
    cases: set = set()
    kinds: Dict[str, int] = {}
    t = time.monotonic()
    for i, (a, sel) in enumerate(zip(a_reports, sels)):
        argv = [sys.executable, "-m", "harness", "compare", str(a), python, *sel.argv(),
                "--out", str(out / f"sel-{i}"), "-q", "--json", "-n", str(args.n)]
        for k, v in env.items():
            argv += ["--env-b", f"{k}={v}"]
        p = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
        if p.returncode not in (0, 1):
            return {"error": f"exit {p.returncode}: {(p.stderr or p.stdout)[-800:]}",
                    "seconds": time.monotonic() - t}
        d = json.loads(p.stdout[p.stdout.index("{"):])
        cases |= {c["case"] for c in d["changes"]}
        for kind, n in d["summary"]["by_kind"].items():
            kinds[kind] = kinds.get(kind, 0) + n
    return {"cases": sorted(cases), "kinds": kinds, "seconds": time.monotonic() - t}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", default=["scenarios/"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--controls", type=int, default=3, help="unchanged B runs per round")
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("-k")
    ap.add_argument("-m")
    ap.add_argument("--plus", nargs="+", default=[], metavar="FILE",
                    help="whole scenario files run beside the -k/-m selection")
    ap.add_argument("--only", help="planted changes to run (names, comma-separated)")
    ap.add_argument("--other-python", help="side B's python for torch_2_14_1 (a venv's python "
                    "with torch 2.14.1 and this package installed)")
    ap.add_argument("--out", default="detection-out")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if args.list:
        for p in PLANTED:
            print(f"{p.name:22} {p.what}")
        return 0
    chosen = PLANTED if not args.only else [p for p in PLANTED if p.name in args.only.split(",")]
    sels = [Selection(args.paths, args.k, args.m)] + ([Selection(args.plus)] if args.plus else [])
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results: Dict[str, List[Dict[str, object]]] = {p.name: [] for p in chosen}
    controls: List[Dict[str, object]] = []
    for r in range(1, args.rounds + 1):
        rd = out / f"round-{r}"
        rd.mkdir(exist_ok=True)
        a_reports = [rd / f"a-{i}.json" for i in range(len(sels))]
        for a, sel in zip(a_reports, sels):
            subprocess.run([sys.executable, "-m", "harness", "run", *sel.argv(), "--report",
                            str(a), "-n", str(args.n), "--no-progress"],
                           cwd=ROOT, capture_output=True, text=True)
            if not a.exists():
                print(f"round {r}: side A wrote no report for {sel}", file=sys.stderr)
                return 3
        for i in range(args.controls):
            controls.append(compare(a_reports, sys.executable, {}, sels, args,
                                    rd / f"control-{i}"))
            print(f"round {r} control {i}: {controls[-1]}", flush=True)
        for p in chosen:
            python, env = sys.executable, dict(p.env)
            if p.other_torch:
                if not args.other_python:
                    results[p.name].append({"error": "no --other-python"})
                    continue
                python = args.other_python
            site = p.site(out)
            if site is not None:
                env["PYTHONPATH"] = os.pathsep.join(
                    [str(site)] + [x for x in [os.environ.get("PYTHONPATH")] if x])
            results[p.name].append(compare(a_reports, python, env, sels, args, rd / p.name))
            print(f"round {r} {p.name}: {results[p.name][-1]}", flush=True)
    lines = ["| planted change | flagged | cases that flagged it (rounds) |", "|---|---|---|"]
    flagged = 0
    for p in chosen:
        rs = results[p.name]
        hits = [x for x in rs if x.get("cases")]
        errs = [x for x in rs if "error" in x]
        by_case: Dict[str, int] = {}
        for x in hits:
            for c in cast(List[str], x["cases"]):
                by_case[c] = by_case.get(c, 0) + 1
        top = ", ".join(f"{c} ({n})" for c, n in sorted(by_case.items(), key=lambda kv: -kv[1])[:4])
        more = f" +{len(by_case) - 4} more" if len(by_case) > 4 else ""
        note = f"; {len(errs)} failed to run" if errs else ""
        lines.append(f"| {p.name}: {p.what} | {len(hits)}/{len(rs)}{note} | {top}{more} |")
        flagged += bool(hits) and len(hits) * 2 > len(rs)
    alarms = [x for x in controls if x.get("cases")]
    lines.append(f"| controls (unchanged B) | {len(alarms)}/{len(controls)} false alarms | "
                 + ", ".join(sorted({c for x in alarms for c in x["cases"]}))  # type: ignore
                 + " |")
    table = "\n".join(lines) + (f"\n\nflagged in most rounds: {flagged} of {len(chosen)} "
                                f"planted changes; {args.rounds} rounds\n")
    (out / "detection.md").write_text(table)
    (out / "detection.json").write_text(json.dumps({"planted": results, "controls": controls},
                                                   indent=1))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

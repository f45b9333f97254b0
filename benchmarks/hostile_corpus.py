"""Run the hostile-input corpus as a new user would and count what happens to each file.

Usage: ``python benchmarks/hostile_corpus.py [--jobs 2] [--json out.json] [--only NAME...]``

Each file of tests/data/hostile/ (plus the generated big ones and the special entries: a FIFO,
a symlink to /dev/zero, a directory and a broken symlink, all named ``*.yaml``) goes through
both front doors, each in its own subprocess with a time limit:

* ``harness validate FILE`` (the special entries: ``harness validate FOLDER``);
* ``pytest`` over a fresh ``scenarios/`` folder holding the file and one good scenario.

A file's verdict is the worst of: ``hang`` (a front door ran past its limit), ``abort``
(pytest INTERNALERROR / exit 3, or the good file did not pass), ``traceback`` (a Python
traceback or an unlocated exception line), ``bypass`` (accepted although it asks for more
processes than the limit: not run, it would start them), ``mismatch`` (validate and pytest
disagree), else ``located`` (both refuse it, every problem line starts with the file name) or
``runs`` (both accept it and its cases ran to a verdict). Measured load times of the two slow
files of issue 7 are printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from hostile import GOOD, SPECIAL, corpus, write_generated  # noqa: E402

BIN = Path(sys.executable).parent
VALIDATE_LIMIT = 60
PYTEST_LIMIT = 240
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^E\s+\w+(Error|Exception)\b|"
                       r"INTERNALERROR", re.M)
TOO_MANY = 8   # an accepted file asking for more processes than this is not run (see docstring)


def _run(cmd: List[str], cwd: Path, limit: int) -> Dict[str, Any]:
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=limit,
                           errors="replace", start_new_session=True)
        return {"rc": p.returncode, "out": p.stdout + p.stderr, "s": time.monotonic() - t0}
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"") + (e.stderr or b"")
        text = out.decode(errors="replace") if isinstance(out, bytes) else str(out)
        return {"rc": None, "out": text, "s": time.monotonic() - t0}


def _processes(path: Path, cwd: Path) -> Optional[int]:
    """How many processes the file's largest case would start (None: it does not load). In a
    subprocess with a time limit: the loader being measured may hang on this very file."""
    code = ("import sys\nfrom harness.faults import resolve\n"
            "from harness.scenario.loader import load_file\n"
            "cases = load_file(sys.argv[1])\nprint(max(s.world_size + sum(len(f.extra_labels(s)) "
            "for f in resolve(s)) for s in cases))")
    r = _run([sys.executable, "-c", code, str(path)], cwd, VALIDATE_LIMIT)
    try:
        return int(r["out"].strip().splitlines()[-1]) if r["rc"] == 0 else None
    except (ValueError, IndexError):
        return None


def judge(path: Path, special: bool) -> Dict[str, Any]:
    name = path.name
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        d = Path(tmp) / "scenarios"
        d.mkdir()
        (d / "good.yaml").write_text(GOOD)
        if special:
            target = d / name
            if name == "fifo.yaml":
                os.mkfifo(target)
            elif name == "dev_zero.yaml":
                target.symlink_to("/dev/zero")
            elif name == "directory.yaml":
                target.mkdir()
            else:
                target.symlink_to(d / "no-such-target.yaml")
            v = _run([str(BIN / "harness"), "validate", "scenarios"], Path(tmp), VALIDATE_LIMIT)
        else:
            shutil.copyfile(path, d / name)
            v = _run([str(BIN / "harness"), "validate", f"scenarios/{name}"], Path(tmp),
                     VALIDATE_LIMIT)
        n = None if special or v["rc"] != 0 else _processes(d / name, Path(tmp))
        if n is not None and n > TOO_MANY:
            p: Dict[str, Any] = {"rc": "not run", "out": "", "s": 0.0}
        else:
            p = _run([str(BIN / "python"), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA",
                      "scenarios"], Path(tmp), PYTEST_LIMIT)
    row: Dict[str, Any] = {"file": name, "validate_rc": v["rc"], "validate_s": round(v["s"], 2),
                           "pytest_rc": p["rc"], "pytest_s": round(p["s"], 2)}
    vout, pout = v["out"], p["out"]
    collect_error = re.search(rf"ERROR collecting scenarios/{re.escape(name)}|"
                              rf"ERROR scenarios/{re.escape(name)}\b", pout) is not None
    ran = re.search(rf"(PASSED|FAILED|ERROR|SKIPPED) scenarios/{re.escape(name)}::", pout)
    good = "PASSED scenarios/good.yaml::good" in pout
    problem_lines = [ln.strip() for ln in vout.splitlines() if ln.startswith("  ")]
    located = all(ln.startswith(f"scenarios/{name}") for ln in problem_lines)
    if v["rc"] is None or p["rc"] is None:
        verdict = "hang"
    elif p["rc"] == 3 or "INTERNALERROR" in pout or (p["rc"] != "not run" and not good):
        verdict = "abort"
    elif TRACEBACK.search(vout) or TRACEBACK.search(pout) or v["rc"] not in (0, 1):
        verdict = "traceback"
    elif p["rc"] == "not run":
        verdict = "bypass"
        row["processes"] = n
    elif special:
        verdict = "runs" if v["rc"] == 0 and not collect_error else "mismatch"
    elif v["rc"] == 1 and collect_error and located and problem_lines:
        verdict = "located"
    elif v["rc"] == 0 and not collect_error and ran:
        verdict = "runs"
    else:
        verdict = "mismatch"
    row["verdict"] = verdict
    if verdict not in ("located", "runs"):
        row["validate_tail"] = vout[-600:]
        row["pytest_tail"] = pout[-1500:]
    return row


def load_time(path: Path, limit: int = 180) -> str:
    code = ("import sys,time; from harness.scenario.loader import load_file, ScenarioFileError\n"
            "t=time.perf_counter()\ntry: load_file(sys.argv[1])\nexcept ScenarioFileError: pass\n"
            "except BaseException as e: print(type(e).__name__, end=' ')\n"
            "print(f'{time.perf_counter()-t:.2f} s')")
    r = _run([sys.executable, "-c", code, str(path)], Path(tempfile.gettempdir()), limit)
    return r["out"].strip().splitlines()[-1] if r["rc"] is not None else f"> {limit} s (killed)"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--times-only", action="store_true")
    args = ap.parse_args(argv)
    import harness
    print(f"harness from {Path(harness.__file__).parent}")
    with tempfile.TemporaryDirectory(prefix="hostile-gen-") as gen:
        generated = write_generated(Path(gen))
        laughs = REPO / "tests" / "data" / "hostile" / "billion_laughs.yaml"
        keys = next(p for p in generated if p.name == "keys_40000.yaml")
        print(f"load time, billion_laughs.yaml ({laughs.stat().st_size} bytes): "
              f"{load_time(laughs)}")
        print(f"load time, keys_40000.yaml ({keys.stat().st_size} bytes): {load_time(keys)}")
        if args.times_only:
            return 0
        items = [(p, False) for p in corpus() + generated] + \
            [(Path(n), True) for n in SPECIAL]
        if args.only:
            items = [(p, s) for p, s in items if p.name in args.only or p.stem in args.only]
        with ThreadPoolExecutor(args.jobs) as ex:
            rows = list(ex.map(lambda it: judge(*it), items))
    counts: Dict[str, int] = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
        if r["verdict"] not in ("located", "runs"):
            print(f"{r['verdict']:9} {r['file']}  validate rc={r['validate_rc']} "
                  f"pytest rc={r['pytest_rc']}")
    print(f"{len(rows)} files: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

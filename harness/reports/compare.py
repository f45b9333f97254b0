"""``harness compare A B``: the same scenarios under two environments, one table of behaviour
changes. The cluster-image gate: A is the accepted image, B the candidate.

A side is one of:

* a saved session report (a JSON file written by ``harness run --report`` or ``pytest
  --harness-report``): used as it is;
* an interpreter (a path to a python, or a virtual environment's folder, or a name on PATH):
  the scenarios are run with every rank (and torchrun agent, spawning parent) on that
  interpreter (``harness run --python``), with the side's extra environment variables
  (``--env-a``/``--env-b KEY=VALUE``: what an image's ``ENV`` lines would set), and its
  report and HTML are written into the output folder.

Both sides run the same scenario files, the same ``-k``/``-m`` selection, the same repeat count
(against a saved report: the report's own, unless ``--repeat`` says otherwise; an
interpreter's ranks always start fresh); a scenario's random draws are seeded by the scenario itself
(``malformed_env``'s faker seed, the proxy's seed), so both sides draw the same. The reports are
compared by :func:`harness.reports.diff.diff_reports`: with ``--repeat N`` (N > 1) a rank's outcome
frequencies (and what it said: ``families``, :func:`harness.reports.report.family_key`) are compared
with Fisher's exact test, and a difference counts only when chance explains it less often than
``ALPHA`` (5%) once all the comparison's tests are counted (Holm's step-down); the table says
how sure (1 - p); what was the same on every run of each side and
differs between them is a change at any N. Run once per side, a move inside a race the
scenario declares is variation, not a change; anything else is one draw against one draw, and
the summary says so.

This module plans and runs the sides (processes: the harness's own CLI in a child) and writes
the side-by-side HTML; the front door is ``harness.cli``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from ..net.addresses import IFNAME_VARS

STOP_WAIT = 120.0   # s a side's run may take to clean up after an interrupt


class CompareError(Exception):
    """A side that is neither a report nor an interpreter, or a run that made no report."""


@dataclass
class Side:
    """One side of a comparison."""
    name: str                         # "a" or "b": its files are <out>/<name>.json/.html
    spec: str                         # as the user gave it
    report: Optional[Path] = None     # a saved report
    python: Optional[str] = None      # an interpreter to run the scenarios with
    env: Dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        if self.report is not None:
            return f"report {self.report}"
        extra = " ".join(f"{k}={v}" for k, v in sorted(self.env.items()))
        # set by the harness for the ranks of a case with hosts (Plan.link_env): an image's
        # value reaches the loopback cases only
        kept = [k for k in sorted(self.env) if k in IFNAME_VARS]
        return f"python {self.python}" + (f" with {extra}" if extra else "") + (
            f" ({', '.join(kept)}: not in cases with hosts:, where each host's ranks get its "
            "own card)" if kept else "")


def parse_env(items: Sequence[str]) -> Dict[str, str]:
    """``KEY=VALUE`` strings as a dict; a clear error for anything else, and for a variable the
    harness clears from every process it starts (it would never reach the job: the comparison
    would run the same job on both sides and call it unchanged)."""
    from ..launchers import CLEARED, CLEARED_PREFIXES

    out: Dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise CompareError(f"{item!r}: give an environment variable as KEY=VALUE")
        if key in CLEARED or key.startswith(CLEARED_PREFIXES):
            raise CompareError(f"{item!r}: the harness clears {key} from every process it "
                               "starts (a job's own rendezvous variables are the scenario's "
                               "to set), so it would not reach the job")
        out[key] = value
    return out


def _looks_like_report(p: Path) -> bool:
    if p.suffix.lower() == ".json":
        return True
    try:
        with p.open("rb") as f:
            return f.read(1) == b"{"
    except OSError:
        return False


def side(name: str, spec: str, env: Optional[Dict[str, str]] = None) -> Side:
    """What ``spec`` names: a saved report, a venv folder, an interpreter path or a name on
    PATH; a :class:`CompareError` saying what it is not otherwise."""
    p = Path(os.path.expanduser(spec))
    if p.is_file() and _looks_like_report(p):
        if env:
            raise CompareError(f"{spec}: a saved report; --env-{name} applies only to an "
                               "interpreter that the scenarios are run with")
        return Side(name, spec, report=p)
    if p.is_dir():
        py = p / "bin" / "python"
        if not py.exists():
            raise CompareError(f"{spec}: a folder without bin/python (not a virtual "
                               "environment)")
        return Side(name, spec, python=str(py.absolute()), env=dict(env or {}))
    if p.is_file():
        if not os.access(p, os.X_OK):
            raise CompareError(f"{spec}: neither a report (JSON) nor an executable interpreter")
        return Side(name, spec, python=str(p.absolute()), env=dict(env or {}))
    if os.sep not in spec:
        found = shutil.which(spec)
        if found:
            return Side(name, spec, python=found, env=dict(env or {}))
    raise CompareError(f"{spec}: no such report, interpreter or virtual environment")


def run_argv(s: Side, paths: Sequence[str], out: Path, *, builtin: bool, k: Optional[str],
             m: Optional[str], repeat: Optional[int], n: Optional[Union[int, str]],
             start: Optional[str], keep: Optional[str], smoke: bool = False) -> List[str]:
    """The ``harness run`` command line of one side (what the side's log shows first)."""
    assert s.python is not None
    argv = [sys.executable, "-m", "harness", "run", *paths, "--python", s.python,
            "--report", str(out / f"{s.name}.json"), "--html", str(out / f"{s.name}.html"),
            "--no-progress"]
    if builtin:
        argv.append("--builtin")
    if smoke:
        argv.append("--smoke")
    for flag, value in (("-k", k), ("-m", m), ("--repeat", repeat), ("-n", n),
                        ("--start", start)):
        if value:
            argv += [flag, str(value)]
    argv += ["--keep", keep or str(out / f"evidence-{s.name}")]
    return argv


def run_side(s: Side, argv: Sequence[str], out: Path, echo: Any = None) -> Path:
    """Run one side's scenarios (its log in ``<out>/<name>.log``, each line also passed to
    ``echo``); the report's path. A run that wrote no report is a :class:`CompareError` quoting
    the end of its log."""
    env = dict(os.environ)
    env.update(s.env)
    log = out / f"{s.name}.log"
    report = out / f"{s.name}.json"
    report.unlink(missing_ok=True)
    with log.open("w") as f:
        f.write("$ " + " ".join(argv) + "\n")
        f.flush()
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                f.write(line)
                if echo is not None:
                    echo(line.rstrip("\n"))
            rc = proc.wait()
        except BaseException:
            _stop(proc)
            raise
    if not report.is_file() or rc in (2, 3, 4):
        tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
        raise CompareError(f"side {s.name} ({s.describe()}): `harness run` ended with exit "
                           f"code {rc} and {'no report' if not report.is_file() else 'an error'}"
                           f"; the end of {log}:\n{tail}")
    return report


def repeat_of(report: Dict[str, Any]) -> int:
    """How many times a saved report ran its cases (the most common repeat count of the cases
    that ran; 0 for once): an interpreter side compared with it runs as often."""
    counts: Dict[int, int] = {}
    for c in report.get("cases") or []:
        if c.get("status") != "skipped":
            n = int(c.get("repeat") or 1)
            counts[n] = counts.get(n, 0) + 1
    if not counts:
        return 0
    n = max(counts, key=lambda k: (counts[k], k))
    return n if n > 1 else 0


def _stop(proc: subprocess.Popen) -> None:
    """This process was interrupted (Ctrl-C, SIGTERM): the side's run gets the same signal
    (a SIGTERM sent to this process alone would not reach it) and is awaited while it cleans
    up its runs, as `harness run` does after SIGTERM; killed only if it does not end."""
    from ..machine import interrupts

    with interrupts.shield():
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=STOP_WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def sureness(old: Dict[str, Any], new: Dict[str, Any]) -> str:
    """One line: how sure the comparison can be, from the repeat counts the reports hold."""
    def repeats(rep: Dict[str, Any]) -> List[int]:
        return sorted({int(c.get("repeat") or 1) for c in rep.get("cases") or []
                       if c.get("status") != "skipped"})
    ro, rn = repeats(old), repeats(new)
    if ro and rn and min(ro) > 1 and min(rn) > 1:
        return (f"each case ran {'/'.join(map(str, ro))} times on side A and "
                f"{'/'.join(map(str, rn))} on side B: outcome and message frequencies count as "
                "changed only when Fisher's exact test gives p < 0.05 (the note says how sure)")
    return ("each case ran once per side: a move inside a race the scenario declares is not "
            "counted; any other difference is one draw against one draw (give --repeat N to "
            "measure how sure)")


def write_json(path: Path, data: Dict[str, Any]) -> Path:
    path.write_text(json.dumps(data, indent=1, default=str))
    return path

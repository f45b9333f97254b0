"""``harness capture -- COMMAND``: a user's own launch command turned into a scenario file.

The command line is parsed into a scenario (launcher and its options, program and its
arguments, the environment torch and its launchers read and the launch needs to start, the
world shape). Then, in order:

1. The launch runs once as written (``run_original``): this shell's whole environment plus the
   command's ``NAME=VALUE`` words, a direct ``python SCRIPT`` once per rank, until it ends or the
   deadline, counted from its processes' torch import (at most the deadline +
   ``START_ALLOWANCE``). Its exit status and last lines are kept
   (the file's ``about:``), and what it wrote in its working folder is listed.
2. The scenario runs through the harness's ordinary run path (``harness run``, a fresh process:
   the same observer, phases, stacks and kill at the deadline), ``--runs`` times (default 2).
   The observed verdicts (job, and per rank: outcome, phase, exception, a generous window)
   become the file's ``expect:``; a later run that raced to another verdict widens it to every
   verdict watched, saying so in ``about:``.
3. Each run, the original included, has its own copy of the working folder (``Folder``: caches,
   version control, virtual envs and the harness's evidence are not copied unless the launch
   names a path in them; a folder over ``MAX_COPY_BYTES`` / ``MAX_COPY_FILES`` is refused), so
   that no run sees what another wrote (a checkpoint it would resume from) and the folder itself
   is never written by a run.
4. A replay whose job ends otherwise than the original launch (``AGREES``), or whose rank fails
   with an exception the original's output never names, stops capture with exit 1 and the
   reason (``differs``: which run, which rank, what differed, a ``--keep-env NAME`` hint for a
   variable the original had and the replays did not); the file is not written.

Understood: ``torchrun ...`` and ``python -m torch.distributed.run ...`` (flags parsed by
torch's own argument parser), ``python -m torch.distributed.launch ...`` (the legacy
launcher), ``python SCRIPT.py ARGS`` / ``python -m MODULE ARGS`` (each rank of the world run
directly), each with leading ``NAME=VALUE`` assignments (and ``env NAME=VALUE ...``). Anything
else (``srun``, ``mpirun``, a shell script) is refused with the reason.

The environment: only variables on the allow-list (``ENV_NAMES``, ``ENV_PREFIXES``: what
torch, gloo, NCCL, CUDA, OpenMP and the launchers read; ``START_NAMES``: what the launch needs to
start) are written, never a secret-looking name; every other variable is listed by name only,
as left out, in the file's header and ``about:`` (those set on the command line separately:
they are absent from every run of the file).

Its parts: the command read as a scenario (``harness.tools.capture_command``: ``scenario_of``,
the allow-list), the original launch run as written and a replay compared with it
(``harness.tools.capture_original``: ``run_original``, ``differs``); here the working folder's
copies (``Folder``), the replays, their ``expect:`` (``expect_of``) and the file written.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml

from ..core.errors import HarnessError
from .capture_command import (
    CaptureError,
    _assignments,
    allowed,
    scenario_of,
    secret,
    shown,
)
from .capture_original import START_ALLOWANCE, Original, differs, run_original

OUTCOMES = ("ok", "error", "timeout", "hang", "crash", "absent")


# -- from observed verdicts to expect: ---------------------------------------------------------

def _window(durations: List[float], deadline: float) -> List[float]:
    """A generous window for a loaded machine: from 0 to 3x the slowest + 15 s (a hang: the
    deadline, plus the time to take stacks and kill)."""
    hi = max(durations)
    return [0, round(max(hi * 3 + 15, deadline + 30), 0)]


def expect_of(runs: List[Dict[str, Any]], deadline: float) -> Dict[str, Any]:
    """The expect: block every run (a report's case) satisfies: per rank the union of its
    outcomes, phases and exceptions watched; a field that varied in its value is left out."""
    from ..core.protocol import PHASE_RE

    jobs = sorted({r["job"] for r in runs if r.get("job")}, key=OUTCOMES.index)
    by_label: Dict[str, List[Dict[str, Any]]] = {}
    for r in runs:
        for rk in r.get("ranks") or []:
            by_label.setdefault(rk["label"], []).append(rk)
    ranks: Dict[str, Any] = {}
    for label, seen in by_label.items():
        e: Dict[str, Any] = {}
        outs = sorted({s["outcome"] for s in seen}, key=OUTCOMES.index)
        if len(seen) < len(runs):
            outs.append("absent")
        e["outcome"] = outs[0] if len(outs) == 1 else outs
        phases = sorted({str(s["phase"]) for s in seen if s.get("phase")})
        if phases and all(s.get("phase") for s in seen) and all(PHASE_RE.match(p)
                                                                 for p in phases):
            e["phase"] = phases[0] if len(phases) == 1 else phases
        excs = {s.get("exception") for s in seen}
        if len(excs) == 1 and None not in excs:
            e["exception"] = excs.pop()
        durs = [s["duration"] for s in seen if s.get("duration") is not None]
        if durs:
            e["within"] = _window(durs, deadline)
        ranks[label] = e
    out: Dict[str, Any] = {}
    if jobs:
        out["job"] = jobs[0] if len(jobs) == 1 else jobs
    out["ranks"] = ranks
    return out


def _summary(case: Dict[str, Any]) -> str:
    parts = []
    for r in case.get("ranks") or []:
        d = r.get("duration")
        parts.append(f"{r['label']} {r['outcome']}" + (f" ({r['phase']})" if r.get("phase")
                                                       else "")
                     + (f" {r['exception']}" if r.get("exception") else "")
                     + ("" if d is None else f" {d:.1f} s"))
    return f"job {case.get('job')}: " + ", ".join(parts)


# -- the working folder: one copy per run ---------------------------------------------------

# never copied unless the launch names a path in them: version control, caches, virtual envs,
# the harness's own evidence (a folder holding pyvenv.cfg or conda-meta is an environment too)
SKIP_DIRS = frozenset((".git", ".hg", ".svn", "__pycache__", ".harness", ".venv", "venv",
                       ".tox", ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache",
                       "node_modules", ".ipynb_checkpoints"))
MAX_COPY_BYTES = int(os.environ.get("HARNESS_CAPTURE_MAX_COPY", str(1 << 30)))
MAX_COPY_FILES = 50_000


def _skipped(path: Path) -> bool:
    return path.name in SKIP_DIRS or (path / "pyvenv.cfg").is_file() \
        or (path / "conda-meta").is_dir()


def named_paths(command: List[str], env: Dict[str, str], cwd: Path) -> List[Path]:
    """The existing paths the launch names: its words and the kept variables' values (each
    part of a PATH-like one), relative ones read from ``cwd``."""
    assigned, argv = _assignments(list(command))
    words = list(argv) + [v for k, v in {**env, **assigned}.items() if allowed(k)]
    out: List[Path] = []
    for w in words:
        for part in (w.split(os.pathsep) if os.pathsep in w else [w]):
            part = part.split("=", 1)[-1] if part.startswith("--") else part
            if not part or "\0" in part or len(part) > 4096:
                continue
            try:
                p = (cwd / part).resolve()
                if p.exists():
                    out.append(p)
            except (OSError, ValueError, RuntimeError):
                continue
    return out


class Folder:
    """The working folder and what a copy of it holds: ``skipped`` (relative paths of the
    folders left out), ``size`` and ``files``; ``refusal`` says why it is not copied."""

    def __init__(self, root: Path, named: List[Path]):
        self.root = root.resolve()
        self.named = named
        self.skipped: List[str] = []
        self.size = 0
        self.files = 0
        self.refusal = ""
        for dirpath, dirnames, filenames in os.walk(self.root):
            here = Path(dirpath)
            for d in list(dirnames):
                if self._skip(here / d):
                    dirnames.remove(d)
                    self.skipped.append(str((here / d).relative_to(self.root)))
            for f in filenames:
                try:
                    st = os.lstat(here / f)
                except OSError:
                    continue
                self.files += 1
                self.size += st.st_size if stat.S_ISREG(st.st_mode) else 0
            if self.size > MAX_COPY_BYTES or self.files > MAX_COPY_FILES:
                self.refusal = (
                    f"the working folder {self.root} holds more than "
                    f"{MAX_COPY_BYTES / (1 << 30):.1f} GiB or {MAX_COPY_FILES} files "
                    f"(seen so far: {self.size / (1 << 30):.2f} GiB, {self.files} files): capture "
                    "runs the launch and each replay in its own copy of it, so that no run sees "
                    "another's files, and will not copy that much. Run capture from a folder "
                    "that holds the program and what it reads, with large data outside it, "
                    "named by absolute path (files outside the working folder are not copied)")
                return

    def _skip(self, path: Path) -> bool:
        if not _skipped(path):
            return False
        return not any(n == path or path in n.parents for n in self.named)

    def copy(self, dest: Path) -> Path:
        """A copy of the folder at ``dest/<its name>`` (symbolic links as links; sockets,
        FIFOs and devices left out)."""
        target = dest / (self.root.name or "work")
        own = dest.resolve()

        def ignore(src: str, names: List[str]) -> List[str]:
            out = []
            for n in names:
                p = Path(src) / n
                try:
                    st = os.lstat(p)
                except OSError:
                    out.append(n)
                    continue
                if stat.S_ISDIR(st.st_mode):
                    if self._skip(p):
                        out.append(n)
                    elif p.resolve() == own or p.resolve() in own.parents:
                        # the copy's own destination (a TMPDIR inside the working folder):
                        # copied, the copy would hold itself without end
                        out.append(n)
                        self.skipped.append(str(p.relative_to(self.root)))
                elif not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                    out.append(n)
            return out

        try:
            shutil.copytree(self.root, target, symlinks=True, ignore=ignore)
        except (OSError, shutil.Error) as e:
            raise HarnessError(f"cannot copy the working folder {self.root} to {target}: "
                               f"{str(e)[:500]}") from None
        return target

    def written_by(self, copy: Path) -> List[str]:
        """What a run wrote in its copy: files new or changed against the folder (relative
        paths; caches left out)."""
        out = []
        for dirpath, dirnames, filenames in os.walk(copy):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in filenames:
                p = Path(dirpath) / f
                rel = p.relative_to(copy)
                try:
                    a, b = os.lstat(p), os.lstat(self.root / rel)
                except FileNotFoundError:
                    out.append(str(rel))
                    continue
                except OSError:
                    continue
                if stat.S_ISREG(a.st_mode) and (a.st_size, a.st_mtime_ns) != \
                        (b.st_size, b.st_mtime_ns):
                    out.append(str(rel))
        return sorted(out)


def in_copy(path: Path, root: Path, copy: Path) -> Path:
    """``path`` moved into the copy when it lies in the working folder."""
    path = path.resolve()
    return copy / path.relative_to(root) if path == root or root in path.parents else path


# -- the file and the runs ---------------------------------------------------------------------

class _Dumper(yaml.SafeDumper):
    """Multi-line text (about:) as a literal block, as people write it by hand."""


def _text(dumper: yaml.SafeDumper, s: str) -> Any:
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)


_Dumper.add_representer(str, _text)


def write(path: Path, scn: Dict[str, Any], left_out: List[str], command: List[str],
          missing: Tuple[str, ...] = ()) -> None:
    head = ["# written by: harness capture -- " + shown(command)[:400],
            "# environment left out (not what torch, gloo, NCCL, OpenMP and the launchers read,",
            "# nor what the launch needs to start; names only, --keep-env NAME writes one): "
            + (", ".join(left_out)[:2000] or "none")]
    if missing:
        head.append("# set on the command line and left out (absent from every run of this "
                    "file): " + ", ".join(missing))
    body = yaml.dump(scn, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(head) + "\n" + body)
    os.replace(tmp, path)


def run_once(path: Path, report: Path, verbose: bool, cwd: Optional[Path] = None
             ) -> Dict[str, Any]:
    """Run the written file through ``harness run`` (a fresh process, in ``cwd``: where its
    evidence folder goes) and return its case."""
    cmd = [sys.executable, "-m", "harness", "run", str(path), "--report", str(report),
           "--no-progress"]
    if cwd is not None:   # the evidence where a user's own run of the file would leave it,
        # and the case named after the file alone (pytest's rootdir: the file's own folder)
        cmd += ["--keep", str(cwd / ".harness" / "evidence"), "--", "--rootdir",
                str(path.parent)]
    proc = subprocess.run(cmd, stdout=None if verbose else subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True,
                          cwd=None if cwd is None else str(cwd))
    from ..reports import report as report_mod

    try:
        rep = report_mod.read(str(report))
    except report_mod.ReportError:
        rep = None
    if not rep or not rep.get("cases"):
        tail = (proc.stdout or "")[-3000:] if not verbose else ""
        raise HarnessError(f"the run of {path} gave no result (exit {proc.returncode})"
                           + (f":\n{tail}" if tail else ""))
    case: Dict[str, Any] = rep["cases"][0]
    if case.get("status") in ("skipped", "error"):
        raise HarnessError(f"the run of {path} was {case['status']}: "
                           f"{(case.get('reason') or case.get('failure') or '')[:1500]}")
    return case


def _replay_file(scn: Dict[str, Any], out: Path, folder: Folder, copy: Path, dest: Path
                 ) -> Path:
    """The scenario as written, its program and folder moved into this run's copy."""
    base = out.resolve().parent
    prog = dict(scn["program"])
    if prog.get("script"):
        prog["script"] = str(in_copy(base / prog["script"], folder.root, copy))
    prog["cwd"] = str(in_copy(base / prog.get("cwd", "."), folder.root, copy))
    path = dest / out.name
    path.write_text(yaml.dump({**scn, "program": prog}, Dumper=_Dumper, sort_keys=False,
                              width=100, allow_unicode=True))
    return path


def _mask(lines: List[str], env: Dict[str, str]) -> List[str]:
    """The original's output lines with the value of every secret-looking variable masked."""
    values = [v for k, v in env.items() if secret(k) and len(v) >= 4]
    out = []
    for ln in lines:
        for v in values:
            ln = ln.replace(v, "...")
        out.append(ln)
    return out


def capture(command: List[str], out: Path, *, name: Optional[str], deadline: float,
            runs: int, world_size: Optional[int], keep_env: Tuple[str, ...],
            verbose: bool, say: Any = print) -> int:
    if out.exists() and out.is_dir():
        raise CaptureError(f"{out}: a folder; give the scenario file's path with -o")
    scn, left_out = scenario_of(command, out, name=name, deadline=deadline,
                                world_size=world_size, keep_env=keep_env)
    assigned, _ = _assignments(list(command))
    missing = tuple(k for k in assigned if k not in scn.get("env", {}))
    base = out.resolve().parent
    workdir = (base / scn["program"].get("cwd", ".")).resolve()
    env_all = {**os.environ, **assigned}
    folder = Folder(workdir, named_paths(command, env_all, workdir))
    if folder.refusal:
        raise CaptureError(folder.refusal)
    about = [f"Captured from: {shown(command)[:400]}",
             f"Environment written: {', '.join(scn.get('env', {})) or 'none'}; left out "
             f"(names only; --keep-env NAME writes one): "
             f"{', '.join(left_out)[:1500] or 'none'}."]
    if missing:
        about.append("Set on the command line and left out (absent from every run of this "
                      "file): " + ", ".join(missing) + ".")
    seen: List[Dict[str, Any]] = []
    from ..machine.rundir import own_folder

    with own_folder() as tmp_:
        tmp = Path(tmp_)
        orig = _original(command, scn, folder, deadline, tmp, env_all, about, say)
        # the first run observes: every outcome allowed, so that it passes whatever happens
        scn["about"] = "\n".join(about + ["(observing: expectations not yet written)"])
        scn["expect"] = {"ranks": {"*": {"outcome": list(OUTCOMES)}}}
        for i in range(1, runs + 1):
            say(f"run {i} of {runs}: harness run {out} (in a copy of its folder"
                + ("; observing)" if i == 1 else "; checking the written expectations)"))
            here = tmp / f"run{i}"
            here.mkdir()
            copy = folder.copy(here)
            path = _replay_file(scn, out, folder, copy, here)
            case = run_once(path, here / "report.json", verbose, cwd=base)
            shutil.rmtree(copy, ignore_errors=True)
            held = "observed" if i == 1 else (
                "the written expectations held" if case.get("status") == "passed"
                else "not the written expectations")
            say(f"  run {i}: {_summary(case)} ({held})")
            if case.get("evidence"):   # stacks of a hang, each rank's output, the diagnosis
                say(f"  evidence: {case['evidence']} (harness explain {case['evidence']})")
            why = differs(orig, case, list(missing), left_out)
            if why:
                say(f"run {i} does not reproduce the original launch: {why}")
                say(f"{out}: not written (capture writes only what its replays reproduce)")
                return 1
            if i > 1 and case.get("status") != "passed":
                say("  torch went another way this time: the expectation is widened to every "
                    "verdict watched")
            seen.append(case)
            watched = [f"run {j}: {_summary(c)}" for j, c in enumerate(seen, 1)]
            scn["about"] = "\n".join(about + [
                f"Watched on torch {case.get('torch_version') or '?'} by harness capture "
                f"({len(seen)} run{'s' * (len(seen) != 1)} on this machine; windows: 0 to 3x "
                f"the slowest + 15 s, at least the deadline + 30 s):"] + watched)
            scn["expect"] = expect_of(seen, deadline)
    write(out, scn, left_out, command, missing)
    say(f"wrote {out}: {_verdict(seen)}, as the original launch ended ({orig.summary()})")
    say(f"run it again: harness run {out}")
    return 0


def _original(command: List[str], scn: Dict[str, Any], folder: Folder, deadline: float,
              tmp: Path, env_all: Dict[str, str], about: List[str], say: Any) -> Original:
    """The original launch run in a copy of the working folder; how it ended, its last lines
    and what it wrote are added to ``about``."""
    workdir = folder.root
    kind = (scn.get("launcher") or {}).get("kind", "direct")
    copied = (f"Each run of capture (the original launch, then each replay) ran in its own copy "
              f"of {workdir}" + (f" (not copied: {', '.join(folder.skipped[:10])})"
                                 if folder.skipped else "") + ".")
    say(f"original launch: {shown(command)[:200]} (in a copy of {workdir}, up to "
        f"{deadline:g} s from its torch import, at most {deadline + START_ALLOWANCE:g} s)")
    (tmp / "original").mkdir()
    copy = folder.copy(tmp / "original")
    orig = run_original(command, kind, int(scn["world_size"]),
                        in_copy(workdir, folder.root, copy), deadline, tmp)
    wrote = folder.written_by(copy)
    shutil.rmtree(copy, ignore_errors=True)
    last = _mask(orig.last_lines(), env_all)
    say(f"  original launch: {orig.summary()}")
    for ln in _mask(orig.notable(), env_all) if orig.state != "ok" else []:
        say(f"    | {ln}")
    about.append(f"The original launch: {orig.summary()}; its last lines:")
    about += [f"  | {ln}" for ln in last] or ["  (no output)"]
    if wrote:
        about.append(f"It writes in its working folder: {', '.join(wrote[:10])}"
                     + (", ..." if len(wrote) > 10 else "") + ". " + copied
                     + f" A later harness run of this file runs in {workdir} itself.")
    else:
        about.append(copied)
    return orig


def _verdict(seen: List[Dict[str, Any]]) -> str:
    """What the replays said, for capture's last line."""
    agree = all(c.get("status") == "passed" for c in seen[1:])
    if len(seen) == 1:
        return "one run watched (--runs 3 or more checks that it holds)"
    if agree:
        return "every run gave the same verdicts"
    return "verdicts differed between runs: every one watched is allowed"

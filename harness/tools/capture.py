"""``harness capture -- COMMAND``: a user's own launch command turned into a scenario file.

The command line is parsed into a scenario (launcher and its options, program and its
arguments, the environment torch and its launchers read and the launch needs to start, the
world shape). Then, in order:

1. The launch runs once as written (``run_original``): this shell's whole environment plus the
   command's ``NAME=VALUE`` words, a direct ``python SCRIPT`` once per rank, until it ends or the
   deadline (+ ``START_ALLOWANCE`` for its cold start). Its exit status and last lines are kept
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
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml

from ..core.errors import HarnessError, UsageError

# what torch, gloo, NCCL and the launchers read (an allow-list: nothing else is ever written)
ENV_NAMES = frozenset((
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "NODE_RANK",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "LOGLEVEL",
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "USE_LIBUV"))
ENV_PREFIXES = ("TORCH_", "GLOO_", "NCCL_", "TORCHELASTIC_", "CUDA_", "PYTORCH_", "OMP_")
# what the launch needs to start at all (issue 39): where Python finds the program's own modules
# and the loader its libraries, and the environment it was started from (a virtual env's or
# conda's prefix). Written like the allow-list above; a secret-looking name never is.
START_NAMES = frozenset(("PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX",
                         "CONDA_DEFAULT_ENV"))
# never written, even on the allow-list or asked for with --keep-env: a name that looks secret
SECRET_RE = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|(^|_)KEY($|_)|AUTH|COOKIE|PRIVATE",
                       re.IGNORECASE)
# set per rank by the harness (direct ranks) or by torchrun (its workers): never one value for all
PER_RANK = ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "NODE_RANK")
# torchrun's flags the scenario's launcher has a field for (harness.launchers.torchrun.FLAGS)
FLAG_FIELDS = ("nnodes", "nproc_per_node", "node_rank", "rdzv_backend", "rdzv_endpoint",
               "rdzv_id", "rdzv_conf", "master_addr", "master_port", "standalone",
               "max_restarts", "monitor_interval")
PROGRAM_DESTS = ("training_script", "training_script_args", "module", "no_python", "run_path")
PYTHON_RE = re.compile(r"python[0-9.]*\Z")
ASSIGN_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=", re.ASCII)
OUTCOMES = ("ok", "error", "timeout", "hang", "crash", "absent")
UNDERSTOOD = ("capture understands: torchrun ..., python -m torch.distributed.run ..., "
              "python -m torch.distributed.launch ..., python SCRIPT.py ARGS, python -m MODULE "
              "ARGS, each with leading NAME=VALUE assignments")


class CaptureError(UsageError):
    """A command capture cannot turn into a scenario (said in one line, no traceback)."""


def secret(name: str) -> bool:
    return bool(SECRET_RE.search(name))


def allowed(name: str) -> bool:
    return (name in ENV_NAMES or name in START_NAMES or name.startswith(ENV_PREFIXES)) \
        and not secret(name)


def shown(command: List[str]) -> str:
    """The command as written into the file: the value of every leading assignment that is not
    on the allow-list is replaced by ``...`` (a secret given on the command line never lands)."""
    env, argv = _assignments(list(command))
    lead = ["env"] if command[:1] == ["env"] else []
    words = lead + [f"{k}={v if allowed(k) else '...'}" for k, v in env.items()] + argv
    return shlex.join(words)


def split_env(env: Dict[str, str]) -> Tuple[Dict[str, str], List[str]]:
    """(the allow-listed variables, the names of every other one)."""
    kept = {k: v for k, v in env.items() if allowed(k)}
    return kept, sorted(k for k in env if not allowed(k))


# -- the command line ------------------------------------------------------------------------

def _assignments(argv: List[str]) -> Tuple[Dict[str, str], List[str]]:
    """Leading NAME=VALUE words (and ``env NAME=VALUE``): (assignments, the command)."""
    env: Dict[str, str] = {}
    i = 0
    if argv and argv[0] == "env":
        i = 1
    while i < len(argv) and ASSIGN_RE.match(argv[i]):
        k, _, v = argv[i].partition("=")
        env[k] = v
        i += 1
    return env, argv[i:]


def _torchrun_parser(kind: str = "torchrun") -> Any:
    import warnings

    try:
        with warnings.catch_warnings():   # torch's import-time warnings (NumPy missing) are noise
            warnings.simplefilter("ignore")
            from torch.distributed.run import get_args_parser
    except Exception as e:   # noqa: BLE001 - torch missing or broken: said, not raised
        raise CaptureError(f"cannot read torchrun's flags: torch.distributed.run does not "
                           f"import here ({type(e).__name__}: {e})") from None
    parser = get_args_parser()
    if kind == "launch":   # torch.distributed.launch.parse_args adds this one to torchrun's
        parser.add_argument("--use-env", "--use_env", default=False, action="store_true")
    return parser


def _parse_torchrun(rest: List[str], env: Dict[str, str], kind: str = "torchrun") -> Any:
    """torchrun's flags as torch itself parses them (PET_* of the command's environment too)."""
    import argparse
    import contextlib
    import io

    parser = _torchrun_parser(kind)
    parser.exit_on_error = False
    saved = dict(os.environ)
    err = io.StringIO()
    try:
        for k in [k for k in os.environ if k.startswith("PET_")]:
            del os.environ[k]
        defaults = vars(parser.parse_args(["x.py"]))
        os.environ.update({k: v for k, v in env.items() if k.startswith("PET_")})
        with contextlib.redirect_stderr(err):
            parsed = vars(parser.parse_args(rest))
    except (SystemExit, argparse.ArgumentError) as e:
        msg = str(e) if isinstance(e, argparse.ArgumentError) else \
            (err.getvalue().strip().splitlines() or ["bad arguments"])[-1]
        raise CaptureError(f"torchrun's own parser refuses these arguments: {msg}") from None
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return parsed, defaults


def _rdzv_conf(text: str) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for part in [p for p in text.split(",") if p]:
        k, eq, v = part.partition("=")
        if not eq:
            raise CaptureError(f"--rdzv-conf {text!r}: write key=value,...")
        for conv in (int, float):
            try:
                out[k] = conv(v)
                break
            except ValueError:
                continue
        else:
            out[k] = {"true": True, "false": False}.get(v.lower(), v)
    return out


def _launcher_from(parsed: Dict[str, Any], defaults: Dict[str, Any], kind: str
                   ) -> Tuple[Dict[str, Any], int]:
    """The scenario's launcher mapping and the world size from torchrun's parsed flags."""
    launcher: Dict[str, Any] = {"kind": kind}
    extra: List[str] = []
    nproc = parsed.get("nproc_per_node")
    try:
        world = int(str(nproc))
    except (TypeError, ValueError):
        raise CaptureError(f"--nproc-per-node {nproc!r}: capture needs a number of workers "
                           "(this machine has no GPU to count)") from None
    for dest, value in parsed.items():
        if dest in PROGRAM_DESTS or dest == "nproc_per_node" or value == defaults.get(dest):
            continue
        if kind == "launch" and dest == "use_env":
            launcher["use_env"] = bool(value)
        elif dest == "rdzv_conf":
            launcher["rdzv_conf"] = _rdzv_conf(value)
        elif dest == "nnodes":
            launcher["nnodes"] = int(value) if str(value).isdigit() else value
        elif dest in ("master_port", "max_restarts", "node_rank"):
            launcher[dest] = int(value)
        elif dest == "monitor_interval":
            launcher[dest] = float(value)
        elif dest == "rdzv_endpoint" and str(value).endswith(":0"):
            # port 0: torchrun picks a free one; the scenario's endpoint without a port is the
            # run's own leased port (a scenario's port is 1..65535)
            launcher[dest] = str(value)[:-2]
        elif dest in FLAG_FIELDS:
            launcher[dest] = value
        elif isinstance(value, bool):   # another flag, verbatim as torchrun spells it
            if value:
                extra.append("--" + dest.replace("_", "-"))
        elif value is not None:
            extra += ["--" + dest.replace("_", "-"), str(value)]
    if extra:
        launcher["args"] = extra
    if parsed.get("no_python"):
        raise CaptureError("--no-python (a program that is not a Python file) is not supported "
                           "by the harness's torchrun launcher")
    return launcher, world


def _rel(path: Path, base: Path) -> str:
    """Relative to the scenario file's folder when inside it (the file travels with its
    program), else absolute."""
    return os.path.relpath(path, base) if base in path.parents or path == base else str(path)


def _program(argv: List[str], module: bool, out_dir: Path, cwd: Path) -> Dict[str, Any]:
    """The scenario's program mapping: the script relative to the scenario file's folder."""
    if not argv:
        raise CaptureError("no program after the launcher: " + UNDERSTOOD)
    head, args = argv[0], list(argv[1:])
    if module:
        prog: Dict[str, Any] = {"module": head}
    else:
        path = (cwd / head).resolve()
        if not path.is_file():
            raise CaptureError(f"no such file: {path} (the program of the command)")
        if not head.endswith(".py"):
            raise CaptureError(f"{head}: the program must be a Python file (SCRIPT.py) or "
                               "-m MODULE")
        prog = {"script": _rel(path, out_dir)}
    if args:
        prog["args"] = args
    if cwd.resolve() != out_dir.resolve():
        prog["cwd"] = _rel(cwd.resolve(), out_dir.resolve())
    return prog


def _same_env(a: str, b: str) -> bool:
    """Two interpreters of one environment: the same file, or one bin folder (a virtual env's
    python is a link to its base interpreter: the link's folder, not its target, says which
    site-packages, so which torch, it imports)."""
    return os.path.abspath(a) == os.path.abspath(b) or \
        Path(os.path.abspath(a)).parent.resolve() == Path(os.path.abspath(b)).parent.resolve()


def _interpreter_of(script: Optional[str], env: Dict[str, str]) -> str:
    """The Python a console script (torchrun) runs under, from its ``#!`` line ("" when it is
    not one capture can read)."""
    if not script:
        return ""
    try:
        with open(script, "rb") as f:
            first = f.readline(512).decode(errors="replace").strip()
    except OSError:
        return ""
    if not first.startswith("#!"):
        return ""
    words = first[2:].split()
    if words[:1] and os.path.basename(words[0]) == "env" and len(words) > 1:
        return shutil.which(words[1], path=env.get("PATH")) or ""
    return words[0] if words and PYTHON_RE.match(os.path.basename(words[0])) else ""


def scenario_of(command: List[str], out: Path, env: Optional[Dict[str, str]] = None,
                cwd: Optional[Path] = None, name: Optional[str] = None,
                deadline: float = 60.0, world_size: Optional[int] = None,
                keep_env: Tuple[str, ...] = ()) -> Tuple[Dict[str, Any], List[str]]:
    """(the scenario mapping, the names of variables left out) for COMMAND (pure: reads no
    process, runs nothing but torch's argument parser)."""
    env = dict(os.environ if env is None else env)
    cwd = Path.cwd() if cwd is None else cwd
    out_dir = out.resolve().parent
    assigned, argv = _assignments(list(command))
    if not argv:
        raise CaptureError("no command after --: " + UNDERSTOOD)
    env.update(assigned)
    word = Path(argv[0]).name
    scn: Dict[str, Any] = {}
    if word in ("srun", "salloc", "sbatch", "mpirun", "mpiexec"):
        hint = ("write a launcher: slurm scenario by hand, docs/how-to/slurm.md"
                if word.startswith("s") else "the harness has no MPI launcher")
        raise CaptureError(f"{word}: not supported yet ({hint}). " + UNDERSTOOD)
    python = ""
    if word == "torchrun":
        kind, rest = "torchrun", argv[1:]
    elif PYTHON_RE.match(word) or word.endswith(".py"):
        if PYTHON_RE.match(word):
            python, rest = argv[0], argv[1:]
            while rest and rest[0] == "-u":   # unbuffered: the harness's ranks always are
                rest = rest[1:]
            if rest and rest[0].startswith("-") and rest[0] != "-m":
                raise CaptureError(f"python option {rest[0]}: not supported (only -u and -m "
                                   "before the program)")
        else:
            rest = argv
        if rest[:2] == ["-m", "torch.distributed.run"]:
            kind, rest = "torchrun", rest[2:]
        elif rest[:2] == ["-m", "torch.distributed.launch"]:
            kind, rest = "launch", rest[2:]
        else:
            kind = "direct"
    else:
        raise CaptureError(f"{argv[0]}: not a command capture understands. " + UNDERSTOOD)
    if python:
        found = shutil.which(python, path=env.get("PATH")) or python
        if not _same_env(found, sys.executable):
            scn["python"] = found
    elif word == "torchrun":   # the interpreter of the torchrun the command finds: its torch
        interp = _interpreter_of(shutil.which(argv[0], path=env.get("PATH")), env)
        if interp and not _same_env(interp, sys.executable):
            scn["python"] = interp
    kept, left_out = split_env(env)
    for k in keep_env:
        if secret(k):
            raise CaptureError(f"--keep-env {k}: its name looks like a secret's; capture never "
                               "writes one (give the program another way to get it)")
        if k in env:
            kept[k] = env[k]
            left_out = [n for n in left_out if n != k]
    dropped: List[str] = []
    if kind == "direct":
        module = rest[:1] == ["-m"]
        program = _program(rest[1:] if module else rest, module, out_dir, cwd)
        ws = world_size or int(kept.get("WORLD_SIZE", "1") or 1)
        if kept.get("MASTER_ADDR"):
            scn["master_addr"] = kept["MASTER_ADDR"]
        for k in ("WORLD_SIZE", "MASTER_ADDR") + PER_RANK:
            if k in kept:
                del kept[k]
                dropped.append(k)
        stem = Path(program.get("script") or program.get("module", "program")).stem
        scn.update(world_size=ws)
    else:
        parsed, defaults = _parse_torchrun(rest, env, kind)
        launcher, ws = _launcher_from(parsed, defaults, kind)
        if world_size is not None and world_size != ws:
            raise CaptureError(f"--world-size {world_size} but the command starts {ws} workers "
                               "(--nproc-per-node)")
        target = [parsed["training_script"]] + list(parsed["training_script_args"] or [])
        program = _program(target, bool(parsed.get("module")), out_dir, cwd)
        for k in [k for k in kept if k in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                  + PER_RANK]:
            del kept[k]          # torchrun sets these for its workers itself
            dropped.append(k)
        for k in [k for k in kept if k.startswith("TORCHELASTIC_")]:
            del kept[k]          # torchrun's own, for its workers
            dropped.append(k)
        stem = Path(str(parsed["training_script"])).stem
        scn.update(world_size=ws, launcher=launcher)
    scn["program"] = program
    if kept:
        scn["env"] = dict(sorted(kept.items()))
    scn["deadline"] = deadline
    scn = {"name": name or re.sub(r"[^A-Za-z0-9_.-]", "_", f"captured_{stem}"),
           "about": "", **scn}
    return scn, sorted(set(left_out) | {f"{k} (set per process by the launcher or the "
                                          f"harness)" for k in dropped})


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


# -- the original launch, as written ---------------------------------------------------------

ORIGINAL_TOKEN = "HARNESS_CAPTURE_ORIGINAL"   # marks every process of the original launch
LAST_LINES = 8
# the original launch's limit is the deadline plus this: its interpreters start and import torch
# cold (torchrun, then its workers), which the harness's deadline, counted from the start line
# its ranks pass once imported, leaves out
START_ALLOWANCE = 30.0


class Original:
    """How the user's own launch ended: ``state`` ok (every process exit 0), error (one exit
    non-zero or a signal) or hang (alive at the deadline, then killed); ``exit`` the launch's
    status (torchrun's, or the first rank's that failed), the output kept."""

    def __init__(self, state: str, exit: Optional[int], detail: str, seconds: float,
                 output: str):
        self.state, self.exit, self.detail, self.seconds = state, exit, detail, seconds
        self.output = output

    def last_lines(self, n: int = LAST_LINES) -> List[str]:
        lines = [ln.rstrip()[:240] for ln in self.output.splitlines() if ln.strip()]
        return lines[-n:]

    def notable(self, n: int = 3) -> List[str]:
        """Its last exception lines (``[rank1]: ValueError: ...``), else its last lines."""
        lines = self.last_lines(10_000)
        exc = [ln for ln in lines if re.search(r"\b[A-Z]\w*(Error|Exception|Exit|Interrupt)\b"
                                               r"(:|$)", ln) and not ln.startswith(" ")]
        seen: List[str] = []
        for ln in reversed(exc):
            if ln not in seen:
                seen.insert(0, ln)
            if len(seen) == n:
                break
        return seen or lines[-n:]

    def summary(self) -> str:
        if self.state == "hang":
            what = f"alive at the deadline ({self.seconds:.0f} s), killed"
        else:
            what = f"exit {self.exit}"
        return what + (f" ({self.detail})" if self.detail else "") + \
            ("" if self.state == "hang" else f" in {self.seconds:.1f} s")


def _marked(token: str) -> List[int]:
    """Every process whose environment carries the original launch's token (torchrun's
    workers run in sessions of their own: the group of the launch does not hold them)."""
    needle = f"{ORIGINAL_TOKEN}={token}".encode() + b"\0"
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if needle in f.read():
                    out.append(int(d))
        except OSError:
            continue
    return out


def _kill_marked(token: str) -> None:
    import signal
    import time

    for _ in range(50):
        pids = _marked(token)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.1)


def run_original(command: List[str], kind: str, world: int, cwd: Path, deadline: float,
                 tmp: Path) -> Original:
    """Run the launch as written (the whole environment of this shell and of the command
    line), in ``cwd``, until it ends or the deadline: a direct ``python SCRIPT`` once per rank
    with RANK/LOCAL_RANK (and WORLD_SIZE, MASTER_ADDR, MASTER_PORT when the command sets
    none), as one command per rank is launched by hand."""
    import time
    import uuid

    from ..machine.output_caps import Capture
    from ..machine.ports import PortLease
    from ..machine.procs import ManagedProcess, PidRecord

    assigned, argv = _assignments(list(command))
    token = uuid.uuid4().hex
    base = {**os.environ, **assigned, ORIGINAL_TOKEN: token}
    if shutil.which(argv[0], path=base.get("PATH")) is None:
        raise CaptureError(f"the launch does not start: {argv[0]}: not found on its PATH (capture "
                           "runs the command as written first, to see how it ends)")
    envs: List[Dict[str, str]] = []
    lease = PortLease()
    try:
        if kind == "direct":
            common = {"WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world)}
            if not base.get("MASTER_ADDR"):
                common["MASTER_ADDR"] = "127.0.0.1"
            if not base.get("MASTER_PORT"):
                common["MASTER_PORT"] = str(lease.take())
            for r in range(world):
                envs.append({**base, **common, "RANK": str(r), "LOCAL_RANK": str(r)})
        else:
            envs.append(base)
        cap = Capture(head=256 << 10, tail=64 << 10)
        procs: List[Any] = []
        outs: List[Path] = []
        t0 = time.monotonic()
        try:
            for r, env in enumerate(envs):
                outs.append(tmp / f"original-{r}.out")
                w = cap.pipe(outs[-1])
                try:
                    procs.append(ManagedProcess(argv, name=f"original {r}", env=env,
                                                cwd=str(cwd), stdout=w, stderr=w,
                                                record=PidRecord(tmp / "pids.jsonl"),
                                                exec_wrapper=True))
                except OSError as e:
                    raise CaptureError(f"the launch does not start: {argv[0]}: "
                                       f"{e.strerror or e}") from None
                finally:
                    os.close(w)
            while any(p.poll() is None for p in procs) and \
                    time.monotonic() - t0 < deadline + START_ALLOWANCE:
                time.sleep(0.1)
            seconds = time.monotonic() - t0
            hung = [i for i, p in enumerate(procs) if p.poll() is None]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            _kill_marked(token)
            cap.close()
    finally:
        lease.release()
    output = "\n".join(o.read_text(errors="replace") for o in outs if o.exists())
    who = (lambda i: f"rank {i}") if kind == "direct" else (lambda i: kind)
    if hung:
        return Original("hang", None, ", ".join(who(i) for i in hung) + " still running",
                        seconds, output)
    codes = [int(p.returncode) for p in procs]
    bad = [i for i, c in enumerate(codes) if c != 0]
    if not bad:
        return Original("ok", 0, "", seconds, output)
    i = bad[0]
    parts = [who(i)] if kind == "direct" and world > 1 else []
    if codes[i] < 0:
        parts.append(f"killed by signal {-codes[i]}")
    detail = ", ".join(parts)
    return Original("error", codes[i], detail, seconds, output)


# the job outcomes of a replay that agree with how the original launch ended
AGREES = {"ok": ("ok",), "error": ("error", "timeout", "crash"), "hang": ("hang",)}


def differs(orig: Original, case: Dict[str, Any], missing: List[str],
            left_out: List[str]) -> str:
    """Why a replay (a report's case) does not reproduce the original launch, or "": its job
    ended another way, or a rank failed with an exception the original's output never names.
    ``missing``: the variables the original had and the replays have not (set on the
    command line, not written); ``left_out``: every name not written."""
    job = case.get("job")
    ranks = case.get("ranks") or []
    failed = [r for r in ranks if r.get("outcome") not in ("ok", None)]
    why = ""
    if job not in AGREES[orig.state]:
        why = f"the original launch ended {orig.summary()}, this replay's job {job}"
    elif orig.state == "error":
        alien = [r for r in failed if r.get("exception") and not re.search(
            r"\b" + re.escape(str(r["exception"]).rsplit(".", 1)[-1]) + r"\b", orig.output)]
        if alien:
            failed = alien
            why = (f"the original launch ended {orig.summary()} and its output never names "
                   + ", ".join(sorted({str(r['exception']) for r in alien})))
    if not why:
        return ""
    rows = []
    for r in failed[:6]:
        msg = [ln.strip() for ln in str(r.get("message") or "").splitlines()
               if re.search(r"[A-Za-z0-9]{2}", ln)][:1]
        rows.append(f"{'rank ' if r['label'][:1].isdigit() else ''}{r['label']} "
                    f"{r.get('outcome')}" + (f" ({r['phase']})" if r.get("phase") else "")
                    + (f" {r['exception']}" if r.get("exception") else "")
                    + (f": {msg[-1][:200]}" if msg else ""))
    text = " ".join(str(r.get("message") or "") for r in failed)
    named = [n for n in left_out if n.split(" ")[0] and re.search(
        r"\b" + re.escape(n.split(" ")[0]) + r"\b", text)]
    hint = [n.split(" ")[0] for n in named or missing]
    out = why + ("; " + "; ".join(rows) if rows else "")
    if orig.state == "hang":
        out += (f". (The original launch had the deadline + {START_ALLOWANCE:g} s for its start, "
                "which the harness's deadline does not count: if it was still starting or "
                "slow, give a longer --deadline)")
    keep = [n for n in hint if not secret(n)]
    if keep:
        out += (". The replays ran without " + ", ".join(keep[:5]) + " (the original launch "
                "had it; not written): if the program needs it, "
                + " ".join(f"--keep-env {n}" for n in keep[:5]) + " writes it into the file")
    if len(keep) < len(hint):
        out += (". Left out for its secret-looking name, never written: "
                + ", ".join(n for n in hint if secret(n))[:200]
                + " (give it to the program another way)")
    if not hint:
        out += (". If the program needs a variable that was not written, give --keep-env NAME"
                + (f" (left out: {', '.join(left_out[:12])}"
                   + (", ..." if len(left_out) > 12 else "") + ")" if left_out else ""))
    return out


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
    kind = (scn.get("launcher") or {}).get("kind", "direct")
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
    copied = (f"Each run of capture (the original launch, then each replay) ran in its own copy "
              f"of {workdir}" + (f" (not copied: {', '.join(folder.skipped[:10])})"
                                 if folder.skipped else "") + ".")
    seen: List[Dict[str, Any]] = []
    from ..machine.rundir import own_folder

    with own_folder() as tmp_:
        tmp = Path(tmp_)
        say(f"original launch: {shown(command)[:200]} (in a copy of {workdir}, up to "
            f"{deadline:g} s + {START_ALLOWANCE:g} s for its start)")
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
    agree = all(c.get("status") == "passed" for c in seen[1:])
    if len(seen) == 1:
        verdict = "one run watched (--runs 3 or more checks that it holds)"
    elif agree:
        verdict = "every run gave the same verdicts"
    else:
        verdict = "verdicts differed between runs: every one watched is allowed"
    say(f"wrote {out}: {verdict}, as the original launch ended ({orig.summary()})")
    say(f"run it again: harness run {out}")
    return 0

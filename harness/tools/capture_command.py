"""A user's launch command read as a scenario, for ``harness capture`` (harness.tools.capture):
which launcher it is (``torchrun``, ``python -m torch.distributed.run`` / ``launch``, ``python
SCRIPT`` / ``-m MODULE`` with leading ``NAME=VALUE``), torchrun's flags by torch's own
``get_args_parser``, the program and its folder, the ``python:`` of another environment
(``_same_env``), and the environment cut to the allow-list (``ENV_NAMES``, ``ENV_PREFIXES``,
``START_NAMES``; never a secret-looking name). ``scenario_of`` is pure: it reads no process and
runs nothing but torch's argument parser."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..core.errors import UsageError

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


def _launch_kind(argv: List[str]) -> Tuple[str, List[str], str]:
    """(direct, torchrun or launch; the words after the launcher; the python the command
    names, "" when it names none) of a command capture understands."""
    word = Path(argv[0]).name
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
    return kind, rest, python


def _python_of(argv: List[str], python: str, env: Dict[str, str]) -> Optional[str]:
    """The scenario's ``python:``: the interpreter the command names, or its torchrun's, when
    of another environment than this one; None when the same."""
    if python:
        found = shutil.which(python, path=env.get("PATH")) or python
        if not _same_env(found, sys.executable):
            return found
    elif Path(argv[0]).name == "torchrun":   # the interpreter of the torchrun found: its torch
        interp = _interpreter_of(shutil.which(argv[0], path=env.get("PATH")), env)
        if interp and not _same_env(interp, sys.executable):
            return interp
    return None


def _kept_env(env: Dict[str, str], keep_env: Tuple[str, ...]
              ) -> Tuple[Dict[str, str], List[str]]:
    """(the variables written, the names of those left out): the allow-list and --keep-env."""
    kept, left_out = split_env(env)
    for k in keep_env:
        if secret(k):
            raise CaptureError(f"--keep-env {k}: its name looks like a secret's; capture never "
                               "writes one (give the program another way to get it)")
        if k in env:
            kept[k] = env[k]
            left_out = [n for n in left_out if n != k]
    return kept, left_out


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
    scn: Dict[str, Any] = {}
    kind, rest, python = _launch_kind(argv)
    interpreter = _python_of(argv, python, env)
    if interpreter is not None:
        scn["python"] = interpreter
    kept, left_out = _kept_env(env, keep_env)
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

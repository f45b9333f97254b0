"""Per-user state folders, run directories in them, and the sweep of what killed runs left.

State lives in ``<tmp>/torchdist-harness-<uid>/`` (``<tmp>``: ``$HARNESS_TMP``, else the
system's temp dir), mode 0700, one folder per user: a root run and a non-root run on one
machine never share (or lock each other out of) a state folder. A folder that is a symlink, is
not a directory, or belongs to another user is refused with one line (a HarnessError), never
used. Port locks are the one thing shared across users (``harness.machine.ports``).

Each run has ``run-<id>/`` holding ``owner.json`` (the supervisor's pid and start time) and
``pids.jsonl`` (every process it started: ranks, port holders, helpers). A session's zygote
(``harness.ranks.forkserver``: the warm parent of ``start: fork`` servers, which outlives runs) has
a folder of the same shape, ``zygote-<id>/``, owned by its supervisor. A run that ends tidies up
after itself; a run that was killed cannot, so every new run first sweeps: a run directory whose
owner is gone has its recorded processes killed (only if pid and start time still match) and is
removed. Runs of live owners (concurrent pytest-xdist workers) are left alone.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Dict, Iterator, List, Optional

from ..core.errors import HarnessError
from ..core.protocol import RUN_TMP
from .procs import PidRecord, alive, identity

STATE_PREFIX = "torchdist-harness-"


def tmp_root() -> Path:
    return Path(os.environ.get("HARNESS_TMP") or tempfile.gettempdir())


def _refuse(d: Path, why: str) -> HarnessError:
    return HarnessError(f"state folder {d}: {why}; remove it, or set HARNESS_TMP to a folder "
                        "of your own")


def private_dir(d: Path) -> Path:
    """``d`` as a folder of this user only (0700): made if missing; refused if it is a
    symlink, not a folder, another user's, or not writable."""
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise _refuse(d, f"cannot create it ({e.strerror or e})") from None
    try:
        st = os.lstat(d)
    except OSError as e:
        raise _refuse(d, f"cannot read it ({e.strerror or e})") from None
    me = os.geteuid()
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(d, "it is a symbolic link (refused: it could point anywhere)")
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(d, "it is not a folder")
    if st.st_uid != me:
        raise _refuse(d, f"it belongs to uid {st.st_uid}, not to you (uid {me})")
    if st.st_mode & 0o077:
        try:
            os.chmod(d, 0o700)
        except OSError as e:
            raise _refuse(d, f"cannot make it private ({e.strerror or e})") from None
    if not os.access(d, os.W_OK | os.X_OK):
        raise _refuse(d, "it is not writable")
    return d


def base_dir() -> Path:
    """This user's state folder, ``<tmp>/torchdist-harness-<uid>`` (see the module's doc)."""
    return private_dir(tmp_root() / f"{STATE_PREFIX}{os.geteuid()}")


def shared_base(folder: str) -> Path:
    """This user's state folder inside ``folder`` (a shared file system every node of an
    allocation sees: ``--harness-shared-dir``)."""
    return private_dir(Path(folder).absolute() / f"{STATE_PREFIX}{os.geteuid()}")


PACKAGE_DIR = Path(__file__).resolve().parent.parent


@functools.cache
def package_path(base: Optional[Path] = None) -> str:
    """A folder that holds the harness package and nothing else (``harness``, a symbolic link
    to it), for a child's ``PYTHONPATH``. The folder above the package is never put there: for
    a wheel it is a whole site-packages, whose torch would shadow the one of the interpreter a
    rank was given (``--python``, ``python:``, ``harness compare``); for a checkout it holds
    ``tests``, ``conftest.py`` and ``benchmarks``, names a user's program may import. Kept in
    the state folder, one per package location (not swept: it is no run's); ``base``: another
    state folder (an allocation's shared one, :func:`shared_base`, which its nodes see: a
    node's own temp folder has no such link)."""
    import hashlib

    key = hashlib.sha256(str(PACKAGE_DIR).encode()).hexdigest()[:12]
    d = (base or base_dir()) / f"pkgpath-{key}"
    d.mkdir(mode=0o700, exist_ok=True)
    link = d / PACKAGE_DIR.name
    try:
        ok = os.readlink(link) == str(PACKAGE_DIR)
    except OSError:
        ok = False
    if not ok:   # made (or mended) atomically: a concurrent run sees the old link or the new
        tmp = d / f".{PACKAGE_DIR.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}"
        os.symlink(PACKAGE_DIR, tmp)
        os.replace(tmp, link)
    return str(d)


# the kinds of owned folders the sweep looks at: a run's, a session's zygote's
# (harness.ranks.forkserver: it outlives runs, not its supervisor), and ``harness run``'s own (its
# report where none was asked for: a SIGKILLed command leaves it to the next sweep)
KINDS = ("run", "zygote", "cli")


class RunDir:
    def __init__(self, base: Optional[Path] = None, shared: bool = False, kind: str = "run"):
        """``shared``: the run's directory lies where other machines see it too (an
        allocation's run): its owner says its machine, and a sweep on another machine leaves
        it alone (it cannot tell whether that owner lives). ``kind``: ``run``, or ``zygote``
        for a session's zygote's folder (owner and pid record, the same shape)."""
        if kind not in KINDS:
            raise ValueError(f"not a kind of state folder: {kind!r}")
        self.base = base or base_dir()
        self.id = uuid.uuid4().hex[:8]
        self.path = self.base / f"{kind}-{self.id}"
        # made under a name the sweep ignores, owned, then renamed: a concurrent sweep never
        # sees a run-* directory without its owner
        tmp = self.base / f".new-{self.id}"
        owner = dict(identity(os.getpid()))
        if shared:
            owner["host"] = socket.gethostname()
        try:
            tmp.mkdir(mode=0o755)
            (tmp / "owner.json").write_text(json.dumps(owner))
            if kind == "run":    # the temp folder of its processes (TMPDIR; plan.run_tmp)
                (tmp / RUN_TMP).mkdir(mode=0o700)
            os.rename(tmp, self.path)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise HarnessError(f"cannot make a run directory in {self.base}: "
                               f"{e.strerror or e}") from None

    @property
    def pids(self) -> PidRecord:
        """The record of every process this run started (harness.machine.procs)."""
        return PidRecord(self.path / "pids.jsonl")

    def record_pid(self, pid: int, name: str = "") -> None:
        self.pids.add(pid, name)

    def remove(self) -> None:
        _rmtree(self.path)


@contextlib.contextmanager
def own_folder() -> Iterator[Path]:
    """A folder of this command's own (``cli-<id>`` in the state folder: ``harness capture``'s
    and ``harness explore``'s reports and scenario files), removed when the block ends; a
    SIGKILLed command leaves it to the next run's sweep, where a bare temp dir stayed for good.
    Made and removed under a shield: a Ctrl-C neither leaves it made but unremembered nor
    half-removed."""
    from . import interrupts

    with interrupts.shield():
        d = RunDir(kind="cli")
    try:
        yield d.path
    finally:
        with interrupts.shield():
            d.remove()


def _rmtree(path: Path) -> None:
    """Remove a run directory whatever a step made of it: read-only folders get their mode back,
    and as root immutable ones (chattr +i, which a step may make and undoes itself, but
    not when the run was killed) lose the flag."""
    def onerror(func, p, exc):
        try:
            os.chmod(os.path.dirname(p), 0o755)
            os.chmod(p, 0o755)
            func(p)
        except OSError:
            pass
    shutil.rmtree(path, onerror=onerror)
    if path.exists() and os.geteuid() == 0 and shutil.which("chattr"):
        subprocess.run(["chattr", "-R", "-i", str(path)], capture_output=True,
                       start_new_session=True)
        shutil.rmtree(path, onerror=onerror)


def kill_recorded(run: Path) -> List[int]:
    """Kill what a run recorded and is still the same process (harness.machine.procs.alive)."""
    return PidRecord(run / "pids.jsonl").kill_all()


def _owner_alive(run: Path) -> bool:
    """The run's owner lives, or lives on another machine (a shared folder's run, owned
    elsewhere: not this machine's to judge)."""
    try:
        owner = json.loads((run / "owner.json").read_text())
    except (OSError, ValueError):
        return False
    if isinstance(owner, dict) and owner.get("host") not in (None, socket.gethostname()):
        return True
    return isinstance(owner, dict) and alive(owner)


def cancel_steps(run: Path) -> List[str]:
    """A dead allocation run's Slurm steps (``alloc/steps``, as its tasks reported them):
    ``scancel JOB.STEP`` each, never a whole job; returns the steps asked to end."""
    try:
        steps = (run / "alloc" / "steps").read_text().split()
    except OSError:
        return []
    out = []
    for step in steps:
        job, _, num = step.partition(".")
        if job.isdigit() and num.isdigit() and shutil.which("scancel"):
            try:
                subprocess.run(["scancel", "--quiet", step], capture_output=True, timeout=30,
                               start_new_session=True)
            except (OSError, subprocess.TimeoutExpired):
                continue
            out.append(step)
    return out


def sweep(base: Optional[Path] = None) -> List[str]:
    """Remove leftovers of dead runs; returns what was removed (for `harness doctor`)."""
    removed = []
    base = base or base_dir()
    for run in sorted(p for kind in KINDS for p in base.glob(f"{kind}-*")):
        if _owner_alive(run):
            continue
        pids = kill_recorded(run)
        steps = cancel_steps(run)
        _rmtree(run)
        removed.append(f"{run.name}" + (f" (killed {pids})" if pids else "")
                       + (f" (cancelled Slurm steps {', '.join(steps)})" if steps else ""))
    for d in sorted(base.glob("pkgpath-*")):
        # package_path's folder of a package that is gone (a removed venv or wheel install):
        # its link leads nowhere, and no process can import through it any more
        link = d / PACKAGE_DIR.name
        if link.is_symlink() and not link.exists():
            _rmtree(d)
            removed.append(d.name)
    for f in sorted(base.glob("probe2-*.json")):
        # torch_probe's answer about a torch that is gone (a removed venv or clone): no
        # interpreter can ask with its key again (the key holds torch's folder). A cache, not
        # a leftover of a run: removed without a word (not in what the sweep returns)
        try:
            gone = not os.path.isdir(json.loads(f.read_text()).get("torch_path") or "")
        except (OSError, ValueError, AttributeError):
            gone = True
        if gone:
            f.unlink(missing_ok=True)
    return removed


def live_runs(base: Optional[Path] = None) -> Dict[str, bool]:
    """Run id -> whether its owner is alive, for every run directory (the sweep of what runs
    made outside their directory, cgroups, reads it)."""
    base = base or base_dir()
    return {run.name[len("run-"):]: _owner_alive(run) for run in base.glob("run-*")}


def leftovers(base: Optional[Path] = None) -> List[str]:
    """Run dirs of dead owners and harness processes without a live run (read-only)."""
    out = []
    base = base or base_dir()
    for run in sorted(p for kind in KINDS for p in base.glob(f"{kind}-*")):
        if not _owner_alive(run):
            out.append(str(run))
    return out

"""file_init: faults of file:// initialisation (per-rank paths, stale file, unwritable dir,
a directory that is not there, a read-only mount).

``python -m harness.faults.file_init --stale PATH WORLD_SIZE`` is the helper that leaves a
FileStore file the way a killed job does: used, then SIGKILLed mid-run.

The evidence of the steps, read at the end of the run: ``StaleFileStore``, the file's size
when the killed job left it and at the end (it acted when the ranks wrote into the stale file:
it grew); ``Unwritable``, the folder's mode and immutable flag read back, what is in it, and
the ranks' errors (it acted when a rank was refused: EPERM/EACCES); ``ReadOnlyDir``, what is in
the folder and the ranks' errors (it acted when a rank met "Read-only file system"). The
plan-only modes act through the ranks' init URLs and add a step that only reads:
``SeparatePaths`` (per_rank_path), the FileStore files the ranks made and whose keys each holds
(it acted when the ranks' stores were in two files or more), and ``MissingDir``, the folder
still missing at the end and the ranks that went into init (it acted when a rank tried to open
the store there and nobody made the folder).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Literal, Optional

from pydantic import Field

from ..core.limits import MAX_WORLD
from ..core.protocol import PHASE
from ..machine.requirement import RESOLVER_VIEW, Tool
from ..net.resolver import ENV_READ_ONLY
from . import Fault
from ._rank_limit import rank_errors
from .steps import Effect, Step, StepError

REFUSED = r"operation not permitted|permission denied|EPERM|EACCES"
READ_ONLY = r"read-only file system|EROFS"


def _ranks(rt) -> List[str]:
    return [r.label for r in rt.plan.ranks]


def _met(rt, pattern: str, what: str) -> Dict[str, Any]:
    """The ranks whose own error says they met the fault, as summary words and events."""
    hits = rank_errors(rt, _ranks(rt), pattern)
    words = ""
    if hits:
        who = ", ".join(h["rank"] for h in hits)
        words = f"{what} (rank{'s' * (len(hits) > 1)} {who}): {hits[0]['line']}"
    return {"hits": hits, "words": words,
            "events": [{"t": h["t"] or 0.0, "what": f"rank {h['rank']}: {h['line']}"}
                       for h in hits]}


def _listing(path: str) -> List[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []

CHATTR = Tool("chattr", package="e2fsprogs", only_as_root=True,
              ok="file_init unwritable_dir can make a directory immutable as root",
              why="as root a 0555 directory is still writable, so file_init unwritable_dir "
                  "makes it immutable with chattr +i")


@dataclass
class StaleFileStore(Step):
    """Run a one-rank job on ``path`` and SIGKILL it mid-run, before the ranks start."""

    path: str = ""
    world_size: int = 1
    _left: Optional[Dict[str, Any]] = field(default=None, init=False, repr=False, compare=False)

    def do(self, rt):
        job = rt.run_helper("stale filestore", rt.python(
            "harness.faults.file_init", "--stale", self.path, str(self.world_size)))
        if job.returncode != -9 or not os.path.exists(self.path):
            raise StepError(f"could not make a stale FileStore at {self.path}: rc "
                            f"{job.returncode}: {job.stderr[-800:]}")
        self._left = {"size": os.path.getsize(self.path), "t": round(rt.now(), 3)}
        return {"size": self._left["size"]}

    def effect(self, rt):
        left = (self._left or {}).get("size", 0)
        try:
            now = os.path.getsize(self.path)
        except FileNotFoundError:
            now = None
        t = round(rt.now(), 3)
        nums = {"bytes_left": left, "bytes_at_end": now}
        if now is None:
            # the last client of a FileStore removes its file: the ranks opened this one
            what = (f"the killed job's file ({left} bytes) was removed by the ranks' FileStore "
                    "when they closed it")
            return Effect(acted=True, summary=what, numbers=nums,
                          events=[{"t": t, "what": what}])
        what = (f"the killed job left {left} bytes at {self.path}; at the end it held {now}"
                + (": the ranks wrote into it" if now > left else ": no rank wrote into it"))
        return Effect(acted=now > left, summary=what, numbers=nums,
                      events=[{"t": t, "what": what}])

    def describe(self):
        return f"leave a stale FileStore at {self.path}"


@dataclass
class Unwritable(Step):
    """A directory the ranks cannot write: mode 0555 and, as root (who writes anywhere),
    immutable (chattr +i); undone at teardown so that the run directory can be removed."""

    path: str = ""
    UNDO_AT_TEARDOWN: ClassVar[bool] = True

    def do(self, rt):
        os.makedirs(self.path, exist_ok=True)
        os.chmod(self.path, 0o555)
        if os.geteuid() == 0:
            p = subprocess.run(["chattr", "+i", self.path], capture_output=True, text=True)
            if p.returncode != 0:
                raise StepError(f"could not make {self.path} immutable (chattr +i): "
                                f"{p.stderr.strip()}")

    def effect(self, rt):
        mode = os.stat(self.path).st_mode & 0o777
        flags = ""
        if os.geteuid() == 0:
            p = subprocess.run(["lsattr", "-d", self.path], capture_output=True, text=True)
            flags = p.stdout.split()[0] if p.returncode == 0 and p.stdout.strip() else ""
        immutable = "i" in flags
        inside = _listing(self.path)
        met = _met(rt, REFUSED, "it refused the ranks' writes")
        closed = not mode & 0o222 and (immutable or os.geteuid() != 0)
        state = (f"{self.path} mode {mode:04o}" + (", immutable" if immutable else "")
                 + (f", {len(inside)} file(s) in it" if inside else ", empty"))
        nums = {"mode": f"{mode:04o}", "immutable": immutable, "files": len(inside),
                "ranks_refused": len(met["hits"])}
        t = round(rt.now(), 3)
        if not closed:
            return Effect(acted=False, summary=f"{state}: it was writable", numbers=nums,
                          events=[{"t": t, "what": state}])
        return Effect(acted=bool(met["hits"]),
                      summary=state + "; " + (met["words"] or "no rank was refused by it"),
                      numbers=nums, events=[{"t": t, "what": f"read back: {state}"}]
                      + met["events"])

    def undo(self, rt):
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", self.path], capture_output=True)
        os.chmod(self.path, 0o755)

    def describe(self):
        return f"make {self.path} unwritable"


@dataclass
class ReadOnlyDir(Step):
    """The store's folder, made by the harness; the ranks see it as a read-only mount (each in
    a private mount namespace: harness.net.resolver.enter_read_only), nothing else does."""

    path: str = ""

    def do(self, rt):
        os.makedirs(self.path, exist_ok=True)

    def effect(self, rt):
        inside = _listing(self.path)
        met = _met(rt, READ_ONLY, "the read-only mount refused the ranks' writes")
        state = f"{self.path} " + (f"holds {len(inside)} file(s)" if inside else "is empty")
        nums = {"files": len(inside), "ranks_refused": len(met["hits"])}
        events = [{"t": round(rt.now(), 3), "what": state}] + met["events"]
        if inside:
            return Effect(acted=False, summary=f"{state}: a rank wrote there, the mount was not "
                          "read-only for it", numbers=nums, events=events)
        return Effect(acted=bool(met["hits"]),
                      summary=state + "; " + (met["words"] or "no rank met the read-only mount"),
                      numbers=nums, events=events)

    def describe(self):
        return f"make {self.path}, mounted read-only in the ranks"


_RANK_KEY = re.compile(rb"/default_pg/\d+//\w+//\d+/(\d+)")


@dataclass
class SeparatePaths(Step):
    """per_rank_path: the plan gave the ranks paths of their own and nothing is done at run
    time; at the end this reads which of the paths the ranks' FileStores made, and the ranks
    whose keys each file holds."""

    paths: Dict[str, str] = field(default_factory=dict)   # rank label -> its FileStore file
    UNDO_AT_TEARDOWN: ClassVar[bool] = False

    def do(self, rt):
        return None

    def effect(self, rt):
        files: Dict[str, List[str]] = {}
        for label, path in self.paths.items():
            files.setdefault(path, []).append(label)
        made, words, events = [], [], []
        t = round(rt.now(), 3)
        for path, labels in files.items():
            try:
                data = Path(path).read_bytes()
            except OSError:
                words.append(f"{path} (rank {', '.join(labels)}): not made")
                continue
            keys = sorted({m.decode() for m in _RANK_KEY.findall(data)}, key=int)
            made.append(path)
            held = f", the keys of rank {', '.join(keys)}" if keys else ""
            words.append(f"{path} (rank {', '.join(labels)}): {len(data)} bytes{held}")
            events.append({"t": t, "what": f"read {path}: {len(data)} bytes{held}"})
        acted = len(made) >= 2
        how = ("the ranks' stores were in separate files" if acted else
               "the ranks' stores were not in separate files")
        return Effect(acted=acted, summary=f"{how}: " + "; ".join(words),
                      numbers={"paths": len(files), "files_made": len(made)}, events=events)

    def describe(self):
        return f"read the ranks' separate FileStore files ({len(set(self.paths.values()))})"


@dataclass
class MissingDir(Step):
    """missing_dir: nobody makes the folder; at the end this reads that it is still missing and
    which ranks went into init (and so tried to open the store there)."""

    folder: str = ""
    UNDO_AT_TEARDOWN: ClassVar[bool] = False

    def do(self, rt):
        return {"exists": os.path.exists(self.folder)}

    def effect(self, rt):
        t = round(rt.now(), 3)
        if os.path.exists(self.folder):
            return Effect(acted=False, summary=f"{self.folder} exists at the end: it was made",
                          events=[{"t": t, "what": f"{self.folder} exists"}])
        tried: List[str] = []
        events = [{"t": t, "what": f"{self.folder} still missing"}]
        for label in _ranks(rt):
            try:
                obs = rt.rank(label).obs
            except (KeyError, AttributeError):
                continue
            into = [e for e in obs.events if e.ev == PHASE and e.phase == "init"]
            if into:
                tried.append(label)
                events.append({"t": obs.released_at or 0.0,
                               "what": f"rank {label} went into init"})
        if not tried:
            return Effect(acted=False, summary=f"{self.folder} still missing at the end, and "
                          "no rank went into init to open the store there",
                          numbers={"ranks_in_init": 0}, events=events)
        return Effect(acted=True, summary=f"{self.folder} still missing at the end (nobody "
                      f"made it); rank{'s' * (len(tried) > 1)} {', '.join(tried)} went into "
                      "init to open the store there", numbers={"ranks_in_init": len(tried)},
                      events=events)

    def describe(self):
        return f"read that {self.folder} stays missing"


class FileInit(Fault):
    kind: Literal["file_init"] = "file_init"
    ON_ALLOCATION = (
        "it shapes the FileStore's directory on the harness's own machine (init: file): not "
        "supported on an allocation")
    summary = "file:// init with a path per rank, a stale file, an unwritable directory, a " \
        "directory that does not exist, or a read-only mount"
    REQUIRES = (CHATTR,)
    mode: Literal["per_rank_path", "stale_file", "unwritable_dir", "missing_dir",
                  "read_only_mount"] = Field(
        description="per_rank_path: ranks use paths of their own; stale_file: a killed job's "
        "file is there; unwritable_dir: mode 0555 (and immutable as root); missing_dir: the "
        "path's folder does not exist (an unmounted share: nobody makes it); read_only_mount: "
        "the folder is a read-only mount in the ranks")
    ranks: List[int] = Field(default_factory=lambda: [1], max_length=MAX_WORLD,
                             description="per_rank_path: ranks that get a path of their own")

    def check(self, scn):
        problems = super().check(scn)
        if scn.init != "file":
            problems.append((("mode",), f"file_init needs 'init: file' (the scenario uses "
                                        f"{scn.init!r})"))
        return problems

    def requirements(self, scn):
        if self.mode == "unwritable_dir":
            return self.REQUIRES
        if self.mode == "read_only_mount":
            return (RESOLVER_VIEW,)     # the same private mount namespace a rank enters
        return ()

    def apply(self, plan, scn):
        path = plan.file_store
        if self.mode == "per_rank_path":
            for r in plan.main_ranks(self.ranks):
                r.init = r.init.with_url(f"file://{path}-rank{r.label}")
            plan.add_step(self, SeparatePaths(
                paths={r.label: r.init.url[len("file://"):] for r in plan.main_ranks()},
                target="file store"))
            plan.notes.append(f"file_init: ranks {self.ranks} use a path of their own")
        elif self.mode == "stale_file":
            plan.add_step(self, StaleFileStore(path=path, world_size=1, target="file store"))
            plan.notes.append(f"file_init: {path} left behind by a killed job")
        elif self.mode == "missing_dir":
            gone = str(Path(plan.run_dir) / "not-mounted")
            for r in plan.ranks:
                r.init = r.init.with_url(f"file://{gone}/pg")
            plan.add_step(self, MissingDir(folder=gone, target="file store"))
            plan.notes.append(f"file_init: {gone} does not exist (nobody makes it: torch "
                              "retries the open)")
        elif self.mode == "read_only_mount":
            ro = str(Path(plan.run_dir) / "ro-mount")
            plan.add_step(self, ReadOnlyDir(path=ro, target="file store"))
            for r in plan.ranks:
                r.init = r.init.with_url(f"file://{ro}/pg")
                r.env[ENV_READ_ONLY] = ro
            plan.notes.append(f"file_init: {ro} is a read-only mount in the ranks")
        else:
            ro = str(Path(plan.run_dir) / "readonly")
            plan.add_step(self, Unwritable(path=ro, target="file store"))
            for r in plan.ranks:
                r.init = r.init.with_url(f"file://{ro}/pg")
            plan.notes.append(f"file_init: {ro} is not writable for the ranks (mode 0555; "
                              "as root also immutable, chattr +i, since root writes anywhere)")


def make_stale_filestore(path: str, world_size: int) -> None:
    """Leave a FileStore file the way a killed job does: used, then SIGKILLed mid-run."""
    import signal
    from datetime import timedelta

    import torch.distributed as dist

    from ..machine.procs import die_with_parent

    die_with_parent()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=world_size,
                            timeout=timedelta(seconds=10))
    dist.barrier()
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 4 and sys.argv[1] == "--stale":
        make_stale_filestore(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit("usage: python -m harness.faults.file_init --stale PATH WORLD_SIZE")

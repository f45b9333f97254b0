"""file_init: faults of file:// initialisation (per-rank paths, stale file, unwritable dir,
a directory that is not there, a read-only mount).

``python -m harness.faults.file_init --stale PATH WORLD_SIZE`` is the helper that leaves a
FileStore file the way a killed job does: used, then SIGKILLed mid-run.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, List, Literal

from pydantic import Field

from ..limits import MAX_WORLD
from ..machine import RESOLVER_VIEW, Tool
from ..resolver import ENV_READ_ONLY
from ..steps import Step, StepError
from . import Fault

CHATTR = Tool("chattr", package="e2fsprogs", only_as_root=True,
              ok="file_init unwritable_dir can make a directory immutable as root",
              why="as root a 0555 directory is still writable, so file_init unwritable_dir "
                  "makes it immutable with chattr +i")


@dataclass
class StaleFileStore(Step):
    """Run a one-rank job on ``path`` and SIGKILL it mid-run, before the ranks start."""

    path: str = ""
    world_size: int = 1

    def do(self, rt):
        job = rt.run_helper("stale filestore", rt.python(
            "harness.faults.file_init", "--stale", self.path, str(self.world_size)))
        if job.returncode != -9 or not os.path.exists(self.path):
            raise StepError(f"could not make a stale FileStore at {self.path}: rc "
                            f"{job.returncode}: {job.stderr[-800:]}")

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

    def undo(self, rt):
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", self.path], capture_output=True)
        os.chmod(self.path, 0o755)

    def describe(self):
        return f"make {self.path} unwritable"


@dataclass
class ReadOnlyDir(Step):
    """The store's folder, made by the harness; the ranks see it as a read-only mount (each in
    a private mount namespace: harness.resolver.enter_read_only), nothing else does."""

    path: str = ""

    def do(self, rt):
        os.makedirs(self.path, exist_ok=True)

    def describe(self):
        return f"make {self.path}, mounted read-only in the ranks"


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
            plan.notes.append(f"file_init: ranks {self.ranks} use a path of their own")
        elif self.mode == "stale_file":
            plan.add_step(self, StaleFileStore(path=path, world_size=1, target="file store"))
            plan.notes.append(f"file_init: {path} left behind by a killed job")
        elif self.mode == "missing_dir":
            gone = str(Path(plan.run_dir) / "not-mounted")
            for r in plan.ranks:
                r.init = r.init.with_url(f"file://{gone}/pg")
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

    from ..procs import die_with_parent

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

"""file_init: faults of file:// initialisation (per-rank paths, stale file, unwritable dir)."""

from pathlib import Path
from typing import List, Literal

from pydantic import Field

from ..plan import PrepPlan, file_store_path
from ..schema import MAX_WORLD
from . import Fault, register


@register
class FileInit(Fault):
    kind: Literal["file_init"] = "file_init"
    summary = "file:// init with a path per rank, a stale file, or an unwritable directory"
    mode: Literal["per_rank_path", "stale_file", "unwritable_dir"]
    ranks: List[int] = Field(default_factory=lambda: [1], max_length=MAX_WORLD,
                             description="per_rank_path: ranks that get a path of their own")

    def check(self, scn):
        problems = super().check(scn)
        if scn.init != "file":
            problems.append((("mode",), f"file_init needs 'init: file' (the scenario uses "
                                        f"{scn.init!r})"))
        return problems

    def apply(self, plan, scn):
        path = file_store_path(plan.run_dir)
        if self.mode == "per_rank_path":
            for r in plan.main_ranks(self.ranks):
                r.init.url = f"file://{path}-rank{r.label}"
            plan.notes.append(f"file_init: ranks {self.ranks} use a path of their own")
        elif self.mode == "stale_file":
            plan.preps.append(PrepPlan("stale_filestore", path, world_size=1))
            plan.notes.append(f"file_init: {path} left behind by a killed job")
        else:
            ro = str(Path(plan.run_dir) / "readonly")
            plan.preps.append(PrepPlan("unwritable_dir", ro))
            for r in plan.ranks:
                r.init.url = f"file://{ro}/pg"
            plan.notes.append(f"file_init: {ro} is not writable for the ranks (mode 0555; "
                              "as root also immutable, chattr +i, since root writes anywhere)")

"""open_files_limit: a low open-files limit (RLIMIT_NOFILE, ``ulimit -n``) on one rank, set
before it is released: the sockets of the store and of gloo's full mesh run out."""

from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from ..steps import StepError
from . import Fault
from ._rank_limit import RankLimit, limit_before_release


@dataclass
class LimitOpenFiles(RankLimit):
    limit: int = 64
    UNDO_AT_TEARDOWN = False     # the rank is gone at teardown

    def do(self, rt):
        import psutil

        pid = rt.rank(self.rank).pid
        try:
            proc = psutil.Process(pid)
            n_open = proc.num_fds()
            proc.rlimit(psutil.RLIMIT_NOFILE, (self.limit, self.limit))
        except (psutil.Error, OSError) as e:
            raise StepError(f"open-files limit on rank {self.rank}: {e}") from None
        rt.rank(self.rank).note(f"open-files limit {self.limit}; it had {n_open} open at the "
                                "start line")
        return {"open_at_start": n_open}

    def describe(self):
        return f"open-files limit {self.limit} on rank {self.rank}"


class OpenFilesLimit(Fault):
    kind: Literal["open_files_limit"] = "open_files_limit"
    ON_ALLOCATION = (
        "the limit is set by prlimit from the harness's own machine on the rank's pid: not "
        "built for an allocation's nodes")
    summary = "a low open-files limit (ulimit -n) on a rank from the start line"
    rank: int = Field(1, description="the limited rank")
    limit: int = Field(ge=3, le=1 << 20, description="RLIMIT_NOFILE, soft and hard (the rank "
                       "has ~20 files open at the start line: torch's libraries, its pipes)")

    def apply(self, plan, scn):
        step = LimitOpenFiles(rank=str(self.rank), limit=self.limit, target=f"rank {self.rank}")
        limit_before_release(plan, self, self.rank, step)
        plan.notes.append(f"open_files_limit: rank {self.rank} may have {self.limit} files open")

"""open_files_limit: a low open-files limit (RLIMIT_NOFILE, ``ulimit -n``) on one rank, set
before it is released: the sockets of the store and of gloo's full mesh run out.

Its evidence (``LimitOpenFiles.effect``): the limit read back from ``/proc/PID/limits`` once
set, the files the rank had open then, and the rank's own error: it acted when the rank ran
out of descriptors (EMFILE, "Too many open files"); a rank that never did, had no effect."""

from dataclasses import dataclass, field
from typing import Any, Dict, Literal, Optional

from pydantic import Field

from . import Fault
from ._rank_limit import (
    RankLimit,
    ended,
    ended_event,
    limit_before_release,
    rank_errors,
    read_limit,
)
from .steps import Effect, StepError

EMFILE = r"too many open files|EMFILE|errno 24"


@dataclass
class LimitOpenFiles(RankLimit):
    limit: int = 64
    UNDO_AT_TEARDOWN = False     # the rank is gone at teardown
    # what /proc/PID/limits said once it was set, and the files open then
    _seen: Optional[Dict[str, Any]] = field(default=None, init=False, repr=False, compare=False)

    def do(self, rt):
        import psutil

        pid = rt.rank(self.rank).pid
        try:
            proc = psutil.Process(pid)
            n_open = proc.num_fds()
            proc.rlimit(psutil.RLIMIT_NOFILE, (self.limit, self.limit))
        except (psutil.Error, OSError) as e:
            raise StepError(f"open-files limit on rank {self.rank}: {e}") from None
        self._seen = {"pid": pid, "open": n_open, "t": round(rt.now(), 3),
                      "read_back": read_limit(pid, "Max open files")}
        rt.rank(self.rank).note(f"open-files limit {self.limit}; it had {n_open} open at the "
                                "start line")
        return {"open_at_start": n_open}

    def effect(self, rt):
        seen = self._seen or {}
        if seen.get("read_back") is None:
            raise OSError(f"the open-files limit could not be read back from "
                          f"/proc/{seen.get('pid')}/limits")
        back = seen["read_back"]["soft"]      # None: unlimited
        if back != self.limit:
            return Effect(acted=False, summary=f"the open-files limit read back from /proc/"
                          f"{seen.get('pid')}/limits is {back}, not the {self.limit} set")
        head = (f"open-files limit {back} read back from /proc/{seen['pid']}/limits, "
                f"{seen['open']} open then")
        hit = rank_errors(rt, [self.rank], EMFILE)
        nums = {"limit": back, "open_at_start": seen["open"], "emfile": len(hit)}
        events = [{"t": seen["t"], "what": head}]
        if hit:
            t = f" (it ended at {hit[0]['t']:.2f} s)" if hit[0]["t"] is not None else ""
            return Effect(acted=True, summary=f"{head}; rank {self.rank} ran out of "
                          f"descriptors{t}: {hit[0]['line']}", numbers=nums,
                          events=events + [{"t": hit[0]["t"] or 0.0,
                                            "what": f"rank {self.rank}: {hit[0]['line']}"}])
        end = ended(rt, self.rank)
        return Effect(acted=False, summary=f"{head}; rank {self.rank} never ran out of "
                      "descriptors" + (f" (it {end})" if end else ""), numbers=nums,
                      events=events + ended_event(rt, self.rank))

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

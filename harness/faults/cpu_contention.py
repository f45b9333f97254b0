"""cpu_contention: a rank starved of CPU from the start line, by a CPU quota (a cgroup) or by
busy processes pinned to its CPU with it, so that it falls behind the others' timeout.

Run as ``python -m harness.faults.cpu_contention hog CPU`` it is one busy process: pinned to
CPU, it prints ``ready`` and spins until killed (a helper of the run: harness.procs owns it,
the sweep kills it after a killed run)."""

import os
import sys
from dataclasses import dataclass, field
from typing import Any, ClassVar, List, Literal

from pydantic import Field

from .. import cgroups
from ..machine import Probe
from ..steps import StepError
from . import Fault
from ._rank_limit import RankLimit, limit_before_release

CGROUP_CPU = Probe("cgroup cpu", ok="CPU quotas on a rank (cpu_contention how: quota)",
                   check=lambda: cgroups.missing("cpu"))


def pin(pid: int, cpu: int) -> int:
    """Pin every thread of ``pid`` to ``cpu``; returns how many threads."""
    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, {cpu})
        except OSError:
            pass
    return len(tids)


@dataclass
class Starve(RankLimit):
    how: str = "quota"
    percent: float = 10.0
    hogs: int = 4
    _cg: Any = field(default=None, init=False, repr=False, compare=False)
    _hogs: List[Any] = field(default_factory=list, init=False, repr=False, compare=False)

    def do(self, rt):
        pid = rt.rank(self.rank).pid
        if self.how == "quota":
            try:
                self._cg = cgroups.Cgroup("cpu", rt.plan.run_id, f"rank{self.rank}-cpu")
                how = self._cg.limit_cpu(self.percent)
                self._cg.add(pid)
            except (cgroups.CgroupError, OSError) as e:
                raise StepError(f"CPU quota on rank {self.rank}: {e}") from None
            rt.rank(self.rank).note(f"CPU quota {self.percent:g}% ({how})")
            return {"via": how, "cgroup": str(self._cg.path)}
        cpu = max(os.sched_getaffinity(0))
        threads = pin(pid, cpu)
        for i in range(self.hogs):
            self._hogs.append(rt.start_helper(
                f"cpu hog {i + 1} of rank {self.rank}",
                rt.python("harness.faults.cpu_contention", "hog", str(cpu)),
                host=rt.plan.rank(self.rank).host))
        rt.rank(self.rank).note(f"pinned to CPU {cpu} with {self.hogs} busy processes")
        return {"cpu": cpu, "threads_pinned": threads, "hogs": [h.pid for h in self._hogs]}

    def undo(self, rt):
        for h in self._hogs:
            h.stop()
        self._hogs = []
        if self._cg is not None:
            self._cg.remove()
            self._cg = None

    def describe(self):
        if self.how == "quota":
            return f"CPU quota {self.percent:g}% on rank {self.rank}"
        return f"{self.hogs} busy processes pinned beside rank {self.rank}"


class CpuContention(Fault):
    kind: Literal["cpu_contention"] = "cpu_contention"
    summary = "a rank starved of CPU from the start line: a CPU quota (cgroup), or busy " \
        "processes pinned to its CPU with it"
    REQUIRES: ClassVar = (CGROUP_CPU,)
    rank: int = Field(1, description="the starved rank")
    how: Literal["quota", "hogs"] = Field("quota", description="quota: a cgroup CPU quota; "
                                          "hogs: the rank and N busy processes pinned to one CPU")
    percent: float = Field(10.0, gt=0, le=100, description="with quota: the share of one CPU")
    hogs: int = Field(4, ge=1, le=64, description="with hogs: how many busy processes")

    def requirements(self, scn):
        return (CGROUP_CPU,) if self.how == "quota" else ()

    def apply(self, plan, scn):
        step = Starve(rank=str(self.rank), how=self.how, percent=float(self.percent),
                      hogs=self.hogs, target=f"rank {self.rank}")
        limit_before_release(plan, self, self.rank, step)
        what = f"a {self.percent:g}% CPU quota" if self.how == "quota" else \
            f"{self.hogs} busy processes pinned to its CPU"
        plan.notes.append(f"cpu_contention: rank {self.rank} gets {what} from the start line")


def _hog(cpu: int) -> None:
    from ..procs import die_with_parent

    die_with_parent()
    os.sched_setaffinity(0, {cpu})
    print("ready", flush=True)
    while True:
        pass


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "hog":
        _hog(int(sys.argv[2]))
    sys.exit("usage: python -m harness.faults.cpu_contention hog CPU")

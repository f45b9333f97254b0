"""cpu_contention: a rank starved of CPU from the start line, by a CPU quota (a cgroup) or by
busy processes pinned to its CPU with it, so that it falls behind the others' timeout.

With ``hogs``, the busy processes start at set-up, before any rank (starting them takes a
Python start-up, which must not delay the starved rank's release), and the rank is pinned to
their CPU at the start line. Run as ``python -m harness.faults.cpu_contention hog CPU N`` it is
the busy processes: pinned to CPU, it forks N-1 more, prints ``ready`` and spins until killed
(one helper of the run: harness.procs owns its process group, the sweep kills it after a killed
run, and its children die with it, PR_SET_PDEATHSIG).

Where the kernel schedules by autogroup (``/proc/sys/kernel/sched_autogroup_enabled``: each
session is one group, and every rank and helper has a session of its own), the busy processes
share the CPU with the rank half and half whatever their number; ``nice`` is then what starves
the rank: it is set on the rank's threads and on its autogroup (``/proc/PID/autogroup``)."""

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from .. import cgroups
from ..machine import Probe
from ..steps import Step, StepError
from . import Fault
from ._rank_limit import RankLimit, limit_before_release

CGROUP_CPU = Probe("cgroup cpu", ok="CPU quotas on a rank (cpu_contention how: quota)",
                   check=lambda: cgroups.missing("cpu"))


def pin(pid: int, cpu: int, nice: int = 0) -> int:
    """Pin every thread of ``pid`` to ``cpu`` (and give it ``nice``); returns how many
    threads. Threads it starts later inherit both."""
    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, {cpu})
            if nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:
            pass
    if nice:   # with autogroup scheduling a session's nice is its autogroup's (the rank has one)
        try:
            Path(f"/proc/{pid}/autogroup").write_text(str(nice))
        except OSError:
            pass
    return len(tids)


def hog_cpu() -> int:
    """The CPU the busy processes and the starved rank share: the harness's last one."""
    return max(os.sched_getaffinity(0))


@dataclass
class Hogs(Step):
    """N busy processes pinned to one CPU, from set-up to teardown."""

    rank: str = "1"
    hogs: int = 4
    _helper: Any = field(default=None, init=False, repr=False, compare=False)

    def do(self, rt):
        self._helper = rt.start_helper(
            f"{self.hogs} busy processes for rank {self.rank}",
            rt.python("harness.faults.cpu_contention", "hog", str(hog_cpu()), str(self.hogs)),
            host=rt.plan.rank(self.rank).host)
        return {"cpu": hog_cpu(), "pid": self._helper.pid}

    def undo(self, rt):
        if self._helper is not None:
            self._helper.stop()
            self._helper = None

    def describe(self):
        return f"{self.hogs} busy processes on CPU {hog_cpu()}"


@dataclass
class Starve(RankLimit):
    how: str = "quota"
    percent: float = 10.0
    hogs: int = 4
    nice: int = 0
    _cg: Any = field(default=None, init=False, repr=False, compare=False)

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
        cpu = hog_cpu()
        threads = pin(pid, cpu, self.nice)
        rt.rank(self.rank).note(f"pinned to CPU {cpu} with {self.hogs} busy processes"
                                + (f", at nice {self.nice}" if self.nice else ""))
        return {"cpu": cpu, "threads_pinned": threads}

    def undo(self, rt):
        if self._cg is not None:
            self._cg.remove()
            self._cg = None

    def describe(self):
        if self.how == "quota":
            return f"CPU quota {self.percent:g}% on rank {self.rank}"
        return f"pin rank {self.rank} to the busy processes' CPU"


class CpuContention(Fault):
    kind: Literal["cpu_contention"] = "cpu_contention"
    ON_ALLOCATION = (
        "a CPU quota (a cgroup) or busy processes pinned beside the rank are set from the "
        "harness's own machine by the rank's pid: not built for an allocation's nodes")
    summary = "a rank starved of CPU from the start line: a CPU quota (cgroup), or busy " \
        "processes pinned to its CPU with it"
    REQUIRES: ClassVar = (CGROUP_CPU,)
    rank: int = Field(1, description="the starved rank")
    how: Literal["quota", "hogs"] = Field("quota", description="quota: a cgroup CPU quota; "
                                          "hogs: the rank and N busy processes pinned to one CPU")
    percent: float = Field(10.0, gt=0, le=100, description="with quota: the share of one CPU")
    hogs: int = Field(4, ge=1, le=64, description="with hogs: how many busy processes")
    nice: int = Field(0, ge=0, le=19, description="with hogs: the rank's nice value (19: it "
                      "runs only when the busy processes leave it the CPU, a noisy neighbour "
                      "of higher priority)")

    def requirements(self, scn):
        return (CGROUP_CPU,) if self.how == "quota" else ()

    def apply(self, plan, scn):
        if self.how == "hogs":
            plan.add_step(self, Hogs(rank=str(self.rank), hogs=self.hogs,
                                     target=f"CPU of rank {self.rank}"))
        step = Starve(rank=str(self.rank), how=self.how, percent=float(self.percent),
                      hogs=self.hogs, nice=self.nice, target=f"rank {self.rank}")
        limit_before_release(plan, self, self.rank, step)
        what = f"a {self.percent:g}% CPU quota" if self.how == "quota" else \
            f"{self.hogs} busy processes pinned to its CPU"
        plan.notes.append(f"cpu_contention: rank {self.rank} gets {what} from the start line")


def _hog(cpu: int, n: int) -> None:
    from ..procs import die_with_parent

    die_with_parent()
    os.sched_setaffinity(0, {cpu})
    for _ in range(n - 1):
        if os.fork() == 0:
            die_with_parent()          # the child dies with the helper
            break
    else:
        print("ready", flush=True)
    while True:
        pass


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "hog":
        _hog(int(sys.argv[2]), int(sys.argv[3]))
    sys.exit("usage: python -m harness.faults.cpu_contention hog CPU N")

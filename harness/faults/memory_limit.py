"""memory_limit: a memory limit on one rank (cgroup memory, else RLIMIT_AS), set before it is
released: a large model's parameter broadcast then gets it OOM-killed (a crash) or its
allocation refused (an error)."""

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import Field

from .. import cgroups
from ..limits import MAX_MODEL_MB
from ..machine import Probe
from ..steps import StepError
from . import Fault
from ._rank_limit import RankLimit, limit_before_release

MIB = 1 << 20
CGROUP_MEMORY = Probe("cgroup memory", ok="memory limits on a rank (memory_limit via cgroup)",
                      check=lambda: cgroups.missing("memory"))


@dataclass
class LimitMemory(RankLimit):
    mb: float = 0.0
    via: str = "auto"
    _cg: Any = field(default=None, init=False, repr=False, compare=False)
    _how: str = field(default="", init=False, repr=False, compare=False)

    def do(self, rt):
        pid = rt.rank(self.rank).pid
        if self.via != "rlimit" and (self.via == "cgroup" or cgroups.missing("memory") is None):
            try:
                self._cg = cgroups.Cgroup("memory", rt.plan.run_id, f"rank{self.rank}-memory")
                self._how = self._cg.limit_memory(int(self.mb * MIB))
                self._cg.add(pid)
            except (cgroups.CgroupError, OSError) as e:
                raise StepError(f"memory limit on rank {self.rank}: {e}") from None
            return {"via": self._how, "cgroup": str(self._cg.path)}
        import psutil

        proc = psutil.Process(pid)
        vms = proc.memory_info().vms
        limit = vms + int(self.mb * MIB)
        proc.rlimit(psutil.RLIMIT_AS, (limit, limit))
        self._how = (f"RLIMIT_AS {limit} (its {vms // MIB} MiB of address space at the start "
                     f"line + {self.mb:g} MiB)")
        rt.rank(self.rank).note(f"memory limit: {self._how}")
        return {"via": self._how}

    def undo(self, rt):
        if self._cg is None:
            return
        kills = self._cg.oom_kills()
        hits, peak, limit = self._cg.limit_hits()
        rp = rt.rank(self.rank)
        if kills:
            rp.note(f"the kernel's OOM killer killed it: {self._how} ({self.mb:g} MiB), "
                    f"{kills} OOM kill(s) in its cgroup")
        elif hits and rp.proc.poll() == -9 and not rp.obs.signals:
            # the kill is in the kernel's log but its cgroup's oom_kill count stayed 0 (seen
            # once in ~10 runs on this kernel): the usage at the limit and a SIGKILL nobody of
            # the run sent say the same
            rp.note(f"the kernel's OOM killer killed it: {self._how} ({self.mb:g} MiB), its "
                    f"usage reached the limit {hits} time(s) (peak {peak // MIB} of "
                    f"{limit // MIB} MiB); the cgroup counted no OOM kill")
        self._cg.remove()
        self._cg = None

    def describe(self):
        return f"memory limit {self.mb:g} MiB on rank {self.rank}"


class MemoryLimit(Fault):
    kind: Literal["memory_limit"] = "memory_limit"
    ON_ALLOCATION = (
        "the limit (a cgroup, or RLIMIT_AS by prlimit) is set from the harness's own machine by"
        " the rank's pid: not built for an allocation's nodes")
    summary = "a memory limit on a rank from the start line (cgroup memory.max / " \
        "memory.limit_in_bytes, else RLIMIT_AS): too small for the model, the rank is " \
        "OOM-killed or its allocation fails"
    REQUIRES: ClassVar = (CGROUP_MEMORY,)
    rank: int = Field(1, description="the limited rank")
    mb: float = Field(gt=0, le=MAX_MODEL_MB, description="MiB it may allocate after the start "
                      "line (what it had from importing torch is not counted)")
    via: Literal["auto", "cgroup", "rlimit"] = Field(
        "auto", description="cgroup (skipped where the machine has none the harness can use), "
        "rlimit (RLIMIT_AS: address space, so allocations fail instead of an OOM kill), auto: "
        "cgroup where it can, else rlimit")

    def requirements(self, scn):
        return (CGROUP_MEMORY,) if self.via == "cgroup" else ()

    def apply(self, plan, scn):
        step = LimitMemory(rank=str(self.rank), mb=float(self.mb), via=self.via,
                           target=f"rank {self.rank}")
        limit_before_release(plan, self, self.rank, step)
        # a forked rank shares its server's pages copy-on-write: each page it touches (every
        # object's reference count) is copied and charged to its memory cgroup, which a fresh
        # rank's import memory never is (charged before it is moved): not the same limit
        plan.pin_fresh(plan.main_ranks([self.rank]), "memory_limit: a forked rank's "
                       "copy-on-write copies of its server's pages count against its limit")
        plan.notes.append(f"memory_limit: rank {self.rank} may allocate {self.mb:g} MiB "
                          f"after the start line (via {self.via})")


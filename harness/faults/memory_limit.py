"""memory_limit: a memory limit on one rank (cgroup memory, else RLIMIT_AS), set before it is
released: a large model's parameter broadcast then gets it OOM-killed (a crash) or its
allocation refused (an error).

Its evidence (``LimitMemory.effect``): with a cgroup, the cgroup's own counters read at the end
of the run (OOM kills, how often the usage hit the limit, the peak usage): it acted when the
usage reached the limit; with RLIMIT_AS, the limit read back from ``/proc/PID/limits`` when it
was set and the rank's own error: it acted when an allocation was refused (ENOMEM,
"can't allocate memory", MemoryError)."""

from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Literal, Optional

from pydantic import Field

from ..core.limits import MAX_MODEL_MB
from ..machine import cgroups
from ..machine.requirement import Probe
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

MIB = 1 << 20
# the words of a refused allocation: torch's CPU allocator, Python's, the C library's
REFUSED = (r"can't allocate memory|cannot allocate memory|MemoryError|bad_alloc|"
           r"out of memory|Error code 12|ENOMEM")
CGROUP_MEMORY = Probe("cgroup memory", ok="memory limits on a rank (memory_limit via cgroup)",
                      check=lambda: cgroups.missing("memory"))


@dataclass
class LimitMemory(RankLimit):
    mb: float = 0.0
    via: str = "auto"
    _cg: Any = field(default=None, init=False, repr=False, compare=False)
    _how: str = field(default="", init=False, repr=False, compare=False)
    # the cgroup's counters read when it was taken away (a heal), or the RLIMIT_AS read back
    _seen: Optional[Dict[str, Any]] = field(default=None, init=False, repr=False, compare=False)

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
        back = read_limit(pid, "Max address space")
        self._seen = {"limit": limit, "read_back": back, "t": round(rt.now(), 3), "pid": pid}
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
        self._seen = self._counters(rt)
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

    def _counters(self, rt) -> Dict[str, Any]:
        hits, peak, limit = self._cg.limit_hits()
        return {"oom_kills": self._cg.oom_kills(), "limit_hits": hits, "peak": peak,
                "limit": limit, "t": round(rt.now(), 3)}

    def effect(self, rt):
        if self._cg is None and (self._seen is None or "oom_kills" not in self._seen):
            return self._rlimit_effect(rt)
        c = self._seen if self._cg is None else self._counters(rt)
        kills, hits, peak, limit = c["oom_kills"], c["limit_hits"], c["peak"], c["limit"]
        nums = {"oom_kills": kills, "limit_hits": hits, "peak_mib": round(peak / MIB, 1),
                "limit_mib": round(limit / MIB, 1)}
        end = ended(rt, self.rank)
        end = f"; rank {self.rank} {end}" if end else ""
        events = [{"t": c["t"], "what": f"cgroup read: {kills} OOM kill(s), usage at the limit "
                                        f"{hits} time(s), peak {peak / MIB:.0f} MiB"}]
        if kills or hits:
            summary = ", ".join(
                ([f"{kills} OOM kill(s) in its cgroup"] if kills else [])
                + ([f"its usage reached the limit {hits} time(s)"] if hits else [])) \
                + f" (peak {peak / MIB:.0f} MiB of the {limit / MIB:.0f} MiB limit){end}"
        else:
            summary = (f"its usage peaked at {peak / MIB:.0f} MiB of the {limit / MIB:.0f} MiB "
                       f"limit: it never reached it, no OOM kill{end}")
        return Effect(acted=bool(kills or hits), summary=summary, numbers=nums,
                      events=events + ended_event(rt, self.rank))

    def _rlimit_effect(self, rt):
        seen = self._seen or {}
        if seen.get("read_back") is None:
            raise OSError(f"RLIMIT_AS could not be read back from "
                          f"/proc/{seen.get('pid')}/limits")
        back = seen["read_back"]["soft"]      # None: unlimited
        if back != seen.get("limit"):
            return Effect(acted=False, summary=f"RLIMIT_AS read back from /proc/"
                          f"{seen.get('pid')}/limits is {back}, not the {seen.get('limit')} set")
        refused = rank_errors(rt, [self.rank], REFUSED)
        nums = {"rlimit_as_mib": round(back / MIB, 1), "refused": len(refused)}
        head = f"RLIMIT_AS {back / MIB:.0f} MiB read back from /proc/{seen['pid']}/limits"
        events = [{"t": seen["t"], "what": f"{head} at the start line"}]
        if refused:
            r = refused[0]
            t = f" (it ended at {r['t']:.2f} s)" if r["t"] is not None else ""
            return Effect(acted=True, summary=f"{head}; an allocation was refused{t}: "
                          f"{r['line']}", numbers=nums,
                          events=events + [{"t": r["t"] or 0.0,
                                            "what": f"rank {self.rank}: {r['line']}"}])
        end = ended(rt, self.rank)
        return Effect(acted=False, summary=f"{head}; no allocation of rank {self.rank} was "
                      f"refused" + (f" (it {end})" if end else ""), numbers=nums,
                      events=events + ended_event(rt, self.rank))

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


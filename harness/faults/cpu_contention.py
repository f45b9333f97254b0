"""cpu_contention: a rank starved of CPU from the start line (or from ``at`` / when it enters
``phase``), by a CPU quota (a cgroup) or by busy processes pinned to its CPU with it, so that it
falls behind the others' timeout; ``heal_after`` or ``heal_phase`` (+ ``heal_rank``) give it the
CPU back (the quota's cgroup removed; hogs: its threads' CPUs and nice as they were).

With ``hogs``, the busy processes start at set-up, before any rank (starting them takes a
Python start-up, which must not delay the starved rank's release), and the rank is pinned to
their CPU at the start line. Run as ``python -m harness.faults.cpu_contention hog CPU N`` it is
the busy processes: pinned to CPU, it forks N-1 more, prints ``ready`` and spins until killed
(one helper of the run: harness.machine.procs owns its process group, the sweep kills it after a
killed run, and its children die with it, PR_SET_PDEATHSIG).

Where the kernel schedules by autogroup (``/proc/sys/kernel/sched_autogroup_enabled``: each
session is one group, and every rank and helper has a session of its own), the busy processes
share the CPU with the rank half and half whatever their number; ``nice`` is then what starves
the rank: it is set on the rank's threads and on its autogroup (``/proc/PID/autogroup``).

Its evidence: with a quota, the cgroup's own ``cpu.stat`` read at the end of the run (the
periods in which the rank was throttled and the time held back): it acted when the rank was
throttled at least once. With hogs, the rank's CPU affinity read back from ``/proc`` once it
was pinned, the seconds its threads then waited for a CPU (its own count), and the busy
processes' CPU time on that CPU (``/proc/PID/stat``, read at the end): it acted when the rank
was pinned to the busy processes' CPU while they ran there."""

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Literal, Optional, Set

from pydantic import Field

from ..core.triggers import When
from ..machine import cgroups
from ..machine.requirement import Probe
from ..ranks.workload import phase_problem
from . import Fault
from ._rank_limit import RankLimit, ended, ended_event, limit_before_release
from .steps import Effect, Step, StepError

CGROUP_CPU = Probe("cgroup cpu", ok="CPU quotas on a rank (cpu_contention how: quota)",
                   check=lambda: cgroups.missing("cpu"))


def _set(pid: int, where: Set[int], nice: Optional[int]) -> int:
    """Every thread of ``pid`` on the CPUs ``where``, and at ``nice`` where one is given (its
    autogroup too: with autogroup scheduling a session's nice is its autogroup's, and the rank
    has one); returns how many threads. Threads it starts later inherit both."""
    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, where)
            if nice is not None:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:
            pass
    if nice is not None:
        try:
            Path(f"/proc/{pid}/autogroup").write_text(str(nice))
        except OSError:
            pass
    return len(tids)


def pin(pid: int, cpu: int, nice: int = 0) -> int:
    """Pin every thread of ``pid`` to ``cpu`` at ``nice`` (0: its nice left as it is)."""
    return _set(pid, {cpu}, nice or None)


def unpin(pid: int, cpus: List[int]) -> int:
    """The pin taken back: ``cpus`` (those it had before) and nice 0."""
    return _set(pid, set(cpus), 0)


def affinity(pid: int) -> Optional[List[int]]:
    """The CPUs a live process may run on, as the kernel says (``Cpus_allowed_list``)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for ln in f:
                if ln.startswith("Cpus_allowed_list:"):
                    return _cpu_list(ln.split(":", 1)[1].strip())
    except OSError:
        pass
    return None


def _cpu_list(text: str) -> List[int]:
    out: List[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out += list(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    return out


def cpu_seconds(pids: List[int]) -> float:
    """The CPU time (user + system, seconds) the live processes of ``pids`` used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])    # utime, stime (fields 14 and 15)
        except (OSError, IndexError, ValueError):
            continue
    return total / tick


def _children(pid: int) -> List[int]:
    """``pid`` and its children (the busy processes it forked)."""
    kids = [pid]
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                kids.append(int(d))
    return kids


def hog_cpu() -> int:
    """The CPU the busy processes and the starved rank share: the harness's last one."""
    return max(os.sched_getaffinity(0))


@dataclass
class Hogs(Step):
    """N busy processes pinned to one CPU, from set-up to teardown."""

    rank: str = "1"
    hogs: int = 4
    _helper: Any = field(default=None, init=False, repr=False, compare=False)
    _start: Optional[Dict[str, Any]] = field(default=None, init=False, repr=False,
                                             compare=False)

    def do(self, rt):
        self._helper = rt.start_helper(
            f"{self.hogs} busy processes for rank {self.rank}",
            rt.python("harness.faults.cpu_contention", "hog", str(hog_cpu()), str(self.hogs)),
            host=rt.plan.rank(self.rank).host)
        pids = _children(self._helper.pid)
        self._start = {"t": round(rt.now(), 3), "cpu_s": cpu_seconds(pids)}
        return {"cpu": hog_cpu(), "pid": self._helper.pid}

    def effect(self, rt):
        pids = _children(self._helper.pid)
        used = cpu_seconds(pids) - (self._start or {}).get("cpu_s", 0.0)
        t = round(rt.now(), 3)
        where = sorted({c for p in pids for c in (affinity(p) or [])})
        nums = {"processes": len(pids), "cpu_seconds": round(used, 2), "cpus": where}
        what = (f"{len(pids)} busy process(es) pinned to CPU {','.join(map(str, where))} used "
                f"{used:.2f} s of CPU by {t:.2f} s after the start line")
        return Effect(acted=used > 0 and len(pids) > 0, summary=what, numbers=nums,
                      events=[{"t": t, "what": what}])

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
    # hogs: the rank's CPUs read back once pinned; quota: cpu.stat read when the cgroup went
    _seen: Optional[Dict[str, Any]] = field(default=None, init=False, repr=False, compare=False)
    # hogs, healed while the rank lived: when, and its CPUs read back after the pin was undone
    _healed: Optional[Dict[str, Any]] = field(default=None, init=False, repr=False,
                                              compare=False)

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
        before = affinity(pid)
        threads = pin(pid, cpu, self.nice)
        self._seen = {"pid": pid, "cpu": cpu, "t": round(rt.now(), 3), "cpus": affinity(pid),
                      "before": before}
        rt.rank(self.rank).note(f"pinned to CPU {cpu} with {self.hogs} busy processes"
                                + (f", at nice {self.nice}" if self.nice else ""))
        return {"cpu": cpu, "threads_pinned": threads}

    def effect(self, rt):
        if self.how == "quota":
            return self._quota_effect(rt)
        seen = self._seen or {}
        cpus = seen.get("cpus")
        end = ended(rt, self.rank)
        if cpus is None:
            raise OSError(f"rank {self.rank}'s CPUs could not be read back from /proc")
        if cpus != [seen.get("cpu")]:
            return Effect(acted=False, summary=f"rank {self.rank}'s CPUs read back from /proc/"
                          f"{seen.get('pid')}/status are {cpus}, not CPU {seen.get('cpu')} "
                          "alone")
        try:
            wait = rt.rank(self.rank).obs.cpu_wait()
        except (KeyError, AttributeError):
            wait = None
        waited = "" if wait is None else f"; its threads waited {wait:.2f} s for a CPU"
        nums = {"cpu": seen["cpu"], "cpu_wait_s": wait}
        events = [{"t": seen["t"], "what": f"rank {self.rank}'s CPUs read back: {cpus}"}]
        healed = ""
        if self._healed is not None:
            h = self._healed
            healed = f"; unpinned at {h['t']:.2f} s (its CPUs read back: {h['cpus']})"
            nums["healed_at"] = h["t"]
            events.append({"t": h["t"], "what": f"rank {self.rank} unpinned, nice 0: its CPUs "
                                                f"read back: {h['cpus']}"})
        return Effect(acted=True, summary=f"rank {self.rank} (pid {seen['pid']}) pinned to "
                      f"CPU {seen['cpu']} alone, read back from /proc at {seen['t']:.2f} s"
                      f"{waited}{healed}" + (f"; it {end}" if end else ""), numbers=nums,
                      events=events + ended_event(rt, self.rank))

    def _quota_effect(self, rt):
        st = self._seen if self._cg is None else self._stat(rt)
        if not st or "nr_throttled" not in st:
            raise OSError("the quota's cgroup gave no cpu.stat nr_throttled to read")
        n, periods, held = st["nr_throttled"], st.get("nr_periods", 0), \
            st.get("throttled_usec", 0) / 1e6
        end = ended(rt, self.rank)
        nums = {"nr_periods": periods, "nr_throttled": n, "throttled_s": round(held, 2)}
        # the kernel sums the throttled time over the CPUs the group ran on: it may pass the wall
        what = (f"its {self.percent:g}% quota throttled it in {n} of {periods} periods "
                f"({held:.2f} s throttled, summed over CPUs)")
        healed = []
        if self._healed is not None:
            what += f"; its quota lifted at {self._healed['t']:.2f} s"
            nums["healed_at"] = self._healed["t"]
            healed = [{"t": self._healed["t"], "what": f"rank {self.rank} moved out of the "
                                                       "quota's cgroup"}]
        return Effect(acted=n > 0, summary=what + (f"; rank {self.rank} {end}" if end else ""),
                      numbers=nums, events=[{"t": st["t"], "what": f"cpu.stat read: {what}"}]
                      + healed + ended_event(rt, self.rank))

    def _stat(self, rt) -> Dict[str, Any]:
        return {**self._cg.cpu_stat(), "t": round(rt.now(), 3)}

    def undo(self, rt):
        if self._cg is not None:
            self._seen = self._stat(rt)
            pid = rt.rank(self.rank).pid
            if pid is not None and not rt.rank(self.rank).ended:
                # a heal: the rank goes back to the harness's cgroup first (remove kills
                # what is still inside)
                try:
                    self._cg.release(pid)
                    self._healed = {"t": round(rt.now(), 3), "cpus": affinity(pid)}
                except cgroups.CgroupError:
                    pass
            self._cg.remove()
            self._cg = None
        seen = self._seen or {}
        if self.how == "hogs" and seen.get("before") and not rt.rank(self.rank).ended:
            # a heal (teardown comes after the rank ended): the CPUs it had, and nice 0
            try:
                unpin(seen["pid"], seen["before"])
            except OSError:
                return          # it ended meanwhile: nothing to give back
            self._healed = {"t": round(rt.now(), 3), "cpus": affinity(seen["pid"])}

    def describe(self):
        if self.how == "quota":
            return f"CPU quota {self.percent:g}% on rank {self.rank}"
        return f"pin rank {self.rank} to the busy processes' CPU"


class CpuContention(Fault, When):
    """Without ``at`` or ``phase`` the rank is starved from the start line, held before its
    release until the starvation holds; with ``at`` from that time, with ``phase`` when the
    rank enters it. A heal (``heal_after``, or ``heal_phase`` + ``heal_rank``: when another
    rank enters a phase or has ended) ends it: with hogs the rank's threads get back the CPUs
    they had and nice 0 (the busy processes spin on until the run's teardown); with quota the
    rank moves back to the harness's own cgroup and the quota's cgroup is removed."""

    kind: Literal["cpu_contention"] = "cpu_contention"
    # busy processes or a quota on one CPU: a run beside it adds load of its own to the rank
    # it starves and to the ranks it does not
    ALONE = True
    ON_ALLOCATION = (
        "a CPU quota (a cgroup) or busy processes pinned beside the rank are set from the "
        "harness's own machine by the rank's pid: not built for an allocation's nodes")
    summary = "a rank starved of CPU from the start line (or a time or phase): a CPU quota " \
        "(cgroup), or busy processes pinned to its CPU with it"
    REQUIRES: ClassVar = (CGROUP_CPU,)
    WILDCARD_FIELDS: ClassVar = ()
    rank: int = Field(1, description="the starved rank (and whose phase starts it, with "
                      "phase); without at or phase it is starved from the start line, before "
                      "its release")
    how: Literal["quota", "hogs"] = Field(
        "quota", description="quota: a cgroup CPU quota (v2 cpu.max, else v1 "
        "cpu.cfs_quota_us); hogs: the rank and N busy processes pinned to one CPU (the "
        "harness's last; the busy processes, one helper of the run that forks, start at set-up)")
    percent: float = Field(10.0, gt=0, le=100, description="with quota: the share of one CPU")
    hogs: int = Field(4, ge=1, le=64, description="with hogs: how many busy processes")
    nice: int = Field(0, ge=0, le=19, description="with hogs: the rank's nice value, set on "
                      "its threads and its autogroup (19: it runs only when the busy processes "
                      "leave it the CPU, a noisy neighbour of higher priority). Where the kernel "
                      "schedules by autogroup (/proc/sys/kernel/sched_autogroup_enabled) the "
                      "busy processes share the CPU with the rank half and half whatever their "
                      "number: there nice is what starves it")

    def requirements(self, scn):
        return (CGROUP_CPU,) if self.how == "quota" else ()

    def check(self, scn):
        problems = super().check(scn)
        if self.phase is not None and not scn.program_argv():
            why = phase_problem(self.phase, scn.workload.steps, scn.workload.destroy)
            if why:   # it would never start
                problems.append((("phase",), why))
        return problems

    def apply(self, plan, scn):
        if self.how == "hogs":
            plan.add_step(self, Hogs(rank=str(self.rank), hogs=self.hogs,
                                     target=f"CPU of rank {self.rank}"))
        step = Starve(rank=str(self.rank), how=self.how, percent=float(self.percent),
                      hogs=self.hogs, nice=self.nice, target=f"rank {self.rank}")
        if self.at is None and self.phase is None:
            limit_before_release(plan, self, self.rank, step)
            when = "from the start line"
        else:
            step.trigger = self.trigger()
            plan.add_step(self, step)
            when = self.trigger().describe()
        step.undo_trigger = self.heal(step.id)
        what = f"a {self.percent:g}% CPU quota" if self.how == "quota" else \
            f"{self.hogs} busy processes pinned to its CPU"
        plan.notes.append(f"cpu_contention: rank {self.rank} gets {what} {when}"
                          f"{self.healed()}")


def _hog(cpu: int, n: int) -> None:
    from ..machine.procs import die_with_parent

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

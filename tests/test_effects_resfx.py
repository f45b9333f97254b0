"""A host-resource or file fault proves it acted (harness.effects): memory_limit (the cgroup's
counters, or RLIMIT_AS read back and the refused allocation), open_files_limit (the limit read
back and EMFILE), cpu_contention (the quota's cpu.stat, the pinned rank's CPUs and the busy
processes' CPU time) and file_init's steps (the store's folder or file read back, the ranks'
errors). The readers are tested on their own; real runs (gloo, world 2), each once where the
fault acts and once where it has none where a real run can have none."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

import pytest

from harness.core.protocol import Event
from harness.faults._rank_limit import parse_limit, rank_errors, read_limit
from harness.faults.cpu_contention import Starve, _cpu_list, affinity, cpu_seconds, hog_cpu
from harness.faults.file_init import (
    MissingDir,
    ReadOnlyDir,
    SeparatePaths,
    StaleFileStore,
    Unwritable,
)
from harness.faults.open_files_limit import LimitOpenFiles
from harness.judge.classify import classify_run
from harness.judge.observation import RankObservation
from harness.machine import cgroups
from harness.run.supervisor import run_scenario
from harness.scenario.expect import check_effects
from harness.scenario.loader import load_text
from harness.scenario.schema import Expect

linux = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


# -- a runtime with ranks that ended, for the probes on their own ----------------------------------
@dataclass
class _Rank:
    obs: RankObservation


@dataclass
class _Rt:
    ranks: Dict[str, RankObservation] = field(default_factory=dict)
    t: float = 5.0

    @property
    def plan(self) -> Any:
        return SimpleNamespace(ranks=[SimpleNamespace(label=k) for k in self.ranks])

    def now(self) -> float:
        return self.t

    def rank(self, label: str) -> _Rank:
        return _Rank(self.ranks[label])


def _ended(label: str, message: Optional[str] = None, stderr: str = "",
           rc: int = 1, at: float = 1.5) -> RankObservation:
    evs: List[Event] = []
    if message is not None:
        evs.append(Event("result", 0.0, {"outcome": "error", "exc": {"type": "RuntimeError",
                                                                    "message": message}}))
    return RankObservation(label=label, events=evs, returncode=rc, ended_at=at,
                           stderr_tail=stderr)


LIMITS = """\
Limit                     Soft Limit           Hard Limit           Units
Max address space         unlimited            unlimited            bytes
Max open files            8                    16                   files
"""


def test_a_limit_is_read_back_as_the_kernel_says_it():
    assert parse_limit(LIMITS, "Max open files") == {"soft": 8, "hard": 16}
    assert parse_limit(LIMITS, "Max address space") == {"soft": None, "hard": None}
    assert parse_limit(LIMITS, "Max locked memory") is None


@linux
def test_a_live_process_limit_and_cpus_come_from_proc():
    soft, hard = __import__("resource").getrlimit(__import__("resource").RLIMIT_NOFILE)
    assert read_limit(os.getpid(), "Max open files") == {"soft": soft, "hard": hard}
    assert read_limit(None, "Max open files") is None
    assert affinity(os.getpid()) == sorted(os.sched_getaffinity(0))
    assert _cpu_list("0-2,5") == [0, 1, 2, 5]
    assert cpu_seconds([os.getpid()]) > 0


def test_a_rank_met_the_fault_only_where_its_own_words_say_so():
    rt = _Rt({"0": _ended("0", "Wait timeout"),
              "1": _ended("1", None, stderr="x\nepoll_create: Too many open files\n", rc=-9)})
    (hit,) = rank_errors(rt, ["0", "1", "7"], r"too many open files")
    assert hit == {"rank": "1", "t": 1.5, "line": "epoll_create: Too many open files"}


def _limited(limit: int, soft: Optional[int]) -> LimitOpenFiles:
    s = LimitOpenFiles(rank="1", limit=limit)
    s._seen = {"pid": 812, "open": 5, "t": 0.0,
               "read_back": None if soft == -1 else {"soft": soft, "hard": soft}}
    return s


def test_open_files_acted_on_emfile_and_had_no_effect_otherwise():
    emfile = _Rt({"1": _ended("1", "[enforce fail at device.cc:186] Too many open files")})
    e = _limited(8, 8).effect(emfile)
    assert e.acted and "ran out of descriptors" in e.summary and e.numbers["emfile"] == 1
    e = _limited(8, 8).effect(_Rt({"1": _ended("1", "Connection reset by peer")}))
    assert not e.acted and e.summary.startswith("open-files limit 8 read back from /proc/812")
    # a limit the kernel does not hold is no effect; one that cannot be read proves nothing
    assert not _limited(8, 1024).effect(emfile).acted
    with pytest.raises(OSError):
        _limited(8, -1).effect(emfile)


def test_a_starved_rank_not_pinned_alone_had_no_effect():
    s = Starve(rank="1", how="hogs")
    s._seen = {"pid": 812, "cpu": 1, "t": 0.0, "cpus": [0, 1]}
    e = s.effect(_Rt({"1": _ended("1")}))
    assert not e.acted and "not CPU 1 alone" in e.summary
    s._seen["cpus"] = [1]
    assert s.effect(_Rt({"1": _ended("1")})).acted


def test_a_quota_acted_when_its_cgroup_throttled_the_rank():
    s = Starve(rank="1", how="quota", percent=1.0)
    s._seen = {"nr_periods": 230, "nr_throttled": 230, "throttled_usec": 21890000, "t": 23.0}
    e = s.effect(_Rt({"1": _ended("1")}))
    assert e.acted and e.numbers == {"nr_periods": 230, "nr_throttled": 230, "throttled_s": 21.89}
    s._seen = {"nr_periods": 40, "nr_throttled": 0, "throttled_usec": 0, "t": 3.0}
    assert not s.effect(_Rt({"1": _ended("1")})).acted


def test_the_file_steps_have_no_effect_where_the_folder_or_file_says_so(tmp_path):
    rt = _Rt({"0": _ended("0", "Operation not permitted"),
              "1": _ended("1", "Read-only file system")})
    # a writable folder refused nothing, whatever a rank said
    u = Unwritable(path=str(tmp_path / "w"))
    os.makedirs(u.path)
    e = u.effect(rt)
    assert not e.acted and e.summary.endswith("it was writable")
    # a read-only folder a rank wrote into was not read-only for it
    ro = ReadOnlyDir(path=str(tmp_path / "ro"))
    ro.do(rt)
    assert ro.effect(rt).acted
    (Path(ro.path) / "pg").write_text("x")
    assert not ro.effect(rt).acted
    # a stale file no rank wrote into: no effect; grown: acted
    st = StaleFileStore(path=str(tmp_path / "pg"))
    Path(st.path).write_bytes(b"x" * 211)
    st._left = {"size": 211, "t": 0.0}
    e = st.effect(rt)
    assert not e.acted and e.numbers == {"bytes_left": 211, "bytes_at_end": 211}
    Path(st.path).write_bytes(b"x" * 719)
    assert st.effect(rt).acted


def test_separate_paths_acted_when_the_ranks_stores_were_in_two_files(tmp_path):
    rt = _Rt({"0": _ended("0"), "1": _ended("1")})
    a, b = tmp_path / "pg", tmp_path / "pg-rank1"
    step = SeparatePaths(paths={"0": str(a), "1": str(b)})
    a.write_bytes(b"\x00refcount/\x00/default_pg/0//cpu//0/0\x00")
    e = step.effect(rt)
    assert not e.acted and f"{b} (rank 1): not made" in e.summary
    b.write_bytes(b"\x00/default_pg/0//cpu//0/1\x00")
    e = step.effect(rt)
    assert e.acted and e.numbers == {"paths": 2, "files_made": 2}
    assert f"{a} (rank 0): " in e.summary and "the keys of rank 1" in e.summary


def test_a_missing_folder_acted_when_a_rank_went_into_init_and_nobody_made_it(tmp_path):
    gone = tmp_path / "not-mounted"
    into = _ended("0")
    into.events.append(Event("phase", 0.0, {"phase": "init"}))
    step = MissingDir(folder=str(gone))
    assert not step.effect(_Rt({"0": _ended("0")})).acted    # no rank got to open it
    e = step.effect(_Rt({"0": into}))
    assert e.acted and "rank 0 went into init" in e.summary
    gone.mkdir()
    assert not step.effect(_Rt({"0": into})).acted


# -- real runs ---------------------------------------------------------------------------------
def _run(text: str, tmp_path: Path):
    (scn,) = load_text(text, "e.yaml")
    obs = run_scenario(scn, keep=tmp_path)
    (e,) = obs.effects
    return obs, e


BASE = """\
name: e
about: a resource fault's effect in a real run
world_size: 2
start: fork
timeout: 3
deadline: 40
"""
needs_memory = pytest.mark.skipif(bool(cgroups.missing("memory")),
                                  reason=f"{cgroups.missing('memory')}")
needs_cpu = pytest.mark.skipif(bool(cgroups.missing("cpu")), reason=f"{cgroups.missing('cpu')}")


@linux
@needs_memory
def test_a_memory_cgroup_counts_the_limit_reached_or_never_reached(tmp_path):
    obs, e = _run(BASE + 'workload: ["ddp 64MB"]\n'
                  "faults: [{kind: memory_limit, rank: 1, mb: 32, via: cgroup}]\n", tmp_path)
    assert e["status"] == "acted", e
    n = e["targets"][0]["steps"][0]["numbers"]
    assert n["oom_kills"] + n["limit_hits"] > 0 and n["limit_mib"] == 32.0, n
    obs, e = _run(BASE + "workload: [barrier]\n"
                  "faults: [{kind: memory_limit, rank: 1, mb: 2000, via: cgroup}]\n", tmp_path)
    assert [v.outcome for v in classify_run(obs)] == ["ok", "ok"]
    assert e["status"] == "no effect", e
    assert "never reached it, no OOM kill" in e["summary"]
    (m,) = check_effects(Expect(), obs.effects)
    assert "never reached it" in str(m)


@linux
def test_an_address_space_limit_with_room_refused_nothing(tmp_path):
    obs, e = _run(BASE + "workload: [barrier]\n"
                  "faults: [{kind: memory_limit, rank: 1, mb: 2000, via: rlimit}]\n", tmp_path)
    assert [v.outcome for v in classify_run(obs)] == ["ok", "ok"]
    assert e["status"] == "no effect", e
    assert "RLIMIT_AS" in e["summary"] and "no allocation of rank 1 was refused" in e["summary"]


@linux
def test_an_open_files_limit_acts_when_the_rank_runs_out_and_not_with_room(tmp_path):
    obs, e = _run(BASE + "workload: [barrier]\n"
                  "faults: [{kind: open_files_limit, rank: 1, limit: 8}]\n", tmp_path)
    assert e["status"] == "acted", e
    assert "Too many open files" in e["summary"] and "read back from /proc/" in e["summary"]
    obs, e = _run(BASE + "workload: [barrier]\n"
                  "faults: [{kind: open_files_limit, rank: 1, limit: 4096}]\n", tmp_path)
    assert [v.outcome for v in classify_run(obs)] == ["ok", "ok"]
    assert e["status"] == "no effect" and "never ran out of descriptors" in e["summary"], e


@linux
@needs_cpu
def test_a_cpu_quota_counts_the_periods_it_throttled(tmp_path):
    obs, e = _run(BASE + "workload: [barrier]\n"
                  "faults: [{kind: cpu_contention, rank: 1, how: quota, percent: 1}]\n",
                  tmp_path)
    assert e["status"] == "acted", e
    n = e["targets"][0]["steps"][0]["numbers"]
    assert n["nr_throttled"] > 0 and n["nr_periods"] >= n["nr_throttled"], n


@linux
def test_the_file_store_folder_faults_name_the_ranks_they_refused(tmp_path):
    base = BASE.replace("timeout: 3", "timeout: 3\ninit: file") + "workload: [barrier]\n"
    obs, e = _run(base + "faults: [{kind: file_init, mode: read_only_mount}]\n", tmp_path)
    assert e["status"] == "acted", e
    assert "(ranks 0, 1): " in e["summary"] and "Read-only file system" in e["summary"]
    obs, e = _run(base + "faults: [{kind: file_init, mode: stale_file}]\n", tmp_path)
    n = e["targets"][0]["steps"][0]["numbers"]
    assert e["status"] == "acted" and n["bytes_at_end"] > n["bytes_left"] > 0, e


@linux
def test_busy_processes_report_their_cpu_time_and_the_rank_its_pinned_cpu(tmp_path):
    obs, e = _run(BASE + "workload: [barrier]\n"
                  "faults: [{kind: cpu_contention, rank: 1, how: hogs, hogs: 2}]\n", tmp_path)
    assert e["status"] == "acted", e
    by = {t["target"]: t for t in e["targets"]}
    hogs = by["CPU of rank 1"]["steps"][0]["numbers"]
    assert hogs["processes"] == 2 and hogs["cpu_seconds"] > 0 and hogs["cpus"] == [hog_cpu()]
    pinned = by["rank 1"]
    assert pinned["status"] == "acted" and pinned["steps"][0]["numbers"]["cpu"] == hog_cpu()
    assert f"pinned to CPU {hog_cpu()} alone, read back from /proc" in pinned["summary"]


@linux
def test_a_pin_healed_on_the_other_ranks_end_gives_the_rank_its_cpus_back(tmp_path):
    """Pinned from its train step 1, healed once rank 0 ended: the effect says when it was
    unpinned, with the CPUs read back, and the rank (its timeout 60 s) sees the closed
    connection as an error instead of hanging starved at the deadline."""
    obs, e = _run(BASE.replace("timeout: 3", "timeout: 3\nrank_timeouts: {1: 60}")
                  + "workload: [\"ddp 16MB\", \"train 3\"]\n"
                  "faults: [{kind: cpu_contention, rank: 1, how: hogs, hogs: 4, nice: 19, "
                  "phase: train step 1, heal_phase: ended, heal_rank: 0}]\n", tmp_path)
    v = {x.label: x for x in classify_run(obs)}
    assert (v["0"].outcome, v["1"].outcome) == ("timeout", "error"), v
    pinned = {t["target"]: t for t in e["targets"]}["rank 1"]
    n = pinned["steps"][0]["numbers"]
    assert pinned["status"] == "acted" and n["healed_at"] >= v["0"].duration - 0.5, pinned
    assert f"(its CPUs read back: {sorted(os.sched_getaffinity(0))})" in pinned["summary"]


@linux
@needs_cpu
def test_a_quota_healed_while_the_rank_runs_lifts_it_and_the_rank_lives_on(tmp_path):
    """A 1% quota from the start line, healed after 1 s: the rank moves back to the harness's
    cgroup before the quota's goes (removing a cgroup kills what is still in it: the rank was
    SIGKILLed before), and its workload ends ok."""
    obs, e = _run(BASE.replace("timeout: 3", "timeout: 20")
                  + "workload: [\"ddp 16MB\", \"train 2\"]\n"
                  "faults: [{kind: cpu_contention, rank: 1, how: quota, percent: 1, "
                  "heal_after: 1}]\n", tmp_path)
    assert [v.outcome for v in classify_run(obs)] == ["ok", "ok"], classify_run(obs)
    n = e["targets"][0]["steps"][0]["numbers"]
    assert e["status"] == "acted" and n.get("healed_at") is not None, e
    assert "its quota lifted at" in e["summary"]

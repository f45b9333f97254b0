"""The session's zygote (start: fork's warm parent, harness.forkserver): which runs it may serve
(pure: its key), and for real: a second run of a session forks its per-host servers from the
same warm zygote, and what their ranks see of their host (network and UTS namespaces, /etc
files, /sys, mounts) is what a fresh rank of the same host sees; the fallbacks to a fresh server
with their reasons; nothing left at the session's end or after a SIGKILL of the supervisor."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any, Dict, List

import psutil
import pytest
from orphans import run_in_workload, state_dir, supervisor, wait_for

from harness.judge.classify import classify_run
from harness.machine.procs import alive
from harness.machine.rundir import sweep
from harness.net import topology
from harness.ranks import forkclient
from harness.ranks.forkclient import PER_RUN_ENV, close_zygotes, warm_zygote, zygote_key
from harness.run.supervisor import Supervisor, run_scenario
from harness.scenario.loader import load_text

ROOT = Path(__file__).resolve().parent.parent


def scenario(text: str):
    (scn,) = load_text(textwrap.dedent(text), "zygote.yaml")
    return scn


@pytest.fixture
def session(tmp_path, monkeypatch):
    """A session of its own: state under tmp_path, no zygote before, every zygote closed
    after (and checked gone)."""
    monkeypatch.setenv("HARNESS_TMP", str(tmp_path))
    monkeypatch.delenv("HARNESS_ZYGOTES", raising=False)
    close_zygotes()
    yield tmp_path
    procs = [z.proc for z in forkclient.zygotes()]
    close_zygotes()
    assert all(p.poll() is not None for p in procs)
    assert not list(state_dir(tmp_path).glob("zygote-*"))


# -- which runs a zygote serves (pure) -----------------------------------------------------------

def test_the_key_leaves_out_only_the_per_run_paths():
    env = {"PYTHONPATH": "/x", "TORCH_CPP_LOG_LEVEL": "INFO"}
    key = zygote_key("/py", env, False)
    assert zygote_key("/py", {**env, **{k: "/run-a/v" for k in PER_RUN_ENV}}, False) == key
    assert zygote_key("/py", {**env, "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, False) != key
    assert zygote_key("/py", {**env, "TORCH_CPP_LOG_LEVEL": "ERROR"}, False) != key
    assert zygote_key("/py", env, True) != key
    assert zygote_key("/other/python", env, False) != key
    assert PER_RUN_ENV == {"HARNESS_RESOLVER_VIEW", "HARNESS_READ_ONLY", "TMPDIR"}


def test_host_entry_names_what_the_exec_prefix_enters():
    topo = topology.Topology("zyg1", ["a", "b"])   # the constructor is pure: nothing made
    topo._hostnames["a"] = "alpha"                 # as set_hostname leaves it
    for host in ("a", "b"):
        prefix, entry = topo.exec_prefix(host), topo.host_entry(host)
        ns = prefix[prefix.index("exec") + 1]
        assert entry["netns"] == ns and entry["net"] == f"/run/netns/{ns}"
        assert entry["etc"] == f"/etc/netns/{ns}"
        uts = [a.split("=", 1)[1] for a in prefix if a.startswith("--uts=")]
        assert (uts[0] if uts else None) == entry["uts"]
    assert topo.host_entry("a")["uts"] and topo.host_entry("b")["uts"] is None


def test_the_report_says_per_host_how_each_server_came_and_why_not_warm():
    from harness.reports.report import _started

    plan = {"ranks": [{"label": "0", "start": "fork"}, {"label": "1", "start": "fork"},
                      {"label": "2", "start": "fresh", "start_note": "its own interpreter"}]}
    servers = [{"host": "a", "warm": True, "ready": True, "zygote": 7},
               {"host": "b", "warm": False, "ready": True, "note": "warm servers are off"}]
    assert _started(plan, servers) == {
        "fresh": 1, "fork": 2, "fresh_because": {"2": "its own interpreter"},
        "servers": {"a": "warm", "b": "fresh"},
        "server_fresh_because": {"b": "warm servers are off"}}
    assert "servers" not in _started(plan)    # start: fresh, or no forked rank


def test_no_zygote_when_they_are_off_or_outside_the_main_thread(session, monkeypatch):
    monkeypatch.setenv("HARNESS_ZYGOTES", "0")
    assert warm_zygote(sys.executable, {}, False) == (None, "warm servers are off "
                                                            "(HARNESS_ZYGOTES=0)")
    monkeypatch.delenv("HARNESS_ZYGOTES")
    got: List[Any] = []
    t = threading.Thread(target=lambda: got.append(warm_zygote(sys.executable, {}, False)))
    t.start()
    t.join()
    assert got[0][0] is None and "main thread" in got[0][1]
    assert forkclient.zygotes() == []


def test_python_forgets_the_machines_uname_in_a_new_uts_namespace():
    """The zygote imported torch (which asks platform.uname()) under the machine's name; a
    server it forks into a host with a name of its own must not keep that name."""
    if os.geteuid() != 0:
        pytest.skip("a UTS namespace needs root")
    code = textwrap.dedent("""
        import ctypes, os, platform, socket
        from harness.ranks.forkserver import forget_uname
        before = platform.node()
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.unshare(0x04000000) == 0, ctypes.get_errno()
        socket.sethostname("zygote-test-host")
        stale = platform.node()
        forget_uname()
        print(before == stale, platform.node())
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    assert p.stdout.split() == ["True", "zygote-test-host"], p.stderr


# -- for real ----------------------------------------------------------------------------------

needs_netns = pytest.mark.skipif(bool(topology.missing()),
                                 reason="hosts need: " + "; ".join(topology.missing()))

HOSTS = """\
name: zygote_hosts
about: two hosts, a with a name of its own and a hosts entry, b sharing the machine's name
hosts:
  - {{name: a, hostname: alpha, names: {{store: b}}}}
  - {{name: b}}
timeout: 20
deadline: 60
start: {start}
workload: [barrier, all_reduce]
"""


def _mounts(pid: int, netns: str) -> List[tuple]:
    """The rank's mounts at /, /etc/... and /sys (point, fs type, source, options), its run's
    namespace name replaced."""
    out = []
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        f = line.split()
        sep = f.index("-")
        point, opts, fstype, source, sopts = f[4], f[5], f[sep + 1], f[sep + 2], f[sep + 3]
        tags = tuple(sorted(t.split(":")[0] for t in f[6:sep]))   # shared/master, no group ids
        if point == "/" or point.startswith(("/etc/", "/sys")):
            out.append((point, opts, tags, fstype, source.replace(netns, "NS"), sopts,
                        f[3].replace(netns, "NS")))
    return sorted(out)


def _net(text: str) -> str:
    """The run's own /24 (each run draws one) written as NET."""
    return re.sub(r"\b10\.\d+\.\d+\.(\d+)\b", r"NET.\1", text)


def _view(sup: Supervisor) -> Dict[str, Dict[str, Any]]:
    """What each rank sees of its host, read from outside while it waits at the start line."""
    seen = {}
    for r in sup.ranks:
        pid = int(r.proc.pid)
        entry = sup.host_entry(r.obs.host)
        assert entry is not None
        root = f"/proc/{pid}/root"
        uts = entry["uts"]
        seen[r.label] = {
            "net": os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(entry["net"]).st_ino,
            "uts": (os.stat(f"/proc/{pid}/ns/uts").st_ino == os.stat(uts).st_ino) if uts
            else os.stat(f"/proc/{pid}/ns/uts").st_ino == os.stat("/proc/self/ns/uts").st_ino,
            **{name: _net(Path(f"{root}/etc/{name}").read_text())
               for name in ("hosts", "nsswitch.conf", "resolv.conf")},
            "etc_is_the_view": all(Path(f"{root}/etc/{name}").read_bytes() ==
                                   Path(entry["etc"], name).read_bytes()
                                   for name in ("hosts", "nsswitch.conf", "resolv.conf")),
            "sys": sorted(os.listdir(f"{root}/sys/class/net")),
            "links": sorted(ln.split(":")[0].strip()
                            for ln in Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]),
            "mounts": _mounts(pid, entry["netns"]),
        }
    return seen


def _run_viewed(text: str, monkeypatch) -> tuple:
    views: List[Dict[str, Any]] = []
    original = Supervisor._wait_ready

    def wait_ready(self: Supervisor) -> None:
        original(self)
        views.append(_view(self))

    monkeypatch.setattr(Supervisor, "_wait_ready", wait_ready)
    run = run_scenario(scenario(text))
    monkeypatch.setattr(Supervisor, "_wait_ready", original)
    return run, views[0]


def _ready(run, label: str) -> dict:
    r = next(r for r in run.ranks if r.label == label)
    return next(e.data for e in r.events if e.ev == "ready")


@needs_netns
@pytest.mark.timeout(600)
def test_a_second_run_reuses_the_warm_zygote_and_its_ranks_see_their_host_as_fresh_ones(
        session, monkeypatch):
    fresh, fresh_view = _run_viewed(HOSTS.format(start="fresh"), monkeypatch)
    first, _ = _run_viewed(HOSTS.format(start="fork"), monkeypatch)
    second, warm_view = _run_viewed(HOSTS.format(start="fork"), monkeypatch)
    for run in (fresh, first, second):
        assert [v.outcome for v in classify_run(run)] == ["ok", "ok"]
    assert [r["start"] for r in second.plan["ranks"]] == ["fork", "fork"]
    zygotes = {s["zygote"] for run in (first, second) for s in run.servers}
    assert len(zygotes) == 1 and [s["warm"] for s in second.servers] == [True, True]
    (z,) = forkclient.zygotes()
    assert z.pid in zygotes and z.proc.poll() is None
    for label in ("0", "1"):
        assert warm_view[label]["net"] and warm_view[label]["uts"]
        assert warm_view[label]["etc_is_the_view"]
        assert warm_view[label] == fresh_view[label], label
        assert _ready(second, label)["hostname"] == _ready(fresh, label)["hostname"]
    assert _ready(second, "0")["hostname"] == "alpha"
    assert re.search(r"\nstore-?\S*|\S+\tstore\n", warm_view["0"]["hosts"])
    assert "lo" in warm_view["0"]["sys"] and "eth0" in warm_view["0"]["sys"]


@needs_netns
@pytest.mark.timeout(600)
def test_a_warm_server_that_cannot_enter_its_host_is_replaced_by_a_fresh_one(
        session, monkeypatch):
    original = Supervisor.host_entry

    def broken(self, host):
        entry = dict(original(self, host) or {})
        entry["net"] = "/run/netns/thx-no-such-namespace"
        return entry

    monkeypatch.setattr(Supervisor, "host_entry", broken)
    run = run_scenario(scenario(HOSTS.format(start="fork")))
    assert [v.outcome for v in classify_run(run)] == ["ok", "ok"]
    assert [r["start"] for r in run.plan["ranks"]] == ["fork", "fork"]
    for s in run.servers:
        assert s["warm"] is False and s["ready"] is True
        assert s["note"].startswith("the warm server could not serve: the warm server could not "
                                    f"enter host {s['host']}: ")
        assert "thx-no-such-namespace" in s["note"]


@pytest.mark.timeout(600)
def test_a_zygote_whose_torch_import_fails_leaves_its_ranks_fresh_as_a_fresh_server_does(
        session, monkeypatch):
    """TORCH_DISTRIBUTED_DEBUG=VERBOSE: torch refuses it at import. The zygote meets that as a
    fresh server would: no fresh server is tried, the ranks start fresh with the same note,
    and their verdict is torch's error in phase import."""
    text = """\
        name: bad_debug
        about: a value torch refuses at import
        world_size: 2
        timeout: 10
        deadline: 60
        isolate: never
        start: fork
        env: {TORCH_DISTRIBUTED_DEBUG: VERBOSE}
    """
    notes = {}
    for zygotes in ("2", "0"):
        monkeypatch.setenv("HARNESS_ZYGOTES", zygotes)
        run = run_scenario(scenario(text))
        vs = classify_run(run)
        assert [(v.outcome, v.phase) for v in vs] == [("error", "import")] * 2
        notes[zygotes] = [r["start_note"] for r in run.plan["ranks"]]
        assert [r["start"] for r in run.plan["ranks"]] == ["fresh", "fresh"]
        (server,) = run.servers
        assert server["warm"] is (zygotes == "2") and server["ready"] is False
    assert notes["2"] == notes["0"]
    assert all(n.startswith("the fork server could not fork: the server could not import "
                            "torch") for n in notes["2"])
    assert forkclient.zygotes() == []   # the failed zygote was not kept


@pytest.mark.timeout(600)
def test_a_zygote_not_ready_in_time_is_closed_and_the_run_goes_on(session, monkeypatch):
    """HARNESS_READY_TIMEOUT 0.05 s: no interpreter imports torch that fast, so the warm server
    is not ready in time; a fresh server replaces it (not ready in time either: the ranks
    start fresh), and the zygote, still importing, is closed rather than kept for later runs
    to wait on."""
    monkeypatch.setenv("HARNESS_READY_TIMEOUT", "0.05")
    run = run_scenario(scenario("""\
        name: impatient
        about: servers given 0.05 s to be ready
        world_size: 2
        timeout: 10
        deadline: 60
        isolate: never
        start: fork
        workload: [all_reduce]
    """))
    assert [v.outcome for v in classify_run(run)] == ["ok", "ok"]
    (server,) = run.servers
    assert server["warm"] is False and server["note"] == (
        "the warm server could not serve: the fork server of host local was not ready in 0 s")
    assert [r["start"] for r in run.plan["ranks"]] == ["fresh", "fresh"]
    assert forkclient.zygotes() == []


@pytest.mark.timeout(600)
def test_a_zygote_killed_between_runs_is_replaced(session):
    text = """\
        name: killed_zygote
        about: the zygote is SIGKILLed between two runs
        world_size: 2
        timeout: 10
        deadline: 60
        isolate: never
        start: fork
        workload: [all_reduce]
    """
    first = run_scenario(scenario(text))
    (z,) = forkclient.zygotes()
    z.proc.popen.send_signal(signal.SIGKILL)
    z.proc.wait(30)
    second = run_scenario(scenario(text))
    assert [v.outcome for v in classify_run(second)] == ["ok", "ok"]
    (z2,) = forkclient.zygotes()
    assert first.servers[0]["zygote"] == z.pid != z2.pid == second.servers[0]["zygote"]
    assert second.servers[0]["warm"] is True


@pytest.mark.timeout(600)
def test_the_session_end_takes_the_zygote_along(tmp_path):
    """A pytest session with --harness-start fork: its report names the zygote that forked the
    servers; when pytest has exited, that zygote is gone and so is its state folder."""
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "s.yaml").write_text(textwrap.dedent("""\
        name: s
        about: two runs of one session
        world_size: 2
        timeout: 10
        deadline: 60
        isolate: never
        cases: {one: {}, two: {}}
        """))
    env = dict(os.environ, HARNESS_TMP=str(tmp_path / "state"))
    env.pop("HARNESS_ZYGOTES", None)
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                        "scenarios", "--harness-start", "fork", "--harness-report", "r.json",
                        "-p", "no:randomly"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=500)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    cases = json.loads((tmp_path / "r.json").read_text())["cases"]
    assert [c["started"]["servers"] for c in cases] == [{"local": "warm"}] * 2
    pids = set()   # the evidence's observations name the zygote of each run's server
    for obs in (tmp_path / ".harness" / "evidence").glob("session-*/*/observation.json"):
        pids |= {s["zygote"] for s in json.loads(obs.read_text())["servers"]}
    assert len(pids) == 1
    (pid,) = pids
    gone = not psutil.pid_exists(pid) or "--zygote" not in " ".join(
        psutil.Process(pid).cmdline())
    assert gone
    assert not list(state_dir(tmp_path / "state").glob("zygote-*"))


SCENARIO = """\
name: orphaned_warm
about: a long warm-forked run whose supervisor is killed
world_size: 2
timeout: 60
deadline: 120
isolate: never
start: fork
workload: [sleep 100]
"""


@pytest.mark.timeout(240)
def test_killed_supervisor_takes_the_zygote_its_server_and_ranks_along(tmp_path):
    sup = supervisor(SCENARIO, tmp_path)
    base = state_dir(tmp_path)
    recs: List[Dict[str, Any]] = []
    try:
        run_dir = wait_for(lambda: run_in_workload(tmp_path), 150,
                           "both forked ranks to start their workload")
        recs = [json.loads(ln) for ln in (run_dir / "pids.jsonl").read_text().splitlines()]
        (zdir,) = base.glob("zygote-*")
        (zrec,) = [json.loads(ln) for ln in (zdir / "pids.jsonl").read_text().splitlines()]
        recs.append(zrec)
        names = [r["name"] for r in recs]
        assert names.count("fork server local (warm)") == 1 and "zygote" in names, names
        server = next(r for r in recs if r["name"] == "fork server local (warm)")
        ranks = [r for r in recs if "forked" in r["name"]]
        assert psutil.Process(server["pid"]).ppid() == zrec["pid"]
        assert all(psutil.Process(r["pid"]).ppid() == server["pid"] for r in ranks)
        assert len(ranks) == 2 and all(alive(r) for r in [server, zrec, *ranks])

        sup.send_signal(signal.SIGKILL)
        sup.wait(timeout=30)
        wait_for(lambda: not any(alive(r) for r in recs), 30,
                 "the zygote, its server and their ranks to die")
        removed = sweep(base)
        assert sorted(r.split()[0] for r in removed) == sorted([run_dir.name, zdir.name])
        assert not list(base.glob("zygote-*")) and not list(base.glob("run-*"))
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
        sup.stderr.close()
        for r in recs:
            if alive(r):
                os.kill(r["pid"], signal.SIGKILL)

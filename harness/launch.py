"""Launch and supervise one run: start every rank, fire timed faults, enforce the deadline,
capture stacks of whatever is still alive, kill every process group. Nothing outlives ``run``.

Every rank is a fresh ``python -m harness.worker`` in its own session (own process group), with
PR_SET_PDEATHSIG so that it dies with the supervisor. Ranks import torch first and report
``ready``; only then is the clock started (the start line) and each rank released, at its
``start_delay``, by a line on its stdin. The loop then watches event files and processes until
every rank has ended or the deadline passes.

A rank's stdout and stderr go through pipes drained by one thread (``harness.capture``): kept
up to a head and a tail with a marker of what was cut, so evidence stays bounded. A rank that
dies before it reported ``ready`` (Python or torch could not start) is a HarnessError naming
the rank and the cause. Cleanup (killing ranks and holders, the topology, the run directory)
runs inside ``interrupts.shield()``: a SIGTERM or a second Ctrl-C waits until it has finished.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from . import interrupts, resolver
from .capture import Capture
from .errors import HarnessError
from .plan import ActionPlan, RankPlan, RunPlan, make_plan
from .ports import PortLease
from .rundir import RunDir, kill_recorded, sweep
from .schema import Scenario

READY_TIMEOUT = float(os.environ.get("HARNESS_READY_TIMEOUT", "180"))
POLL = 0.02
TAIL = 4000
STACKS_MAX = 1 << 20     # a faulthandler dump is kept up to this many bytes per rank




@dataclass
class RankObservation:
    label: str
    pid: Optional[int] = None
    host: str = "local"
    addr: str = "127.0.0.1"
    events: List[Dict[str, Any]] = field(default_factory=list)
    returncode: Optional[int] = None     # negative: killed by that signal
    killed_at_deadline: bool = False
    signals: List[Dict[str, Any]] = field(default_factory=list)  # sent by faults: {sig, t}
    stacks: str = ""
    stdout_tail: str = ""
    stderr_tail: str = ""
    native_stacks: str = ""              # py-spy dump --native of a hung rank, where permitted
    released_at: Optional[float] = None  # seconds after the start line
    ended_at: Optional[float] = None     # seconds after the start line (as seen by the supervisor)

    def result(self) -> Optional[Dict[str, Any]]:
        for e in self.events:
            if e.get("ev") == "result":
                return e
        return None


@dataclass
class RunObservation:
    plan: Dict[str, Any]
    torch_version: str
    ranks: List[RankObservation]
    holders: List[Dict[str, Any]]
    wall: float                          # seconds from the start line to the end of the run
    run_dir: str
    t0: float = 0.0                      # the start line, on the monotonic clock
    port_owners: List[Dict[str, Any]] = field(default_factory=list)  # who held MASTER_PORT
    net_log: List[Dict[str, Any]] = field(default_factory=list)  # network changes and when
    rules: Dict[str, str] = field(default_factory=dict)           # nft rules per host at the end

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


class _Rank:
    def __init__(self, plan: RankPlan, proc: subprocess.Popen, ev_path: Path, st_path: Path,
                 out_path: Path, err_path: Path):
        self.plan, self.proc = plan, proc
        self.ev_path, self.st_path, self.out_path, self.err_path = ev_path, st_path, out_path, \
            err_path
        self.obs = RankObservation(label=plan.label, pid=proc.pid, host=plan.host)
        self._offset = 0
        self._partial = b""
        self.released = False
        self.ended = False
        self.cutoff: Optional[int] = None    # events after the deadline are not the run's

    def read_events(self) -> List[Dict[str, Any]]:
        new: List[Dict[str, Any]] = []
        try:
            with open(self.ev_path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return new
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            try:
                new.append(json.loads(line))
            except ValueError:
                continue
        self.obs.events.extend(new)
        return new

    def ready(self) -> bool:
        return any(e.get("ev") == "ready" for e in self.obs.events)

    def release(self) -> None:
        self.released = True
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _read_stacks(path: Path) -> str:
    """A rank's faulthandler dump, at most STACKS_MAX bytes (the file is cut to that too, with
    a marker: it is evidence, and a rank with thousands of threads must not make it huge)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            data = f.read(STACKS_MAX)
    except OSError:
        return ""
    if size > STACKS_MAX:
        note = f"\n[harness: {size - STACKS_MAX} bytes of stacks cut here]\n".encode()
        data += note
        try:
            with open(path, "r+b") as f:
                f.seek(STACKS_MAX)
                f.write(note)
                f.truncate()
        except OSError:
            pass
    return data.decode(errors="replace")


_ERROR_LINE = re.compile(r"^(?:[\w.]+(?:Error|Exception|Interrupt|Exit)\b|Fatal Python error)")


def start_failure(label: str, returncode: Optional[int], events: List[Dict[str, Any]],
                  stderr: str) -> str:
    """One line: why a rank died before it was ready (could not start Python, import torch or
    the worker). The worker's own exception record wins, else the telling line of stderr."""
    phase = next((e["phase"] for e in reversed(events) if e.get("ev") == "phase"), None)
    exc = next((e.get("exc") for e in events if e.get("ev") == "result" and e.get("exc")), None)
    if exc:
        first = (str(exc.get("message", "")).strip().splitlines() or [""])[0]
        cause = f"{exc.get('type')}: {first}"
    else:
        lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
        telling = [ln for ln in lines if _ERROR_LINE.match(ln)]
        cause = (telling[-1] if telling else lines[-1] if lines else "(no output on stderr)")
    if returncode is None:
        how = "ended"
    elif returncode < 0:
        how = f"was killed by {signal.Signals(-returncode).name}" if -returncode in \
            signal.valid_signals() else f"was killed by signal {-returncode}"
    else:
        how = f"exited with status {returncode}"
    if phase is None:
        what = "Python or the harness worker could not start"
    elif phase == "import":
        what = "could not import torch"
    else:
        what = f"the harness worker failed in phase {phase}"
    return f"rank {label} {how} before it was ready: {what}: {cause[:300]}"


def _py_spy() -> Optional[str]:
    return shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))


def native_stacks_available() -> bool:
    return _py_spy() is not None


def native_stacks(pid: int) -> str:
    """``py-spy dump --native``: the C++ frames (TCPStore::ping -> recv ...) of a stuck rank.
    Empty when py-spy is not installed; its error when not permitted (needs CAP_SYS_PTRACE)."""
    exe = _py_spy()
    if not exe:
        return ""
    try:
        p = subprocess.run([exe, "dump", "--native", "--pid", str(pid)], capture_output=True,
                           text=True, timeout=20, start_new_session=True)
    except (subprocess.TimeoutExpired, OSError) as e:
        return f"py-spy failed: {e}"
    if p.returncode == 0:   # pybind11's template frames run to thousands of characters
        return "\n".join(ln if len(ln) <= 200 else ln[:150] + " ... " + ln[ln.rfind("("):]
                         for ln in p.stdout.splitlines()) + "\n"
    return f"py-spy failed (rc {p.returncode}): {p.stderr[-500:]}"


def port_owners(port: int) -> List[Dict[str, Any]]:
    """Processes with a socket on ``port`` (psutil), e.g. the holder of a busy port."""
    import psutil

    out: List[Dict[str, Any]] = []
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return out
    for c in conns:
        if c.laddr and c.laddr.port == port:
            rec: Dict[str, Any] = {"pid": c.pid, "status": c.status,
                                   "laddr": f"{c.laddr.ip}:{c.laddr.port}"}
            try:
                proc = psutil.Process(c.pid) if c.pid else None
                rec["cmdline"] = " ".join(proc.cmdline())[:200] if proc else ""
            except psutil.Error:
                rec["cmdline"] = ""
            out.append(rec)
    return out


def _netem(host: Any, delay_ms: float, jitter_ms: float) -> None:
    argv = ["tc", "-n", host.netns, "qdisc", "replace", "dev", host.ifname, "root", "netem",
            "delay", f"{delay_ms}ms"] + ([f"{jitter_ms}ms"] if jitter_ms else [])
    p = subprocess.run(argv, capture_output=True, text=True, start_new_session=True)
    if p.returncode != 0:
        raise HarnessError(f"latency: {' '.join(argv)} failed: {p.stderr.strip()}")


def _sig(name: str) -> int:
    return int(getattr(signal, "SIG" + name))


def _rank_env(rp: RankPlan, ev_fd: int, st_fd: int) -> Dict[str, str]:
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("PYTEST_", "HARNESS_")) or k in ("MASTER_ADDR", "MASTER_PORT", "RANK",
                                                           "WORLD_SIZE", "LOCAL_RANK",
                                                           "LOCAL_WORLD_SIZE"):
            env.pop(k)
    env.update(rp.env)
    for k in rp.unset:
        env.pop(k, None)
    env["HARNESS_EVENT_FD"] = str(ev_fd)
    env["HARNESS_STACK_FD"] = str(st_fd)
    # the rank resolves names with the harness's files only (no DNS query leaves the machine)
    env[resolver.ENV_VIEW] = rp.resolver_view
    if os.environ.get(resolver.ENV_USERNS):
        env[resolver.ENV_USERNS] = os.environ[resolver.ENV_USERNS]
    env["PYTHONUNBUFFERED"] = "1"
    # torch's C++ store/gloo log lines (connect, retry, timeout) land in the rank's stderr
    if "TORCH_CPP_LOG_LEVEL" not in rp.env:
        env["TORCH_CPP_LOG_LEVEL"] = "INFO"
    env.setdefault("PYTHONWARNINGS", "ignore")
    # the worker must import this very harness, wherever the supervisor found it
    pkg_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                    else "")
    return env


class Supervisor:
    """Runs one RunPlan. Use ``run_scenario`` unless you build plans yourself."""

    def __init__(self, plan: RunPlan, run_dir: RunDir, topo: Any = None):
        self.plan = plan
        self.topo = topo                 # harness.topology.Topology when the run has namespaces
        self._net_done: Dict[int, float] = {}      # net action index -> when it was done
        self._net_handles: Dict[int, Any] = {}
        self._net_undone: set = set()
        self.rundir = run_dir
        self.dir = Path(plan.run_dir)
        self.ranks: List[_Rank] = []
        self.holders: List[Dict[str, Any]] = []
        self._holder_procs: List[subprocess.Popen] = []
        self._fds: List[int] = []
        self._actions_done: set = set()
        self.capture = Capture()

    # -- start ---------------------------------------------------------------------------------
    def _prepare(self) -> None:
        if not self.plan.netns:   # the topology writes the views of namespace hosts
            for view in sorted({r.resolver_view for r in self.plan.ranks}):
                resolver.write_view(Path(view))
        for prep in self.plan.preps:
            if prep.kind == "unwritable_dir":
                os.makedirs(prep.path, exist_ok=True)
                os.chmod(prep.path, 0o555)
                if os.geteuid() == 0:   # root ignores modes: make it immutable
                    p = subprocess.run(["chattr", "+i", prep.path], capture_output=True,
                                       text=True, start_new_session=True)
                    if p.returncode != 0:
                        raise HarnessError(f"could not make {prep.path} immutable (chattr +i): "
                                           f"{p.stderr.strip()}")
            elif prep.kind == "stale_filestore":
                job = subprocess.run(
                    [sys.executable, "-m", "harness.worker", "--stale-filestore", prep.path,
                     str(prep.world_size)], capture_output=True, timeout=READY_TIMEOUT,
                    env=_rank_env(self.plan.ranks[0], -1, -1), cwd=self.dir, text=True,
                    start_new_session=True)
                if job.returncode != -signal.SIGKILL or not os.path.exists(prep.path):
                    raise HarnessError(f"could not make a stale FileStore at {prep.path}: "
                                       f"rc {job.returncode}: {job.stderr[-800:]}")
            else:
                raise HarnessError(f"unknown preparation {prep.kind!r}")

    def _prefix(self, host: str) -> List[str]:
        return self.topo.exec_prefix(host) if self.topo is not None else []

    def _master_host(self) -> str:
        return self.plan.ranks[0].host

    def _start_holders(self) -> None:
        for h in self.plan.holders:
            with interrupts.shield():   # a process that exists is a process that is tracked
                proc = subprocess.Popen(
                    self._prefix(self._master_host())
                    + [sys.executable, "-m", "harness.portholder", str(h.port), h.mode],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                    env=_rank_env(self.plan.ranks[0], -1, -1))
                self._holder_procs.append(proc)
                self.rundir.record_pid(proc.pid)
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != b"ready":
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise HarnessError(f"port holder on {h.port} ({h.mode}) failed: {err[-800:]}")
            self.holders.append({"port": h.port, "mode": h.mode, "pid": proc.pid,
                                 "release_after": h.release_after, "released_at": None})

    def _spawn(self, rp: RankPlan) -> None:
        tag = rp.label.replace(":", "-")
        ev_path, st_path = self.dir / f"rank-{tag}.events", self.dir / f"rank-{tag}.stacks"
        out_path, err_path = self.dir / f"rank-{tag}.out", self.dir / f"rank-{tag}.err"
        ev_fd = os.open(ev_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._fds.append(ev_fd)
        st_fd = os.open(st_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._fds.append(st_fd)
        spec = {"backend": self.plan.backend, "timeout": self.plan.timeout,
                "steps": self.plan.steps, "destroy": self.plan.destroy,
                "init": asdict(rp.init), "label": rp.label}
        out_w, err_w = self.capture.pipe(out_path), self.capture.pipe(err_path)
        try:
            with interrupts.shield():   # a process that exists is a process that is tracked
                proc = subprocess.Popen(
                    self._prefix(rp.host)
                    + [sys.executable, "-m", "harness.worker", json.dumps(spec)],
                    stdin=subprocess.PIPE, stdout=out_w, stderr=err_w, pass_fds=(ev_fd, st_fd),
                    start_new_session=True, env=_rank_env(rp, ev_fd, st_fd), cwd="/")
                rank = _Rank(rp, proc, ev_path, st_path, out_path, err_path)
                self.ranks.append(rank)
                self.rundir.record_pid(proc.pid)
        finally:
            os.close(out_w)
            os.close(err_w)
        if self.plan.hosts:
            h = self.plan.host(rp.host) if any(x.name == rp.host for x in self.plan.hosts) \
                else self.plan.hosts[0]
            rank.obs.addr = h.addr

    def _wait_ready(self) -> None:
        limit = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < limit:
            pending = False
            for r in self.ranks:
                r.read_events()
                if r.ready():
                    continue
                if r.proc.poll() is None:
                    pending = True
                    continue
                r.read_events()
                if not r.ready():   # died before it was ready: the harness could not start it
                    self.capture.wait_eof([r.err_path], timeout=2.0)
                    stream = self.capture.stream(r.err_path)
                    err = _tail(r.err_path) + (bytes(stream.tail[-TAIL:]).decode(
                        errors="replace") if stream is not None else "")
                    raise HarnessError(start_failure(r.plan.label, r.proc.returncode,
                                                     r.obs.events, err))
            if not pending:
                return
            time.sleep(POLL)
        slow = [r.plan.label for r in self.ranks if not r.ready()]
        raise HarnessError(f"ranks {slow} did not import torch within {READY_TIMEOUT:.0f} s "
                           "(set HARNESS_READY_TIMEOUT for a slower machine)")

    # -- the loop ------------------------------------------------------------------------------
    def _due(self, a: ActionPlan, r: _Rank, now: float) -> bool:
        if a.at is not None:
            return now >= a.at
        for e in r.obs.events:
            if e.get("ev") == "phase" and e["phase"] == a.at_phase:
                return now >= (e["t"] - self.t0) + a.after
        return False

    def _fire_actions(self, now: float) -> None:
        for i, a in enumerate(self.plan.actions):
            if i in self._actions_done:
                continue
            r = self._rank(a.target)
            if r.ended or not r.released:
                continue
            if self._due(a, r, now):
                self._actions_done.add(i)
                r.signal(_sig(a.signal))
                r.obs.signals.append({"signal": a.signal, "t": round(now, 3), "why": a.why})
        for h, proc in zip(self.holders, self._holder_procs):
            if h["release_after"] is not None and h["released_at"] is None \
                    and now >= h["release_after"]:
                proc.kill()
                proc.wait()
                h["released_at"] = round(now, 3)

    def _net_do(self, i: int, now: Optional[float]) -> None:
        a = self.plan.net_actions[i]
        if self.topo is None:
            raise HarnessError(f"{a.why}: needs the run's network namespaces, and it has none")
        t, args = self.topo, a.args
        if a.op == "firewall":
            h = t.firewall(args["host"], action=args["action"], direction=args["direction"],
                           ports=args["ports"])
        elif a.op == "partition":
            h = t.partition(args["a"], args["b"])
        elif a.op == "packet_loss":
            h = t.packet_loss(args["host"], args["percent"], args["direction"])
        elif a.op == "bandwidth":
            t.bandwidth(args["host"], args["rate"], direction=args["direction"])
            h = None
        elif a.op == "latency":
            _netem(t.host(args["host"]), args["delay_ms"], args["jitter_ms"])
            h = None
        elif a.op == "hosts_file":
            h = t.set_hosts_file(args["host"], args["entries"])
        elif a.op == "resolv_conf":
            h = t.set_resolv_conf(args["host"], args["lines"])
        else:
            raise HarnessError(f"unknown network action {a.op!r}")
        self._net_handles[i] = h
        self._net_done[i] = now if now is not None else 0.0

    def _net_undo(self, i: int) -> None:
        a, h = self.plan.net_actions[i], self._net_handles.get(i)
        if a.op in ("firewall", "packet_loss"):
            self.topo.remove_rule(a.args["host"], h)
        elif a.op == "partition":
            self.topo.heal(h)
        elif a.op == "bandwidth":
            self.topo.clear_bandwidth(a.args["host"], a.args["direction"])
        elif a.op == "latency":
            host = self.topo.host(a.args["host"])
            subprocess.run(["tc", "-n", host.netns, "qdisc", "del", "dev", host.ifname, "root"],
                           capture_output=True, start_new_session=True)
        self._net_undone.add(i)

    def _fire_net(self, now: float) -> None:
        for i, a in enumerate(self.plan.net_actions):
            if i not in self._net_done:
                if a.at is None and a.at_phase is None:
                    continue
                r = self._rank(a.target)
                due = now >= a.at if a.at is not None else self._due(
                    ActionPlan(target=a.target, signal="", at_phase=a.at_phase, after=a.after),
                    r, now)
                if due:
                    self._net_do(i, now)
                    self.net_log.append({"op": a.op, "t": round(now, 3), "why": a.why,
                                         "args": a.args})
            elif a.undo_after is not None and i not in self._net_undone and \
                    now >= self._net_done[i] + a.undo_after:
                self._net_undo(i)
                self.net_log.append({"op": a.op + " off", "t": round(now, 3), "why": a.why,
                                     "args": a.args})

    def _rank(self, label: str) -> _Rank:
        for r in self.ranks:
            if r.plan.label == label:
                return r
        raise KeyError(label)

    def _capture_stacks(self, live: List[_Rank]) -> None:
        """py-spy's native stacks where permitted, then the faulthandler dump of every live rank
        (SIGUSR1; SIGCONT too, so that a stopped rank can write it). What a resumed rank does
        after the deadline is not part of the run: its events are cut at the deadline."""
        import psutil

        for r in live:
            r.read_events()
            r.cutoff = len(r.obs.events)
            try:
                stopped = psutil.Process(r.proc.pid).status() == psutil.STATUS_STOPPED
            except psutil.Error:
                stopped = False
            r.obs.native_stacks = (
                "(no native stacks: the rank is stopped (SIGSTOP) and py-spy cannot attach to a "
                "stopped process)" if stopped and native_stacks_available()
                else native_stacks(r.proc.pid))
        for r in live:
            try:
                os.kill(r.proc.pid, signal.SIGUSR1)
                os.kill(r.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        # a dump is complete when the file stops growing; a rank gets up to 3 s
        sizes: Dict[str, int] = {}
        limit = time.monotonic() + 3.0
        while time.monotonic() < limit:
            done = True
            for r in live:
                size = r.st_path.stat().st_size if r.st_path.exists() else 0
                if size == 0 or sizes.get(r.plan.label) != size:
                    done = False
                sizes[r.plan.label] = size
            if done:
                break
            time.sleep(0.1)
        for r in live:
            r.obs.stacks = _read_stacks(r.st_path)

    def run(self) -> RunObservation:
        self.net_log: List[Dict[str, Any]] = []
        for i, a in enumerate(self.plan.net_actions):   # set-up time network changes
            if a.at is None and a.at_phase is None:
                self._net_do(i, None)
                self.net_log.append({"op": a.op, "t": 0.0, "why": a.why, "args": a.args})
        self._prepare()
        self._start_holders()
        owners = self._port_owners()
        for rp in self.plan.ranks:
            self._spawn(rp)
        self._wait_ready()
        self.t0 = time.monotonic()
        torch_version = str(next((e.get("torch") for r in self.ranks for e in r.obs.events
                                  if e.get("ev") == "ready"), "unknown"))
        deadline = self.plan.deadline
        while True:
            now = time.monotonic() - self.t0
            for r in self.ranks:
                if not r.released and now >= r.plan.start_delay and r.proc.poll() is None:
                    r.release()
                    r.obs.released_at = round(now, 3)
                r.read_events()
                if not r.ended and r.proc.poll() is not None:
                    r.ended = True
                    r.read_events()
                    r.obs.returncode = r.proc.returncode
                    r.obs.ended_at = round(time.monotonic() - self.t0, 3)
            self._fire_actions(now)
            self._fire_net(now)
            if all(r.ended for r in self.ranks) or now >= deadline:
                break
            time.sleep(POLL)
        live = [r for r in self.ranks if not r.ended]
        if live:
            self._capture_stacks(live)
            for r in live:
                r.obs.killed_at_deadline = True
                r.signal(signal.SIGKILL)
        for r in self.ranks:
            r.proc.wait()
            r.read_events()
            if r.cutoff is not None:
                del r.obs.events[r.cutoff:]
            if r.obs.returncode is None:
                r.obs.returncode = r.proc.returncode
                r.obs.ended_at = round(time.monotonic() - self.t0, 3)
        self.capture.close()    # every rank is gone: the last bytes, the tails, the markers
        for r in self.ranks:
            r.obs.stdout_tail, r.obs.stderr_tail = _tail(r.out_path), _tail(r.err_path)
            if not r.obs.stacks and r.st_path.exists():
                r.obs.stacks = _read_stacks(r.st_path)
        wall = time.monotonic() - self.t0
        return RunObservation(plan=self.plan.to_dict(), torch_version=torch_version,
                              ranks=[r.obs for r in self.ranks], holders=self.holders,
                              wall=round(wall, 3), run_dir=str(self.dir), t0=self.t0,
                              port_owners=owners, net_log=self.net_log,
                              rules={h.name: self._rules(h.name) for h in self.plan.hosts}
                              if self.topo is not None else {})

    def _port_owners(self) -> List[Dict[str, Any]]:
        """Who holds MASTER_PORT, seen from the master host (inside its namespace if any:
        psutil only sees the network namespace it runs in)."""
        if self.topo is None:
            return port_owners(self.plan.master_port)
        code = ("import json,sys; from harness.launch import port_owners; "
                f"print(json.dumps(port_owners({self.plan.master_port})))")
        try:
            p = subprocess.run(self._prefix(self._master_host()) + [sys.executable, "-c", code],
                               capture_output=True, text=True, timeout=60,
                               env=_rank_env(self.plan.ranks[0], -1, -1),
                               start_new_session=True)
            return list(json.loads(p.stdout.strip().splitlines()[-1]))
        except (subprocess.TimeoutExpired, ValueError, IndexError, OSError):
            return []

    def _rules(self, host: str) -> str:
        try:
            return str(self.topo.rules(host))
        except Exception as e:  # evidence only: never fail the run for it
            return f"(could not list: {e})"

    def close(self) -> None:
        """Kill everything this run started (also after an exception), close files. Call it
        inside ``interrupts.shield()``."""
        for r in self.ranks:
            r.signal(signal.SIGKILL)
            try:
                r.proc.kill()
            except OSError:
                pass
        for r in self.ranks:
            r.proc.wait()
            if r.proc.stdin and not r.proc.stdin.closed:
                try:
                    r.proc.stdin.close()
                except OSError:
                    pass
        for proc in self._holder_procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
            for s in (proc.stdout, proc.stderr):
                if s:
                    s.close()
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        self.capture.close()


def run_scenario(scn: Scenario, keep: Optional[Path] = None) -> RunObservation:
    """Plan and run one scenario case for real; leaves nothing behind, also when interrupted
    (Ctrl-C, SIGTERM: the cleanup runs shielded, then the interrupt goes on).

    ``keep``: copy the run directory (events, stacks, stdout/stderr) there before removal; also
    when the harness failed (a HarnessError), with the error in ``harness-error.txt``.
    """
    from . import topology

    can_netns = not topology.missing()
    with interrupts.shield():
        sweep()
        if can_netns:
            topology.sweep()
        rundir = RunDir()
    sup: Optional[Supervisor] = None
    topo: Any = None
    lease: Optional[PortLease] = None
    failure: Optional[BaseException] = None
    try:
        lease = PortLease()
        plan = make_plan(scn, str(rundir.path), lease.take, netns=can_netns, run_id=rundir.id)
        if plan.netns and not can_netns:
            raise HarnessError("this scenario needs network namespaces: "
                               + "; ".join(topology.missing()))
        if plan.netns:
            topo = topology.Topology(plan.run_id, [h.name for h in plan.hosts],
                                     link=plan.link or None)
            with interrupts.shield():   # made whole or torn down whole
                topo.__enter__()
        sup = Supervisor(plan, rundir, topo)
        return sup.run()
    except BaseException as e:  # noqa: B036 - noted for the cleanup, re-raised
        failure = e
        raise
    finally:
        with interrupts.shield():
            left = _cleanup(sup, topo, lease, rundir, keep, failure)
        if isinstance(failure, KeyboardInterrupt):
            interrupts.note_cleaned(rundir.id, left)
        elif left and failure is None:
            raise HarnessError("cleanup left things behind: " + "; ".join(left))


def _cleanup(sup: Optional[Supervisor], topo: Any, lease: Optional[PortLease], rundir: RunDir,
             keep: Optional[Path], failure: Optional[BaseException]) -> List[str]:
    """Everything a run made goes, in order: processes, network, ports, run directory.
    Returns what could not be removed (said, never raised: the first error matters)."""
    left: List[str] = []
    if sup is not None:
        try:
            sup.close()
        except Exception as e:  # noqa: BLE001 - go on with the rest
            left.append(f"closing the run's processes: {e}")
    killed = kill_recorded(rundir.path)   # anything recorded that is still alive
    if killed:
        left.append(f"processes {killed} had to be killed from the run's record")
    if topo is not None:
        try:
            topo.__exit__(None, None, None)
        except Exception as e:  # noqa: BLE001
            left.append(str(e))
    if lease is not None:
        lease.release()
    keep_error = ""
    if keep is not None and not isinstance(failure, KeyboardInterrupt):
        try:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copytree(rundir.path, keep, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("filestore", "readonly", "owner.json",
                                                          "pids.jsonl"))
            if isinstance(failure, Exception):
                (keep / "harness-error.txt").write_text(f"{failure}\n")
        except OSError as e:
            keep_error = f"could not keep the evidence in {keep}: {e.strerror or e}"
    rundir.remove()
    if rundir.path.exists():
        left.append(f"run directory {rundir.path}")
    if keep_error and failure is None:
        raise HarnessError(keep_error)
    return left

"""Services: the long-lived helper processes a run needs beside its ranks (the service seam).

A service (the fault proxy today; a name server, etcd, a Slurm controller later) is one program
the run starts on one of its hosts, waits for until it ANSWERS, talks to while the run goes on,
and stops with the run. This module owns that life, the same way for every kind:

* start: through :class:`harness.machine.procs.ManagedProcess` (a session of its own, recorded in
  the run's pid record, so that the sweep after a SIGKILLed run kills it by identity), inside a
  host's network namespace (the caller's spawn function adds the exec prefix), stdout and stderr
  into files of the run directory (evidence; a pipe that nobody drains would block it once full). A
  harness program also calls ``die_with_parent`` first thing.
* ready: a :class:`Readiness` check polled until it holds, the process exits, or the spec's
  timeout passes: a line in its output (:class:`ReadyLine`), a UNIX socket that answers a
  request (:class:`Answers`). Never a sleep before the first query. A service that dies or
  never answers is a :class:`ServiceError` that quotes its own output.
* talk: :meth:`Service.call` sends one JSON request line to its control socket and reads one
  JSON answer line (the proxy's toxics are switched on and off that way). The socket lies in
  the run directory; a service binds it by its name (its working directory is the run
  directory), the supervisor reaches a path longer than ``sun_path`` through a descriptor of
  the folder (``/proc/self/fd/N/name``), so a deep HARNESS_TMP still works.
* stop: SIGTERM to its group, a short grace, then SIGKILL of the group
  (:meth:`ManagedProcess.kill`), and the process reaped.

This is mirakuru's pattern (an executor plus a check: ``OutputExecutor``, ``TCPExecutor``;
start, wait within a timeout, stop, kill the same way for every kind). mirakuru itself is not
used: it starts the process itself, so the child would escape harness.machine.procs (the one owner
of every process and its pid record, which the sweep of a killed run reads), and its TCP check dials
from the caller's network namespace, while a service lives in a host's namespace, whose ports the
supervisor cannot reach. A UNIX socket in the run directory can be reached from any network
namespace (it is found through the file system), so that is the check used here.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence

from ..machine.procs import ManagedProcess

POLL = 0.02
READY_TIMEOUT = 30.0
STOP_GRACE = 2.0
OUTPUT_TAIL = 2000
UNIX_PATH_MAX = 107          # sun_path holds 108 bytes, the last one a NUL


class ServiceError(RuntimeError):
    """A service did not start, did not answer, or refused a request (a harness failure)."""


class Readiness(Protocol):
    """A check that a started service answers. ``ready`` is polled; it must not block long."""

    def ready(self, svc: Service) -> bool: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class ReadyLine:
    """The service printed this line (stripped) on its stdout."""

    line: str = "ready"

    def ready(self, svc: Service) -> bool:
        try:
            text = svc.stdout_path.read_text(errors="replace")
        except OSError:
            return False
        return any(ln.strip() == self.line for ln in text.splitlines())

    def describe(self) -> str:
        return f"the line {self.line!r} on its stdout"


@dataclass(frozen=True)
class Answers:
    """The service's control socket accepts a connection and answers ``request`` with a JSON
    line whose ``ok`` is true."""

    request: Dict[str, Any] = field(default_factory=lambda: {"op": "ping"})

    def ready(self, svc: Service) -> bool:
        if svc.spec.control is None or not Path(svc.spec.control).exists():
            return False
        try:
            answer = svc.call(self.request, timeout=1.0)
        except ServiceError:
            return False
        return bool(answer.get("ok"))

    def describe(self) -> str:
        return f"an answer to {json.dumps(self.request)} on its control socket"


# the spawn function the supervisor gives: argv, stdout file, stderr file -> the process
Spawn = Callable[[Sequence[str], Any, Any], ManagedProcess]


@dataclass
class ServiceSpec:
    """What to start, where, and how to know it is up."""

    name: str                            # unique in the run: "proxy@a"
    argv: List[str]
    host: str = ""                       # the plan's host it runs on ("": the master host)
    ready: Optional[Readiness] = None    # None: up as soon as it started
    control: Optional[str] = None        # its control socket (a path), if it has one
    timeout: float = READY_TIMEOUT       # seconds to answer before it counts as failed
    # how it enters its host (argv in front of ``argv``); None: the host's exec prefix. A
    # daemon that ``ip netns exec`` cannot start (slurmd: it remounts /sys) brings its own
    prefix: Optional[List[str]] = None

    def __post_init__(self) -> None:
        # a long path is reached through its folder (see Service.call); only its name counts
        if self.control is not None and \
                len(os.fsencode(os.path.basename(self.control))) > UNIX_PATH_MAX - 30:
            raise ServiceError(f"{self.name}: the control socket's name "
                               f"{os.path.basename(self.control)!r} is too long for a UNIX "
                               "socket path")


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


class Service:
    """One running service: its process, its output files, its control socket."""

    def __init__(self, spec: ServiceSpec, log_dir: Path):
        self.spec = spec
        self.name = spec.name
        slug = _slug(spec.name)
        self.stdout_path = Path(log_dir) / f"service-{slug}.out"
        self.stderr_path = Path(log_dir) / f"service-{slug}.err"
        self.proc: Optional[ManagedProcess] = None
        self.started_at: Optional[float] = None
        self.ready_after: Optional[float] = None    # seconds from start to ready

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise ServiceError(f"{self.name} was not started")
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, spawn: Spawn) -> Service:
        """Start the process (not waiting for it: see :meth:`wait_ready`)."""
        if self.proc is not None:
            raise ServiceError(f"{self.name} was already started")
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = spawn(self.spec.argv, out, err)
        self.started_at = time.monotonic()
        return self

    def wait_ready(self) -> Service:
        """Poll the readiness check until it holds; a ServiceError if the process exits first
        or the spec's timeout passes (the service is then stopped)."""
        if self.proc is None or self.started_at is None:
            raise ServiceError(f"{self.name} was not started")
        check = self.spec.ready
        limit = self.started_at + self.spec.timeout
        while True:
            if check is None or check.ready(self):
                self.ready_after = round(time.monotonic() - self.started_at, 3)
                return self
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise ServiceError(f"{self.name} exited (status {code}) before it answered: "
                                   f"{self.output()}")
            if time.monotonic() >= limit:
                self.stop()
                raise ServiceError(f"{self.name} did not answer within {self.spec.timeout:g} s "
                                   f"(waited for {check.describe()}): {self.output()}")
            time.sleep(POLL)

    def call(self, request: Dict[str, Any], timeout: float = 10.0) -> Dict[str, Any]:
        """One JSON request line to the control socket, one JSON answer line back."""
        if self.spec.control is None:
            raise ServiceError(f"{self.name} has no control socket")
        path, dfd = self.spec.control, -1
        try:
            if len(os.fsencode(path)) > UNIX_PATH_MAX:
                # sun_path is short (108 bytes) and run directories may be deep: connect
                # through an open descriptor of the folder, a path of some 30 bytes
                dfd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
                path = f"/proc/self/fd/{dfd}/{os.path.basename(path)}"
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                s.connect(path)
                s.sendall(json.dumps(request).encode() + b"\n")
                buf = b""
                while not buf.endswith(b"\n"):
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
        except OSError as e:
            raise ServiceError(f"{self.name}: no answer on {self.spec.control}: {e}") from None
        finally:
            if dfd >= 0:
                os.close(dfd)
        try:
            answer = json.loads(buf.decode())
        except ValueError:
            raise ServiceError(f"{self.name} answered {buf[:200]!r}, not a JSON line") from None
        if not isinstance(answer, dict):
            raise ServiceError(f"{self.name} answered {answer!r}, not an object")
        return answer

    def request(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """:meth:`call`, and a ServiceError when the answer is not ``ok``."""
        answer = self.call(request)
        if not answer.get("ok"):
            raise ServiceError(f"{self.name} refused {json.dumps(request)}: "
                               f"{answer.get('error', answer)}")
        return answer

    def stop(self, grace: float = STOP_GRACE) -> Optional[int]:
        """SIGTERM to its group, up to ``grace`` seconds, then SIGKILL; returns its status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.signal_group(signal.SIGTERM)
            limit = time.monotonic() + grace
            while self.proc.poll() is None and time.monotonic() < limit:
                time.sleep(POLL)
        self.proc.kill()   # the group too (whatever it started), reaped
        return self.proc.returncode

    def output(self) -> str:
        """The tail of its stderr (else stdout), one line, for error messages."""
        for path in (self.stderr_path, self.stdout_path):
            try:
                text = path.read_text(errors="replace").strip()
            except OSError:
                continue
            if text:
                return " | ".join(text[-OUTPUT_TAIL:].splitlines()[-8:])
        return "(no output)"


class Services:
    """The services of one run, by name; stops them all (reverse order) at the end."""

    def __init__(self, log_dir: Path):
        self.log_dir = Path(log_dir)
        self._by_name: Dict[str, Service] = {}

    def start(self, spec: ServiceSpec, spawn: Spawn) -> Service:
        if spec.name in self._by_name:
            raise ServiceError(f"a service named {spec.name!r} already runs in this run")
        svc = Service(spec, self.log_dir)
        self._by_name[spec.name] = svc
        svc.start(spawn)
        return svc

    def get(self, name: str) -> Service:
        try:
            return self._by_name[name]
        except KeyError:
            raise ServiceError(f"no service {name!r} in this run (running: "
                               f"{', '.join(self._by_name) or 'none'})") from None

    def __iter__(self) -> Any:
        return iter(list(self._by_name.values()))

    def stop_all(self) -> List[str]:
        """Stop every service, the last started first; return what went wrong (said, never
        raised: every one must be stopped)."""
        problems = []
        for svc in reversed(list(self._by_name.values())):
            try:
                svc.stop()
            except Exception as e:  # noqa: BLE001 - stop the others anyway
                problems.append(f"stopping {svc.name}: {e}")
        return problems

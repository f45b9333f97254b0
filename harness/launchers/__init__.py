"""Launchers: how the processes of a run come to life (the launcher seam).

A launcher starts every process the run has from the plan and returns, for each rank, a
:class:`RankProcess`: the process, where its events, stacks and output go, and what was
observed of it so far. The supervisor does the rest the same way for every launcher: waits
until every rank is ready (torch imported), starts the clock (the start line), releases each
rank when its release trigger holds, fires the fault steps, enforces the deadline, takes the
stacks of whatever is alive and kills it all.

``direct`` (:mod:`harness.launchers.direct`) starts each rank as a fresh
``python -m harness.worker``. Launchers are looked up by name with :func:`launcher_for`.
"""

from __future__ import annotations

import os
import signal as _signal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from .. import resolver
from ..observe import RankObservation, SignalSent
from ..procs import ManagedProcess
from ..protocol import GO_LINE, EventReader, entered

if TYPE_CHECKING:
    from ..plan import RankPlan


class RankProcess:
    """One rank as the supervisor sees it: its process (owned by harness.procs), its event
    reader, what was observed, and whether it was released or has ended. It is the
    :class:`harness.steps.RankControl` that steps act on."""

    def __init__(self, plan: RankPlan, proc: ManagedProcess, *, events: Path, stacks: Path,
                 out: Path, err: Path, now: Callable[[], float], addr: str = ""):
        self.plan = plan
        self.label = plan.label
        self.proc = proc
        self.events_path, self.stacks_path, self.out_path, self.err_path = \
            events, stacks, out, err
        self.reader = EventReader(events)
        self.obs = RankObservation(label=plan.label, pid=proc.pid, host=plan.host,
                                   addr=addr or "127.0.0.1")
        self._now = now
        self._released = False
        self._ended = False
        self.cutoff: Optional[int] = None    # events after the deadline are not the run's

    # -- RankControl ---------------------------------------------------------------------------
    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid

    @property
    def released(self) -> bool:
        return self._released

    @property
    def ended(self) -> bool:
        return self._ended

    def signal(self, name: str) -> None:
        """SIG<name> to the rank's process group, recorded as evidence."""
        self.proc.signal_group(int(getattr(_signal, "SIG" + name)))
        self.obs.signals.append(SignalSent(name, round(self._now(), 3)))

    def note(self, text: str) -> None:
        """Evidence a step found out about the rank (the OOM killer killed it), for its
        verdict's reason."""
        self.obs.notes.append(text)

    # -- the supervisor's side -----------------------------------------------------------------
    def read_events(self) -> None:
        self.obs.events.extend(self.reader.read())

    def ready(self) -> bool:
        return self.obs.ready()

    def entered(self, phase: str) -> Optional[float]:
        """When (monotonic) the rank entered ``phase``."""
        return entered(self.obs.events, phase)

    def release(self, now: float) -> None:
        """The start line: one line on the rank's stdin."""
        self._released = True
        self.obs.released_at = round(now, 3)
        stdin = self.proc.popen.stdin
        try:
            if stdin is not None:
                stdin.write(GO_LINE)
                stdin.close()
        except (BrokenPipeError, OSError):
            pass

    def poll_end(self, now: float) -> bool:
        """Mark the rank ended if its process exited; True when it just did."""
        if self._ended or self.proc.poll() is None:
            return False
        self._ended = True
        self.read_events()
        self.obs.returncode = self.proc.returncode
        self.obs.ended_at = round(now, 3)
        return True


class Launcher:
    """Base of the launchers: ``start`` spawns every process of the plan and returns its ranks
    (not released yet); it records every process in the run's pid record."""

    name = ""

    def start(self, sup: Any) -> List[RankProcess]:
        raise NotImplementedError


PKG_ROOT = str(Path(__file__).resolve().parent.parent.parent)
CLEARED = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def process_env(rp: Optional[RankPlan] = None, extra: Optional[Dict[str, str]] = None
                ) -> Dict[str, str]:
    """The environment of a process the harness starts for a rank (or, without ``rp``, a
    helper on the rank's machine): the harness's own minus what would leak into the job
    (pytest's and the harness's variables, a MASTER_ADDR of the caller), then the rank's plan,
    the resolver view it must resolve with, and the harness importable wherever it lives."""
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("PYTEST_", "HARNESS_")) or k in CLEARED:
            env.pop(k)
    if rp is not None:
        env.update(rp.env)
        for k in rp.unset:
            env.pop(k, None)
        # the rank resolves names with the harness's files only (no DNS query leaves)
        env[resolver.ENV_VIEW] = rp.resolver_view
        if os.environ.get(resolver.ENV_USERNS):
            env[resolver.ENV_USERNS] = os.environ[resolver.ENV_USERNS]
        # torch's C++ store/gloo log lines (connect, retry, timeout) land in the rank's stderr
        if "TORCH_CPP_LOG_LEVEL" not in rp.env:
            env["TORCH_CPP_LOG_LEVEL"] = "INFO"
    env.update(extra or {})
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("PYTHONWARNINGS", "ignore")
    env["PYTHONPATH"] = PKG_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                    else "")
    return env


def launcher_for(name: str) -> Launcher:
    from .direct import DirectLauncher

    launchers = {DirectLauncher.name: DirectLauncher}
    try:
        return launchers[name]()
    except KeyError:
        raise ValueError(f"unknown launcher {name!r} (known: {', '.join(launchers)})") from None


def close_fds(fds: List[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()

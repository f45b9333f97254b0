"""busy_port: a process of the harness holds MASTER_PORT before the ranks start.

The holder is this module run as a program: ``python -m harness.faults.busy_port PORT MODE``;
MODE is ``bound`` (bind only), ``listening`` (listen, never accept) or ``accepting`` (accept every
connection, never send a byte: a foreign server on the port). It prints ``ready`` once the port
is held and dies with its parent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from pydantic import Field

from ..limits import Seconds
from ..steps import Step
from ..triggers import Trigger
from . import Fault


@dataclass
class HoldPort(Step):
    """A holder process on ``port`` on ``host``, started at set-up; undone by stopping it."""

    port: int = 0
    mode: str = "listening"
    host: str = "local"
    _helper: Any = field(default=None, init=False, repr=False, compare=False)

    def do(self, rt):
        self._helper = rt.start_helper(
            "port holder", rt.python("harness.faults.busy_port", str(self.port), self.mode),
            host=self.host)
        return {"pid": self._helper.pid}

    def undo(self, rt):
        if self._helper is not None:
            self._helper.stop()

    def describe(self):
        return f"hold port {self.port} ({self.mode})"


class BusyPort(Fault):
    kind: Literal["busy_port"] = "busy_port"
    ON_ALLOCATION = (
        "its port holder is a process the harness starts on its own machine (or in its "
        "namespaces) before the ranks: not built for an allocation's nodes")
    summary = "MASTER_PORT is held by another process (bound, listening, or accepting silently)"
    mode: Literal["bound", "listening", "accepting"] = Field(
        "listening", description="bound: bind() only; listening: listen() and never accept(); "
        "accepting: accept() and never answer (a foreign server)")
    release_after: Optional[Seconds] = Field(
        None, description="the holder exits this many seconds after the start line")

    def check(self, scn):
        problems = super().check(scn)
        if scn.init == "file":
            problems.append((("kind",), "busy_port holds MASTER_PORT, which 'init: file' never "
                                        "uses: this fault would change nothing"))
        return problems

    def apply(self, plan, scn):
        from ..jobstore import known_port

        port = known_port(plan, "busy_port")   # the job's store port, wherever the launch puts it
        step = HoldPort(port=port, mode=self.mode, host=plan.store().host or plan.ranks[0].host,
                        target="port holder")
        if self.release_after is not None:
            step.undo_trigger = Trigger.at_time(self.release_after)
        plan.add_step(self, step)
        rel = ("" if self.release_after is None
               else f", released {self.release_after:g} s after the start line")
        plan.notes.append(f"busy_port: port {port} held ({self.mode}){rel}")


def main() -> None:
    import signal
    import socket
    import sys

    from ..procs import die_with_parent

    port, mode = int(sys.argv[1]), sys.argv[2]
    die_with_parent()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("0.0.0.0", port))
    if mode != "bound":
        s.listen(128)
    print("ready", flush=True)
    kept = []
    if mode == "accepting":
        while True:
            conn, _ = s.accept()
            kept.append(conn)      # keep it open, never answer
    else:
        signal.pause()


if __name__ == "__main__":
    main()

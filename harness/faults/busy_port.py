"""busy_port: a process of the harness holds MASTER_PORT before the ranks start.

The holder is this module run as a program: ``python -m harness.faults.busy_port PORT MODE``;
MODE is ``bound`` (bind only), ``listening`` (listen, never accept) or ``accepting`` (accept every
connection, never send a byte: a foreign server on the port). It prints ``ready`` once the port
is held and dies with its parent. On stderr it logs, as JSON lines on the monotonic clock, the
socket it holds (``held``: address, port, the socket's inode) and each connection it accepts.

Its evidence (:meth:`HoldPort.effect`): that the holder still held the port when read (its
socket's inode among its open files, a listener's entry in the kernel's TCP table), what met
it there (connections waiting unaccepted in a listener's backlog, those it accepted, with their
times), and the ranks whose own store failed to bind it (EADDRINUSE naming the port, from their
result). Held, with nothing that met it, is "no effect"; a holder that no longer held it is too.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional

from pydantic import Field

from ..core.limits import Seconds
from ..core.triggers import Trigger
from . import Fault
from .steps import Effect, Step


@dataclass
class HoldPort(Step):
    """A holder process on ``port`` on ``host``, started at set-up; undone by stopping it."""

    port: int = 0
    mode: str = "listening"
    host: str = "local"
    _helper: Any = field(default=None, init=False, repr=False, compare=False)
    _seen: Optional[Dict[str, Any]] = field(default=None, init=False, repr=False, compare=False)

    def do(self, rt):
        self._helper = rt.start_helper(
            "port holder", rt.python("harness.faults.busy_port", str(self.port), self.mode),
            host=self.host)
        return {"pid": self._helper.pid}

    def undo(self, rt):
        if self._helper is not None:
            self._seen = self._read(rt)   # what it held and met goes with it
            self._helper.stop()

    def _read(self, rt) -> Dict[str, Any]:
        from ..net import sockets

        pid = self._helper.pid
        log = holder_log(getattr(self._helper, "stderr_path", None),
                         time.monotonic() - rt.now())
        held = log.get("held") or {}
        ino = held.get("ino")
        fds = set(sockets.socket_inodes(pid))
        recs = sockets.snapshot({pid: "port holder"}).get(pid, [])
        listen = [r for r in recs if r.state == "LISTEN" and r.local_port == self.port]
        return {"t": round(rt.now(), 3), "pid": pid, "held": ino is not None and ino in fds,
                "reported": bool(held), "waiting": sum(r.recv_queue for r in listen),
                "accepted": log.get("accepted") or []}

    def _ranks_met(self, rt, holder: int, accepted: List[Dict[str, Any]]) -> Dict[str, str]:
        """The rows the holder met, by label, with how: their own store's bind failed on the
        port (their result's exception says EADDRINUSE and names it), they were connected to
        the holder (their sockets as the supervisor read them, at the deadline or when they
        raised), or the holder accepted a connection of theirs (its log names the peer's pid)."""
        out: Dict[str, str] = {}
        by_pid = {a.get("pid"): a for a in accepted if a.get("pid")}
        for rp in getattr(rt.plan, "ranks", []) or []:
            try:
                rc = rt.rank(rp.label)
            except KeyError:
                continue
            obs = getattr(rc, "obs", None)
            res = obs.result() if obs is not None else None
            msg = str(((res.data.get("exc") or {}) if res is not None else {}).get("message", ""))
            if re.search(r"EADDRINUSE|address already in use", msg, re.I) and \
                    re.search(rf"\b{self.port}\b", msg):
                out[str(rp.label)] = "its store's bind failed (EADDRINUSE)"
            elif rc.pid is not None and rc.pid in by_pid:
                out[str(rp.label)] = "connected, accepted and never answered"
            elif any(sk.peer_pid == holder and sk.remote_port == self.port
                     for sk in (getattr(obs, "sockets", None) or [])):
                out[str(rp.label)] = "connected, never accepted"
        return out

    def effect(self, rt):
        seen = self._seen if self._seen is not None else self._read(rt)
        acc = seen["accepted"]
        met = self._ranks_met(rt, seen["pid"], acc)
        mine = [a for a in acc if a.get("pid") == os.getpid()]   # the harness's store probe
        when = "when released" if self._seen is not None else "at the end of the run"
        if seen["held"]:
            how = "listening, never accepting" if self.mode == "listening" else \
                "accepting, never answering" if self.mode == "accepting" else "bound only"
            head = f"port {self.port} held by pid {seen['pid']} ({how})"
        elif not seen["reported"]:
            head = f"the port holder (pid {seen['pid']}) never said it held port {self.port}"
        else:
            head = f"port {self.port} no longer held by pid {seen['pid']}"
        grouped: Dict[str, List[str]] = {}
        for label, how in met.items():
            grouped.setdefault(how, []).append(label)
        parts = [f"rank{'s' * (len(labels) > 1)} {', '.join(labels)}: {how}"
                 for how, labels in grouped.items()] or ["no rank bound it or connected to it"]
        if self.mode == "listening":
            parts.append(f"{seen['waiting']} connection{'s' * (seen['waiting'] != 1)} waiting "
                         "in its backlog (the ranks' and the harness's own store probe's)")
        elif self.mode == "accepting":
            parts.append(f"{len(acc)} connection{'s' * (len(acc) != 1)} accepted"
                         + (f" ({len(mine)} of them the harness's own store probe)"
                            if mine else ""))
        labels = {}
        for rp in getattr(rt.plan, "ranks", []) or []:
            try:
                labels[rt.rank(rp.label).pid] = f"rank {rp.label}, pid"
            except KeyError:
                continue
        labels[os.getpid()] = "the harness's store probe, pid"

        def who(a: Dict[str, Any]) -> str:
            if not a.get("pid"):
                return "its process not found"
            return f"{labels[a['pid']]} {a['pid']}" if a["pid"] in labels else \
                str(a.get("who") or f"pid {a['pid']}")

        events = [{"t": a["t"], "what": f"accepted a connection from {a['peer']} ({who(a)})"}
                  for a in acc[:20]]
        events.append({"t": seen["t"], "what": f"holder read {when}: "
                                               f"{'held' if seen['held'] else 'not held'}, "
                                               f"{seen['waiting']} connections waiting"})
        return Effect(acted=seen["held"] and bool(met),
                      summary=f"{head}: {'; '.join(parts)}",
                      numbers={"ranks_met": len(met), "waiting": seen["waiting"],
                               "accepted": len(acc)},
                      events=events)

    def describe(self):
        return f"hold port {self.port} ({self.mode})"


def holder_log(path: Any, start_line: float) -> Dict[str, Any]:
    """The holder's stderr log: ``{"held": {...}, "accepted": [{"t", "peer"}]}``, times in
    seconds after the start line (``start_line`` on the monotonic clock)."""
    out: Dict[str, Any] = {"held": None, "accepted": []}
    try:
        text = Path(path).read_text(errors="replace") if path else ""
    except OSError:
        return out
    for ln in text.splitlines():
        try:
            rec = json.loads(ln)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        if rec.get("ev") == "held":
            out["held"] = rec
        elif rec.get("ev") == "accepted":
            out["accepted"].append({"t": round(float(rec.get("t") or 0.0) - start_line, 3),
                                    "peer": str(rec.get("peer", "?")), "pid": rec.get("pid"),
                                    "who": rec.get("who")})
    return out


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
        from ..core.jobstore import known_port

        port = known_port(plan, "busy_port")   # the job's store port, wherever the launch puts it
        step = HoldPort(port=port, mode=self.mode, host=plan.store().host or plan.ranks[0].host,
                        target="port holder")
        if self.release_after is not None:
            step.undo_trigger = Trigger.at_time(self.release_after)
        plan.add_step(self, step)
        rel = ("" if self.release_after is None
               else f", released {self.release_after:g} s after the start line")
        plan.notes.append(f"busy_port: port {port} held ({self.mode}){rel}")


def peer_pid(conn: Any) -> Optional[int]:
    """The process holding the other end of an accepted loopback or same-namespace connection:
    the kernel's TCP table of this namespace gives the peer socket's inode, and /proc the
    process with that inode open (None when it is gone or elsewhere)."""
    from ..net.sockets import _read, parse_proc_net_tcp, socket_inodes

    (lip, lport), (rip, rport) = conn.getsockname()[:2], conn.getpeername()[:2]
    local, remote = f"{lip}:{lport}", f"{rip}:{rport}"
    table = parse_proc_net_tcp(_read("/proc/self/net/tcp"))
    table.update(parse_proc_net_tcp(_read("/proc/self/net/tcp6")))
    ino = next((i for i, r in table.items()
                if i and r.local == remote and r.remote == local), None)
    if ino is None:
        return None
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid() and ino in socket_inodes(int(name)):
            return int(name)
    return None


def _describe(pid: int) -> str:
    from ..net.sockets import describe_pid

    return describe_pid(pid)[:100]


def main() -> None:
    import signal
    import socket
    import sys

    from ..machine.procs import die_with_parent

    port, mode = int(sys.argv[1]), sys.argv[2]
    die_with_parent()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("0.0.0.0", port))
    if mode != "bound":
        s.listen(128)

    def log(**rec: Any) -> None:
        sys.stderr.write(json.dumps({"t": time.monotonic(), **rec}) + "\n")
        sys.stderr.flush()

    addr = s.getsockname()
    log(ev="held", addr=addr[0], port=addr[1], mode=mode, ino=os.fstat(s.fileno()).st_ino)
    print("ready", flush=True)
    kept = []
    if mode == "accepting":
        while True:
            conn, peer = s.accept()
            kept.append(conn)      # keep it open, never answer
            pid = peer_pid(conn) if len(kept) <= 64 else None
            log(ev="accepted", peer=f"{peer[0]}:{peer[1]}", pid=pid,
                who=None if pid is None else _describe(pid))
    else:
        signal.pause()


if __name__ == "__main__":
    main()

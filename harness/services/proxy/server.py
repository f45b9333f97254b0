"""The fault proxy: a user-space TCP proxy whose faults ("toxics") are switched on and off while
a run goes on. A harness program, run as a service (harness.services) on one host of the run.

    python -m harness.services.proxy --control SOCK [--mark N] [--seed S] \\
        (--transparent IN_PORT OUT_PORT | --front LISTEN_ADDR LISTEN_PORT UP_ADDR UP_PORT)

Two ways to stand in front of traffic:

* ``--transparent``: behind nftables REDIRECT rules in the host's network namespace (the
  topology adds them: :meth:`harness.net.topology.Topology.redirect`). Connections redirected on
  their way IN to the host arrive at IN_PORT (the host is the server: a store, a gloo listener),
  connections the host opens on its way OUT arrive at OUT_PORT (the host is the client). Where
  each was going comes from ``SO_ORIGINAL_DST`` (conntrack's NAT record), and the proxy dials
  that; its own sockets carry the firewall mark ``--mark`` so that the OUT rule lets them pass.
* ``--front``: in front of one server without any rule (no root needed): it listens at
  LISTEN_ADDR:LISTEN_PORT and dials UP_ADDR:UP_PORT. The planner points the ranks that should
  go through it (every rank but rank 0, which hosts the store) at its port.

Toxics (Toxiproxy's model: a named thing with a direction, a probability and a few
parameters) are one module each in :mod:`harness.services.proxy.toxics` (``latency``,
``bandwidth``, ``slicer``, ``limit_data``, ``reset_peer``, ``blackhole``, ``slow_close``: each
module says what it does and its parameters); the proxy knows them only through that registry
(``TOXICS``) and their hooks. Each has:

* ``direction``, seen from the proxy's host: ``out`` = bytes the host sends (for a connection
  to the host: the server's replies; for one it opened: its requests), ``in`` = bytes it
  receives, ``both``;
* ``probability``: drawn once per connection and toxic (``--seed`` makes the draws repeat);
* ``ports``: ``{"only": [...]}`` or ``{"except": [...]}`` of the connection's original
  destination port, or every connection.

A toxic switched on applies to the connections already open and to new ones; switched off,
data flows as without it (data already delayed keeps its delivery time, held data flows again).
The connections are :mod:`.conn`'s.

Control: a UNIX socket, one JSON request line, one JSON answer line, ``ok`` true or false with
``error``: ``{"op": "ping"}``, ``{"op": "add", "id", "type", "direction", "probability",
"ports", "params"}``, ``{"op": "remove", "id"}``, ``{"op": "stats"}``. Every connection and
toxic change is one JSON line on stderr (the service's log in the run directory).

Only the standard library: asyncio, sockets, nothing to install.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import sys
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from .conn import Conn, original_dst, reset_socket
from .toxics import Toxic, ToxicError

LOG_MAX = 20000                # log lines at most (evidence stays bounded)


# --------------------------------------------------------------------------------------------
# the proxy


class Proxy:
    def __init__(self, *, mark: int = 0, seed: Optional[int] = None,
                 upstream: Optional[Tuple[str, int]] = None, log=sys.stderr):
        self.mark = mark
        self.rng = random.Random(seed)
        self.upstream = upstream
        self.toxics: Dict[str, Toxic] = {}
        self.conns: Dict[int, Conn] = {}
        self.opened = 0
        self.applied: Dict[str, int] = {}
        self._log = log
        self._lines = 0
        self._changed = asyncio.Event()
        self.listeners: List[socket.socket] = []
        self._tasks: Set[asyncio.Task[Any]] = set()
        self.t0 = time.monotonic()

    def log(self, ev: str, **data: Any) -> None:
        if self._lines >= LOG_MAX:
            return
        self._lines += 1
        if self._lines == LOG_MAX:
            ev, data = "log_cut", {"after": LOG_MAX}
        self._log.write(json.dumps({"t": round(time.monotonic() - self.t0, 4), "ev": ev,
                                    **data}) + "\n")
        self._log.flush()

    def spawn(self, coro: Any) -> None:
        """A task kept referenced until it ends (the loop keeps only weak references)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- change notification ----------------------------------------------------------------
    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, timeout: Optional[float] = None) -> None:
        ev = self._changed
        try:
            await asyncio.wait_for(ev.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    async def wait_until(self, cond) -> None:
        while not cond():
            await self.changed()

    # -- listening ------------------------------------------------------------------------
    def listen(self, addr: str, port: int, kind: str) -> List[socket.socket]:
        """Listen on ``addr`` (an address; "*" = 0.0.0.0 and [::]) for connections of ``kind``."""
        made: List[socket.socket] = []
        targets = [("0.0.0.0", socket.AF_INET), ("::", socket.AF_INET6)] if addr == "*" else \
            [(addr, socket.AF_INET6 if ":" in addr else socket.AF_INET)]
        for host, family in targets:
            s = socket.socket(family, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind((host, port))
            except OSError as e:
                s.close()
                if addr == "*" and family == socket.AF_INET6 and len(made) == 1:
                    continue    # no IPv6 in this namespace: IPv4 only
                raise OSError(f"cannot listen on [{host}]:{port}: {e.strerror or e}") from None
            s.listen(512)
            s.setblocking(False)
            made.append(s)
            self.spawn(self.accept_loop(s, kind))
            self.log("listen", addr=host, port=port, kind=kind)
        self.listeners += made
        return made

    async def accept_loop(self, listener: socket.socket, kind: str) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                client, peer = await loop.sock_accept(listener)
            except OSError as e:
                self.log("accept_error", error=str(e))
                await asyncio.sleep(0.05)
                continue
            client.setblocking(False)
            try:
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                dst = self.upstream or original_dst(client)
            except OSError as e:
                self.log("no_destination", peer=list(peer[:2]), error=str(e))
                reset_socket(client)
                continue
            self.opened += 1
            conn = Conn(self, self.opened, kind, client, (str(peer[0]), int(peer[1])),
                        (str(dst[0]), int(dst[1])))
            self.conns[conn.id] = conn
            self.spawn(conn.run())

    # -- control --------------------------------------------------------------------------
    def handle(self, req: Any) -> Dict[str, Any]:
        if not isinstance(req, dict):
            return {"ok": False, "error": "a request is a JSON object"}
        op = req.get("op")
        if op == "ping":
            return {"ok": True, "pid": os.getpid()}
        if op == "add":
            try:
                t = Toxic.parse(req)
            except ToxicError as e:
                return {"ok": False, "error": str(e)}
            if t.id in self.toxics:
                return {"ok": False, "error": f"toxic {t.id!r} is already on"}
            self.toxics[t.id] = t
            self.log("toxic_on", toxic=t.id, type=t.type, direction=t.direction,
                     probability=t.probability, ports=t.ports, params=t.params)
            self.notify()
            return {"ok": True, "open": len(self.conns)}
        if op == "remove":
            tid = req.get("id")
            if tid not in self.toxics:
                return {"ok": False, "error": f"no toxic {tid!r} is on"}
            del self.toxics[tid]
            for c in self.conns.values():
                c.draws.pop(tid, None)
            self.log("toxic_off", toxic=tid)
            self.notify()
            return {"ok": True}
        if op == "stats":
            return {"ok": True, "opened": self.opened, "open": len(self.conns),
                    "toxics": sorted(self.toxics), "applied": dict(self.applied)}
        return {"ok": False, "error": f"unknown op {op!r} (ping, add, remove, stats)"}

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                try:
                    req = json.loads(line)
                except ValueError:
                    answer = {"ok": False, "error": "not a JSON line"}
                else:
                    answer = self.handle(req)
                writer.write(json.dumps(answer).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()


async def serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    upstream = (args.front[2], int(args.front[3])) if args.front else None
    proxy = Proxy(mark=args.mark, seed=args.seed, upstream=upstream)
    if args.transparent:
        proxy.listen("*", int(args.transparent[0]), "in")
        proxy.listen("*", int(args.transparent[1]), "out")
    else:
        proxy.listen(args.front[0], int(args.front[1]), "in")
    try:
        os.unlink(args.control)
    except FileNotFoundError:
        pass
    server = await asyncio.start_unix_server(proxy.control, path=args.control)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # t0: the proxy's clock (every line's t counts from it) on the machine's monotonic clock,
    # so that a reader places its lines on the run's timeline
    proxy.log("ready", pid=os.getpid(), t0=round(proxy.t0, 4))
    await stop.wait()
    proxy.log("stop", opened=proxy.opened, open=len(proxy.conns))
    server.close()
    try:
        os.unlink(args.control)
    except OSError:
        pass
    for c in list(proxy.conns.values()):
        c.finish("proxy stopped", reset=False)


def main(argv: Optional[List[str]] = None) -> int:
    from ...machine.procs import die_with_parent

    ap = argparse.ArgumentParser(prog="python -m harness.services.proxy",
                                 description="the harness's fault proxy (see the module doc)")
    ap.add_argument("--control", required=True, help="the control socket's path")
    ap.add_argument("--mark", type=lambda v: int(v, 0), default=0,
                    help="firewall mark of the proxy's own connections (transparent mode)")
    ap.add_argument("--seed", type=int, default=None, help="seed of the per-connection draws")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--transparent", nargs=2, metavar=("IN_PORT", "OUT_PORT"))
    mode.add_argument("--front", nargs=4, metavar=("LISTEN_ADDR", "LISTEN_PORT", "UP_ADDR",
                                                   "UP_PORT"))
    args = ap.parse_args(argv)
    die_with_parent()
    try:
        asyncio.run(serve(args))
    except OSError as e:
        print(f"harness proxy: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

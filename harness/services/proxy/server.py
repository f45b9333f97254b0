"""The fault proxy: a user-space TCP proxy whose faults ("toxics") are switched on and off while
a run goes on. A harness program, run as a service (harness.services) on one host of the run.

    python -m harness.services.proxy --control SOCK [--mark N] [--seed S] \\
        (--transparent IN_PORT OUT_PORT | --front LISTEN_ADDR LISTEN_PORT UP_ADDR UP_PORT)

Two ways to stand in front of traffic:

* ``--transparent``: behind nftables REDIRECT rules in the host's network namespace (the
  topology adds them: :meth:`harness.topology.Topology.redirect`). Connections redirected on
  their way IN to the host arrive at IN_PORT (the host is the server: a store, a gloo listener),
  connections the host opens on its way OUT arrive at OUT_PORT (the host is the client). Where
  each was going comes from ``SO_ORIGINAL_DST`` (conntrack's NAT record), and the proxy dials
  that; its own sockets carry the firewall mark ``--mark`` so that the OUT rule lets them pass.
* ``--front``: in front of one server without any rule (no root needed): it listens at
  LISTEN_ADDR:LISTEN_PORT and dials UP_ADDR:UP_PORT. The planner points the ranks that should
  go through it (every rank but rank 0, which hosts the store) at its port.

Toxics (Toxiproxy's model: a named thing with a direction, a probability and a few
parameters): ``latency`` (delay_ms, jitter_ms), ``bandwidth`` (bytes_per_s), ``slicer``
(size, variation, delay_ms), ``limit_data`` (bytes), ``reset_peer`` (after_bytes, after_s),
``blackhole``, ``slow_close`` (delay_ms). ``limit_data``'s close is a clean end of stream
on both sides (FIN; what a side sends afterwards is read and dropped until it closes), never a
reset: a reset is ``reset_peer``'s. Each has:

* ``direction``, seen from the proxy's host: ``out`` = bytes the host sends (for a connection
  to the host: the server's replies; for one it opened: its requests), ``in`` = bytes it
  receives, ``both``;
* ``probability``: drawn once per connection and toxic (``--seed`` makes the draws repeat);
* ``ports``: ``{"only": [...]}`` or ``{"except": [...]}`` of the connection's original
  destination port, or every connection.

A toxic switched on applies to the connections already open and to new ones; switched off,
data flows as without it (data already delayed keeps its delivery time). ``blackhole`` holds:
nothing is read in its direction (TCP's own flow control then stops the sender), and a new
connection whose client-to-server stream it holds is accepted and never dialed on; when it is
switched off, the held data flows again (TCP cannot lose bytes in the middle of a stream).

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
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

SO_ORIGINAL_DST = 80           # netfilter's, for IPv4 (SOL_IP) and IPv6 (SOL_IPV6)
CHUNK = 65536
LOG_MAX = 20000                # log lines at most (evidence stays bounded)
TYPES = ("latency", "bandwidth", "slicer", "limit_data", "reset_peer", "blackhole",
         "slow_close")
DIRECTIONS = ("in", "out", "both")
UP, DOWN = "up", "down"        # client -> server, server -> client


class ToxicError(ValueError):
    """A request names an unknown toxic, direction or parameter."""


# --------------------------------------------------------------------------------------------
# toxics


def _num(params: Dict[str, Any], name: str, default: Optional[float] = None, *,
         low: float = 0.0, high: float = 1e12) -> float:
    v = params.get(name, default)
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ToxicError(f"{name} must be a number, got {v!r}")
    if not low <= v <= high:
        raise ToxicError(f"{name} must be within {low:g}..{high:g}, got {v!r}")
    return float(v)


REQUIRED = {"latency": ("delay_ms",), "bandwidth": ("bytes_per_s",), "slicer": ("size",),
            "limit_data": ("bytes",), "reset_peer": (), "blackhole": (),
            "slow_close": ("delay_ms",)}
OPTIONAL = {"latency": ("jitter_ms",), "slicer": ("variation", "delay_ms"),
            "reset_peer": ("after_bytes", "after_s")}


@dataclass
class Toxic:
    id: str
    type: str
    direction: str = "both"
    probability: float = 1.0
    ports: Optional[Dict[str, List[int]]] = None
    params: Dict[str, Any] = field(default_factory=dict)
    since: float = 0.0             # monotonic time it was switched on

    @classmethod
    def parse(cls, req: Dict[str, Any]) -> Toxic:
        tid, typ = req.get("id"), req.get("type")
        if not isinstance(tid, str) or not tid:
            raise ToxicError("a toxic needs an id (a non-empty string)")
        if typ not in TYPES:
            raise ToxicError(f"unknown toxic type {typ!r} (known: {', '.join(TYPES)})")
        direction = req.get("direction", "both")
        if direction not in DIRECTIONS:
            raise ToxicError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        prob = _num(req, "probability", 1.0, low=0.0, high=1.0)
        ports = req.get("ports")
        if ports is not None:
            if not isinstance(ports, dict) or len(ports) != 1 or \
                    next(iter(ports)) not in ("only", "except") or \
                    not all(isinstance(p, int) and 0 < p < 65536 for p in next(iter(
                        ports.values()))):
                raise ToxicError(f"ports must be {{'only': [...]}} or {{'except': [...]}}, got "
                                 f"{ports!r}")
        params = req.get("params") or {}
        if not isinstance(params, dict):
            raise ToxicError("params must be an object")
        unknown = set(params) - set(REQUIRED[typ]) - set(OPTIONAL.get(typ, ()))
        if unknown:
            raise ToxicError(f"{typ} takes no {', '.join(sorted(unknown))}")
        for name in REQUIRED[typ]:
            _num(params, name, low=0.0 if typ != "bandwidth" else 1.0)
        for name in OPTIONAL.get(typ, ()):
            if params.get(name) is not None:
                _num(params, name)
        if typ == "slicer" and params["size"] < 1:
            raise ToxicError("slicer size must be at least 1 byte")
        return cls(tid, typ, direction, prob, ports, dict(params), time.monotonic())

    def port_matches(self, port: int) -> bool:
        if self.ports is None:
            return True
        if "only" in self.ports:
            return port in self.ports["only"]
        return port not in self.ports["except"]

    def p(self, name: str, default: float = 0.0) -> float:
        v = self.params.get(name)
        return default if v is None else float(v)


# --------------------------------------------------------------------------------------------
# connections


def original_dst(sock: socket.socket) -> Tuple[str, int]:
    """Where a REDIRECTed connection was going (netfilter's NAT record)."""
    if sock.family == socket.AF_INET:
        raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
        return socket.inet_ntop(socket.AF_INET, raw[4:8]), struct.unpack("!H", raw[2:4])[0]
    raw = sock.getsockopt(socket.IPPROTO_IPV6, SO_ORIGINAL_DST, 28)
    return socket.inet_ntop(socket.AF_INET6, raw[8:24]), struct.unpack("!H", raw[2:4])[0]


def _reset(sock: Optional[socket.socket]) -> None:
    """Close with a TCP reset (SO_LINGER 0)."""
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def _close(sock: Optional[socket.socket]) -> None:
    if sock is not None:
        try:
            sock.close()
        except OSError:
            pass


DRAIN_S = 30.0


async def _close_after_drain(sock: socket.socket) -> None:
    """Close ``sock`` after its peer has closed its side (or DRAIN_S), discarding what it sends.

    The write side is already shut (a FIN went out). A socket closed with unread bytes in its
    receive buffer sends a reset instead of that clean end, and whether bytes were waiting
    depends on when the peer wrote its next request: a race of the harness's own making. So
    whatever the peer sends after the cut is read and dropped until it closes."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(0)     # the pumps' cancelled reads let go of the socket first
    await asyncio.sleep(0)
    end = time.monotonic() + DRAIN_S
    try:
        while (left := end - time.monotonic()) > 0:
            if not await asyncio.wait_for(loop.sock_recv(sock, CHUNK), left):
                break
    except (OSError, asyncio.TimeoutError):
        pass
    finally:
        _close(sock)


class Conn:
    """One proxied connection: client <-> proxy <-> server."""

    def __init__(self, proxy: Proxy, cid: int, kind: str, client: socket.socket,
                 peer: Tuple[str, int], dst: Tuple[str, int]):
        self.proxy, self.id, self.kind = proxy, cid, kind     # kind: "in" | "out"
        self.client: Optional[socket.socket] = client
        self.server: Optional[socket.socket] = None
        self.peer, self.dst = peer, dst
        self.start = time.monotonic()
        self.draws: Dict[str, bool] = {}
        self.sent = {UP: 0, DOWN: 0}
        self.tasks: Set[asyncio.Task[Any]] = set()
        self.done = False
        self.why = ""

    def stream_dir(self, stream: str) -> str:
        """The host-relative direction (in/out) of a stream of this connection."""
        if self.kind == "in":      # the host is the server: what it receives goes up
            return "in" if stream == UP else "out"
        return "out" if stream == UP else "in"

    def applies(self, t: Toxic, stream: Optional[str] = None) -> bool:
        if not t.port_matches(self.dst[1]):
            return False
        if stream is not None and t.direction != "both" and t.direction != self.stream_dir(stream):
            return False
        if t.id not in self.draws:
            self.draws[t.id] = t.probability >= 1.0 or self.proxy.rng.random() < t.probability
            if self.draws[t.id]:
                self.proxy.applied[t.id] = self.proxy.applied.get(t.id, 0) + 1
                self.proxy.log("toxic_applies", conn=self.id, toxic=t.id)
        return self.draws[t.id]

    def active(self, typ: str, stream: Optional[str] = None) -> List[Toxic]:
        return [t for t in self.proxy.toxics.values()
                if t.type == typ and self.applies(t, stream)]

    # -- life -----------------------------------------------------------------------------
    async def run(self) -> None:
        self.proxy.log("open", conn=self.id, kind=self.kind, peer=list(self.peer),
                       dst=list(self.dst))
        try:
            await self.proxy.wait_until(lambda: self.done or not self.active("blackhole", UP))
            if self.done:
                return
            await self.dial()
            if self.done:
                return
            ups = asyncio.ensure_future(self.pump(UP))
            downs = asyncio.ensure_future(self.pump(DOWN))
            watch = asyncio.ensure_future(self.watch_resets())
            self.tasks.update((ups, downs, watch))
            await asyncio.wait([ups, downs], return_when=asyncio.FIRST_EXCEPTION)
            failed = next((t.exception() for t in (ups, downs)
                           if t.done() and not t.cancelled() and t.exception()), None)
            if failed is not None:   # a side reset the connection: so does the proxy
                self.finish(f"{type(failed).__name__}: {failed}", reset=True)
            watch.cancel()
            if not self.done:
                self.finish("closed", reset=False)
        except asyncio.CancelledError:
            self.finish("cancelled", reset=True)
            raise
        except Exception as e:  # noqa: BLE001 - one connection never stops the proxy
            self.finish(f"error: {type(e).__name__}: {e}", reset=True)

    async def dial(self) -> None:
        loop = asyncio.get_running_loop()
        host, port = self.proxy.upstream or self.dst
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            if self.proxy.mark:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, self.proxy.mark)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, (host, port))
        except OSError as e:
            sock.close()
            self.finish(f"dial {host}:{port} failed: {e.strerror or e}", reset=True)
            return
        self.server = sock

    async def pump(self, stream: str) -> None:
        """Copy one stream, through the toxics that apply to it."""
        loop = asyncio.get_running_loop()
        src, dst = (self.client, self.server) if stream == UP else (self.server, self.client)
        assert src is not None and dst is not None
        queue: asyncio.Queue[Tuple[float, Optional[bytes]]] = asyncio.Queue()

        async def reader() -> None:
            last = 0.0
            while not self.done:
                await self.proxy.wait_until(
                    lambda: self.done or not self.active("blackhole", stream))
                if self.done:
                    return
                try:
                    data = await loop.sock_recv(src, CHUNK)
                except OSError as e:   # reset by that side: so is the other one
                    self.finish(f"{'client' if stream == UP else 'server'} side: "
                                f"{e.strerror or e}", reset=True)
                    return
                if data and self.active("blackhole", stream):   # came in while it was on
                    await self.proxy.wait_until(
                        lambda: self.done or not self.active("blackhole", stream))
                    if self.done:
                        return
                now = time.monotonic()
                delay = 0.0
                for t in self.active("latency", stream):
                    jitter = t.p("jitter_ms")
                    delay += max(0.0, t.p("delay_ms") + (self.proxy.rng.uniform(-jitter, jitter)
                                                         if jitter else 0.0)) / 1000.0
                last = max(last, now + delay)        # order is kept, whatever the jitter
                await queue.put((last, data or None))
                if not data:
                    return

        rtask = asyncio.ensure_future(reader())
        self.tasks.add(rtask)
        try:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if data is None:
                    for t in self.active("slow_close", stream):
                        await asyncio.sleep(t.p("delay_ms") / 1000.0)
                    try:
                        dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    return
                await self.send(stream, dst, data)
                if self.done:
                    return
        finally:
            rtask.cancel()

    async def send(self, stream: str, dst: socket.socket, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        while data and not self.done:
            piece, pause = data, 0.0
            for t in self.active("slicer", stream):
                size = max(1, int(t.p("size") + self.proxy.rng.uniform(
                    -t.p("variation"), t.p("variation"))))
                piece, pause = data[:size], max(pause, t.p("delay_ms") / 1000.0)
            for t in self.active("limit_data", stream):
                room = int(t.p("bytes")) - self.sent[stream]
                if room <= 0:
                    self.finish(f"limit_data {t.id}: {self.sent[stream]} bytes", reset=False,
                                drain=True)
                    return
                piece = piece[:room]
            for t in self.active("reset_peer", stream):
                if t.params.get("after_bytes") is not None:
                    room = int(t.p("after_bytes")) - self.sent[stream]
                    if room <= 0:
                        self.finish(f"reset_peer {t.id}: after {self.sent[stream]} bytes",
                                    reset=True)
                        return
                    piece = piece[:room]
            rates = [t.p("bytes_per_s") for t in self.active("bandwidth", stream)]
            if rates:   # at most a twentieth of a second's worth at a time, then its time
                piece = piece[:max(1, int(min(rates) / 20))]
                pause = max(pause, len(piece) / min(rates))
            await loop.sock_sendall(dst, piece)
            self.sent[stream] += len(piece)
            data = data[len(piece):]
            if pause:
                await asyncio.sleep(pause)

    async def watch_resets(self) -> None:
        """reset_peer by time: after_s seconds after the toxic met this connection."""
        while not self.done:
            due = None
            for t in self.active("reset_peer"):
                if t.params.get("after_bytes") is None or t.params.get("after_s") is not None:
                    at = max(self.start, t.since) + t.p("after_s")
                    due = at if due is None else min(due, at)
            if due is not None and time.monotonic() >= due:
                self.finish("reset_peer: after time", reset=True)
                return
            timeout = None if due is None else max(0.0, due - time.monotonic())
            await self.proxy.changed(timeout)

    def finish(self, why: str, reset: bool, drain: bool = False) -> None:
        """End the connection on both sides: with a reset, a close, or (``drain``) a clean
        end of stream that the proxy keeps clean: each side's FIN first, what it still sends
        read and dropped, the close when it has closed too."""
        if self.done:
            return
        self.done, self.why = True, why
        for s in (self.client, self.server):
            if s is not None and drain and not reset:
                try:
                    s.shutdown(socket.SHUT_WR)
                except OSError:
                    _close(s)
                else:
                    self.proxy.spawn(_close_after_drain(s))
            else:
                (_reset if reset else _close)(s)
        for t in self.tasks:
            if t is not asyncio.current_task():
                t.cancel()
        self.proxy.log("close", conn=self.id, why=why, reset=reset, up=self.sent[UP],
                       down=self.sent[DOWN], seconds=round(time.monotonic() - self.start, 3))
        self.proxy.conns.pop(self.id, None)
        self.proxy.notify()


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
                _reset(client)
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

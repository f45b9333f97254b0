"""One proxied connection (client <-> proxy <-> server) and how it ends: the two streams copied
through the toxics that apply to them (:mod:`.toxics`: a connection asks each toxic's hooks,
never a toxic's name)."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, Tuple

from .toxics import Toxic

if TYPE_CHECKING:
    from .server import Proxy

SO_ORIGINAL_DST = 80           # netfilter's, for IPv4 (SOL_IP) and IPv6 (SOL_IPV6)
CHUNK = 65536
UP, DOWN = "up", "down"        # client -> server, server -> client



def original_dst(sock: socket.socket) -> Tuple[str, int]:
    """Where a REDIRECTed connection was going (netfilter's NAT record)."""
    if sock.family == socket.AF_INET:
        raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
        return socket.inet_ntop(socket.AF_INET, raw[4:8]), struct.unpack("!H", raw[2:4])[0]
    raw = sock.getsockopt(socket.IPPROTO_IPV6, SO_ORIGINAL_DST, 28)
    return socket.inet_ntop(socket.AF_INET6, raw[8:24]), struct.unpack("!H", raw[2:4])[0]


def reset_socket(sock: Optional[socket.socket]) -> None:
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

    def active(self, hook: str, stream: Optional[str] = None) -> List[Toxic]:
        """The toxics that do something at ``hook`` (their kind overrides it; ``holds``: the
        kinds that hold a stream) and apply to this connection (and ``stream``); ``shape``'s in
        their kinds' STAGE order."""
        found = [t for t in self.proxy.toxics.values()
                 if type(t).overrides(hook) and self.applies(t, stream)]
        return sorted(found, key=lambda t: t.STAGE) if hook == "shape" else found

    # -- life -----------------------------------------------------------------------------
    async def run(self) -> None:
        self.proxy.log("open", conn=self.id, kind=self.kind, peer=list(self.peer),
                       dst=list(self.dst))
        try:
            await self.proxy.wait_until(lambda: self.done or not self.active("holds", UP))
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
                    lambda: self.done or not self.active("holds", stream))
                if self.done:
                    return
                try:
                    data = await loop.sock_recv(src, CHUNK)
                except OSError as e:   # reset by that side: so is the other one
                    self.finish(f"{'client' if stream == UP else 'server'} side: "
                                f"{e.strerror or e}", reset=True)
                    return
                if data and self.active("holds", stream):   # came in while it was on
                    await self.proxy.wait_until(
                        lambda: self.done or not self.active("holds", stream))
                    if self.done:
                        return
                now = time.monotonic()
                delay = 0.0
                for t in self.active("read_delay", stream):
                    delay += t.read_delay(self)
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
                    for t in self.active("close_delay", stream):
                        await asyncio.sleep(t.close_delay(self))
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
            for t in self.active("shape", stream):
                piece, pause = t.shape(self, stream, piece, pause)
                if self.done:       # the toxic ended the connection
                    return
            await loop.sock_sendall(dst, piece)
            self.sent[stream] += len(piece)
            data = data[len(piece):]
            if pause:
                await asyncio.sleep(pause)

    async def watch_resets(self) -> None:
        """Resets by time (reset_peer's after_s): the earliest a toxic asks for."""
        while not self.done:
            due, by = None, ""
            for t in self.active("reset_at"):
                at = t.reset_at(self)
                if at is not None and (due is None or at < due):
                    due, by = at, t.type
            if due is not None and time.monotonic() >= due:
                self.finish(f"{by}: after time", reset=True)
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
                (reset_socket if reset else _close)(s)
        for t in self.tasks:
            if t is not asyncio.current_task():
                t.cancel()
        self.proxy.log("close", conn=self.id, why=why, reset=reset, up=self.sent[UP],
                       down=self.sent[DOWN], seconds=round(time.monotonic() - self.start, 3))
        self.proxy.conns.pop(self.id, None)
        self.proxy.notify()



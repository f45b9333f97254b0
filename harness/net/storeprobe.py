"""What a torch store holds: asked over TCPStore's own wire protocol, without importing torch.

At the deadline (before the kill) and when a rank first raises, the supervisor asks the run's
store, from inside the store host's network namespace, what it holds: every key (``LIST_KEYS``,
torch 2.6+; older stores answer only the count), how many clients joined (the ``init/`` counter
that ``TCPStore`` bumps for each client that waits for the workers, the "1/2 clients joined" of
its timeout), and the address each rank's gloo published for its full mesh
(``/default_pg/0//cpu//0/<rank>``: a packed ``sockaddr``). A rank whose gloo key is missing never
got that far; a rank that published ``127.0.0.1`` on namespace hosts advertised an address its
peers cannot reach.

Why not a torch client: importing torch costs a second of CPU, and the answer is needed
before the deadline's kill (the supervisor waits for it, a few seconds at most). The protocol
is small and stable (``TCPStoreBackend.hpp``: a ``QueryType`` byte, then length-prefixed
strings, host byte order; ``VALIDATE`` with the magic number first). Asking is read-only
(``LIST_KEYS``, ``GETNUMKEYS``, ``CHECK``, ``GET`` of keys that exist: a ``GET`` of a missing
key would block), bounded by a timeout per step (``TIMEOUT``), and a listener that is not a
torch store (a port squatter) shows as ``answered: false`` with why.

:func:`ask` talks over a connected socket; :func:`parse` turns raw keys into a
:class:`StoreSnapshot` (pure, unit-tested).
"""

from __future__ import annotations

import ipaddress
import re
import socket
import struct
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

MAGIC = 0x3C85F7CE
VALIDATE, GET, CHECK, GETNUMKEYS, LIST_KEYS = 0, 3, 5, 7, 17
READY = 0
# seconds each step of the conversation may take: a store answers in milliseconds, but at a
# deadline on a loaded machine (two catalogs at -n 4 on 2 cores, py-spy on every live rank) a
# half second went unanswered (hang_defaults raised_in_init_of_three, 1 of 8 catalog runs on
# 2026-12-07: "no answer within 0.5 s", and the hung rank's cause fell to unknown); the
# supervisor waits for the answer before the kill (harness.run.probes.settle_store)
TIMEOUT = 3.0
MAX_KEYS = 256            # kept in the snapshot (a big world has several keys per rank)
MAX_VALUE = 64            # bytes of a value kept (a text value: its first 64 characters)
INIT_KEY = "init/"
GLOO_KEY = re.compile(r"^/(?P<pg>.*/)(?P<rank>\d+)$")   # "/default_pg/0//cpu//0/" + rank


class StoreProtocolError(Exception):
    """The listener did not answer as a torch store does."""


@dataclass
class StoreSnapshot:
    """What the store at ``addr`` held at ``t`` (seconds after the start line)."""

    addr: str                               # "ip:port" asked
    host: str = ""                          # the scenario host it was asked from
    t: Optional[float] = None
    answered: bool = False                  # it spoke the store's protocol
    error: str = ""                         # why not (refused, timed out, not a store...)
    num_keys: Optional[int] = None
    joined: Optional[int] = None            # clients that joined (init/ counter)
    keys: Dict[str, str] = field(default_factory=dict)   # key -> value, shortened
    gloo: Dict[str, str] = field(default_factory=dict)   # rank -> "ip:port" its gloo published
    listed: bool = True                     # LIST_KEYS worked (torch 2.6+)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StoreSnapshot:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})

    def gloo_ranks(self) -> List[int]:
        return sorted(int(r) for r in self.gloo)

    def lines(self) -> List[str]:
        """Readable evidence lines."""
        at = f" at {self.t:g} s" if self.t is not None else ""
        if not self.answered:
            return [f"store {self.addr}{at}: no answer ({self.error or 'unknown'})"]
        out = [f"store {self.addr}{at}: {self.num_keys} keys"
               + (f", {self.joined} clients joined" if self.joined is not None else "")]
        if self.gloo:
            out.append("gloo addresses published: " + ", ".join(
                f"rank {r} {a}" for r, a in sorted(self.gloo.items(), key=lambda x: int(x[0]))))
        elif self.listed:
            out.append("gloo addresses published: none")
        return out


def decode_sockaddr(value: bytes) -> str:
    """The address gloo packed into a rank's key ("ip:port"), "" when none is found.

    gloo's tcp ``Address`` is a ``sockaddr_storage`` with a sequence number; newer gloo put a
    header of its own before it (torch 2.13: 18 bytes). The first AF_INET (2) or AF_INET6 (10)
    ``sockaddr`` with a port, an address that is not the wildcard and zeros where the kernel's
    ``sockaddr`` has them (``sin_zero``, ``sin6_flowinfo``) is the one."""
    for off in range(0, max(0, len(value) - 7)):
        fam = struct.unpack_from("<H", value, off)[0]
        if fam == socket.AF_INET and off + 8 <= len(value):
            port = struct.unpack_from("!H", value, off + 2)[0]
            ip = str(ipaddress.IPv4Address(value[off + 4:off + 8]))
            if port and value[off + 4] != 0 and not any(value[off + 8:off + 16]):
                return f"{ip}:{port}"
        if fam == socket.AF_INET6 and off + 24 <= len(value):
            port = struct.unpack_from("!H", value, off + 2)[0]
            ip6 = str(ipaddress.IPv6Address(value[off + 8:off + 24]))
            if port and ip6 != "::" and not any(value[off + 4:off + 8]):
                return f"[{ip6}]:{port}"
    return ""


def _show(value: bytes) -> str:
    try:
        text = value.decode("ascii")
        if text.isprintable():
            return text[:MAX_VALUE]
    except UnicodeDecodeError:
        pass
    return f"<{len(value)} bytes>"


def parse(addr: str, raw: Mapping[bytes, Optional[bytes]], num_keys: Optional[int] = None,
          listed: bool = True) -> StoreSnapshot:
    """A snapshot from the keys read (``None``: a key that exists, value not read)."""
    snap = StoreSnapshot(addr=addr, answered=True, listed=listed,
                         num_keys=num_keys if num_keys is not None else len(raw))
    for k, v in sorted(raw.items())[:MAX_KEYS]:
        key = k.decode("utf-8", "replace")
        snap.keys[key] = "" if v is None else _show(v)
        if key == INIT_KEY and v is not None and v.strip().isdigit():
            snap.joined = int(v.strip())
        m = GLOO_KEY.match(key)
        if m is not None and v is not None and "//" in m.group("pg"):
            where = decode_sockaddr(v)
            if where:
                snap.gloo[m.group("rank")] = where
    return snap


class _Conn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise StoreProtocolError("the listener closed the connection")
            buf += chunk
        return buf

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.recv(8))[0])

    def i64(self) -> int:
        return int(struct.unpack("<q", self.recv(8))[0])

    @staticmethod
    def string(s: bytes) -> bytes:
        return struct.pack("<Q", len(s)) + s


def ask(sock: socket.socket, addr: str, timeout: float = TIMEOUT) -> StoreSnapshot:
    """Ask a connected socket's store what it holds (never raises: a failure is the answer)."""
    sock.settimeout(timeout)
    c = _Conn(sock)
    try:
        c.send(struct.pack("<BI", VALIDATE, MAGIC))
        c.send(struct.pack("<B", GETNUMKEYS))
        count = c.i64()
        if count < 0 or count > 1 << 24:
            raise StoreProtocolError(f"an impossible key count {count}")
        listed = True
        names: List[bytes] = []
        try:
            c.send(struct.pack("<B", LIST_KEYS))
            n = c.i64()
            if n < 0 or n > 1 << 24:
                raise StoreProtocolError(f"an impossible key count {n}")
            for _ in range(n):
                size = c.u64()
                if size > 1 << 16:
                    raise StoreProtocolError(f"an impossible key length {size}")
                names.append(c.recv(size))
        except (StoreProtocolError, OSError):
            listed = False   # an older torch: the count is all it says
        raw: Dict[bytes, Optional[bytes]] = {}
        if listed:
            wanted = [k for k in names if k == INIT_KEY.encode() or GLOO_KEY.match(
                k.decode("utf-8", "replace"))][:MAX_KEYS]
            for k in names[:MAX_KEYS]:
                raw[k] = None
            for k in wanted:
                c.send(struct.pack("<B", GET) + c.string(k))
                size = c.u64()
                if size > 1 << 20:
                    raise StoreProtocolError(f"an impossible value length {size}")
                raw[k] = c.recv(size)
        return parse(addr, raw, num_keys=count, listed=listed)
    except socket.timeout:
        return StoreSnapshot(addr=addr, error=f"no answer within {timeout:g} s: the listener "
                             "is not a torch store, or it is stuck")
    except (StoreProtocolError, OSError, struct.error) as e:
        return StoreSnapshot(addr=addr, error=str(e) or type(e).__name__)


def split_addr(addr: str) -> Tuple[str, int]:
    """("ip", port) of "ip:port" or "[v6]:port"."""
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def connect_and_ask(sock: socket.socket, addr: str, timeout: float = TIMEOUT) -> StoreSnapshot:
    """Connect ``sock`` (made in the right namespace, of the right family) to ``addr`` and ask."""
    ip, port = split_addr(addr)
    sock.settimeout(timeout)
    try:
        sock.connect((ip, port))
    except socket.timeout:
        return StoreSnapshot(addr=addr, error=f"connect timed out after {timeout:g} s")
    except OSError as e:
        return StoreSnapshot(addr=addr, error=f"connect failed: {e.strerror or e}")
    try:
        return ask(sock, addr, timeout)
    finally:
        sock.close()

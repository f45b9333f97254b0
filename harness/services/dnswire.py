"""The DNS wire format, the little the harness needs (standard library only): build a query,
parse an answer (rcode, A/AAAA/PTR records), answer a query with an rcode. Used by the name
server's readiness check and tests (a real query, no ``dig`` needed) and by the harness's
own responder (harness.services.dns_responder)."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

TYPES = {"A": 1, "PTR": 12, "AAAA": 28}
NAMES = {v: k for k, v in TYPES.items()}
RCODES = {0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}


class DnsError(RuntimeError):
    """No answer, or an answer that is not DNS."""


@dataclass
class Answer:
    rcode: str
    records: List[Tuple[str, str]] = field(default_factory=list)   # (type, value) in order

    def values(self, rtype: str) -> List[str]:
        return [v for t, v in self.records if t == rtype]


def encode_name(name: str) -> bytes:
    out = b""
    for label in name.rstrip(".").split("."):
        raw = label.encode("ascii")
        if not 0 < len(raw) < 64:
            raise ValueError(f"bad DNS label in {name!r}")
        out += bytes([len(raw)]) + raw
    return out + b"\0"


def reverse_name(addr: str) -> str:
    return ipaddress.ip_address(addr).reverse_pointer


def build_query(name: str, rtype: str = "A", qid: Optional[int] = None) -> bytes:
    qid = int.from_bytes(os.urandom(2), "big") if qid is None else qid
    header = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0)   # RD
    return header + encode_name(name) + struct.pack("!HH", TYPES[rtype], 1)


def _read_name(msg: bytes, off: int) -> Tuple[str, int]:
    labels: List[str] = []
    end = -1
    for _ in range(128):
        n = msg[off]
        if n & 0xC0 == 0xC0:
            if end < 0:
                end = off + 2
            off = ((n & 0x3F) << 8) | msg[off + 1]
            continue
        if n == 0:
            return ".".join(labels), (end if end >= 0 else off + 1)
        labels.append(msg[off + 1:off + 1 + n].decode("ascii", "replace"))
        off += 1 + n
    raise DnsError("a name with too many labels or a pointer loop")


def question(msg: bytes) -> Tuple[int, str, int]:
    """(id, name, type) of a query."""
    if len(msg) < 12:
        raise DnsError("shorter than a DNS header")
    qid, _flags, qd = struct.unpack("!HHH", msg[:6])
    if qd < 1:
        raise DnsError("no question")
    name, off = _read_name(msg, 12)
    (qtype,) = struct.unpack("!H", msg[off:off + 2])
    return qid, name, qtype


def client_subnet(msg: bytes) -> Optional[str]:
    """The address of an EDNS Client Subnet option (RFC 7871) in a query, as dnsmasq's
    ``add-subnet`` puts the asking client's address there; None without one."""
    try:
        _qid, _flags, qd, an, ns, ar = struct.unpack("!HHHHHH", msg[:12])
        off = 12
        for _ in range(qd):
            _, off = _read_name(msg, off)
            off += 4
        for i in range(an + ns + ar):
            _, off = _read_name(msg, off)
            rtype, _cls, _ttl, length = struct.unpack("!HHIH", msg[off:off + 10])
            off += 10
            data, off = msg[off:off + length], off + length
            if rtype != 41 or i < an + ns:      # OPT, in the additional section
                continue
            at = 0
            while at + 4 <= len(data):
                code, olen = struct.unpack("!HH", data[at:at + 4])
                opt = data[at + 4:at + 4 + olen]
                at += 4 + olen
                if code != 8 or len(opt) < 4:   # ECS: family, source prefix, scope, address
                    continue
                family, prefix = struct.unpack("!HB", opt[:3])
                size = 4 if family == 1 else 16 if family == 2 else 0
                if not size or prefix > size * 8:
                    return None
                raw = opt[4:].ljust(size, b"\0")[:size]
                return str(ipaddress.ip_address(raw))
    except (struct.error, IndexError, ValueError, DnsError):
        return None
    return None


def parse_answer(msg: bytes) -> Answer:
    try:
        _qid, flags, qd, an = struct.unpack("!HHHH", msg[:8])
        off = 12
        for _ in range(qd):
            _, off = _read_name(msg, off)
            off += 4
        records = []
        for _ in range(an):
            _, off = _read_name(msg, off)
            rtype, _cls, _ttl, length = struct.unpack("!HHIH", msg[off:off + 10])
            off += 10
            data = msg[off:off + length]
            if rtype == 1:
                records.append(("A", socket.inet_ntop(socket.AF_INET, data)))
            elif rtype == 28:
                records.append(("AAAA", socket.inet_ntop(socket.AF_INET6, data)))
            elif rtype == 12:
                records.append(("PTR", _read_name(msg, off)[0]))
            off += length
    except (struct.error, IndexError, ValueError) as e:
        raise DnsError(f"not a DNS answer: {e}") from None
    return Answer(RCODES.get(flags & 0xF, str(flags & 0xF)), records)


def error_reply(query: bytes, rcode: int) -> bytes:
    """An answer to ``query`` with no records and ``rcode`` (2: SERVFAIL, 3: NXDOMAIN)."""
    qid, _flags = struct.unpack("!HH", query[:4])
    _, name_end = _read_name(query, 12)
    q = query[12:name_end + 4]
    return struct.pack("!HHHHHH", qid, 0x8180 | rcode, 1, 0, 0, 0) + q


def query(server: str, name: str, rtype: str = "A", port: int = 53, timeout: float = 1.0,
          sock: Optional[socket.socket] = None) -> Answer:
    """Ask ``server`` once over UDP; DnsError when nothing comes back within ``timeout``.
    ``sock``: a UDP socket to ask from (one made inside a network namespace)."""
    family = socket.AF_INET6 if ":" in server else socket.AF_INET
    own = sock is None
    s = socket.socket(family, socket.SOCK_DGRAM) if sock is None else sock
    try:
        s.settimeout(timeout)
        q = build_query(name, rtype)
        s.sendto(q, (server, port))
        while True:
            try:
                data, _ = s.recvfrom(4096)
            except socket.timeout:
                raise DnsError(f"no answer from {server}:{port} for {name} {rtype} within "
                               f"{timeout:g} s") from None
            if data[:2] == q[:2]:
                return parse_answer(data)
    finally:
        if own:
            s.close()

"""Sockets: the TCP sockets of the run's processes, read from /proc, and who holds each end.

``/proc/<pid>/net/tcp[6]`` lists the sockets of the network namespace ``pid`` lives in, so the
supervisor reads a namespace host's sockets without entering it; ``/proc/<pid>/fd`` names the
socket inodes a process holds. :func:`snapshot` reads both for a set of processes and matches
each connection's remote end to the process holding it (the accepted socket of a server, or a
listener whose backlog holds the connection not yet accepted). It never blocks: plain reads of
/proc, a few milliseconds for a run; a process that is gone has no sockets (evidence only).

The kernel does not say how long a socket has been in its state; it says the retransmissions
of an unanswered SYN (``retransmits``) and the byte counts waiting in each queue.

:func:`port_owners` (psutil) says who holds one port in the namespace it runs in: the
supervisor asks it before the start line, in a child inside the master host's namespace; this
module imports nothing of the harness, so that child stays cheap.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

# include/net/tcp_states.h
TCP_STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2",
              6: "TIME_WAIT", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN",
              11: "CLOSING", 12: "NEW_SYN_RECV"}
MAX_SOCKETS = 64        # kept per process (a rank of a big mesh has many; the evidence is bounded)


@dataclass
class SocketRecord:
    """One TCP socket of a process, as the kernel listed it at ``t`` (s after the start line)."""

    state: str                  # ESTABLISHED, SYN_SENT, LISTEN, CLOSE_WAIT...
    local: str                  # "ip:port"
    remote: str                 # "ip:port" ("0.0.0.0:0" for a listener)
    netns: str = ""             # "net:[4026531993]": which network namespace
    retransmits: int = 0        # unanswered retransmissions (a SYN_SENT's SYN retries)
    send_queue: int = 0         # bytes sent and not acknowledged (or, listening: the backlog)
    recv_queue: int = 0         # bytes received and not read (or, listening: accepted waiting)
    peer_pid: Optional[int] = None   # the process holding the remote end, when found
    peer: str = ""              # who that is: "rank 0", "port holder#1", "pid N: cmdline"
    peer_accepted: Optional[bool] = None   # the remote end accepted the connection (False:
    #                                         it waits in a listener's backlog)
    t: Optional[float] = None

    @property
    def remote_port(self) -> int:
        return int(self.remote.rsplit(":", 1)[-1])

    @property
    def local_port(self) -> int:
        return int(self.local.rsplit(":", 1)[-1])

    def line(self) -> str:
        """One readable line: 'ESTABLISHED 10.0.0.2:41234 -> 10.0.0.1:29500 (port holder...)'."""
        s = f"{self.state} {self.local} -> {self.remote}"
        if self.state == "LISTEN":
            s = f"LISTEN {self.local}"
        extra = []
        if self.retransmits:
            extra.append(f"{self.retransmits} retransmissions")
        if self.state == "ESTABLISHED" and self.send_queue:
            extra.append(f"{self.send_queue} bytes unacknowledged")
        if self.state == "ESTABLISHED" and self.recv_queue:
            extra.append(f"{self.recv_queue} bytes unread")
        if self.peer:
            held = "held by " + self.peer
            if self.peer_accepted is False:
                held += ", not accepted: in its listen backlog"
            extra.append(held)
        return s + (f" ({'; '.join(extra)})" if extra else "")

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SocketRecord:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


def _addr(hexaddr: str) -> str:
    ip_hex, port_hex = hexaddr.split(":")
    raw = bytes.fromhex(ip_hex)
    # the kernel prints each 32-bit word in host order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(words) if len(words) in (4, 16) else ipaddress.ip_address(0)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return f"{ip}:{int(port_hex, 16)}"


def parse_proc_net_tcp(text: str) -> Dict[int, SocketRecord]:
    """``/proc/net/tcp`` or ``tcp6`` -> inode -> record (without netns, peer or time)."""
    out: Dict[int, SocketRecord] = {}
    for ln in text.splitlines()[1:]:
        f = ln.split()
        if len(f) < 10:
            continue
        try:
            tx, rx = (int(x, 16) for x in f[4].split(":"))
            out[int(f[9])] = SocketRecord(state=TCP_STATES.get(int(f[3], 16), f[3]),
                                          local=_addr(f[1]), remote=_addr(f[2]),
                                          retransmits=int(f[6], 16), send_queue=tx,
                                          recv_queue=rx)
        except ValueError:
            continue
    return out


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def socket_inodes(pid: int) -> List[int]:
    out: List[int] = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.append(int(link[8:-1]))
    return out


def _netns(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr.rsplit(":", 1)[0]).is_loopback
    except ValueError:
        return False


def _unspecified(addr: str) -> bool:
    return addr.rsplit(":", 1)[0] in ("0.0.0.0", "::")


def describe_pid(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = ""
    return f"pid {pid}" + (f": {cmd[:120]}" if cmd else "")


def snapshot(pids: Mapping[int, str], t: Optional[float] = None
             ) -> Dict[int, List[SocketRecord]]:
    """The TCP sockets of every process in ``pids`` (pid -> its name in the run: "rank 1",
    "port holder#1"), each connection's remote end matched to the process in ``pids`` holding
    it. A process that is gone is left out."""
    per_pid: Dict[int, List[SocketRecord]] = {}
    tables: Dict[str, Dict[int, SocketRecord]] = {}
    for pid in pids:
        ns = _netns(pid)
        if not ns:
            continue
        if ns not in tables:
            table = parse_proc_net_tcp(_read(f"/proc/{pid}/net/tcp"))
            table.update(parse_proc_net_tcp(_read(f"/proc/{pid}/net/tcp6")))
            tables[ns] = table
        recs = []
        for ino in socket_inodes(pid):
            rec = tables[ns].get(ino)
            if rec is not None:
                recs.append(SocketRecord(**{**asdict(rec), "netns": ns, "t": t}))
        per_pid[pid] = recs
    _match_peers(per_pid, pids)
    for recs in per_pid.values():
        recs.sort(key=lambda r: (r.state != "ESTABLISHED", r.state, r.local))
        del recs[MAX_SOCKETS:]
    return per_pid


def _same_place(a: SocketRecord, b: SocketRecord) -> bool:
    """Two sockets can be the two ends of one connection: same namespace for loopback."""
    return a.netns == b.netns or not _is_loopback(a.remote)


def _match_peers(per_pid: Dict[int, List[SocketRecord]], names: Mapping[int, str]) -> None:
    by_local: Dict[Tuple[str, str], List[Tuple[int, SocketRecord]]] = {}
    listeners: Dict[int, List[Tuple[int, SocketRecord]]] = {}
    for pid, recs in per_pid.items():
        for r in recs:
            if r.state == "LISTEN":
                listeners.setdefault(r.local_port, []).append((pid, r))
            else:
                by_local.setdefault((r.local, r.remote), []).append((pid, r))
    for recs in per_pid.values():
        for r in recs:
            if r.state in ("LISTEN", "TIME_WAIT"):
                continue
            found = [(p, o) for p, o in by_local.get((r.remote, r.local), [])
                     if o is not r and _same_place(r, o)]
            if found:
                r.peer_pid, r.peer_accepted = found[0][0], True
            else:
                ip = r.remote.rsplit(":", 1)[0]
                for p, o in listeners.get(r.remote_port, []):
                    if (o.local.rsplit(":", 1)[0] == ip or _unspecified(o.local)) \
                            and _same_place(r, o) and r.state != "SYN_SENT":
                        r.peer_pid, r.peer_accepted = p, False
                        break
            if r.peer_pid is not None:
                r.peer = names.get(r.peer_pid) or describe_pid(r.peer_pid)


def children(pid: int) -> List[int]:
    """Every descendant of ``pid`` (psutil; empty when it is gone)."""
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def lines(recs: Iterable[SocketRecord]) -> List[str]:
    return [r.line() for r in recs]


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

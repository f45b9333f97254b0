"""What a fault's probe reads (shared by the probes of harness.faults): a service's log, and
the sockets of a process as its kernel has them (/proc/PID/net/{tcp,udp}[6]).

The harness's own services (the fault proxy, the DNS responder) log one JSON object a line on
their stderr (``service-<name>.err`` in the run directory); dnsmasq logs plain text lines
there. A probe reads the file at the end of the run (or at a heal) while the service may
still be writing: a line cut short, a line that is not JSON, or a missing file is skipped,
never an error (a probe that finds nothing says so in its summary)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..net.sockets import socket_inodes


def read_text(path: Any, start: int = 0, end: int = -1) -> str:
    """The file's text from byte ``start`` to ``end`` (-1: its end); "" when unreadable."""
    try:
        with open(Path(path), "rb") as f:
            f.seek(max(0, start))
            data = f.read() if end < 0 else f.read(max(0, end - start))
    except OSError:
        return ""
    return data.decode(errors="replace")


def size(path: Any) -> int:
    """The file's length in bytes now (0 when it does not exist): a mark in a log, so that a
    probe reads only what was written between two moments (a fault's do and its heal)."""
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0


def json_lines(path: Any) -> Iterator[Dict[str, Any]]:
    """The JSON objects of a log, one a line, in order; other lines are skipped."""
    for ln in read_text(path).splitlines():
        try:
            rec = json.loads(ln)
        except ValueError:
            continue
        if isinstance(rec, dict):
            yield rec


def text_lines(path: Any, window: Tuple[int, int] = (0, -1)) -> List[str]:
    """The complete lines of a plain-text log within the byte ``window`` (from, to; -1: the
    end). A line still being written at the window's end is left out."""
    text = read_text(path, *window)
    lines = text.split("\n")
    return lines[:-1]


# /proc/net/tcp's state numbers (include/net/tcp_states.h)
TCP_STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2",
              6: "TIME_WAIT", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN",
              11: "CLOSING"}


def own_connections(pid: int, port: int) -> List[Dict[str, Any]]:
    """The TCP connections to ``pid``'s ``port`` whose other end ``pid`` holds itself (etcd's
    gateway dials its own client port): a probe that counts clients leaves them out."""
    peers: Dict[Tuple[str, str], int] = {}
    socks = sockets(pid, port, "tcp", peer_of=peers)
    mine = set(socket_inodes(pid))   # harness.net.sockets: the pid's open socket inodes
    return [s for s in socks if s["state"] != "LISTEN"
            and peers.get((s["remote"], s["local"])) in mine]


def sockets(pid: int, port: int, proto: str = "tcp",
            peer_of: Optional[Dict[Tuple[str, str], int]] = None) -> List[Dict[str, Any]]:
    """The sockets of ``pid``'s network namespace whose local port is ``port`` (IPv4 and IPv6),
    as the kernel counts them now: state, bytes waiting to be read (``rx``: for a listening
    TCP socket, the connections waiting to be accepted; for UDP the memory its queued
    datagrams take), bytes not yet acknowledged (``tx``), and for UDP the datagrams dropped
    (a full queue), the kernel's ``local``/``remote`` endpoints (hex, as /proc writes them) and
    the socket's ``inode``. ``peer_of``: filled with (local, remote) -> inode of every other
    socket of the namespace, to find a connection's other end. A process that is gone:
    OSError."""
    out: List[Dict[str, Any]] = []
    read_any = False
    for fam in ("", "6"):
        try:
            text = Path(f"/proc/{pid}/net/{proto}{fam}").read_text()
        except FileNotFoundError:
            continue
        read_any = True
        for ln in text.splitlines()[1:]:
            f = ln.split()
            if len(f) < 10:
                continue
            try:
                lport = int(f[1].rsplit(":", 1)[1], 16)
                tx, rx = (int(x, 16) for x in f[4].split(":"))
                state = int(f[3], 16)
            except (ValueError, IndexError):
                continue
            if lport != port and peer_of is None:
                continue
            rec: Dict[str, Any] = {"state": TCP_STATES.get(state, str(state)) if proto == "tcp"
                                   else "UDP", "rx": rx, "tx": tx, "local": f[1],
                                   "remote": f[2], "inode": int(f[9]) if f[9].isdigit() else 0}
            if lport != port:       # kept only to name the peers of the port's connections
                assert peer_of is not None
                peer_of[(f[1], f[2])] = rec["inode"]
                continue
            if proto == "udp" and len(f) >= 13:
                rec["drops"] = int(f[12]) if f[12].isdigit() else 0
            out.append(rec)
    if not read_any:
        raise OSError(f"no /proc/{pid}/net/{proto}: the process is gone")
    return out


def process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (R, S, T stopped, Z...); "" when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2:][:1]
    except (OSError, ValueError):
        return ""

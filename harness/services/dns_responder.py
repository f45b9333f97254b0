"""The harness's own tiny DNS responder: the answers dnsmasq cannot be told to give for one
name (SERVFAIL, no answer at all, addresses in a fixed order). A harness program run as a
service (harness.services) in the name server's namespace, on loopback only:

    python -m harness.services.dns_responder --control SOCK --port PORT \\
        --name NAME=MODE[:ADDR,ADDR...] ...

dnsmasq forwards each faulted name to it (``server=/NAME/127.0.0.1#PORT``), so the ranks
still ask only the run's name server and every query stays inside the run's namespaces.
Modes per name: ``servfail`` (rcode 2), ``silent`` (reads the query, never answers),
``nxdomain`` (rcode 3), ``answer`` (the addresses, A and AAAA as asked, in the given order,
TTL 0 so that nothing is cached). Names it was not told: REFUSED. A name's fault may hold
for some clients only (``--only NAME=ADDR,...``; the set op's ``only``): dnsmasq adds the
asking host's address to each forwarded query (``add-subnet``, an EDNS Client Subnet option),
and every other client gets the name's live addresses (``--live NAME=ADDR,...``).

Control: a UNIX socket, one JSON line each way: ``{"op": "ping"}``, ``{"op": "set", "name",
"mode", "addrs"}``, ``{"op": "stats"}`` (queries seen per name and mode). Every query is one
JSON line on stderr (the service's log in the run directory). Standard library only.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import selectors
import socket
import struct
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from .dnswire import DnsError, client_subnet, encode_name, error_reply, question

MODES = ("servfail", "silent", "nxdomain", "answer")
LOG_MAX = 20000


class Responder:
    def __init__(self, names: Dict[str, Tuple[str, List[str]]],
                 only: Optional[Dict[str, List[str]]] = None,
                 live: Optional[Dict[str, List[str]]] = None):
        self.names = {n.lower().rstrip("."): v for n, v in names.items()}
        # name -> the clients its fault holds for (absent: every client), and its live answer
        self.only = {n.lower().rstrip("."): list(v) for n, v in (only or {}).items()}
        self.live = {n.lower().rstrip("."): list(v) for n, v in (live or {}).items()}
        self.seen: Dict[str, int] = {}
        self.logged = 0

    def log(self, **rec: Any) -> None:
        if self.logged < LOG_MAX:
            self.logged += 1
            print(json.dumps({"t": round(time.time(), 3), **rec}), file=sys.stderr, flush=True)

    def set(self, name: str, mode: str, addrs: List[str],
            only: Optional[List[str]] = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        for a in [*addrs, *(only or [])]:
            ipaddress.ip_address(a)
        key = name.lower().rstrip(".")
        self.names[key] = (mode, list(addrs))
        if only is None:
            self.only.pop(key, None)
        else:
            self.only[key] = list(only)
        self.log(event="set", name=name, mode=mode, addrs=addrs, only=only)

    def reply(self, msg: bytes) -> bytes:
        """The answer to a query, b"" for none."""
        qid, qname, qtype = question(msg)
        name = qname.lower().rstrip(".")
        mode, addrs = self.names.get(name, ("refused", []))
        client = client_subnet(msg)
        only = self.only.get(name)
        held = only is None or client in only
        if not held:   # not a host the name's setting holds for: its live answer
            mode, addrs = "answer", self.live.get(name, [])
        key = f"{qname} {mode}"
        self.seen[key] = self.seen.get(key, 0) + 1
        self.log(event="query", name=qname, type=qtype, mode=mode, client=client, held=held)
        if mode == "silent":
            return b""
        if mode == "servfail":
            return error_reply(msg, 2)
        if mode == "nxdomain":
            return error_reply(msg, 3)
        if mode == "refused":
            return error_reply(msg, 5)
        fam = {1: 4, 28: 6}.get(qtype)
        rdatas = [ipaddress.ip_address(a).packed for a in addrs
                  if ipaddress.ip_address(a).version == fam]
        head = error_reply(msg, 0)
        head = head[:6] + struct.pack("!H", len(rdatas)) + head[8:]
        rr = b"".join(encode_name(qname) + struct.pack("!HHIH", qtype, 1, 0, len(d)) + d
                      for d in rdatas)
        return head + rr


def serve(port: int, control: str, resp: Responder) -> None:
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", port))
    ctl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.unlink(control)
    except FileNotFoundError:
        pass
    ctl.bind(control)
    ctl.listen(8)
    sel = selectors.DefaultSelector()
    sel.register(udp, selectors.EVENT_READ, "udp")
    sel.register(ctl, selectors.EVENT_READ, "ctl")
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            if key.data == "udp":
                msg, peer = udp.recvfrom(4096)
                try:
                    out = resp.reply(msg)
                except (DnsError, ValueError, IndexError, struct.error) as e:
                    resp.log(event="bad query", error=str(e))
                    continue
                if out:
                    udp.sendto(out, peer)
            else:
                conn, _ = ctl.accept()
                with conn:
                    conn.settimeout(2.0)
                    try:
                        line = conn.makefile("rb").readline()
                        req = json.loads(line.decode())
                        answer = handle(resp, req)
                    except (OSError, ValueError) as e:
                        answer = {"ok": False, "error": str(e)}
                    try:
                        conn.sendall(json.dumps(answer).encode() + b"\n")
                    except OSError:
                        pass


def handle(resp: Responder, req: Dict[str, Any]) -> Dict[str, Any]:
    op = req.get("op")
    if op == "ping":
        return {"ok": True}
    if op == "stats":
        return {"ok": True, "seen": dict(resp.seen)}
    if op == "set":
        name = req.get("name")
        if not isinstance(name, str) or not name:
            return {"ok": False, "error": "set needs a name"}
        only = req.get("only")
        resp.set(name, str(req.get("mode")), list(req.get("addrs") or []),
                 None if only is None else list(only))
        return {"ok": True}
    return {"ok": False, "error": f"unknown op {op!r}"}


def parse_name(text: str) -> Tuple[str, Tuple[str, List[str]]]:
    name, _, rest = text.partition("=")
    mode, _, addrs = rest.partition(":")
    if not name or mode not in MODES:
        raise argparse.ArgumentTypeError(f"--name NAME=MODE[:ADDR,...] with MODE one of "
                                         f"{', '.join(MODES)}, got {text!r}")
    return name, (mode, [a for a in addrs.split(",") if a])


def parse_list(text: str) -> Tuple[str, List[str]]:
    name, _, addrs = text.partition("=")
    if not name:
        raise argparse.ArgumentTypeError(f"NAME=ADDR,... expected, got {text!r}")
    return name, [a for a in addrs.split(",") if a]


def main(argv: Any = None) -> int:
    from ..machine.procs import die_with_parent

    die_with_parent()
    ap = argparse.ArgumentParser(prog="python -m harness.services.dns_responder")
    ap.add_argument("--control", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--name", type=parse_name, action="append", default=[])
    ap.add_argument("--only", type=parse_list, action="append", default=[],
                    help="NAME=ADDR,...: the name's mode holds only for these clients")
    ap.add_argument("--live", type=parse_list, action="append", default=[],
                    help="NAME=ADDR,...: what every other client gets for the name")
    args = ap.parse_args(argv)
    serve(args.port, args.control, Responder(dict(args.name), dict(args.only),
                                             dict(args.live)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

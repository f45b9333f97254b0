"""The harness's own tiny DNS responder: the answers dnsmasq cannot be told to give for one
name (SERVFAIL, no answer at all, addresses in a fixed order). A harness program run as a
service (harness.services) in the name server's namespace, on loopback only:

    python -m harness.services.dns_responder --control SOCK --port PORT \\
        --name NAME=MODE[:ADDR,ADDR...] ...

dnsmasq forwards each faulted name to it (``server=/NAME/127.0.0.1#PORT``), so the ranks
still ask only the run's name server and every query stays inside the run's namespaces.
Modes per name: ``servfail`` (rcode 2), ``silent`` (reads the query, never answers),
``nxdomain`` (rcode 3), ``answer`` (the addresses, A and AAAA as asked, in the given order,
TTL 0 so that nothing is cached). Names it was not told: REFUSED.

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
from typing import Any, Dict, List, Tuple

from .dnswire import DnsError, encode_name, error_reply, question

MODES = ("servfail", "silent", "nxdomain", "answer")
LOG_MAX = 20000


class Responder:
    def __init__(self, names: Dict[str, Tuple[str, List[str]]]):
        self.names = {n.lower().rstrip("."): v for n, v in names.items()}
        self.seen: Dict[str, int] = {}
        self.logged = 0

    def log(self, **rec: Any) -> None:
        if self.logged < LOG_MAX:
            self.logged += 1
            print(json.dumps({"t": round(time.time(), 3), **rec}), file=sys.stderr, flush=True)

    def set(self, name: str, mode: str, addrs: List[str]) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        for a in addrs:
            ipaddress.ip_address(a)
        self.names[name.lower().rstrip(".")] = (mode, list(addrs))
        self.log(event="set", name=name, mode=mode, addrs=addrs)

    def reply(self, msg: bytes) -> bytes:
        """The answer to a query, b"" for none."""
        qid, qname, qtype = question(msg)
        mode, addrs = self.names.get(qname.lower().rstrip("."), ("refused", []))
        key = f"{qname} {mode}"
        self.seen[key] = self.seen.get(key, 0) + 1
        self.log(event="query", name=qname, type=qtype, mode=mode)
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
        resp.set(name, str(req.get("mode")), list(req.get("addrs") or []))
        return {"ok": True}
    return {"ok": False, "error": f"unknown op {op!r}"}


def parse_name(text: str) -> Tuple[str, Tuple[str, List[str]]]:
    name, _, rest = text.partition("=")
    mode, _, addrs = rest.partition(":")
    if not name or mode not in MODES:
        raise argparse.ArgumentTypeError(f"--name NAME=MODE[:ADDR,...] with MODE one of "
                                         f"{', '.join(MODES)}, got {text!r}")
    return name, (mode, [a for a in addrs.split(",") if a])


def main(argv: Any = None) -> int:
    from ..machine.procs import die_with_parent

    die_with_parent()
    ap = argparse.ArgumentParser(prog="python -m harness.services.dns_responder")
    ap.add_argument("--control", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--name", type=parse_name, action="append", default=[])
    args = ap.parse_args(argv)
    serve(args.port, args.control, Responder(dict(args.name)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

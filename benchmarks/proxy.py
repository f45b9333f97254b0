"""What the fault proxy (harness.services.proxy) adds with no fault configured, side by side.

An echo server on loopback; a client does request/reply round trips of a small message
(64 bytes: a store request) and one bulk transfer (8 MB echoed back: a gloo tensor):
- direct: to the echo server;
- proxy: through the fault proxy (``--front``, no toxic), started as a harness service.
Rounds alternate so that machine noise hits both alike. Printed: median and 90th percentile of
the round trip, the added time per round trip (proxy - direct, medians), and the bulk
throughput of each with their ratio. Usage: python benchmarks/proxy.py [ROUNDS] [TRIPS]
"""

from __future__ import annotations

import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness.machine.procs import ManagedProcess
from harness.services import Answers, Service, ServiceSpec

SMALL = b"s" * 64
BULK = 8 << 20


def echo_server() -> int:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)

    def serve(c: socket.socket) -> None:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            d = c.recv(1 << 20)
            if not d:
                return
            c.sendall(d)

    def accept() -> None:
        while True:
            c, _ = srv.accept()
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return int(srv.getsockname()[1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def trips(port: int, n: int) -> list:
    out = []
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n):
            t = time.perf_counter()
            s.sendall(SMALL)
            got = 0
            while got < len(SMALL):
                got += len(s.recv(65536))
            out.append(time.perf_counter() - t)
    return out


def bulk(port: int) -> float:
    """MB/s of BULK bytes sent and echoed back."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        t = time.perf_counter()
        sender = threading.Thread(target=s.sendall, args=(b"b" * BULK,))
        sender.start()
        got = 0
        while got < BULK:
            got += len(s.recv(1 << 20))
        sender.join()
        return BULK / (1 << 20) / (time.perf_counter() - t)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    upstream = echo_server()
    with tempfile.TemporaryDirectory() as d:
        port = free_port()
        ctl = str(Path(d) / "p.sock")
        spec = ServiceSpec("proxy", [sys.executable, "-m", "harness.services.proxy", "--control",
                                     ctl, "--front", "127.0.0.1", str(port), "127.0.0.1",
                                     str(upstream)], ready=Answers(), control=ctl)
        svc = Service(spec, Path(d)).start(
            lambda argv, out, err: ManagedProcess(argv, name="proxy", stdout=out, stderr=err))
        svc.wait_ready()
        try:
            direct, proxied, bd, bp = [], [], [], []
            for _ in range(rounds):
                direct += trips(upstream, n)
                proxied += trips(port, n)
                bd.append(bulk(upstream))
                bp.append(bulk(port))
        finally:
            svc.stop()

    def q(xs: list, p: float) -> float:
        return sorted(xs)[int(p * (len(xs) - 1))] * 1e6

    md, mp = statistics.median(direct) * 1e6, statistics.median(proxied) * 1e6
    print(f"round trip of {len(SMALL)} bytes, {rounds} x {n} each (microseconds):")
    print(f"  direct: median {md:.0f}, p90 {q(direct, 0.9):.0f}")
    print(f"  proxy:  median {mp:.0f}, p90 {q(proxied, 0.9):.0f}")
    print(f"  added by the proxy: {mp - md:.0f} us per round trip (median), x{mp / md:.1f}")
    bdm, bpm = statistics.median(bd), statistics.median(bp)
    print(f"bulk {BULK >> 20} MB echoed: direct {bdm:.0f} MB/s, proxy {bpm:.0f} MB/s "
          f"(x{bpm / bdm:.2f})")


if __name__ == "__main__":
    main()

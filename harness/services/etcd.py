"""A real etcd as a service of the run: what starts it and how the supervisor knows it answers.

torchrun's ``--rdzv-backend etcd`` (the legacy handler) and ``etcd-v2`` (the dynamic
rendezvous on etcd's v2 API) keep the rendezvous in an outside etcd. A scenario with an
``etcd:`` block gets one of its own (the machine's ``etcd`` binary, Debian's ``etcd-server``,
or the path the block gives), started by the run's set-up step
(:mod:`harness.faults._etcd`, which plans it and owns its fault steps). This module is what a
step, a test or ``harness doctor`` needs of etcd itself: the requirements, the command line,
the readiness check (an HTTP answer on its client port, asked from inside its host's network
namespace) and one request.

etcd runs with ``--enable-v2`` (both torch backends speak v2 through ``python-etcd``), a data
directory inside the run directory, a client and a peer port leased for the run, listening
and advertising on its host's address only (the address the agents dial; the client library
asks etcd for its member list and then dials what etcd advertises).
"""

from __future__ import annotations

import importlib.util
import socket
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Set

from ..machine.requirement import Probe, Tool

ETCD = Tool("etcd", package="etcd-server",
            why="the run's etcd for torchrun's etcd / etcd-v2 rendezvous (an etcd: block)")
SERVICE = "etcd"
DATA_DIR = "etcd-data"     # in the run directory; never copied into the kept evidence
NAME = "harness"          # the member's name (one member)


def _python_etcd_missing() -> Optional[str]:
    if importlib.util.find_spec("etcd") is None or importlib.util.find_spec("urllib3") is None:
        return ("python-etcd is not installed: torchrun's etcd and etcd-v2 rendezvous import "
                "it (install the harness's extra: pip install -e '.[etcd]')")
    return None


PYTHON_ETCD = Probe("python-etcd", ok="torchrun's etcd and etcd-v2 rendezvous can run",
                    check=_python_etcd_missing)


def url(addr: str, port: int) -> str:
    return f"http://[{addr}]:{port}" if ":" in addr else f"http://{addr}:{port}"


def argv(binary: str, addr: str, client_port: int, peer_port: int, data_dir: str) -> List[str]:
    """etcd's command line: one member, v2 enabled, on ``addr`` only, logs on stderr."""
    client, peer = url(addr, client_port), url(addr, peer_port)
    return [binary, "--name", NAME, "--data-dir", data_dir,
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"{NAME}={peer}", "--initial-cluster-state", "new",
            "--enable-v2", "--logger", "zap", "--log-outputs", "stderr"]


# a socket factory: (family, kind) -> a socket, made in the service's network namespace
SocketFactory = Callable[[int, int], Any]


def plain_socket(family: int, kind: int) -> Any:
    return socket.socket(family, kind)


def get(make: SocketFactory, addr: str, port: int, path: str = "/version",
        timeout: float = 1.0, sent_from: Optional[Set[int]] = None) -> str:
    """One HTTP/1.0 GET to etcd, the answer's text (status line first); OSError if none.
    ``sent_from``: gets the connection's source port (also when it fails or times out)."""
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with make(fam, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect((addr, port))
        finally:
            if sent_from is not None:
                _note_source_port(s, sent_from)
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n".encode())
        buf = b""
        while len(buf) < 65536:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    return buf.decode(errors="replace")


def _note_source_port(s: Any, ports: Set[int]) -> None:
    try:
        src = s.getsockname()[1]
    except OSError:
        return
    if src:
        ports.add(src)


@dataclass(frozen=True)
class EtcdAnswers:
    """Readiness: ``GET /version`` on the client port answers ``200`` (asked from inside the
    service's host, through ``make``). ``asked_from``: the source ports of every readiness
    connection, so a fault that counts the requests waiting on a frozen etcd leaves the
    harness's own out (seen in a test under load: a probe that timed out at 0.5 s left its
    43 request bytes unread, and a freeze right after read them as a client's)."""

    make: SocketFactory
    addr: str
    port: int
    asked_from: Set[int] = field(default_factory=set, compare=False, hash=False)

    def ready(self, svc: Any) -> bool:
        try:
            status = get(self.make, self.addr, self.port, timeout=0.5,
                         sent_from=self.asked_from).split("\r\n", 1)[0]
            return status.split(" ")[1:2] == ["200"]
        except OSError:
            return False

    def describe(self) -> str:
        return f"an HTTP 200 answer to GET /version on {url(self.addr, self.port)}"

"""The run's name server as a service: what starts it and how the supervisor knows it answers.

dnsmasq (Debian's ``dnsmasq-base``) runs on a host of its own for a scenario with a ``dns:``
block; its configuration, records and faults are the run's set-up and fault steps
(:mod:`harness.faults._dns`, which has the whole picture). This module is what a step, a test
or ``harness doctor`` needs of the server itself: the requirement, the service names, the
readiness check (a real query asked from inside a host's namespace) and one query.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from ..machine.requirement import Tool
from .dnswire import DnsError, query

DNSMASQ = Tool("dnsmasq", package="dnsmasq-base", why="the run's name server (a dns: block)")
SERVICE = "dns"
RESPONDER = "dns-responder"


@dataclass(frozen=True)
class DnsAnswers:
    """Readiness: a real query, asked from inside a host's namespace, gets an answer."""

    net: Any
    host: str
    server: str
    name: str

    def ready(self, svc: Any) -> bool:
        fam = socket.AF_INET6 if ":" in self.server else socket.AF_INET
        try:
            with self.net.socket(self.host, fam, socket.SOCK_DGRAM) as s:
                query(self.server, self.name, "PTR", timeout=0.2, sock=s)
            return True
        except (DnsError, OSError):
            return False

    def describe(self) -> str:
        return f"an answer to a PTR query for {self.name} from host {self.host}"


def ask(net: Any, host: str, server: str, name: str, rtype: str = "A",
        timeout: float = 1.0) -> Any:
    """One query from inside ``host``'s namespace (tests, checks)."""
    fam = socket.AF_INET6 if ":" in server else socket.AF_INET
    with net.socket(host, fam, socket.SOCK_DGRAM) as s:
        return query(server, name, rtype, timeout=timeout, sock=s)

"""Network safety: the harness sends traffic only to loopback and to namespaces it made itself.

Every address a scenario names passes through ``refuse_address``; a non-empty answer is the
reason the scenario is refused (reported as a located scenario error, before anything runs).
A host name is accepted only when the ranks' own hosts file (the resolver view of
``harness.resolver``, which every rank resolves with, and which has no DNS) maps it to loopback
addresses only; the names are read from the very text the view writes.
"""

from __future__ import annotations

import ipaddress
from typing import Iterable, Optional

from .resolver import loopback_names, machine_hostname


def refuse_address(addr: str, own_subnets: Iterable[str] = (),
                   unresolvable: str = "a fault for that") -> Optional[str]:
    """None if traffic to ``addr`` is allowed, else a sentence saying why it is refused."""
    names = loopback_names()
    if addr.lower() in names:   # glibc's files backend compares names case-insensitively
        return None
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        if addr.startswith("[") and addr.endswith("]"):
            return (f"{addr!r}: write an IPv6 address without brackets (MASTER_ADDR={addr} "
                    "is looked up as a host name)")
        accepted = ", ".join(sorted(names))
        hostname = machine_hostname()
        if hostname and addr.lower() == hostname.lower():
            return (f"{addr!r} is this machine's host name: the ranks' hosts file maps it to "
                    f"127.0.0.1, but a scenario naming it runs only on this machine; use one of "
                    f"the loopback names ({accepted}) or 127.0.0.1")
        return (f"{addr!r} is a host name the ranks' hosts file does not map to loopback: "
                "resolving it could send a DNS query off this machine. The harness sends "
                f"traffic only to loopback (127.0.0.0/8, ::1, the names {accepted}) and to its "
                "own namespaces' subnet; for a name that does not resolve use the "
                f"{unresolvable} fault")
    if ip.is_loopback:
        return None
    for net in own_subnets:
        if ip in ipaddress.ip_network(net):
            return None
    return (f"{addr} is not a loopback address: the harness sends traffic only to loopback "
            "(127.0.0.0/8, ::1) and to the subnet of the namespaces it makes itself")

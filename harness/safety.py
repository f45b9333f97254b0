"""Network safety: the harness sends traffic only to loopback and to namespaces it made itself.

Every address a scenario names passes through ``refuse_address``; a non-empty answer is the
reason the scenario is refused (reported as a located scenario error, before anything runs).
"""

from __future__ import annotations

import ipaddress
from typing import Iterable, Optional

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def refuse_address(addr: str, own_subnets: Iterable[str] = ()) -> Optional[str]:
    """None if traffic to ``addr`` is allowed, else a sentence saying why it is refused."""
    if addr.lower() in LOOPBACK_NAMES:
        return None
    try:
        ip = ipaddress.ip_address(addr.strip("[]"))
    except ValueError:
        return (f"{addr!r} is a host name: resolving it could send a DNS query off this machine. "
                "The harness sends traffic only to loopback (127.0.0.0/8, ::1, localhost) and to "
                "its own namespaces' subnet; for a name that does not resolve use the "
                "unresolvable_host fault")
    if ip.is_loopback:
        return None
    for net in own_subnets:
        if ip in ipaddress.ip_network(net):
            return None
    return (f"{addr} is not a loopback address: the harness sends traffic only to loopback "
            "(127.0.0.0/8, ::1) and to the subnet of the namespaces it makes itself")

"""Network safety: the harness sends traffic only to loopback and to namespaces it made itself.

Every address a scenario names passes through ``refuse_address``; a non-empty answer is the
reason the scenario is refused (reported as a located scenario error, before anything runs).
The rule judges where traffic can go, not how the value is spelled:

* an address is judged by what it stands for once the spellings users really write are read
  as such (:func:`as_meant`): surrounding white space (``" 127.0.0.1"``), URL brackets
  (``[::1]``), a trailing dot (``localhost.``, the fully qualified form), an IPv4-mapped IPv6
  address (``::ffff:127.0.0.1``). The value itself reaches torch unchanged: what torch makes
  of ``[::1]`` in MASTER_ADDR (it looks it up as a name, and the lookup fails) is the verdict.
  Such a spelling leads to loopback or nowhere: every process the harness starts for torch
  resolves names with the run's resolver view (``harness.net.resolver``: files only, no DNS), so a
  spelling the hosts file does not list fails at once, on this machine;
* a host name is accepted only when the ranks' own hosts file (the resolver view, which every
  rank resolves with) maps it to loopback addresses only; the names are read from the very
  text the view writes. Any other name is refused: a process outside the view (a tool, the
  machine's own resolver) could send a DNS query for it off this machine;
* an address must be loopback or in a subnet the harness's own namespaces use.
"""

from __future__ import annotations

import ipaddress
from typing import Iterable, Optional

from .resolver import loopback_names, machine_hostname


def as_meant(addr: str) -> str:
    """What a spelling of an address stands for (pure): white space around it, one pair of
    URL brackets, one trailing dot of a name or an IPv4 address dropped; an IPv4-mapped IPv6
    address as its IPv4 address. Anything else is returned as it is."""
    a = addr.strip()
    if len(a) > 2 and a.startswith("[") and a.endswith("]"):
        a = a[1:-1].strip()
    if len(a) > 1 and a.endswith(".") and not a.endswith(".."):
        a = a[:-1]
    try:
        ip = ipaddress.ip_address(a)
    except ValueError:
        return a
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def refuse_address(addr: str, own_subnets: Iterable[str] = (),
                   unresolvable: str = "a fault for that") -> Optional[str]:
    """None if traffic to ``addr`` is allowed, else a sentence saying why it is refused."""
    names = loopback_names()
    meant = as_meant(addr)
    # glibc's files backend compares names case-insensitively
    if addr.lower() in names or meant.lower() in names:
        return None
    try:
        ip = ipaddress.ip_address(meant)
    except ValueError:
        accepted = ", ".join(sorted(names))
        hostname = machine_hostname()
        if hostname and meant.lower() == hostname.lower():
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
    shown = addr if addr == meant else f"{addr!r} ({meant})"
    return (f"{shown} is not a loopback address: the harness sends traffic only to loopback "
            "(127.0.0.0/8, ::1) and to the subnet of the namespaces it makes itself")

"""A host as a whole machine (pure): its own name, the names it knows, its kernel settings.

A scenario host is a network namespace; this module says what else makes it a machine, as
data the plan carries and the topology applies before any process starts on it:

* its host name (``gethostname()``, ``socket.getfqdn()``, torchrun's c10d "is this node the
  store's host?"): the machine's, shared by every host (the default: what network namespaces
  alone give), or its own, in a UTS namespace of the host's (``hostname:``, ``hostnames: own``);
* its hosts file (``/etc/netns/<ns>/hosts``, which every process on the host reads): the
  loopback lines, its own name (``resolves_self``: its link address, a loopback address such
  as Debian's 127.0.1.1 line, or nothing), the names of the hosts it ``knows``, and ``names``
  (more lines: a host of the scenario, a loopback address, ``dead``);
* its kernel network settings (``sysctl:``, only keys a network namespace owns:
  :data:`SYSCTL_KEYS`) and its link's MTU.

:func:`host_names` turns a scenario's hosts and the addresses the topology gives them into one
:class:`HostNames` per host; the plan keeps them on its hosts, faults may change them (the
``hostname_loopback`` fault is ``resolves_self: 127.0.1.1`` on every host), the run's set-up step
``ShapeHosts`` (harness.run.plan) hands them to the topology.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = [
    "COUNTERS",
    "DEAD",
    "MACHINE",
    "SYSCTL_KEYS",
    "HostNames",
    "host_names",
    "resolves_self_problem",
    "sysctl_problem",
]

DEAD = "dead"     # a names entry: an address of the run's network where no host is
MACHINE = "@machine"   # an entries key: the machine's own host name (shared by plain hosts)

# Keys a network namespace owns (each namespace has its own value; writing one inside a host's
# namespace changes nothing else), with what a value must be. Read off torch start-up failures:
# the listen backlog a burst of store clients overflows, SYN retries, IPv6 off on a host...
_INT = (r"^-?[0-9]{1,10}$", "an integer")
_BOOL = (r"^[01]$", "0 or 1")
_PAIR = (r"^[0-9]{1,5}[ \t]+[0-9]{1,5}$", "two port numbers, 'LOW HIGH'")
_TRIPLE = (r"^[0-9]{1,10}[ \t]+[0-9]{1,10}[ \t]+[0-9]{1,10}$", "three integers 'MIN DEFAULT MAX'")
SYSCTL_KEYS: Dict[str, Tuple[str, str]] = {
    "net.core.somaxconn": _INT,
    "net.ipv4.tcp_abort_on_overflow": _BOOL,
    "net.ipv4.tcp_max_syn_backlog": _INT,
    "net.ipv4.tcp_syncookies": (r"^[0-2]$", "0, 1 or 2"),
    "net.ipv4.tcp_syn_retries": _INT,
    "net.ipv4.tcp_synack_retries": _INT,
    "net.ipv4.tcp_retries1": _INT,
    "net.ipv4.tcp_retries2": _INT,
    "net.ipv4.tcp_orphan_retries": _INT,
    "net.ipv4.tcp_fin_timeout": _INT,
    "net.ipv4.tcp_keepalive_time": _INT,
    "net.ipv4.tcp_keepalive_intvl": _INT,
    "net.ipv4.tcp_keepalive_probes": _INT,
    "net.ipv4.tcp_tw_reuse": (r"^[0-2]$", "0, 1 or 2"),
    "net.ipv4.tcp_fastopen": _INT,
    "net.ipv4.tcp_timestamps": (r"^[0-2]$", "0, 1 or 2"),
    "net.ipv4.tcp_window_scaling": _BOOL,
    "net.ipv4.tcp_sack": _BOOL,
    "net.ipv4.tcp_mtu_probing": (r"^[0-2]$", "0, 1 or 2"),
    "net.ipv4.tcp_rmem": _TRIPLE,
    "net.ipv4.tcp_wmem": _TRIPLE,
    "net.ipv4.tcp_rfc1337": _BOOL,
    "net.ipv4.ip_local_port_range": _PAIR,
    "net.ipv4.ip_no_pmtu_disc": (r"^[0-3]$", "0 to 3"),
    "net.ipv4.icmp_echo_ignore_all": _BOOL,
    "net.ipv6.conf.all.disable_ipv6": _BOOL,
    "net.ipv6.conf.default.disable_ipv6": _BOOL,
}


# The kernel's TCP counters a run's evidence keeps per host (its namespace is new with the run,
# so a count is the run's): what happened on the wire that torch does not say.
COUNTERS = (
    "Tcp.ActiveOpens", "Tcp.PassiveOpens", "Tcp.AttemptFails", "Tcp.EstabResets",
    "Tcp.RetransSegs", "Tcp.OutRsts", "TcpExt.ListenOverflows", "TcpExt.ListenDrops",
    "TcpExt.TCPSynRetrans", "TcpExt.TCPAbortOnData", "TcpExt.TCPAbortOnTimeout",
    "TcpExt.TCPTimeouts", "TcpExt.SyncookiesSent", "TcpExt.TCPReqQFullDrop",
)
_COUNT_BOUND = re.compile(r"^\s*(>=|<=|>|<|==)\s*([0-9]{1,12})\s*$")


def count_bound_problem(text: Any) -> Optional[str]:
    if not isinstance(text, str) or not _COUNT_BOUND.match(text):
        return f"{str(text)[:40]!r}: write a bound on a count, e.g. '>= 1', '== 0', '< 5'"
    return None


def count_holds(text: str, count: int) -> bool:
    m = _COUNT_BOUND.match(text)
    assert m is not None
    op, n = m.group(1), int(m.group(2))
    return {">=": count >= n, "<=": count <= n, ">": count > n, "<": count < n,
            "==": count == n}[op]


def sysctl_problem(key: Any, value: Any) -> Optional[str]:
    """None if ``key: value`` may be set on a host, else why not (one sentence)."""
    if not isinstance(key, str) or key not in SYSCTL_KEYS:
        shown = str(key)[:80]
        return (f"{shown!r} is not a kernel setting of a host's own network namespace; one of: "
                + ", ".join(sorted(SYSCTL_KEYS)))
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return f"{key}: a number or a string of numbers, got {type(value).__name__}"
    pattern, what = SYSCTL_KEYS[key]
    text = str(value)
    if not re.match(pattern, text):
        return f"{key}: {what}, got {text[:40]!r}"
    if key == "net.core.somaxconn" and int(text) < 0:
        return f"{key}: at least 0, got {text}"
    return None


def resolves_self_problem(value: str) -> Optional[str]:
    """None if ``value`` may say what a host's own name resolves to, else why not."""
    if value in ("link", "none"):
        return None
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        return (f"{value!r}: 'link' (the host's address), 'none', or a loopback address such as "
                "127.0.1.1")
    if not ip.is_loopback:
        return (f"{value}: not a loopback address; a host's own name resolves to its link "
                "('link'), to loopback (127.0.1.1) or to nothing ('none')")
    return None


def names_entry_problem(target: str, hosts: Sequence[str]) -> Optional[str]:
    """None if a ``names:`` target is a host of the scenario, a loopback address or ``dead``."""
    if target in hosts or target == DEAD:
        return None
    try:
        ip = ipaddress.ip_address(target)
    except ValueError:
        return (f"{target!r}: a host of the scenario ({', '.join(hosts)}), a loopback address "
                f"or '{DEAD}' (an address of the run where no host is)")
    if not ip.is_loopback:
        return (f"{target}: a hosts-file line may point only at a host of the scenario, at "
                f"loopback or at '{DEAD}': the harness sends traffic only there")
    return None


@dataclass
class HostNames:
    """One host's machine identity, as the topology applies it."""

    hostname: str = ""                       # its own name ("" = the machine's, shared)
    entries: Dict[str, List[str]] = field(default_factory=dict)   # its hosts file's lines
    #                                          (MACHINE: the machine's name; [] = unknown)
    sysctl: Dict[str, str] = field(default_factory=dict)
    mtu: Optional[int] = None

    def is_plain(self) -> bool:
        return not (self.hostname or self.entries or self.sysctl or self.mtu is not None)

    def describe(self) -> str:
        parts = []
        if self.hostname:
            parts.append(f"named {self.hostname}")
        if self.entries:
            parts.append("hosts: " + "; ".join(f"{n} -> {', '.join(a) or 'nothing'}"
                                               for n, a in self.entries.items()))
        if self.sysctl:
            parts.append(", ".join(f"{k}={v}" for k, v in self.sysctl.items()))
        if self.mtu is not None:
            parts.append(f"mtu {self.mtu}")
        return "; ".join(parts)


def host_names(scn: Any, addresses: Mapping[str, Sequence[str]],
               dead: Callable[[], str]) -> Dict[str, HostNames]:
    """Each host's :class:`HostNames` (host -> it). ``addresses``: a host's addresses in the
    run (IPv4 first, then IPv6; loopback for a host without a link); ``dead``: an address of
    the run's network where no host is."""
    hosts = list(scn.hosts or [])
    own = {h.name: h.hostname or (h.name if scn.hostnames == "own" else "") for h in hosts}
    out: Dict[str, HostNames] = {}
    for h in hosts:
        entries: Dict[str, List[str]] = {}
        name = own[h.name]
        if name:
            self_to = h.resolves_self or "link"
            entries[name] = list(addresses[h.name]) if self_to == "link" else \
                [] if self_to == "none" else [self_to]
            known = [o.name for o in hosts if o.name != h.name] if h.knows == "all" else \
                [] if h.knows == "none" else [k for k in h.knows if k != h.name]
            for other in known:
                if own[other]:
                    entries[own[other]] = list(addresses[other])
        elif h.resolves_self:   # the machine's name, which this host shares
            entries[MACHINE] = [] if h.resolves_self == "none" else \
                list(addresses[h.name]) if h.resolves_self == "link" else [h.resolves_self]
        for n, targets in h.names.items():
            vals = [targets] if isinstance(targets, str) else list(targets)
            addrs: List[str] = []
            for t in vals:
                addrs += list(addresses[t]) if t in addresses else [dead()] if t == DEAD \
                    else [t]
            entries[n] = addrs
        out[h.name] = HostNames(hostname=name, entries=entries, sysctl=dict(h.sysctl),
                                mtu=h.mtu)
    return out

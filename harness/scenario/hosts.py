"""A scenario's hosts and the services of its own network (pure): ``hosts:`` entries
(``Host``: a network namespace, and optionally a whole machine: a name, hosts-file lines,
kernel settings, an MTU), the run's own name server (``dns:``) and etcd (``etcd:``), and the
checks that look at several hosts at once (:func:`check_hosts`, :meth:`Dns.check_records`),
which the scenario's own validators call.
"""

from __future__ import annotations

from typing import Annotated, Any, Dict, List, Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from ..core.limits import MAX_ADDR, MAX_HOSTS, MAX_SHORT, MAX_TEXT, MAX_WORLD, located
from .parts import Strict

_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"       # one label of a host name
HOSTNAME_RE = rf"^{_LABEL}(\.{_LABEL})*$"


class Host(Strict):
    # the topology's own rule: starts with a letter or digit, at most 16 characters
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,15}$",
                      description="host name (a namespace): 1-16 of [A-Za-z0-9_-], starting with "
                      "a letter or digit")
    ranks: int = Field(1, ge=1, le=MAX_WORLD, description="ranks on this host")
    python: Optional[str] = Field(None, min_length=1, max_length=MAX_TEXT,
                                  description="the interpreter of this host's ranks (another "
                                  "venv, another torch); default: the harness's own")
    # -- the host as a whole machine (a UTS namespace, its own files, its kernel settings) --
    hostname: Optional[str] = Field(
        None, pattern=HOSTNAME_RE, max_length=63,
        description="the host's own name (gethostname(), socket.getfqdn(), torchrun's "
        "rendezvous): a UTS namespace of its own; default: the machine's name, shared by every "
        "host (or the host's own name with hostnames: own)")
    resolves_self: Optional[str] = Field(
        None, max_length=MAX_ADDR,
        description="what the host's own name resolves to in its own hosts file: 'link' (its "
        "address on the run's link; the default), 'none' (not at all) or a loopback address "
        "(Debian's 127.0.1.1 line)")
    knows: Union[Literal["all", "none"], List[str]] = Field(
        "all", max_length=MAX_HOSTS, description="which other hosts' names its hosts file "
        "lists: all, none, or a list of host names (only hosts with their own name count)")
    names: Dict[Annotated[str, Field(pattern=HOSTNAME_RE, max_length=MAX_ADDR)],
                Union[str, List[str]]] = Field(
        default_factory=dict, max_length=64,
        description="more lines of its hosts file: a name -> a host of the scenario (its "
        "address), an address of the run or a loopback address, or a list of them in order; "
        "[] makes the name unknown on this host")
    sysctl: Dict[str, Union[int, str]] = Field(
        default_factory=dict, max_length=32,
        description="kernel settings of the host's own network namespace, e.g. "
        "net.core.somaxconn: 8, net.ipv4.tcp_syn_retries: 1 (only keys a network namespace "
        "owns; harness.net.hostspec.SYSCTL_KEYS lists them)")
    mtu: Optional[int] = Field(None, ge=68, le=65535,
                               description="the MTU of the host's link interface")

    @field_validator("sysctl")
    @classmethod
    def _sysctl(cls, v: Dict[str, Any]) -> Dict[str, str]:
        from ..net.hostspec import sysctl_problem

        out = {}
        for key, value in v.items():
            why = sysctl_problem(key, value)
            if why:
                raise ValueError(why)
            out[key] = str(value)
        return out

    @field_validator("resolves_self")
    @classmethod
    def _self(cls, v: Optional[str]) -> Optional[str]:
        from ..net.hostspec import resolves_self_problem

        why = None if v is None else resolves_self_problem(v)
        if why:
            raise ValueError(why)
        return v

    def is_whole_machine(self) -> bool:
        """It asks for more than a network namespace's link: a name, files or settings."""
        return bool(self.hostname or self.resolves_self or self.names or self.sysctl
                    or self.mtu is not None or self.knows != "all")


DNS_NAME_RE = r"^[a-z0-9]([a-z0-9-]{0,62})(\.[a-z0-9]([a-z0-9-]{0,62}))*$"


class Etcd(Strict):
    """The run's own etcd (``etcd:``), for torchrun's ``etcd`` / ``etcd-v2`` rendezvous: one
    member with ``--enable-v2``, its data directory and leased ports in the run directory
    (harness.services.etcd, harness.faults._etcd)."""

    host: str = Field(
        "etcd", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,15}$",
        description="where it runs: a host of its own of this name (the default 'etcd': no "
        "ranks on it, on the run's link, at its last addresses like the name server's), a "
        "host of the scenario (in that host's namespace, on its address, beside that agent), "
        "or 'loopback' (127.0.0.1 of a single-host run, in the machine's network namespace "
        "when the run has none: no namespaces needed)")
    binary: Optional[str] = Field(
        None, max_length=MAX_SHORT, description="the etcd program (default: etcd on PATH, "
        "Debian's etcd-server)")

    def own_host(self, scenario_hosts: List[str]) -> bool:
        """It runs on a host of its own (not a scenario host, not loopback)."""
        return self.host != "loopback" and self.host not in scenario_hosts


class Dns(Strict):
    """The run's own name server (``dns:``): dnsmasq on a host of its own, with no upstream;
    every scenario host resolves through it (harness.services.dns)."""

    domain: Optional[str] = Field(
        None, pattern=DNS_NAME_RE, max_length=MAX_ADDR,
        description="search domain written into every host's resolv.conf; a record without a "
        "dot is this name under it")
    records: Dict[Annotated[str, Field(pattern=DNS_NAME_RE, max_length=MAX_ADDR)],
                  Union[Annotated[str, Field(max_length=MAX_ADDR)],
                        Annotated[List[Annotated[str, Field(max_length=MAX_ADDR)]],
                                  Field(min_length=1, max_length=8)]]] = Field(
        default_factory=dict, max_length=MAX_HOSTS,
        description="name -> a host of the scenario (its addresses: A and/or AAAA by ip; "
        "HOST/4 only its A, HOST/6 only its AAAA), 'dead' (an address of the run where no "
        "host is), a loopback address, or a list of them in order")
    master: Optional[str] = Field(
        None, pattern=DNS_NAME_RE, max_length=MAX_ADDR,
        description="MASTER_ADDR of every rank: a name the ranks ask the server (a short name "
        "goes through the search domain); null (the default): the master host's address, also "
        "in a case that overrides a file's dns: with master: null")
    ptr: bool = Field(True, description="PTR records for every record's addresses; false: "
                      "none (every reverse lookup of the run is NXDOMAIN; the names are then "
                      "answered by the harness's responder behind dnsmasq)")
    timeout: int = Field(5, ge=1, le=30, description="resolv.conf options timeout: (glibc's "
                         "default 5)")
    attempts: int = Field(2, ge=1, le=5, description="resolv.conf options attempts: (glibc's "
                          "default 2)")
    host: str = Field("dns", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,15}$",
                      description="the name of the server's own host (no ranks on it)")

    def fqdn(self, name: str) -> str:
        """A record's full name (a short one under the domain)."""
        return name if "." in name or not self.domain else f"{name}.{self.domain}"

    @model_validator(mode="after")
    def _short_names(self) -> Dns:
        short = [n for n in self.records if "." not in n]
        if short and not self.domain:
            raise located("records", f"{short[0]!r} is a short name: give domain: (the search "
                          "domain it lives under) or write the full name")
        return self

    def check_records(self, names: List[str]) -> None:
        """Its host is none of the scenario's hosts (``names``), and each record is one of
        them, 'dead' or a loopback address (located at the scenario's ``dns``)."""
        import ipaddress

        if self.host in names:
            raise located("dns", f"host {self.host!r} is the name server's own host: name "
                          "yours otherwise, or give dns: host: another name")
        for rec, targets in self.records.items():
            for t in [targets] if isinstance(targets, str) else targets:
                host, _, fam = t.partition("/")
                if (host in names and fam in ("", "4", "6")) or t == "dead":
                    continue
                try:
                    ip = ipaddress.ip_address(t)
                except ValueError:
                    raise located("dns", f"record {rec!r}: {t!r} is not a host of the scenario "
                                  f"({', '.join(names)}; HOST/4 or HOST/6 for one "
                                  "family), 'dead' or an IP address") from None
                if not ip.is_loopback:
                    raise located("dns", f"record {rec!r}: {t} is outside the run: a record "
                                  "may only be a host of the scenario, 'dead' (an address of "
                                  "the run's own network) or loopback")


def check_hosts(hosts: List[Host], hostnames: str) -> List[str]:
    """The scenario's hosts among themselves (``hostnames``: its ``hostnames:``): the hosts
    each one knows and its names: entries are hosts of the scenario, no two hosts share a host
    name or a name. Returns their names, in order (errors located at the scenario's
    ``hosts``)."""
    names = [h.name for h in hosts]
    for i, h in enumerate(hosts):
        known = [] if isinstance(h.knows, str) else h.knows
        for other in known:
            if other not in names:
                raise located(("hosts", i, "knows"), f"{other!r} is not one of "
                              f"the hosts {names}")
    from ..net.hostspec import names_entry_problem

    for j, h in enumerate(hosts):
        for entry, targets in h.names.items():
            for t in [targets] if isinstance(targets, str) else targets:
                why = names_entry_problem(t, names)
                if why:
                    raise located(("hosts", j, "names", entry), why)
    own = [h.hostname or (h.name if hostnames == "own" else None)
           for h in hosts]
    dupes = sorted({n for n in own if n and own.count(n) > 1})
    if dupes:
        raise located("hosts", f"two hosts with the host name {dupes[0]!r}: give each "
                      "its own")
    if len(set(names)) != len(names):
        raise located("hosts", f"host names must be unique: {names}")
    return names

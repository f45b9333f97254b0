"""A topology's firewall: every nftables rule a run adds, removes and reads back.

Each host namespace has one table ``inet <prefix without its dash>`` (``thx``) with base chains
``input`` and ``output`` (filter hooks, priority 0, policy accept) and a regular chain
``conntrack`` whose one ``ct state`` rule, never jumped to, turns connection tracking on from
the start (so that a later ``ct state new`` rule sees the connections made before it as
established). Every rule goes there, inside the host's namespace, through nftables' JSON
interface only (``nft -j``, :mod:`harness.net.nft`): rules go in as JSON, their handles come
back as JSON, and whether a table or rule is still there is asked (``nft -j list``), never read
from an error's words.

Firewall rules match every interface of the host, loopback included: a process dialing its own
host's address is subject to them, as it would be behind a host packet filter that filters
``lo`` too. Random drops act on the host's link (``ifname``) only. Cuts drop, on each side,
inbound packets whose source is a host of the other side.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Union

from . import nft as nftjson
from .addresses import TopologyBase
from .netns import NETNS_RUN_DIR, TopologyError, _run

Action = Literal["drop", "reject"]
Direction = Literal["in", "out"]
LossDirection = Literal["in", "out", "both"]
Proto = Literal["tcp", "udp"]
Ports = Union[Literal["all"], int, Sequence[int], Tuple[int, int], Mapping[str, Sequence[int]]]
"""``"all"``; a port or a list of ports; a 2-tuple ``(low, high)`` for an inclusive range;
``{"except": [ports]}`` for every port but these."""


@dataclass(frozen=True)
class _Rule:
    host: str
    chain: str
    nft_handle: int


# --------------------------------------------------------------------------------------------
# nft rule expressions (JSON, harness.net.nft)


def _port_list(ports: Sequence[int]) -> List[int]:
    values = [_check_port(p) for p in ports]
    if not values:
        raise ValueError("a port list must not be empty")
    return sorted(set(values))


def _check_port(port: object) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"a port must be an integer in 1..65535, got {port!r}")
    return port


def _ports_value(ports: List[int]) -> Union[int, List[int]]:
    """One port as itself, several as a set (what nft itself keeps of a one-element set)."""
    return ports[0] if len(ports) == 1 else ports


def _port_match(proto: str, ports: Ports) -> Tuple[nftjson.Expr, bool]:
    """nft match (JSON) for the destination ports, and whether it is an 'every port but' match."""
    dport = nftjson.payload(proto, "dport")
    if isinstance(ports, str):
        if ports != "all":
            raise ValueError(
                f"ports must be 'all', a port list, a (low, high) range or "
                f"{{'except': [...]}}, got {ports!r}"
            )
        return nftjson.match(nftjson.meta("l4proto"), proto), False
    if isinstance(ports, Mapping):
        if set(ports) != {"except"}:
            raise ValueError(f"a ports mapping must be {{'except': [ports]}}, got {ports!r}")
        return nftjson.match(dport, _ports_value(_port_list(ports["except"])), "!="), True
    if isinstance(ports, tuple):
        if len(ports) != 2:
            raise ValueError(f"a port range is a (low, high) tuple, got {ports!r}")
        low, high = _check_port(ports[0]), _check_port(ports[1])
        if low > high:
            raise ValueError(f"port range {ports!r} has low > high")
        return nftjson.match(dport, {"range": [low, high]}), False
    if isinstance(ports, int):
        return nftjson.match(dport, _check_port(ports)), False
    return nftjson.match(dport, _ports_value(_port_list(list(ports)))), False


class Firewall(TopologyBase):
    """The nftables part of a Topology: the hosts' tables, filter rules, redirects to a proxy,
    cuts, random drops and counting rules, each behind a handle."""

    _rules: Dict[str, List[_Rule]]   # handle -> the rules behind it
    _counter: int                    # handles made so far

    def _nft(self, netns: str, commands: Sequence[nftjson.Expr]) -> Dict[str, Any]:
        """One batch of JSON commands (``nft -j --echo --handle -f -``: all or nothing); what
        nft echoed back (the added objects with their handles), as JSON."""
        out = _run(["ip", "netns", "exec", netns, "nft", "-j", "--echo", "--handle", "-f", "-"],
                   stdin=nftjson.script(commands)).stdout
        try:
            return dict(json.loads(out)) if out.strip() else {}
        except ValueError as exc:
            raise TopologyError(f"nft in {netns} echoed no JSON ({exc}): {out[:300]}") from exc

    def _nft_list(self, netns: str, *what: str) -> Dict[str, Any]:
        """``nft -j list WHAT`` in the namespace, as JSON."""
        out = _run(["ip", "netns", "exec", netns, "nft", "-j", "list", *what]).stdout
        try:
            return dict(json.loads(out))
        except ValueError as exc:
            raise TopologyError(f"nft -j list {' '.join(what)} in {netns} gave no JSON ({exc}): "
                                f"{out[:300]}") from exc

    def _has_table(self, netns: str) -> bool:
        """Whether the namespace still exists and holds the run's table (asked, not guessed
        from an error's words)."""
        if not (NETNS_RUN_DIR / netns).exists():
            return False
        return ("inet", self.table) in nftjson.tables_of(self._nft_list(netns, "tables"))

    def _delete_table(self, netns: str) -> None:
        """Remove the run's table from a namespace (no error when it or the namespace is
        gone)."""
        if self._has_table(netns):
            self._nft(netns, [nftjson.delete_table("inet", self.table)])

    def _add_tables(self) -> None:
        """The run's table in every host's namespace (as the module's doc says)."""
        table = [
            nftjson.add_table("inet", self.table),
            nftjson.add_chain("inet", self.table, "input", type="filter", hook="input", prio=0),
            nftjson.add_chain("inet", self.table, "output", type="filter", hook="output",
                              prio=0),
            # connection tracking from the namespace's birth: a ct expression loaded in any
            # chain turns it on. Without it, the first `ct state new` rule (firewall ports:
            # data, added mid-run) turned it on late and saw the mesh's live connections as
            # new: their next inbound packet was dropped (1 packet, 100 bytes, in a catalog
            # run under load), so "new connections only" hit an established one
            {"add": {"chain": {"family": "inet", "table": self.table, "name": "conntrack"}}},
            nftjson.add_rule("inet", self.table, "conntrack", [nftjson.ct_state("established")],
                             comment="track connections from the start"),
        ]
        for host in self._hosts.values():
            self._nft(host.netns, table)

    def _add_rules(self, kind: str,
                   rules: Mapping[str, Sequence[Tuple[str, Sequence[nftjson.Expr]]]]) -> str:
        """Add rules (host -> [(chain, rule expressions)]) atomically per host; return a
        handle."""
        self._require_up()
        self._counter += 1
        handle = f"{kind}{self._counter}"
        added: List[_Rule] = []
        try:
            for host, chain_rules in rules.items():
                netns = self.host(host).netns
                echoed = self._nft(netns, [
                    nftjson.add_rule("inet", self.table, chain, expr, comment=handle)
                    for chain, expr in chain_rules])
                got = [_Rule(host, str(r["chain"]), int(r["handle"]))
                       for r in nftjson.rules_of(echoed)
                       if r.get("comment") == handle and "handle" in r]
                added.extend(got)
                if len(got) != len(chain_rules):
                    raise TopologyError(
                        f"nft in {netns} did not echo a handle for every rule of {handle}: "
                        f"{json.dumps(echoed)[:500]}"
                    )
        except BaseException:
            self._delete_rules(added)
            raise
        self._rules[handle] = added
        return handle

    def _delete_rules(self, rules: Sequence[_Rule]) -> None:
        """Remove rules by their handles: per host, those the table still holds (listed first,
        so that a rule already gone never fails the batch that removes the others)."""
        by_host: Dict[str, List[_Rule]] = {}
        for rule in rules:
            by_host.setdefault(rule.host, []).append(rule)
        for host, host_rules in by_host.items():
            netns = self.host(host).netns
            if not self._has_table(netns):
                continue
            there = {(str(r.get("chain")), r.get("handle"))
                     for r in nftjson.rules_of(self._nft_list(netns, "table", "inet",
                                                              self.table))}
            gone = [nftjson.delete_rule("inet", self.table, r.chain, r.nft_handle)
                    for r in host_rules if (r.chain, r.nft_handle) in there]
            if gone:
                self._nft(netns, gone)

    def rules_json(self, host: str) -> Dict[str, Any]:
        """The host's nftables table as ``nft -j list table`` gives it."""
        self._require_up()
        return self._nft_list(self.host(host).netns, "table", "inet", self.table)

    def rules(self, host: str) -> str:
        """The host's nftables table in nft's own text (what ``nft -a list table`` prints),
        rendered from its JSON (for reports and the diagnosis)."""
        return nftjson.render_table(self.rules_json(host))

    def _peer_addr(self, peer: str) -> str:
        if peer in self._hosts:
            return self._hosts[peer].addr
        try:
            return str(ipaddress.ip_address(peer))
        except ValueError:
            raise ValueError(
                f"peer must be a host of this topology or an IP address, got {peer!r}"
            ) from None

    def filter_rule(
        self,
        host: str,
        *,
        action: Action,
        direction: Direction,
        ports: Ports,
        proto: Proto = "tcp",
        peer: Optional[str] = None,
        new_only: Optional[bool] = None,
        counter: bool = False,
    ) -> str:
        """Drop or reject packets at a host; return a handle for :meth:`remove_rule`.

        ``direction="in"`` matches packets arriving at the host whose destination port is in
        ``ports`` (input chain); ``"out"`` matches packets the host sends to such a port
        (output chain). ``peer`` (a host name or IPv4 address) narrows the rule to packets
        from (in) or to (out) that peer. ``reject`` answers TCP with a reset and anything else
        with ICMP port-unreachable. ``new_only`` adds ``ct state new`` so that only new
        connections are hit and established ones keep working; by default it is on for
        ``{"except": [...]}`` (otherwise the replies of the excepted connections, which come
        back to ephemeral ports, would be dropped too) and off otherwise (so a rule cuts live
        connections as well). ``counter``: the rule counts the packets and bytes it matched
        (read back with :meth:`rule_counters`: a fault's evidence that it acted).
        """
        self._require_up()
        self.host(host)
        if action not in ("drop", "reject"):
            raise ValueError(f"action must be 'drop' or 'reject', got {action!r}")
        if direction not in ("in", "out"):
            raise ValueError(f"direction must be 'in' or 'out', got {direction!r}")
        if proto not in ("tcp", "udp"):
            raise ValueError(f"proto must be 'tcp' or 'udp', got {proto!r}")
        parts: List[nftjson.Expr] = []
        if peer is not None:
            paddr = self._peer_addr(peer)
            family = "ip6" if ":" in paddr else "ip"
            parts.append(nftjson.match(
                nftjson.payload(family, "saddr" if direction == "in" else "daddr"), paddr))
        match, is_except = _port_match(proto, ports)
        parts.append(match)
        if is_except if new_only is None else new_only:
            parts.append(nftjson.ct_state("new"))
        if counter:
            parts.append({"counter": None})
        if action == "drop":
            parts.append({"drop": None})
        elif proto == "tcp":
            parts.append({"reject": {"type": "tcp reset"}})
        else:
            parts.append({"reject": {"type": "icmpx", "expr": "port-unreachable"}})
        chain = "input" if direction == "in" else "output"
        return self._add_rules("fw", {host: [(chain, parts)]})

    def redirect(
        self,
        host: str,
        *,
        ports: Ports,
        in_port: int,
        out_port: int,
        mark: int,
    ) -> str:
        """Send the host's TCP connections to ``ports`` through a proxy listening in the host
        (nftables ``redirect``, in ``nat`` chains of the host's own table); returns a handle for
        :meth:`remove_rule`.

        Connections arriving at the host (prerouting) go to ``in_port``, connections the host
        opens (output, loopback ones included) to ``out_port``; the proxy finds where each was
        going with ``SO_ORIGINAL_DST``. Connections of sockets carrying firewall mark ``mark``
        (the proxy's own, on their way to the real destination) pass unchanged, as do
        connections to the proxy's two ports. NAT acts on a connection's first packet only:
        connections open before the rule keep their path.
        """
        self._require_up()
        net = self.host(host)
        for port in (in_port, out_port):
            _check_port(port)
        if isinstance(mark, bool) or not isinstance(mark, int) or not 0 < mark < 2**32:
            raise ValueError(f"mark must be an integer in 1..2**32-1, got {mark!r}")
        match, _ = _port_match("tcp", ports)
        own = nftjson.match(nftjson.payload("tcp", "dport"),
                            _ports_value(_port_list([in_port, out_port])), "!=")
        self._nft(net.netns, [
            nftjson.add_chain("inet", self.table, "nat_in", type="nat", hook="prerouting",
                              prio=-100),
            nftjson.add_chain("inet", self.table, "nat_out", type="nat", hook="output",
                              prio=-100),
        ])
        not_own = nftjson.match(nftjson.meta("mark"), mark, "!=")
        return self._add_rules(
            "redir",
            {
                host: [
                    ("nat_in", [match, own, {"redirect": {"port": in_port}}]),
                    ("nat_out", [not_own, match, own, {"redirect": {"port": out_port}}]),
                ]
            },
        )

    def rule_counters(self, host: str, handle: str,
                      chain: Optional[str] = None) -> Dict[str, int]:
        """The packets and bytes the rules behind ``handle`` (made with ``counter``) matched so
        far, summed over them (``chain``: only that chain's), read from the host's table (``nft
        -j list table``)."""
        self._require_up()
        rules = self._rules.get(handle)
        if rules is None:
            raise ValueError(f"no active rule {handle!r}; active: {sorted(self._rules)}")
        mine = {(r.chain, r.nft_handle) for r in rules
                if r.host == host and (chain is None or r.chain == chain)}
        listing = self._nft_list(self.host(host).netns, "table", "inet", self.table)
        return nftjson.counters_of(listing, mine)

    def remove_rule(self, host: str, handle: str) -> None:
        """Remove the rules behind a handle from :meth:`filter_rule` or :meth:`random_drop`."""
        self._require_up()
        rules = self._rules.get(handle)
        if rules is None:
            raise ValueError(f"no active rule {handle!r}; active: {sorted(self._rules)}")
        if any(rule.host != host for rule in rules):
            raise ValueError(f"rule {handle!r} does not belong to host {host!r}")
        self._delete_rules(rules)
        del self._rules[handle]

    def cut(self, group_a: Sequence[str], group_b: Sequence[str], counter: bool = False) -> str:
        """Cut every packet between the two groups (both ways, live connections too).

        Each host drops inbound packets from the other group's addresses, so senders see
        silence, not errors. Returns a handle for :meth:`heal`. ``counter``: each host's rule
        counts what it dropped (:meth:`rule_counters`).
        """
        self._require_up()
        if not self.link:
            raise ValueError("a cut needs a linked topology (several hosts or link=True)")
        a, b = list(group_a), list(group_b)
        if not a or not b:
            raise ValueError("both sides of a cut need at least one host")
        if set(a) & set(b):
            raise ValueError(f"hosts on both sides of a cut: {sorted(set(a) & set(b))}")
        for name in a + b:
            self.host(name)

        def drops(group: Sequence[str]) -> List[Tuple[str, List[nftjson.Expr]]]:
            out = []
            for family, attr in (("ip", "addr4"), ("ip6", "addr6")):
                found = [getattr(self._hosts[n], attr) for n in group]
                if all(found):
                    saddr = nftjson.match(nftjson.payload(family, "saddr"),
                                          found[0] if len(found) == 1 else found)
                    out.append(("input", [saddr, *([{"counter": None}] if counter else []),
                                          {"drop": None}]))
            return out

        rules: Dict[str, List[Tuple[str, List[nftjson.Expr]]]] = {}
        for name in a:
            rules[name] = drops(b)
        for name in b:
            rules[name] = drops(a)
        return self._add_rules("cut", rules)

    def heal(self, handle: str) -> None:
        """Remove a cut (or any other rule handle)."""
        self._require_up()
        rules = self._rules.pop(handle, None)
        if rules is None:
            raise ValueError(f"no active rule {handle!r}; active: {sorted(self._rules)}")
        self._delete_rules(rules)

    def random_drop(self, host: str, percent: float, direction: LossDirection = "both",
                    counter: bool = False) -> str:
        """Drop ``percent`` % of the packets on the host's link, at random; returns a handle.

        Uses ``numgen random mod 10000 < percent*100`` (0.01 % steps); 100 % is a plain drop.
        On a loopback-only host both directions are the same packets, so ``both`` compounds.
        ``counter``: each rule (chain ``input`` for in, ``output`` for out) counts the packets
        it dropped (:meth:`rule_counters`).
        """
        self._require_up()
        net = self.host(host)
        if isinstance(percent, bool) or not isinstance(percent, (int, float)):
            raise ValueError(f"percent must be a number, got {percent!r}")
        if not 0 <= percent <= 100:
            raise ValueError(f"percent must be within 0..100, got {percent!r}")
        if direction not in ("in", "out", "both"):
            raise ValueError(f"direction must be 'in', 'out' or 'both', got {direction!r}")
        threshold = round(percent * 100)
        verdict: List[nftjson.Expr] = [*([{"counter": None}] if counter else []),
                                       {"drop": None}]
        if threshold < 10000:
            verdict.insert(0, nftjson.match(
                {"numgen": {"mode": "random", "mod": 10000, "offset": 0}}, threshold, "<"))
        chain_rules: List[Tuple[str, List[nftjson.Expr]]] = []
        if direction in ("in", "both"):
            chain_rules.append(("input", [nftjson.match(nftjson.meta("iifname"), net.ifname),
                                          *verdict]))
        if direction in ("out", "both"):
            chain_rules.append(("output", [nftjson.match(nftjson.meta("oifname"), net.ifname),
                                           *verdict]))
        return self._add_rules("loss", {host: chain_rules})


    def count_link(self, host: str, ifname: str, family: str = "ipv4") -> str:
        """Count the IPv4 packets the host sends out of ``ifname`` (chain ``output``) and
        receives on it (chain ``input``), with two nft rules that only count (no verdict);
        returns a handle for :meth:`rule_counters` and :meth:`remove_rule`. IPv4 only: an
        interface that is up sends IPv6 neighbour and router messages of its own, which are not
        traffic of the run's programs. ``family="ipv6"``: IPv6 TCP packets only (a card with
        only a link-local address), for the same reason."""
        match = [nftjson.match(nftjson.meta("nfproto"), "ipv4")] if family == "ipv4" else \
            [nftjson.match(nftjson.meta("nfproto"), "ipv6"),
             nftjson.match(nftjson.meta("l4proto"), "tcp")]
        return self._add_rules("count", {host: [
            ("output", [nftjson.match(nftjson.meta("oifname"), ifname), *match,
                        {"counter": None}]),
            ("input", [nftjson.match(nftjson.meta("iifname"), ifname), *match,
                       {"counter": None}])]})

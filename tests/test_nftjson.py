"""harness.nftjson: rules built as nft JSON, and the rules in force rendered back to nft's text.

The pure tests pin the rendering of JSON that nft 1.0.6 itself gave (``nft -j list table``);
the real test makes every kind of rule the topology adds, in real namespaces, and asserts the
rendering from ``nft -j list table`` is character for character what ``nft -a list table``
prints, so that reports and the diagnosis quote rules exactly as before.
"""

from __future__ import annotations

import subprocess
import uuid
from typing import Any, Dict, List

import pytest

from harness.net import nft as nftjson
from harness.net.topology import Topology, missing


def _rule(chain: str, handle: int, comment: str, expr: List[Dict[str, Any]]) -> Dict[str, Any]:
    return {"family": "inet", "table": "thx", "chain": chain, "handle": handle,
            "comment": comment, "expr": expr}


DPORT = {"payload": {"protocol": "tcp", "field": "dport"}}


@pytest.mark.parametrize("expr, text", [
    ([{"match": {"op": "==", "left": DPORT, "right": 1234}}, {"drop": None}],
     'tcp dport 1234 drop comment "fw1" # handle 5'),
    ([{"match": {"op": "!=", "left": DPORT, "right": {"set": [29500, 29501]}}},
      {"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": "new"}},
      {"reject": {"type": "tcp reset"}}],
     'tcp dport != { 29500, 29501 } ct state new reject with tcp reset comment "fw1" # handle 5'),
    ([{"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "udp"}},
      {"reject": {"type": "icmpx", "expr": "port-unreachable"}}],
     'meta l4proto udp reject comment "fw1" # handle 5'),
    ([{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}},
                 "right": {"set": ["10.0.0.2", "10.0.0.3"]}}}, {"drop": None}],
     'ip saddr { 10.0.0.2, 10.0.0.3 } drop comment "fw1" # handle 5'),
    ([{"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "eth0"}},
      {"match": {"op": "<", "left": {"numgen": {"mode": "random", "mod": 10000, "offset": 0}},
                 "right": 250}}, {"drop": None}],
     'iifname "eth0" numgen random mod 10000 < 250 drop comment "fw1" # handle 5'),
    ([{"match": {"op": "!=", "left": {"meta": {"key": "mark"}}, "right": 42}},
      {"match": {"op": "==", "left": DPORT, "right": {"range": [100, 200]}}},
      {"redirect": {"port": 4001}}],
     'meta mark != 0x0000002a tcp dport 100-200 redirect to :4001 comment "fw1" # handle 5'),
])
def test_a_rule_renders_as_nft_prints_it(expr: List[Dict[str, Any]], text: str) -> None:
    assert nftjson.render_rule(_rule("input", 5, "fw1", expr)) == text


def test_an_unknown_statement_is_written_as_its_json_not_dropped() -> None:
    text = nftjson.render_rule(_rule("input", 1, "x", [{"queue": {"num": 3}}]))
    assert text == '{"queue": {"num": 3}} comment "x" # handle 1'


def test_rules_of_reads_echoed_adds_and_listings() -> None:
    r = _rule("input", 7, "fw1", [{"drop": None}])
    assert nftjson.rules_of({"nftables": [{"add": {"rule": r}}]}) == [r]
    assert nftjson.rules_of({"nftables": [{"metainfo": {}}, {"rule": r}]}) == [r]


_MISSING = missing()


@pytest.mark.skipif(bool(_MISSING), reason="; ".join(_MISSING) or "-")
def test_the_rendering_is_what_nft_prints_for_every_kind_of_rule_the_topology_adds() -> None:
    with Topology("n" + uuid.uuid4().hex[:10], ["a", "b", "c"], ip="dual") as topo:
        b = topo.host("b").addr
        topo.filter_rule("a", action="drop", direction="in", ports=1234)
        topo.filter_rule("a", action="reject", direction="in", ports="all", proto="udp")
        topo.filter_rule("a", action="reject", direction="out", ports=[29500, 29400], peer="b")
        topo.filter_rule("a", action="drop", direction="in", ports=(1000, 2000), new_only=True)
        topo.filter_rule("a", action="drop", direction="in", ports={"except": [29500]})
        topo.filter_rule("a", action="reject", direction="out", ports={"except": [1, 2]},
                         peer=topo.host("c").addr6)
        topo.filter_rule("a", action="drop", direction="in", ports="all", peer=b)
        topo.cut(["a"], ["b", "c"])
        topo.cut(["b"], ["c"])
        topo.random_drop("a", 12.5)
        topo.random_drop("b", 100, "out")
        topo.redirect("c", ports=[29500], in_port=4000, out_port=4001, mark=0x2A)
        topo.redirect("c", ports="all", in_port=4002, out_port=4003, mark=7)
        for host in ("a", "b", "c"):
            printed = subprocess.run(
                topo.exec_prefix(host) + ["nft", "-a", "list", "table", "inet", topo.table],
                capture_output=True, text=True, check=True, timeout=30).stdout
            assert topo.rules(host) == printed

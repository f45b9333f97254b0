"""IPv6 and dual stack (``ip: 6`` / ``ip: dual``): the run's own unique local addresses, the
MASTER_ADDR and tcp:// URL each family gives, and address safety for IPv6 exactly as for IPv4.
Pure (planning, the topology's constructor, the loader); the real runs are the catalog's
``net-ipv6`` scenarios."""

from __future__ import annotations

import ipaddress
import textwrap

import pytest

from harness.core.protocol import url_host
from harness.net.safety import refuse_address
from harness.net.topology import Topology
from harness.run.plan import make_plan
from harness.scenario.loader import ScenarioFileError, load_text

TWO = """\
name: s
about: why
hosts: [{name: a}, {name: b}]
"""


def load(text: str):
    (scn,) = load_text(textwrap.dedent(text), "s.yaml")
    return scn


def plan_of(text: str, counter_ports, netns: bool = True):
    return make_plan(load(text), "/tmp/x", counter_ports, netns=netns, run_id="v6run")


def test_ip_6_gives_hosts_unique_local_addresses_of_the_run_only():
    topo = Topology("v6run", ["a", "b"], ip="6")
    a, b = topo.hosts["a"], topo.hosts["b"]
    assert (a.addr4, b.addr4) == ("", "")
    assert a.addr == a.addr6 and b.addr == b.addr6
    for addr in (a.addr6, b.addr6):
        ip = ipaddress.IPv6Address(addr)
        assert ip in ipaddress.IPv6Network("fd00::/8") and ip.is_private   # ULA, never routed
        assert ip in topo.network6
    assert ipaddress.IPv6Address(b.addr6) == ipaddress.IPv6Address(a.addr6) + 1
    # another run, another /64
    assert Topology("other", ["a"], ip="6", link=True).network6 != topo.network6


def test_ip_dual_gives_both_and_ranks_use_the_ipv4_one():
    topo = Topology("v6run", ["a", "b"], ip="dual")
    a = topo.hosts["a"]
    assert a.addr == a.addr4 and ipaddress.ip_address(a.addr4).version == 4
    assert ipaddress.ip_address(a.addr6).version == 6


def test_ip_4_is_the_default_and_has_no_ipv6_address():
    a = Topology("v6run", ["a", "b"]).hosts["a"]
    assert a.addr6 == "" and a.addr == a.addr4


def test_an_unknown_family_is_refused():
    with pytest.raises(ValueError, match="ip must be one of"):
        Topology("v6run", ["a"], ip="5")
    with pytest.raises(ScenarioFileError, match="ip"):
        load(TWO + "ip: 5\n")


def test_ip_6_makes_master_addr_an_ipv6_literal(counter_ports):
    p = plan_of(TWO + "ip: 6\n", counter_ports)
    assert p.ip == "6"
    addr = p.rank(0).env["MASTER_ADDR"]
    assert ipaddress.ip_address(addr).version == 6 and addr == p.host("a").addr6
    assert p.rank(1).env["MASTER_ADDR"] == addr


def test_ip_6_tcp_init_brackets_the_literal(counter_ports):
    p = plan_of(TWO + "ip: 6\ninit: tcp\n", counter_ports)
    url = p.rank(1).init.url
    assert url == f"tcp://[{p.host('a').addr6}]:{p.master_port}"


def test_single_host_ip_6_uses_the_ipv6_loopback(counter_ports):
    p = plan_of("name: s\nabout: why\nworld_size: 2\nip: 6\n", counter_ports, netns=False)
    assert p.rank(0).env["MASTER_ADDR"] == "::1"
    assert not load("name: s\nabout: why\nip: 6\n").needs_namespaces()


def test_url_host_brackets_ipv6_only():
    assert url_host("::1") == "[::1]"
    assert url_host("[::1]") == "[::1]"
    assert url_host("127.0.0.1") == "127.0.0.1"
    assert url_host("localhost") == "localhost"


@pytest.mark.parametrize("addr, allowed", [
    ("::1", True),
    ("127.0.0.1", True),
    ("fd74:6878:1:2::1", False),          # looks like ours, but no run made it for this file
    ("fd00::1", False),
    ("fe80::1", False),                   # link-local: another machine on the segment
    ("2001:db8::1", False),
    ("::ffff:10.1.2.3", False),           # IPv4-mapped: the IPv4 rule still holds
    ("::ffff:127.0.0.1", True),           # IPv4-mapped loopback: a v6 socket reaches 127.0.0.1
    ("::", False),
    ("10.1.2.3", False),
])
def test_ipv6_addresses_are_refused_exactly_as_ipv4_ones(addr, allowed):
    assert (refuse_address(addr) is None) is allowed


def test_an_ipv6_master_addr_outside_loopback_is_a_located_error():
    with pytest.raises(ScenarioFileError) as e:
        load('name: s\nabout: why\nmaster_addr: "fd00::1"\n')
    assert "s.yaml:3: master_addr: fd00::1 is not a loopback address" in str(e.value)
    with pytest.raises(ScenarioFileError) as e:
        load('name: s\nabout: why\nenv: {MASTER_ADDR: "fe80::1"}\n')
    assert "env.MASTER_ADDR: fe80::1 is not a loopback address" in str(e.value)


def test_a_bracketed_master_addr_loads_and_reaches_torch_as_written(counter_ports):
    # issue 41: users write it; torch's own behaviour is the verdict, the plan says so
    assert refuse_address("[::1]") is None
    assert "[fd00::1]" in (refuse_address("[fd00::1]") or "")
    p = plan_of("name: s\nabout: why\nmaster_addr: \"[::1]\"\n", counter_ports)
    assert p.ranks[0].env["MASTER_ADDR"] == "[::1]"
    assert any("'[::1]' reaches torch as written (it stands for ::1)" in n for n in p.notes)


def test_unreachable_master_on_ipv6_hosts_stays_inside_the_runs_64(counter_ports):
    p = plan_of(TWO + "ip: 6\nfaults: [{kind: unreachable_master}]\n", counter_ports)
    addr = ipaddress.IPv6Address(p.rank(1).env["MASTER_ADDR"])
    assert addr in Topology("v6run", ["a", "b"], ip="6").network6
    assert addr == ipaddress.IPv6Address(p.host("a").addr6) - 1 + 250

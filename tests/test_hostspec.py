"""A host as a whole machine, the pure part: what the scenario says (located errors), what each
host's name, hosts file, kernel settings and MTU become in the plan, and bounds on the run's TCP
counters in expectations. The real runs are the catalog's net-hosts-as-machines.yaml; the
topology's side (UTS namespaces, sysctl, MTU, sweep) is tests/test_topology.py."""

from __future__ import annotations

import textwrap

import pytest

from harness.judge.classify import Verdict
from harness.net.hostspec import (
    DEAD,
    MACHINE,
    SYSCTL_KEYS,
    count_bound_problem,
    count_holds,
    host_names,
    sysctl_problem,
)
from harness.net.topology import Topology
from harness.run.plan import ShapeHosts, make_plan
from harness.scenario.expect import check
from harness.scenario.loader import ScenarioFileError, load_text


def load(text: str):
    (scn,) = load_text(textwrap.dedent(text), "s.yaml")
    return scn


def plan_of(text: str, counter_ports, run_id: str = "hs1"):
    return make_plan(load(text), "/tmp/x", counter_ports, netns=True, run_id=run_id)


TOPO = Topology("hs1", ["a", "b", "c"])
ADDR = {n: h.addr for n, h in TOPO.hosts.items()}


def test_plain_hosts_are_plain_and_add_no_step(counter_ports):
    p = plan_of("name: s\nabout: w\nhosts: [{name: a}, {name: b}]\n", counter_ports)
    assert all(h.machine.is_plain() for h in p.hosts)
    assert not any(isinstance(s, ShapeHosts) for s in p.steps)
    assert all("machine" not in h for h in p.to_dict()["hosts"])   # the plan's JSON unchanged


def test_own_names_know_each_other_and_resolve_to_their_links(counter_ports):
    p = plan_of("""\
        name: s
        about: w
        hostnames: own
        hosts: [{name: a}, {name: b}, {name: c, hostname: gamma}]
        """, counter_ports)
    m = {h.name: h.machine for h in p.hosts}
    assert [m[n].hostname for n in "abc"] == ["a", "b", "gamma"]
    assert m["a"].entries == {"a": [ADDR["a"]], "b": [ADDR["b"]], "gamma": [ADDR["c"]]}
    assert isinstance(p.steps[0], ShapeHosts)                      # before anything else
    assert p.to_dict()["hosts"][2]["machine"]["hostname"] == "gamma"


def test_resolves_self_knows_and_names(counter_ports):
    p = plan_of("""\
        name: s
        about: w
        hosts:
          - {name: a, hostname: alpha, resolves_self: 127.0.1.1, knows: none,
             names: {store: b, nowhere: dead, gone: []}}
          - {name: b, hostname: beta, resolves_self: none, knows: [a]}
          - {name: c, resolves_self: 127.0.1.1}
        """, counter_ports)
    m = {h.name: h.machine for h in p.hosts}
    dead = str(TOPO.network.network_address + 4)                    # after the three hosts
    assert m["a"].entries == {"alpha": ["127.0.1.1"], "store": [ADDR["b"]],
                              "nowhere": [dead], "gone": []}
    assert m["b"].entries == {"beta": [], "alpha": [ADDR["a"]]}
    assert m["c"].hostname == "" and m["c"].entries == {MACHINE: ["127.0.1.1"]}


def test_sysctl_and_mtu_go_to_the_plan_as_text(counter_ports):
    p = plan_of("""\
        name: s
        about: w
        hosts:
          - {name: a, sysctl: {net.core.somaxconn: 8, net.ipv4.ip_local_port_range: "40000 40100"},
             mtu: 1400}
          - {name: b}
        """, counter_ports)
    a = p.host("a").machine
    assert a.sysctl == {"net.core.somaxconn": "8", "net.ipv4.ip_local_port_range": "40000 40100"}
    assert a.mtu == 1400 and p.host("b").machine.is_plain()


def test_a_single_whole_host_needs_namespaces():
    scn = load("name: s\nabout: w\nhosts: [{name: a, ranks: 2, sysctl: "
               "{net.ipv4.tcp_syn_retries: 1}}]\n")
    assert scn.needs_namespaces()
    assert not load("name: s\nabout: w\nhosts: [{name: a, ranks: 2}]\n").needs_namespaces()


@pytest.mark.parametrize("hosts, line, says", [
    ("[{name: a, knows: [zz]}, {name: b}]", 3, "hosts[0].knows: 'zz' is not one of the hosts"),
    ("[{name: a}, {name: b, names: {x: 8.8.8.8}}]", 3,
     "hosts[1].names.x: 8.8.8.8: a hosts-file line may point only at"),
    ("[{name: a, sysctl: {kernel.panic: 1}}, {name: b}]", 3,
     "'kernel.panic' is not a kernel setting of a host's own network namespace"),
    ("[{name: a, sysctl: {net.core.somaxconn: lots}}, {name: b}]", 3, "an integer"),
    ("[{name: a, resolves_self: 10.0.0.1}, {name: b}]", 3, "not a loopback address"),
    ("[{name: a, hostname: x}, {name: b, hostname: x}]", 3, "two hosts with the host name 'x'"),
    ("[{name: a, hostname: 'bad_name'}, {name: b}]", 3, "hostname"),
    ("[{name: a, mtu: 20}, {name: b}]", 3, "mtu"),
])
def test_bad_hosts_are_located(hosts, line, says):
    with pytest.raises(ScenarioFileError) as e:
        load(f"name: s\nabout: w\nhosts: {hosts}\n")
    assert f"s.yaml:{line}:" in str(e.value) and says in str(e.value), str(e.value)


def test_sysctl_keys_are_network_namespace_keys_only():
    assert all(k.startswith("net.") for k in SYSCTL_KEYS)
    assert sysctl_problem("net.core.somaxconn", 0) is None
    assert sysctl_problem("net.core.somaxconn", True) is not None
    assert sysctl_problem("net.core.rmem_max", 1) is not None     # global, not per namespace


def test_count_bounds():
    assert count_bound_problem(">= 1") is None and count_bound_problem("lots") is not None
    assert count_holds(">= 1", 3) and not count_holds(">= 1", 0)
    assert count_holds("== 0", 0) and count_holds("< 5", 4) and not count_holds("> 4", 4)


def test_counter_expectations_are_checked_per_host_and_located():
    scn = load("""\
        name: s
        about: w
        hosts: [{name: a}, {name: b}]
        expect:
          job: ok
          counters:
            a: {TcpExt.ListenOverflows: ">= 1"}
        """)
    exp = scn.expect[0]
    ok = [Verdict(label=str(r), outcome="ok", phase="exit", duration=0.1) for r in (0, 1)]
    assert check(exp, ok, {"a": {"TcpExt.ListenOverflows": 2}}) == []
    (m,) = check(exp, ok, {"a": {}, "b": {"TcpExt.ListenOverflows": 5}})
    assert (m.label, m.field, m.expected, m.observed) == \
        ("host a", "counter TcpExt.ListenOverflows", ">= 1", "0")
    assert m.line == 6                                           # its counters: line
    assert check(exp, ok) == []                                   # counters unknown: unchecked
    with pytest.raises(ScenarioFileError, match=r"s.yaml:6: expect.counters: 'c' is not a host"):
        load("name: s\nabout: w\nhosts: [{name: a}, {name: b}]\nexpect:\n  job: ok\n"
             "  counters: {c: {Tcp.OutRsts: '>= 1'}}\n")
    with pytest.raises(ScenarioFileError, match="not a counter the harness keeps"):
        load("name: s\nabout: w\nhosts: [{name: a}, {name: b}]\nexpect:\n"
             "  counters: {a: {Tcp.Everything: '>= 1'}}\n")


def test_host_names_is_pure_over_addresses():
    scn = load("name: s\nabout: w\nhostnames: own\nhosts: [{name: a, names: {n: [b, dead]}},"
               " {name: b}]\n")
    got = host_names(scn, {"a": ["10.0.0.1"], "b": ["10.0.0.2", "fd00::2"]}, lambda: "10.0.0.9")
    assert got["a"].entries == {"a": ["10.0.0.1"], "b": ["10.0.0.2", "fd00::2"],
                                "n": ["10.0.0.2", "fd00::2", "10.0.0.9"]}
    assert DEAD == "dead"


def test_master_addr_may_be_a_name_the_runs_own_hosts_files_give():
    scn = load("name: s\nabout: w\nhostnames: own\nhosts: [{name: a}, {name: b, names: "
               "{store: a}}]\nenv: {MASTER_ADDR: store}\n")
    assert scn.env["MASTER_ADDR"] == "store"
    load("name: s\nabout: w\nhostnames: own\nhosts: [{name: a}, {name: b}]\n"
         "env: {MASTER_ADDR: a}\n")
    with pytest.raises(ScenarioFileError, match="does not map to loopback"):
        load("name: s\nabout: w\nhosts: [{name: a}, {name: b}]\nenv: {MASTER_ADDR: a}\n")

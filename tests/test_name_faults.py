"""Planning of the name faults (master_name, hostname_loopback): pure, no processes. What each
host's hosts file will say (addresses, their order, when), what the ranks are told, and the
located errors; the real runs are the catalog's ``net-names`` scenarios."""

from __future__ import annotations

import ipaddress
import textwrap

import pytest

from harness.core.triggers import Trigger
from harness.faults._names import WriteHosts
from harness.faults.steps import RUN
from harness.net.hostspec import MACHINE
from harness.net.resolver import machine_hostname
from harness.net.topology import Topology
from harness.run.plan import ShapeHosts, make_plan
from harness.scenario.loader import ScenarioFileError, load_text

TWO = """\
name: s
about: why
hosts: [{name: a}, {name: b}]
"""


def load(text: str):
    (scn,) = load_text(textwrap.dedent(text), "s.yaml")
    return scn


def plan_of(text: str, counter_ports):
    return make_plan(load(text), "/tmp/x", counter_ports, netns=True, run_id="nm1")


def steps(p):
    return [s for s in p.steps if s.fault != RUN]


def with_fault(fault: str, extra: str = "") -> str:
    return TWO + extra + f"faults: [{fault}]\n"


TOPO = Topology("nm1", ["a", "b"], ip="dual")
A4, A6 = TOPO.hosts["a"].addr4, TOPO.hosts["a"].addr6
DEAD4 = str(TOPO.network.network_address + 3)     # after the two hosts' .1 and .2
DEAD6 = str(TOPO.network6.network_address + 3)
FAR4 = str(TOPO.network.network_address + 250)    # far off: sorted last
FAR6 = str(TOPO.network6.network_address + 0xFA)


@pytest.mark.parametrize("fault, extra, addrs", [
    ("{kind: master_name}", "", [A4]),                               # the run's family
    ("{kind: master_name}", "ip: 6\n", [A6]),
    ("{kind: master_name}", "ip: dual\n", [A4, A6]),
    ("{kind: master_name, family: '6'}", "", [A6]),                  # AAAA only, IPv4 hosts
    ("{kind: master_name, family: '4'}", "ip: 6\n", [A4]),           # A only, IPv6 hosts
    ("{kind: master_name, dead: first}", "", [DEAD4, A4]),
    ("{kind: master_name, dead: last}", "", [A4, FAR4]),
    ("{kind: master_name, dead: last, family: '6'}", "ip: 6\n", [A6, FAR6]),
    ("{kind: master_name, dead: first, family: '6'}", "ip: 6\n", [DEAD6, A6]),
])
def test_master_name_maps_the_name_in_every_hosts_file(counter_ports, fault, extra, addrs):
    p = plan_of(with_fault(fault, extra), counter_ports)
    (step,) = steps(p)
    assert isinstance(step, WriteHosts) and step.trigger == Trigger.setup()
    assert step.hosts == ["a", "b"] and step.entries == {"master.harness.test": addrs}
    assert not step.in_place
    assert {r.env["MASTER_ADDR"] for r in p.ranks} == {"master.harness.test"}
    for addr in addrs:   # only the run's own networks
        ip = ipaddress.ip_address(addr)
        assert ip in TOPO.network or ip in TOPO.network6


def test_a_late_name_is_unknown_until_its_time_and_written_in_place(counter_ports):
    p = plan_of(with_fault("{kind: master_name, resolves_after: 3}"), counter_ports)
    first, late = steps(p)
    assert first.trigger == Trigger.setup() and first.entries == {"master.harness.test": []}
    assert late.trigger == Trigger.at_time(3.0) and late.in_place
    assert late.entries == {"master.harness.test": [A4]}
    assert "known only 3 s after the start line" in " ".join(p.notes)


def test_master_name_only_for_chosen_ranks_and_in_a_tcp_url(counter_ports):
    p = plan_of(with_fault("{kind: master_name, ranks: [1]}", "init: tcp\n"), counter_ports)
    assert p.rank(0).env["MASTER_ADDR"] == A4
    assert p.rank(1).env["MASTER_ADDR"] == "master.harness.test"
    assert p.rank(1).init.url == f"tcp://master.harness.test:{p.master_port}"


@pytest.mark.parametrize("fault, says", [
    ("{kind: master_name, name: master.example.com}", "name"),
    ("{kind: master_name, family: '5'}", "family"),
    ("{kind: master_name, dead: middle}", "dead"),
    ("{kind: master_name, resolves_after: 0}", "resolves_after"),
    ("{kind: hostname_loopback, addr: 10.0.0.1}", "not a loopback address"),
])
def test_bad_name_faults_are_located_errors(fault, says):
    with pytest.raises(ScenarioFileError) as e:
        load(with_fault(fault))
    assert "s.yaml:4:" in str(e.value) and says in str(e.value)


def test_master_name_needs_the_runs_namespaces():
    scn = load(with_fault("{kind: master_name}"))
    assert scn.needs_namespaces() and scn.faults[0].needs_link


@pytest.mark.skipif(machine_hostname() is None, reason="this machine's name is not hosts-safe")
def test_hostname_loopback_maps_the_machines_name_and_unsets_the_interface(counter_ports):
    p = plan_of(with_fault("{kind: hostname_loopback}"), counter_ports)
    assert steps(p) == []    # no mechanism of its own: the hosts' machine model says it
    assert isinstance(p.steps[0], ShapeHosts)
    for h in p.hosts:
        assert h.machine.entries == {MACHINE: ["127.0.1.1"]} and not h.machine.hostname
    for r in p.ranks:
        assert "GLOO_SOCKET_IFNAME" not in r.env and "GLOO_SOCKET_IFNAME" in r.unset
        assert "NCCL_SOCKET_IFNAME" in r.unset


def test_hostname_loopback_on_hosts_with_names_of_their_own_maps_each_hosts_name(
        counter_ports):
    p = plan_of(with_fault("{kind: hostname_loopback}", "hostnames: own\n"), counter_ports)
    for h in p.hosts:
        other = "b" if h.name == "a" else "a"
        assert h.machine.hostname == h.name
        assert h.machine.entries[h.name] == ["127.0.1.1"]          # its own name: Debian's line
        assert h.machine.entries[other] == [TOPO.hosts[other].addr4]   # the other: its link

"""Network faults: their planning (pure), their located errors, the skip reason without
namespaces, the safety rule, and two real runs through network namespaces.

The planning tests call ``make_plan(..., netns=True)`` with a counter port source: the topology's
constructor is pure (it only computes names and addresses), so no namespace is made. The real
runs at the end need root, ``ip``, ``nft`` and ``tc`` and are skipped, with the reason, without.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import textwrap
from pathlib import Path
from typing import List

import pytest

from harness.core.triggers import Trigger
from harness.faults.bandwidth import RateLimit
from harness.faults.firewall import FirewallRule
from harness.faults.latency import Delay
from harness.faults.packet_loss import Loss
from harness.faults.partition import Cut
from harness.faults.steps import RUN
from harness.net import topology
from harness.run.plan import make_plan
from harness.run.requirements import skip_reason
from harness.scenario.loader import ScenarioFileError, load_file, load_text

DATA = Path(__file__).parent / "data" / "net"
RUN_DIR = "/tmp/torchdist-harness/run-nettest"
RUN_ID = "nettest1"
TORCH_ENV = {"torch": "2.13.0+cpu", "distributed": True, "gloo": True, "nccl": False,
             "gpus": 0, "python": "3.11"}
TWO_HOSTS = """\
    name: s
    about: why
    hosts: [{name: a}, {name: b}]
    timeout: 5
"""


def net_steps(plan):
    """The steps the faults added (the run's own set-up steps left out)."""
    return [s for s in plan.steps if s.fault != RUN]


def load(text: str):
    (scn,) = load_text(textwrap.dedent(text), "s.yaml")
    return scn


def plan_of(text: str, counter_ports, netns: bool = True):
    return make_plan(load(text), RUN_DIR, counter_ports, netns=netns, run_id=RUN_ID)


def with_faults(*faults: str, base: str = TWO_HOSTS) -> str:
    return textwrap.dedent(base) + "faults:\n" + "".join(f"  - {f}\n" for f in faults)


def problems(text: str) -> List[str]:
    with pytest.raises(ScenarioFileError) as e:
        load(text)
    return [str(p) for p in e.value.problems]


# -- hosts, addresses, interfaces --------------------------------------------------------------

def test_two_hosts_get_namespaces_and_addresses_on_one_private_24(counter_ports):
    plan = plan_of(TWO_HOSTS, counter_ports)
    assert plan.netns and plan.link and plan.run_id == RUN_ID
    a, b = plan.hosts
    assert (a.name, b.name) == ("a", "b")
    assert (a.netns, b.netns) == (f"thx-{RUN_ID}-a", f"thx-{RUN_ID}-b")
    assert a.ifname == b.ifname == "eth0"
    net = ipaddress.ip_interface(f"{a.addr}/24").network
    assert ipaddress.ip_address(b.addr) in net and net.subnet_of(
        ipaddress.ip_network("10.213.0.0/16"))
    assert [int(a.addr.rsplit(".", 1)[1]), int(b.addr.rsplit(".", 1)[1])] == [1, 2]


def test_ranks_run_on_their_hosts_and_dial_the_master_hosts_address(counter_ports):
    plan = plan_of(TWO_HOSTS, counter_ports)
    a = plan.host("a")
    assert plan.master_addr == a.addr and plan.master_port == 30000
    assert [(r.label, r.host) for r in plan.ranks] == [("0", "a"), ("1", "b")]
    for r in plan.ranks:
        assert r.env["MASTER_ADDR"] == a.addr and r.env["MASTER_PORT"] == "30000"


def test_socket_ifname_defaults_to_each_hosts_link(counter_ports):
    plan = plan_of(TWO_HOSTS, counter_ports)
    for r in plan.ranks:
        assert r.env["GLOO_SOCKET_IFNAME"] == "eth0"
        assert r.env["NCCL_SOCKET_IFNAME"] == "eth0"
        assert r.unset == []


def test_a_users_own_socket_ifname_is_kept(counter_ports):
    plan = plan_of(textwrap.dedent(TWO_HOSTS) + "env: {GLOO_SOCKET_IFNAME: lo}\n", counter_ports)
    assert [r.env["GLOO_SOCKET_IFNAME"] for r in plan.ranks] == ["lo", "lo"]
    assert [r.env["NCCL_SOCKET_IFNAME"] for r in plan.ranks] == ["eth0", "eth0"]


def test_master_host_moves_the_master_address(counter_ports):
    plan = plan_of(textwrap.dedent(TWO_HOSTS) + "master_host: b\n", counter_ports)
    assert plan.master_addr == plan.host("b").addr
    assert {r.env["MASTER_ADDR"] for r in plan.ranks} == {plan.host("b").addr}


def test_rank0_the_store_runs_on_the_master_host(counter_ports):
    plan = plan_of(textwrap.dedent(TWO_HOSTS) + "master_host: b\n", counter_ports)
    assert plan.rank(0).host == "b"


def test_nodes_times_ranks_per_node(counter_ports):
    plan = plan_of("""\
        name: s
        about: why
        nodes: 2
        ranks_per_node: 2
    """, counter_ports)
    assert plan.world_size == 4 and [h.name for h in plan.hosts] == ["node0", "node1"]
    got = [(r.label, r.host, r.env["LOCAL_RANK"], r.env["LOCAL_WORLD_SIZE"], r.env["RANK"],
            r.env["WORLD_SIZE"]) for r in plan.ranks]
    assert got == [("0", "node0", "0", "2", "0", "4"), ("1", "node0", "1", "2", "1", "4"),
                   ("2", "node1", "0", "2", "2", "4"), ("3", "node1", "1", "2", "3", "4")]


@pytest.mark.parametrize("isolate, can, netns", [
    ("auto", True, True), ("auto", False, False), ("never", True, False),
    ("always", True, True), ("always", False, True)])
def test_single_host_isolation(counter_ports, isolate, can, netns):
    plan = plan_of(f"name: s\nabout: why\nisolate: {isolate}\n", counter_ports, netns=can)
    assert plan.netns is netns and plan.link is False
    (h,) = plan.hosts
    assert (h.name, h.addr, h.ifname) == ("local", "127.0.0.1", "lo")
    assert h.netns == (f"thx-{RUN_ID}-local" if netns else "")
    for r in plan.ranks:   # one host, no link: no interface is forced on gloo
        assert r.env["MASTER_ADDR"] == "127.0.0.1" and "GLOO_SOCKET_IFNAME" not in r.env


def test_a_network_fault_forces_namespaces_on_a_single_host(counter_ports):
    plan = plan_of(with_faults("{kind: firewall, host: local}",
                               base="name: s\nabout: why\nisolate: never\n"), counter_ports,
                   netns=False)
    assert plan.netns and not plan.link


# -- firewall and the timing of network actions ------------------------------------------------

def test_firewall_defaults_master_port_drop_inbound_on_the_master_host_at_setup(counter_ports):
    plan = plan_of(with_faults("{kind: firewall}"), counter_ports)
    (s,) = net_steps(plan)
    assert isinstance(s, FirewallRule)
    assert (s.host, s.action, s.direction, s.ports, s.trigger, s.undo_trigger, s.fault) == \
        ("a", "drop", "in", [30000], Trigger.setup(), None, "firewall")
    assert plan.notes == ["firewall: drop inbound master port 30000 on host a, from the start"]


def test_a_firewall_rule_with_a_peer_matches_only_that_host(counter_ports):
    # issue 41: "host a drops SYNs from host b"; a real run: net-store-port-blocked.yaml
    plan = plan_of(with_faults("{kind: firewall, peer: b}"), counter_ports)
    (s,) = net_steps(plan)
    assert (s.host, s.direction, s.peer) == ("a", "in", "b")
    assert plan.notes == ["firewall: drop inbound master port 30000 from host b on host a, "
                          "from the start"]
    out = plan_of(with_faults("{kind: firewall, host: b, direction: out, peer: a}"),
                  counter_ports)
    assert "drop outbound master port 30001 to host a on host b" in out.notes[0]
    (line,) = problems(with_faults("{kind: firewall, peer: z}"))
    assert "faults[0].peer: no host 'z' (hosts: a, b)" in line


def test_a_master_name_resolves_late_or_never_on_the_hosts_named_only(counter_ports):
    # issue 41: per-host resolves_after; real runs: net-names.yaml *_on_one_host
    three = TWO_HOSTS.replace("[{name: a}, {name: b}]", "[{name: a}, {name: b}, {name: c}]")
    plan = plan_of(with_faults("{kind: master_name, resolves_after: {b: 3, c: never}}",
                               base=three), counter_ports)
    got = [(s.hosts, s.entries["master.harness.test"] != [], s.in_place, s.trigger)
           for s in net_steps(plan)]
    assert got == [(["a"], True, False, Trigger.setup()),
                   (["b", "c"], False, False, Trigger.setup()),
                   (["b"], True, True, Trigger.at_time(3))]
    assert plan.notes[-1].endswith("on b known only 3 s after the start line, on c never known")
    (line,) = problems(with_faults("{kind: master_name, resolves_after: {z: 3}}"))
    assert "faults[0].resolves_after.z: no host 'z' (hosts: a, b)" in line


def test_firewall_default_host_follows_master_host(counter_ports):
    plan = plan_of(with_faults("{kind: firewall}", base=TWO_HOSTS + "    master_host: b\n"),
                   counter_ports)
    assert net_steps(plan)[0].host == "b"


@pytest.mark.parametrize("ports, expected", [
    ("data", {"except": [30000]}),
    ("all", "all"),
    ("[80, 443]", [80, 443]),
])
def test_firewall_port_selections(counter_ports, ports, expected):
    plan = plan_of(with_faults(f"{{kind: firewall, ports: {ports}}}"), counter_ports)
    assert net_steps(plan)[0].ports == expected


def test_firewall_port_range_reject_outbound_on_another_host(counter_ports):
    plan = plan_of(with_faults("{kind: firewall, host: b, action: reject, direction: out, "
                               "port_range: [20000, 20100]}"), counter_ports)
    s = net_steps(plan)[0]
    assert (s.host, s.action, s.direction, s.ports) == ("b", "reject", "out", (20000, 20100))


def test_firewall_at_a_phase_of_a_rank_plus_delay(counter_ports):
    plan = plan_of(with_faults('{kind: firewall, ports: all, phase: "workload step 2", '
                               'rank: 1, after: 0.5}'), counter_ports)
    a = net_steps(plan)[0]
    assert (a.trigger, a.undo_trigger) == (Trigger.on_phase("1", "workload step 2", 0.5), None)
    assert plan.notes[0].endswith("when rank 1 enters workload step 2 + 0.5 s")


def test_firewall_at_a_time_healed_later(counter_ports):
    plan = plan_of(with_faults("{kind: firewall, at: 1.5, heal_after: 3}"), counter_ports)
    a = net_steps(plan)[0]
    assert (a.trigger, a.undo_trigger) == (Trigger.at_time(1.5), Trigger.after_step(a.id, 3))
    assert plan.notes[0].endswith("at 1.5 s, healed 3 s later")


# -- the other network faults ------------------------------------------------------------------

def test_partition_groups_and_heal(counter_ports):
    plan = plan_of(with_faults("{kind: partition, groups: [[a], [b]], heal_after: 2}"),
                   counter_ports)
    (a,) = net_steps(plan)
    assert isinstance(a, Cut)
    assert (a.a, a.b, a.trigger, a.undo_trigger) == \
        (["a"], ["b"], Trigger.setup(), Trigger.after_step(a.id, 2))


def test_unreachable_master_is_a_silent_address_inside_the_runs_24(counter_ports):
    plan = plan_of(with_faults("{kind: unreachable_master}"), counter_ports)
    net = ipaddress.ip_interface(f"{plan.hosts[0].addr}/24").network
    silent = {r.env["MASTER_ADDR"] for r in plan.ranks}
    assert silent == {str(net.network_address + 250)}
    assert not silent & {h.addr for h in plan.hosts}
    assert net_steps(plan) == []


def test_unreachable_master_for_some_ranks_with_tcp_init(counter_ports):
    plan = plan_of(with_faults("{kind: unreachable_master, ranks: [1], host_number: 200}",
                               base=TWO_HOSTS + "    init: tcp\n"), counter_ports)
    r0, r1 = plan.ranks
    assert r0.env["MASTER_ADDR"] == plan.host("a").addr
    assert r1.env["MASTER_ADDR"].endswith(".200")
    assert r1.init.url == f"tcp://{r1.env['MASTER_ADDR']}:30000"
    assert r0.init.url == f"tcp://{plan.host('a').addr}:30000"


def test_unresolvable_host_only_renames_master_addr_each_rank_keeps_its_hosts_view(
        counter_ports):
    plan = plan_of(with_faults("{kind: unresolvable_host}"), counter_ports)
    assert {r.env["MASTER_ADDR"] for r in plan.ranks} == {"master.harness.invalid"}
    # the name fails locally because every rank resolves with the harness's view (no DNS);
    # the fault changes nothing of the network
    assert net_steps(plan) == []
    assert [r.resolver_view for r in plan.ranks] == [f"/etc/netns/thx-{RUN_ID}-a",
                                                     f"/etc/netns/thx-{RUN_ID}-b"]


def test_unresolvable_host_needs_no_namespace(counter_ports):
    plan = plan_of(with_faults("{kind: unresolvable_host}", base="name: s\nabout: why\n"
                               "isolate: never\n"), counter_ports, netns=True)
    assert not plan.netns
    assert {r.resolver_view for r in plan.ranks} == {f"{RUN_DIR}/resolver"}


def test_unresolvable_host_name_must_end_in_invalid():
    (p,) = problems(with_faults("{kind: unresolvable_host, name: master.example.com}"))
    assert p.startswith("s.yaml:6: faults[0].name:")


@pytest.mark.parametrize("mode, value", [("missing", "eth9"), ("other", "lo")])
def test_wrong_interface_names_another_interface(counter_ports, mode, value):
    plan = plan_of(with_faults(f"{{kind: wrong_interface, mode: {mode}}}"), counter_ports)
    for r in plan.ranks:
        assert r.env["GLOO_SOCKET_IFNAME"] == r.env["NCCL_SOCKET_IFNAME"] == value
        assert r.unset == []


def test_wrong_interface_unset_removes_the_variables(counter_ports):
    plan = plan_of(with_faults("{kind: wrong_interface, mode: unset, ranks: [1]}"),
                   counter_ports)
    r0, r1 = plan.ranks
    assert r0.env["GLOO_SOCKET_IFNAME"] == "eth0" and r0.unset == []
    assert "GLOO_SOCKET_IFNAME" not in r1.env and "NCCL_SOCKET_IFNAME" not in r1.env
    assert sorted(r1.unset) == ["GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"]


def test_wrong_interface_named(counter_ports):
    plan = plan_of(with_faults("{kind: wrong_interface, mode: missing, name: ib0}"),
                   counter_ports)
    assert {r.env["GLOO_SOCKET_IFNAME"] for r in plan.ranks} == {"ib0"}


@pytest.mark.parametrize("fault, step", [
    ("{kind: bandwidth}", RateLimit(host="a", rate="1mbit", direction="out")),
    ("{kind: bandwidth, host: b, rate: 100kbit, direction: both}",
     RateLimit(host="b", rate="100kbit", direction="both")),
    ("{kind: packet_loss, percent: 30}", Loss(host="a", percent=30.0, direction="both")),
    ("{kind: latency, delay_ms: 100, host: b, engine: netem}",
     Delay(host="b", delay_ms=100.0, jitter_ms=0.0)),
])
def test_link_faults(counter_ports, fault, step):
    plan = plan_of(with_faults(fault), counter_ports)
    (a,) = net_steps(plan)
    params = {k: v for k, v in a.to_dict().items() if k in ("host", "rate", "direction",
                                                             "percent", "delay_ms", "jitter_ms")}
    want = {k: v for k, v in step.to_dict().items() if k in params}
    assert (type(a), params, a.trigger) == (type(step), want, Trigger.setup())


# -- located errors ----------------------------------------------------------------------------

@pytest.mark.parametrize("fault, where", [
    ("{kind: firewall, host: c}", "faults[0].host"),
    ("{kind: bandwidth, host: c}", "faults[0].host"),
    ("{kind: packet_loss, host: c, percent: 5}", "faults[0].host"),
    ("{kind: latency, host: c, delay_ms: 5}", "faults[0].host"),
    ("{kind: partition, groups: [[a], [c]]}", "faults[0].groups[1][0]"),
])
def test_unknown_host_is_a_located_error(fault, where):
    (p,) = problems(with_faults(fault))
    assert p == f"s.yaml:6: {where}: no host 'c' (hosts: a, b)"


def test_single_host_knows_only_local():
    (p,) = problems(with_faults("{kind: firewall, host: a}", base="name: s\nabout: why\n"))
    assert p == "s.yaml:4: faults[0].host: no host 'a' (hosts: local)"


def test_partition_host_on_both_sides():
    (p,) = problems(with_faults("{kind: partition, groups: [[a, b], [b]]}"))
    assert "faults[0].groups: a host cannot be on both sides" in p


@pytest.mark.parametrize("fault, says", [
    ('{kind: firewall, at: 1, phase: init}', "give at most one of 'at' and 'phase'"),
    ('{kind: firewall, phase: "step 2"}', "use init, model, ddp, 'train step N'"),
    ('{kind: firewall, phase: init, rank: 2}', "rank 2 is outside the world"),
])
def test_bad_timing(fault, says):
    assert any(says in p for p in problems(with_faults(fault)))


# -- the safety rule ---------------------------------------------------------------------------

@pytest.mark.parametrize("name, line, says", [
    ("master_addr_outside.yaml", 9, "10.1.2.3 is not a loopback address"),
    ("master_addr_hostname.yaml", 6, "'trainer-0.cluster.example.com' is a host name"),
])
def test_outside_master_addr_is_refused_with_a_located_error(name, line, says):
    with pytest.raises(ScenarioFileError) as e:
        load_file(DATA / name)
    # the safety rule's problem (a two-host case also says master_addr is not used there)
    (p,) = [p for p in e.value.problems if "loopback" in p.message]
    assert (p.line, p.field) == (line, "master_addr")
    assert says in p.message
    assert str(p).startswith(f"{DATA / name}:{line}: master_addr: ")


# -- the skip reason without namespaces ----------------------------------------------------------

GAPS = ["not running as root (euid 1000): network namespaces need root",
        "nft not found: apt-get install nftables"]


@pytest.mark.parametrize("text, what", [
    (TWO_HOSTS, "several hosts"),
    ("name: s\nabout: why\nfaults: [{kind: firewall}]\n", "the fault firewall"),
    ("name: s\nabout: why\nisolate: always\n", "isolate: always"),
])
def test_skip_reason_names_what_is_missing(monkeypatch, text, what):
    monkeypatch.setattr(topology, "missing", lambda: list(GAPS))
    assert skip_reason(load(text), TORCH_ENV) == \
        f"{what} needs network namespaces, and: " + "; ".join(GAPS)


def test_single_host_auto_is_not_skipped_without_namespaces(monkeypatch):
    monkeypatch.setattr(topology, "missing", lambda: list(GAPS))
    assert skip_reason(load("name: s\nabout: why\n"), TORCH_ENV) is None


def test_nothing_missing_no_skip(monkeypatch):
    monkeypatch.setattr(topology, "missing", lambda: [])
    assert skip_reason(load(TWO_HOSTS), TORCH_ENV) is None


# -- real runs ---------------------------------------------------------------------------------

_MISSING = topology.missing()
real = pytest.mark.skipif(bool(_MISSING), reason="real network runs need: " + "; ".join(_MISSING))


@real
def test_latency_runs_through_the_proxy_without_netem_and_netem_alone_is_skipped():
    from harness.faults.latency import NETEM

    why = NETEM.missing()
    if why is None:
        pytest.skip("this kernel has netem: latency scenarios run with it here")
    assert why.startswith("not supported on this kernel: the netem qdisc is missing")
    assert skip_reason(load(with_faults("{kind: latency, delay_ms: 100}")), TORCH_ENV) is None
    scn = load(with_faults("{kind: latency, delay_ms: 100, engine: netem}"))
    assert skip_reason(scn, TORCH_ENV) == f"latency: {why}"


def _ours_left(run_id: str) -> List[str]:
    """Everything of one run that could outlive it: namespaces, /etc/netns, the state file."""
    left = [ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                        text=True).stdout.split() if run_id in ns]
    left += [str(p) for p in topology.NETNS_ETC_DIR.glob(f"*{run_id}*")]
    left += [str(p) for p in topology.STATE_DIR.glob(f"*{run_id}*")]
    return left


def _root_veths_and_bridges() -> List[str]:
    """veth and bridge interfaces of the root namespace (the topology must never add one)."""
    out = subprocess.run(["ip", "-j", "-d", "link", "show"], capture_output=True,
                         text=True).stdout
    return sorted(link["ifname"] for link in json.loads(out)
                  if link.get("linkinfo", {}).get("info_kind") in ("veth", "bridge"))


def _root_nft_tables() -> str:
    return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout


def _run(text: str):
    from harness.judge.classify import classify_run
    from harness.run.supervisor import run_scenario

    links = set(_root_veths_and_bridges())
    observed = run_scenario(load(text))
    obs = observed.to_dict()
    run_id = obs["plan"]["run_id"]
    assert _ours_left(run_id) == []
    assert set(_root_veths_and_bridges()) - links == set()   # none of ours in the root ns
    assert "thx" not in _root_nft_tables()         # no table of ours in the root namespace
    return obs, {v.label: v for v in classify_run(observed)}


@real
def test_real_two_hosts_healthy():
    obs, v = _run(TWO_HOSTS + "    workload: [barrier, all_reduce]\n")
    assert (v["0"].outcome, v["1"].outcome) == ("ok", "ok")
    assert (v["0"].host, v["1"].host) == ("a", "b")
    assert v["0"].addr != v["1"].addr and v["0"].addr.startswith("10.213.")


@real
def test_real_master_port_drop_times_out_both_ranks():
    obs, v = _run(with_faults("{kind: firewall, ports: master, action: drop}",
                              base=TWO_HOSTS.replace("timeout: 5", "timeout: 3")))
    assert (v["0"].outcome, v["1"].outcome) == ("timeout", "timeout")
    assert all(x.phase == "init" and 2.5 <= x.duration <= 30 for x in v.values())
    assert "drop" in obs["rules"]["a"] and str(obs["plan"]["master_port"]) in obs["rules"]["a"]
    (done,) = [r for r in obs["step_log"] if r["fault"] == "firewall"]
    assert (done["action"], done["t"], done["error"]) == ("do", 0.0, None)


def test_env_master_addr_outside_is_refused():
    from harness.scenario.loader import ScenarioFileError, load_text

    with pytest.raises(ScenarioFileError) as e:
        load_text("name: s\nabout: why\nenv:\n  MASTER_ADDR: 8.8.8.8\n", "s.yaml")
    assert str(e.value).startswith("s.yaml:4: env.MASTER_ADDR: 8.8.8.8 is not a loopback")

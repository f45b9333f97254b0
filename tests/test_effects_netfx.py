"""The network faults prove they acted (issue 39): partition and packet_loss (their nft rules'
drop counters), bandwidth's tc limit (the tbf qdisc's statistics), second_nic and
wrong_interface's spare card (its IPv4 counters, or the host's unrouted sends for a card that
is down) and busy_port's holder (what met it and the ranks whose bind failed on it).

Each probe once in pure form (a fake network that gives the numbers) and in real runs, where
the fault acts and where it has none."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

from harness.faults.bandwidth import RateLimit
from harness.faults.busy_port import holder_log
from harness.faults.packet_loss import Loss
from harness.faults.steps import Scheduler
from harness.faults.wrong_interface import SpareLink
from harness.judge.classify import classify_run
from harness.net import topology
from harness.run.supervisor import run_scenario
from harness.scenario.loader import load_text

_MISSING = topology.missing()
real = pytest.mark.skipif(bool(_MISSING) or sys.platform != "linux",
                          reason="real network runs need: " + "; ".join(_MISSING))


# -- the probes' arithmetic, on a network that gives fixed numbers -------------------------------
class FakeNet:
    def __init__(self, **kw: Any):
        self.kw = kw
        self.removed: List[str] = []

    def random_drop(self, host, percent, direction, counter=False):
        assert counter, "the drop rules must count"
        return "loss1"

    def rule_counters(self, host, handle, chain=None):
        return dict(self.kw["counters"][chain])

    def remove_rule(self, host, handle):
        self.removed.append(handle)

    def rate_limit(self, host, rate, direction):
        pass

    def rate_limit_stats(self, host, direction):
        return [dict(q) for q in self.kw["qdiscs"]]

    def clear_rate_limit(self, host, direction):
        self.kw["qdiscs"] = []

    def add_spare_link(self, host, ifname, up, link_local=False):
        return "10.213.9.2"

    def count_link(self, host, ifname, family="ipv4"):
        return "count1"

    def snmp(self, host):
        return {"Ip.OutNoRoutes": self.kw["noroutes"].pop(0)}

    def link_stats(self, host, ifname):
        return dict(self.kw["link"])


class FakeRt:
    def __init__(self, net: FakeNet):
        self.net = net

    def now(self) -> float:
        return 1.5


def test_loss_counts_what_each_direction_dropped_and_keeps_it_past_a_heal():
    net = FakeNet(counters={"input": {"packets": 3, "bytes": 180},
                            "output": {"packets": 0, "bytes": 0}})
    step = Loss(host="a", percent=100, direction="both")
    step.do(FakeRt(net))
    step.undo(FakeRt(net))
    assert net.removed == ["loss1"]
    net.kw["counters"] = {}          # the rules are gone: the probe must not read them again
    e = step.effect(FakeRt(net))
    assert e.acted and e.summary == "3 packets (180 bytes) dropped on host a (in 3, out 0)"
    assert e.numbers == {"packets": 3, "bytes": 180, "packets_in": 3, "packets_out": 0}
    assert e.events == [{"t": 1.5, "what": "drop counters read when healed: in 3, out 0"}]
    out = Loss(host="a", percent=10, direction="out")
    out.do(FakeRt(FakeNet()))
    e = out.effect(FakeRt(FakeNet(counters={"output": {"packets": 0, "bytes": 0}})))
    assert not e.acted and e.summary == "0 packets (0 bytes) dropped on host a (out 0)"


TBF = {"link": "eth0", "way": "out", "kind": "tbf", "packets": 50, "bytes": 4406,
       "overlimits": 0, "drops": 0}


def test_a_rate_limit_acted_when_tbf_held_traffic_back_and_not_when_it_all_fit_the_burst():
    e = RateLimit(host="a").effect(FakeRt(FakeNet(qdiscs=[TBF])))
    assert not e.acted
    assert e.summary == "0 packets held back or dropped: all 50 packets (4406 bytes) fit in " \
                        "tbf's burst"
    step = RateLimit(host="a", direction="both")
    net = FakeNet(qdiscs=[{**TBF, "overlimits": 943, "packets": 759},
                          {**TBF, "link": "p0", "way": "in", "packets": 285, "drops": 2}])
    step.undo(FakeRt(net))          # healed: read before the qdisc goes
    e = step.effect(FakeRt(net))
    assert e.acted and e.numbers == {"packets": 1044, "bytes": 8812, "overlimits": 943,
                                     "drops": 2}
    assert e.summary.startswith("tbf held traffic back 943 times and dropped 2 of 1044")
    assert "when healed: eth0 (out): 759 packets, 943 overlimits" in e.events[0]["what"]


def test_a_rate_limit_whose_qdisc_is_gone_is_not_observable_never_no_effect():
    step = RateLimit(host="a", fault_no=1, id="bandwidth#1.1", target="host a")
    s = Scheduler([step], rt=FakeRt(FakeNet(qdiscs=[{"link": "eth0", "kind": None}])),
                  clock=None)
    s.setup()
    (r,) = s.effects(2.0)
    assert r["status"] == "not observable" and "no tbf qdisc on eth0" in r["summary"]


LINK = {"up": True, "operstate": "UP", "addrs": ["10.213.9.2", "fe80::1"], "tx_packets": 9,
        "rx_packets": 8}


def test_a_spare_card_acted_when_ipv4_took_it_or_when_down_a_send_found_no_route():
    def effect(up: bool, out: int, noroutes: List[int]):
        net = FakeNet(counters={"output": {"packets": out, "bytes": 60 * out},
                                "input": {"packets": 0, "bytes": 0}},
                      noroutes=noroutes, link={**LINK, "up": up})
        step = SpareLink(host="b", ifname="eth1", up=up)
        step.do(FakeRt(net))
        return step.effect(FakeRt(net))

    e = effect(True, 0, [4, 4])    # the card's own counters (IPv6 chatter) are not the run's
    assert not e.acted
    assert e.summary == "eth1 (10.213.9.2) up on host b: 0 IPv4 packets sent out of it, " \
                        "0 received"
    assert effect(True, 2, [4, 4]).acted
    e = effect(False, 0, [4, 5])
    assert e.acted and e.numbers["no_route"] == 1
    assert e.summary.endswith("1 send on the host found no route (Ip OutNoRoutes since it was "
                              "added)")
    assert not effect(False, 0, [4, 4]).acted


def test_the_holder_log_gives_what_it_held_and_what_it_accepted_on_the_run_clock(tmp_path):
    log = tmp_path / "service-port_holder_1.err"
    log.write_text("\n".join(json.dumps(x) for x in [
        {"t": 100.0, "ev": "held", "addr": "0.0.0.0", "port": 29500, "mode": "accepting",
         "ino": 77},
        {"t": 101.25, "ev": "accepted", "peer": "127.0.0.1:4000", "pid": 12,
         "who": "pid 12: python"}]) + "\nTraceback...\n")
    got = holder_log(log, start_line=100.5)
    assert got["held"]["ino"] == 77
    assert got["accepted"] == [{"t": 0.75, "peer": "127.0.0.1:4000", "pid": 12,
                                "who": "pid 12: python"}]
    assert holder_log(tmp_path / "none", 0.0) == {"held": None, "accepted": []}


def test_every_snmp_counter_is_read_zeros_included():
    text = "Ip: Forwarding OutNoRoutes\nIp: 1 0\nTcp: ActiveOpens\nTcp: 3\n"
    assert topology.parse_counters(text, every=True) == {"Ip.Forwarding": 1,
                                                         "Ip.OutNoRoutes": 0,
                                                         "Tcp.ActiveOpens": 3}
    assert topology.parse_counters(text) == {"Tcp.ActiveOpens": 3}


# -- real runs ------------------------------------------------------------------------------------
TWO_HOSTS = """\
name: e
about: a network fault's effect in a real run
hosts: [{name: node0}, {name: node1}]
timeout: 2
deadline: 30
"""


def _run(text: str, tmp_path: Path):
    (scn,) = load_text(text, "e.yaml")
    obs = run_scenario(scn, keep=tmp_path)
    return obs, {e["n"]: e for e in obs.effects}


def _numbers(e: Dict[str, Any], target: str) -> Dict[str, Any]:
    (t,) = [t for t in e["targets"] if t["target"] == target]
    return t["steps"][0]["numbers"]


@real
def test_a_partition_counts_what_each_side_dropped(tmp_path):
    obs, fx = _run(TWO_HOSTS + "workload: [barrier]\n"
                   "faults: [{kind: partition, groups: [[node0], [node1]]}]\n", tmp_path)
    e = fx[1]
    assert e["status"] == "acted", e
    assert _numbers(e, "network")["packets"] > 0
    assert "node0" in e["summary"] and "node1" in e["summary"]


@real
def test_packet_loss_counts_the_packets_it_dropped(tmp_path):
    obs, fx = _run(TWO_HOSTS + "workload: [barrier]\n"
                   "faults: [{kind: packet_loss, host: node0, percent: 100}]\n", tmp_path)
    e = fx[1]
    assert e["status"] == "acted", e
    n = _numbers(e, "host node0")
    assert n["packets_in"] > 0 and n["packets"] == n["packets_in"] + n["packets_out"]


@real
def test_network_faults_that_met_no_traffic_say_so_with_their_zero_counts(tmp_path):
    # a quiet job: the cut and the loss hold only during its sleep, the limit passes the little
    # traffic of a start-up in its burst, and no rank points gloo at the second card
    obs, fx = _run(TWO_HOSTS + "workload: [barrier, 'sleep 3', barrier]\nfaults:\n"
                   "  - {kind: partition, groups: [[node0], [node1]], at: 1, heal_after: 0.5}\n"
                   "  - {kind: packet_loss, host: node0, percent: 100, at: 1.8, "
                   "heal_after: 0.5}\n"
                   "  - {kind: bandwidth, host: node0, rate: 1mbit, direction: both}\n"
                   "  - {kind: second_nic}\n", tmp_path)
    assert [v.outcome for v in classify_run(obs)] == ["ok", "ok"]
    assert {n: e["status"] for n, e in fx.items()} == {1: "no effect", 2: "no effect",
                                                       3: "no effect", 4: "no effect"}, fx
    assert fx[1]["summary"] == "0 packets (0 bytes) dropped (node0 0, node1 0)"
    assert fx[2]["summary"] == "0 packets (0 bytes) dropped on host node0 (in 0, out 0)"
    assert "read when healed" in fx[2]["targets"][0]["steps"][0]["events"][0]["what"]
    assert fx[3]["summary"].startswith("0 packets held back or dropped: all ")
    assert _numbers(fx[3], "host node0")["packets"] > 0     # traffic did pass the qdisc
    for host in ("node0", "node1"):
        assert _numbers(fx[4], f"host {host}")["ipv4_out"] == 0


@real
def test_a_rate_limit_holds_back_a_model_broadcast(tmp_path):
    obs, fx = _run(TWO_HOSTS + "workload: [barrier, 'ddp 1MB']\n"
                   "faults: [{kind: bandwidth, host: node0, rate: 10mbit, direction: both}]\n",
                   tmp_path)
    assert [v.outcome for v in classify_run(obs)] == ["ok", "ok"]
    e = fx[1]
    assert e["status"] == "acted", e
    n = _numbers(e, "host node0")
    assert n["overlimits"] > 0 and n["bytes"] > 1_000_000


@real
def test_a_second_card_gloo_is_pointed_at_carries_the_dials_to_it(tmp_path):
    obs, fx = _run(TWO_HOSTS + "workload: [barrier]\nenv: {GLOO_SOCKET_IFNAME: eth1}\n"
                   "faults: [{kind: second_nic}]\n", tmp_path)
    e = fx[1]
    assert e["status"] == "acted", e
    assert sum(_numbers(e, f"host {h}")["ipv4_out"] for h in ("node0", "node1")) > 0
    assert " up on host node" in e["summary"]


def test_a_link_local_only_card_must_come_up():
    from harness.scenario.loader import ScenarioFileError, load_text

    with pytest.raises(ScenarioFileError) as e:
        load_text(TWO_HOSTS + "workload: [barrier]\n"
                  "faults: [{kind: second_nic, address: link_local, up: false}]\n", "e.yaml")
    assert "faults[0].address" in str(e.value) and "leave up true" in str(e.value)


@real
def test_a_down_card_in_the_interface_list_makes_a_send_find_no_route(tmp_path):
    obs, fx = _run(TWO_HOSTS + "workload: [barrier]\n"
                   "faults: [{kind: wrong_interface, mode: list_down}]\n", tmp_path)
    e = fx[1]
    assert e["status"] == "acted", e
    assert sum(_numbers(e, f"host {h}")["no_route"] for h in ("node0", "node1")) > 0
    assert "down on host" in e["summary"]


ONE_HOST = """\
name: e
about: a port holder's effect in a real run
world_size: 2
timeout: 2
deadline: 6
workload: [barrier]
"""


@real
def test_a_listening_holder_shows_the_connections_in_its_backlog_and_the_failed_bind(tmp_path):
    obs, fx = _run(ONE_HOST + "faults: [{kind: busy_port, mode: listening}]\n", tmp_path)
    e = fx[1]
    assert e["status"] == "acted", e
    n = _numbers(e, "port holder")
    assert n["waiting"] >= 1 and n["ranks_met"] == 2
    assert "rank 0: its store's bind failed (EADDRINUSE); rank 1: connected, never accepted" \
        in e["summary"]


@real
def test_a_holder_no_rank_reached_had_no_effect(tmp_path):
    # every rank fails before init (no MASTER_ADDR): nothing connects to the port or binds it
    obs, fx = _run(ONE_HOST + "faults: [{kind: busy_port, mode: accepting}, "
                              "{kind: missing_env, vars: [MASTER_ADDR]}]\n", tmp_path)
    e = fx[1]
    assert e["status"] == "no effect", e
    # the harness's own store probe connects when a rank raises: said, never taken for a rank
    assert "(accepting, never answering): no rank bound it or connected to it" in e["summary"]
    assert _numbers(e, "port holder")["ranks_met"] == 0

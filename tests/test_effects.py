"""A fault proves it acted (harness.effects): the pure parts (how step records add up per fault
and target, the no-effect failure, the expectation's effects:, the log readers) and one real
run per probe (firewall counters, the fault proxy's log, a signal's pid, the DNS responder's
answers), each once where the fault acts and once where it has none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from harness.core.triggers import Trigger
from harness.faults._dns import faulted_answers
from harness.faults._proxy import connections_met
from harness.faults.steps import Effect, Scheduler, Step
from harness.judge import effects as fx
from harness.judge.classify import classify_run
from harness.net import topology
from harness.net.nft import counters_of
from harness.run.supervisor import run_scenario
from harness.scenario.expect import check, check_effects, failure_table
from harness.scenario.loader import ScenarioFileError, load_text
from harness.scenario.schema import Expect

_MISSING = topology.missing()
real = pytest.mark.skipif(bool(_MISSING) or sys.platform != "linux",
                          reason="real network runs need: " + "; ".join(_MISSING))


def rec(n: int, target: str, status: str, summary: str = "", what: str = "x",
        kind: str = "firewall", **kw: Any) -> Dict[str, Any]:
    return {"fault_no": n, "kind": kind, "step": f"{kind}#{n}", "target": target, "what": what,
            "status": status, "summary": summary, "numbers": kw.get("numbers", {}),
            "events": kw.get("events", []), "done_at": kw.get("done_at", 0.0)}


FAULTS = [{"n": 1, "kind": "firewall", "optional": False},
          {"n": 2, "kind": "missing_env", "optional": False},
          {"n": 3, "kind": "partition", "optional": True}]


# -- aggregation -------------------------------------------------------------------------------
def test_a_fault_acted_where_any_target_acted_and_each_target_keeps_its_own_status():
    steps = [rec(1, "host a", "no effect", "0 packets (0 bytes) matched"),
             rec(1, "host b", "acted", "3 packets (180 bytes) matched"),
             rec(3, "host a", "not observable", "no probe for partition yet", kind="partition")]
    out = fx.aggregate(FAULTS, steps)
    assert [e["status"] for e in out] == ["acted", "not observable", "not observable"]
    assert {t["target"]: t["status"] for t in out[0]["targets"]} == {
        "host a": "no effect", "host b": "acted"}
    assert out[0]["summary"] == "host b: 3 packets (180 bytes) matched"
    # a fault with no step at run time: said so, never claimed
    assert out[1]["targets"] == [] and out[1]["summary"] == fx.NO_STEP
    assert out[2]["optional"] is True


def test_a_fault_had_no_effect_when_every_probe_saw_none_and_an_unprobed_step_proves_nothing():
    steps = [rec(1, "host a", "not observable", "no probe"),
             rec(1, "host a", "no effect", "0 packets (0 bytes) matched",
                 what="drop inbound ports [29999]")]
    (e,) = fx.aggregate(FAULTS[:1], steps)
    assert e["status"] == "no effect"
    assert e["what"] == "firewall on host a, drop inbound ports [29999]"
    assert fx.no_effect_line(e) == ("fault 1 (firewall on host a, drop inbound ports [29999]) "
                                    "had no effect: 0 packets (0 bytes) matched")
    assert fx.unproven([e]) == [e]
    assert fx.unproven([{**e, "optional": True}]) == []


def test_event_lines_give_times_and_numbers_per_target():
    steps = [rec(1, "host a", "acted", "2 packets", numbers={"packets": 2},
                 events=[{"t": 1.234, "what": "counter read"}], done_at=0.5)]
    (e,) = fx.aggregate(FAULTS[:1], steps)
    assert fx.event_lines(e) == ["host a: acted, done at 0.50 s (packets 2)",
                                 "  t=1.23 s  counter read"]


# -- the case's verdict --------------------------------------------------------------------------
def _no_effect() -> List[Dict[str, Any]]:
    return fx.aggregate(FAULTS[:1], [rec(1, "host node0", "no effect", "0 packets matched",
                                         what="drop inbound ports [29999]")])


def test_a_required_fault_without_effect_fails_the_case_and_says_so_in_the_failure_text():
    exp = Expect()
    (m,) = check(exp, [], None, _no_effect())
    text = failure_table([], exp, [m])
    assert ("fault 1 (firewall on host node0, drop inbound ports [29999]) had no effect: "
            "0 packets matched") in text
    assert check(exp, [], None, None) == []      # effects not known: not checked


def test_an_optional_fault_without_effect_passes_and_the_expectation_checks_its_status():
    optional = [{**e, "optional": True} for e in _no_effect()]
    assert check_effects(Expect(), optional) == []
    assert check_effects(Expect(effects={1: "no effect"}), optional) == []
    (m,) = check_effects(Expect(effects={1: "acted"}), optional)
    assert (m.expected, m.observed) == ("acted", "no effect: 0 packets matched")
    (m,) = check_effects(Expect(effects={4: "acted"}), optional)
    assert m.observed == "no such fault in the run"


def test_not_observable_never_fails_and_never_passes_as_proof():
    blind = fx.aggregate(FAULTS[1:2], [])
    assert check_effects(Expect(), blind) == []
    for want in ("acted", "no effect"):
        (m,) = check_effects(Expect(effects={2: want}), blind)
        assert m.observed.startswith("not observable")


def test_effect_is_a_field_of_every_fault_and_the_expectation_key_is_checked():
    (scn,) = load_text("name: e\nabout: x\nworld_size: 2\nfaults: [{kind: kill_rank, rank: 1, "
                       "at: 1, effect: optional}]\nexpect: {job: ok, effects: {1: no effect}}\n")
    assert scn.faults[0].effect == "optional"
    assert scn.faults[0].model_dump()["effect"] == "optional"
    (plain,) = load_text("name: e\nabout: x\nworld_size: 2\nfaults: [{kind: kill_rank, "
                         "rank: 1, at: 1}]\n")
    assert "effect" not in plain.faults[0].model_dump()   # the default is not written out
    for bad in ("effect: maybe", "effect: 1"):
        with pytest.raises(ScenarioFileError, match="effect"):
            load_text("name: e\nabout: x\nworld_size: 2\nfaults: [{kind: kill_rank, rank: 1, "
                      f"at: 1, {bad}}}]\n")
    with pytest.raises(ScenarioFileError, match="effects"):
        load_text("name: e\nabout: x\nworld_size: 2\nexpect: {effects: {1: worked}}\n")


# -- the scheduler's side ------------------------------------------------------------------------
@dataclass
class Probed(Step):
    saw: Optional[int] = None

    def do(self, rt):
        return None

    def effect(self, rt):
        if self.saw is None:
            raise OSError("gone")
        return Effect(self.saw > 0, f"{self.saw} seen", {"seen": self.saw})


@dataclass
class Blind(Step):
    def do(self, rt):
        return None


class _Clock:
    def phase_entered(self, rank, phase):
        return None


def test_the_scheduler_reads_each_fault_step_and_says_why_one_proves_nothing():
    steps = [Probed(saw=2, fault_no=1, target="a", id="p#1"),
             Probed(saw=0, fault_no=1, target="b", id="p#2"),
             Probed(saw=None, fault_no=2, target="a", id="p#3"),
             Blind(fault_no=2, target="a", id="b#4"),
             Probed(saw=5, fault_no=3, target="a", id="p#5", trigger=Trigger(at=99.0)),
             Blind(fault_no=3, target="c", id="b#6", trigger=Trigger(at=99.0)),
             Blind(fault_no=0, target="run", id="run#7")]
    s = Scheduler(steps, rt=None, clock=_Clock())
    s.setup()
    s.tick(1.0)
    got = {r["step"]: (r["status"], r["summary"]) for r in s.effects(1.5)}
    assert got["p#1"] == ("acted", "2 seen")
    assert got["p#2"] == ("no effect", "0 seen")
    assert got["p#3"][0] == "not observable" and "probe failed: OSError: gone" in got["p#3"][1]
    assert got["b#4"][0] == "not observable" and "no probe" in got["b#4"][1]
    assert got["p#5"][0] == "no effect" and got["p#5"][1].startswith("never fired")
    assert got["b#6"][0] == "not observable" and "no probe" in got["b#6"][1]
    assert "run#7" not in got


# -- the probes' readers --------------------------------------------------------------------------
def test_counters_of_sums_the_fault_rules_only():
    listing = {"nftables": [
        {"rule": {"chain": "input", "handle": 4, "expr": [{"counter": {"packets": 3,
                                                                      "bytes": 180}}]}},
        {"rule": {"chain": "input", "handle": 5, "expr": [{"counter": {"packets": 9,
                                                                      "bytes": 900}}]}},
        {"rule": {"chain": "output", "handle": 4, "expr": [{"drop": None}]}}]}
    assert counters_of(listing, {("input", 4), ("output", 4)}) == {
        "packets": 3, "bytes": 180, "rules": 1}


def test_the_proxy_log_gives_the_connections_a_toxic_met_on_the_run_clock(tmp_path):
    log = tmp_path / "service-proxy_a.err"
    log.write_text("\n".join(json.dumps(x) for x in [
        {"t": 0.0, "ev": "ready", "pid": 1, "t0": 100.0},
        {"t": 1.0, "ev": "open", "conn": 1, "kind": "in", "dst": ["10.0.0.1", 25000]},
        {"t": 1.1, "ev": "toxic_applies", "conn": 1, "toxic": "blackhole#2"},
        {"t": 1.2, "ev": "toxic_applies", "conn": 1, "toxic": "other#3"}]) + "\nnot json\n")
    (ev,) = connections_met(log, "blackhole#2", start_line=100.5)
    assert ev["t"] == 0.6 and ev["dst"] == "10.0.0.1:25000"
    assert connections_met(tmp_path / "none.err", "x", 0.0) == []


def test_the_responder_log_counts_only_answers_given_while_the_fault_held(tmp_path):
    log = tmp_path / "r.err"
    log.write_text("\n".join(json.dumps(x) for x in [
        {"t": 10.0, "event": "query", "name": "master.c.test", "type": 1, "mode": "answer"},
        {"t": 11.0, "event": "set", "name": "master.c.test", "mode": "servfail", "addrs": []},
        {"t": 11.5, "event": "query", "name": "MASTER.c.test.", "type": 28, "mode": "servfail"},
        {"t": 11.6, "event": "query", "name": "other.c.test", "type": 1, "mode": "servfail"},
        {"t": 12.0, "event": "set", "name": "master.c.test", "mode": "answer",
         "addrs": ["10.0.0.1"]},
        {"t": 12.5, "event": "query", "name": "master.c.test", "type": 1, "mode": "answer"}]))
    (ev,) = faulted_answers(log, "master.c.test", "servfail", [], start_line=10.0)
    assert ev["t"] == 1.5 and ev["type"] == "AAAA"


# -- real runs: one per probe, acting and not ----------------------------------------------------
TWO_HOSTS = """\
name: e
about: a fault's effect in a real run
hosts: [{name: node0}, {name: node1}]
timeout: 3
deadline: 30
workload: [barrier]
"""


def _run(text: str, tmp_path: Path):
    (scn,) = load_text(text, "e.yaml")
    obs = run_scenario(scn, keep=tmp_path)
    (e,) = obs.effects
    return obs, e


@real
def test_a_firewall_on_the_master_port_counts_the_packets_it_dropped(tmp_path):
    obs, e = _run(TWO_HOSTS + "faults: [{kind: firewall, host: node0, ports: master}]\n",
                  tmp_path)
    assert e["status"] == "acted", e
    (t,) = e["targets"]
    assert t["target"] == "host node0" and t["steps"][0]["numbers"]["packets"] > 0


@real
def test_a_firewall_on_a_port_nobody_uses_has_no_effect_and_fails_its_case(tmp_path):
    obs, e = _run(TWO_HOSTS + "faults: [{kind: firewall, host: node0, ports: [29999]}]\n",
                  tmp_path)
    assert [v.outcome for v in classify_run(obs)] == ["ok", "ok"]
    assert e["status"] == "no effect" and e["summary"] == "0 packets (0 bytes) matched"
    (m,) = check(Expect(job=["ok"]), classify_run(obs), obs.counters, obs.effects)
    assert fx.no_effect_line(e) in failure_table(classify_run(obs), None, [m])
    # the JSON edge keeps it, and harness explain prints it with its times
    (tmp_path / "case").mkdir()
    (tmp_path / "case" / "observation.json").write_text(json.dumps(obs.to_dict()))
    p = subprocess.run([sys.executable, "-m", "harness", "explain", str(tmp_path / "case")],
                       capture_output=True, text=True, timeout=120, env={
                           **os.environ, "COLUMNS": "300"})
    assert p.returncode == 0, p.stderr
    assert ("fault 1 (firewall on host node0, drop inbound ports [29999]): no effect: "
            "0 packets (0 bytes) matched") in p.stdout
    assert "rule counter read at the end of the run: 0 packets, 0 bytes" in p.stdout


@real
def test_a_proxy_toxic_lists_the_connections_it_met_or_none(tmp_path):
    obs, e = _run(TWO_HOSTS.replace("deadline: 30", "deadline: 6")
                  + "faults: [{kind: blackhole, host: node0, traffic: store}]\n",
                  tmp_path / "a")
    assert e["status"] == "acted"
    evs = e["targets"][0]["steps"][-1]["events"]
    port = obs.plan["master_port"]
    assert any(ev["dst"].endswith(f":{port}") and 0 <= ev["t"] < 6 for ev in evs), evs
    obs, e = _run(TWO_HOSTS + "faults: [{kind: blackhole, host: node0, traffic: [29999]}]\n",
                  tmp_path / "b")
    assert e["status"] == "no effect" and e["summary"].startswith("0 connections")


@real
def test_a_signal_names_its_pid_and_one_that_never_fired_had_no_effect(tmp_path):
    obs, e = _run(TWO_HOSTS + "faults: [{kind: kill_rank, rank: 1, phase: init}]\n",
                  tmp_path / "a")
    assert e["status"] == "acted"
    pid = next(r.pid for r in obs.ranks if r.label == "1")
    assert e["summary"].startswith(f"SIGKILL delivered to pid {pid} (alive")
    assert "killed by SIGKILL" in e["summary"]
    obs, e = _run(TWO_HOSTS + "faults: [{kind: kill_rank, rank: 1, at: 25}]\n", tmp_path / "b")
    assert [v.outcome for v in classify_run(obs)] == ["ok", "ok"]
    assert e["status"] == "no effect" and e["summary"].startswith("never fired")


DNS = """\
dns:
  domain: cluster.test
  records: {master: node0, node0: node0, node1: node1, spare: node1}
  master: master
"""


@real
@pytest.mark.skipif(not any(os.access(os.path.join(d, "dnsmasq"), os.X_OK)
                            for d in os.environ.get("PATH", "").split(os.pathsep)
                            + ["/usr/sbin", "/sbin"]), reason="needs dnsmasq")
def test_a_name_fault_counts_the_queries_answered_the_faulted_way(tmp_path):
    obs, e = _run(TWO_HOSTS + DNS + "faults: [{kind: dns_name, name: master, answer: "
                                    "servfail}]\n", tmp_path / "a")
    assert e["status"] == "acted" and e["targets"][0]["steps"][0]["numbers"]["queries"] > 0
    obs, e = _run(TWO_HOSTS + DNS + "faults: [{kind: dns_name, name: spare, answer: "
                                    "servfail}]\n", tmp_path / "b")
    assert e["status"] == "no effect"
    assert e["summary"] == "0 queries for spare.cluster.test answered SERVFAIL"


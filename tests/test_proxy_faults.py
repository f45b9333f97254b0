"""Planning of the proxy faults (harness.faults._proxy and its kinds): pure, no processes.

What each kind puts in the plan: one proxy set-up step per host (shared), what it redirects,
the toxic's step with its parameters, direction, probability and ports, its timing and heal;
placement front (no namespaces: ranks but rank 0 dial the proxy's port); latency's engine
choice and its note; the located errors of impossible combinations."""

from __future__ import annotations

import textwrap
from typing import List

import pytest

from harness.core.triggers import Trigger
from harness.faults import REGISTRY
from harness.faults import latency as latency_mod
from harness.faults._proxy import MARK, ProxyFault, ProxyUp, ToxicStep, proxy_name, rate_bytes
from harness.faults.latency import Delay
from harness.faults.steps import RUN
from harness.machine.requirement import NAMESPACES
from harness.run.plan import make_plan
from harness.run.requirements import skip_reason
from harness.scenario.loader import ScenarioFileError, load_text
from harness.services.proxy.toxics import TOXICS

RUN_DIR = "/tmp/x"
TWO_HOSTS = """\
name: s
about: why
hosts: [{name: a}, {name: b}]
timeout: 5
"""
ONE_HOST = """\
name: s
about: why
world_size: 2
timeout: 5
"""
TORCH_ENV = {"torch": "2.13.0", "distributed": True, "gloo": True, "nccl": False, "gpus": 0}


def load(text: str):
    (scn,) = load_text(textwrap.dedent(text), "s.yaml")
    return scn


def with_faults(*faults: str, base: str = TWO_HOSTS) -> str:
    return base + "faults:\n" + "".join(f"  - {f}\n" for f in faults)


def plan_of(text: str, counter_ports, netns: bool = True):
    return make_plan(load(text), RUN_DIR, counter_ports, netns=netns, run_id="t1")


def steps(p) -> list:
    return [s for s in p.steps if s.fault != RUN]


def problems(text: str) -> List[str]:
    with pytest.raises(ScenarioFileError) as e:
        load(text)
    return [str(x) for x in e.value.problems] if hasattr(e.value, "problems") else [str(e.value)]


# the proxy fault kinds, from the registry: every fault kind made by the fault proxy
PROXY_KINDS = sorted(k for k, cls in REGISTRY.items() if issubclass(cls, ProxyFault))


def test_every_proxy_kind_is_registered_with_a_summary_and_a_toxic_of_the_proxy():
    assert {"reset_peer", "blackhole", "slow_close", "limit_data", "slicer", "latency",
            "bandwidth"} <= set(PROXY_KINDS)
    for kind in PROXY_KINDS:
        cls = REGISTRY.get(kind)
        assert cls is not None and cls.summary, kind
        assert cls.TOXIC in TOXICS, kind


def test_a_proxy_faults_parameters_are_its_fields_of_its_toxics_names():
    """ProxyFault.params reads the names from the toxic's module: a field of each required
    name, the optional ones only when set; a fault that names a toxic the proxy lacks, or
    lacks a field its toxic needs, is told what to add."""
    from typing import Literal

    from harness.faults._proxy import ProxyFault as Base

    class NoSuch(Base):
        kind: Literal["no_such_toxic_test"] = "no_such_toxic_test"
        TOXIC = "no_such"

    class Fieldless(Base):
        kind: Literal["fieldless_slicer_test"] = "fieldless_slicer_test"
        TOXIC = "slicer"

    with pytest.raises(TypeError, match=r"add harness/services/proxy/toxics/no_such\.py"):
        NoSuch().params()
    with pytest.raises(TypeError, match="the toxic slicer needs size: give Fieldless a field"):
        Fieldless().params()
    (reset,) = load(with_faults("{kind: reset_peer, after_s: 2}")).faults
    assert reset.params() == {"after_s": 2.0}


@pytest.mark.parametrize("fault, toxic, params", [
    ("{kind: reset_peer}", "reset_peer", {}),
    ("{kind: reset_peer, after_bytes: 100, after_s: 2}", "reset_peer",
     {"after_bytes": 100, "after_s": 2.0}),
    ("{kind: blackhole}", "blackhole", {}),
    ("{kind: slow_close, delay_ms: 500}", "slow_close", {"delay_ms": 500.0}),
    ("{kind: limit_data, bytes: 64}", "limit_data", {"bytes": 64}),
    ("{kind: slicer, size: 8, variation: 2, delay_ms: 5}", "slicer",
     {"size": 8, "variation": 2, "delay_ms": 5.0}),
    ("{kind: latency, delay_ms: 200, jitter_ms: 50, engine: proxy}", "latency",
     {"delay_ms": 200.0, "jitter_ms": 50.0}),
    ("{kind: bandwidth, rate: 800kbit, engine: proxy}", "bandwidth", {"bytes_per_s": 100000.0}),
])
def test_a_proxy_fault_is_a_proxy_on_the_master_host_and_one_toxic(counter_ports, fault, toxic,
                                                                    params):
    p = plan_of(with_faults(fault), counter_ports)
    up, tox = steps(p)
    assert isinstance(up, ProxyUp) and isinstance(tox, ToxicStep)
    assert up.host == tox.host == "a" and up.placement == "transparent"
    assert up.trigger == Trigger.setup() and up.captures == ["all"]
    assert len({up.in_port, up.out_port, p.master_port}) == 3     # ports of their own
    assert tox.type == toxic and tox.params == params and tox.ports is None
    assert tox.trigger == Trigger.setup() and tox.undo_trigger is None
    assert tox.request() == {"op": "add", "id": tox.id, "type": toxic,
                             "direction": tox.direction, "probability": 1.0, "ports": None,
                             "params": params}
    assert p.netns and p.notes and toxic.split("_")[0] in " ".join(p.notes)


def test_traffic_store_data_and_ports_become_redirects_and_toxic_filters(counter_ports):
    p = plan_of(with_faults("{kind: blackhole, traffic: store}",
                            "{kind: reset_peer, traffic: data, direction: in}",
                            "{kind: slow_close, delay_ms: 1, traffic: [7000, 7001], host: b}"),
                counter_ports)
    ups = [s for s in steps(p) if isinstance(s, ProxyUp)]
    toxics = [s for s in steps(p) if isinstance(s, ToxicStep)]
    assert [u.host for u in ups] == ["a", "b"]                 # one proxy per host, shared
    assert ups[0].captures == [[p.master_port], {"except": [p.master_port]}]
    assert ups[1].captures == [[7000, 7001]]
    assert [t.ports for t in toxics] == [{"only": [p.master_port]},
                                         {"except": [p.master_port]}, {"only": [7000, 7001]}]
    assert [t.direction for t in toxics] == ["both", "in", "both"]


def test_timing_heal_and_probability_reach_the_toxic_step(counter_ports):
    p = plan_of(with_faults("{kind: blackhole, phase: init, rank: 1, after: 0.5, heal_after: 3, "
                            "probability: 0.25}"), counter_ports)
    up, tox = steps(p)
    assert up.trigger == Trigger.setup()                     # the proxy is there before init
    assert tox.trigger == Trigger.on_phase(1, "init", 0.5)
    assert tox.undo_trigger == Trigger.after_step(tox.id, 3.0)
    assert tox.probability == 0.25 and "0.25 of connections" in tox.describe()
    assert load(with_faults("{kind: blackhole, probability: 0.25}")).faults[0].is_random()
    assert not load(with_faults("{kind: blackhole}")).faults[0].is_random()


def test_front_placement_needs_no_namespaces_and_points_other_ranks_at_the_proxy(counter_ports):
    text = with_faults("{kind: latency, delay_ms: 200, traffic: store, placement: front, "
                       "engine: proxy}", base=ONE_HOST)
    scn = load(text)
    assert not scn.needs_namespaces()
    assert scn.faults[0].requirements(scn) == ()
    p = make_plan(scn, RUN_DIR, counter_ports, netns=False, run_id="t1")
    up, tox = steps(p)
    assert up.placement == "front" and up.listen == "127.0.0.1" == up.upstream
    assert up.upstream_port == p.master_port != up.listen_port
    assert p.rank(0).env["MASTER_PORT"] == str(p.master_port)        # it serves the store
    assert p.rank(1).env["MASTER_PORT"] == str(up.listen_port)       # it dials the proxy
    assert tox.ports == {"only": [p.master_port]}


def test_front_placement_rewrites_a_tcp_url_of_other_ranks(counter_ports):
    p = plan_of(with_faults("{kind: blackhole, traffic: store, placement: front}",
                            base=ONE_HOST + "init: tcp\n"), counter_ports, netns=False)
    up = steps(p)[0]
    assert p.rank(0).init.url.endswith(f":{p.master_port}")
    assert p.rank(1).init.url == f"tcp://127.0.0.1:{up.listen_port}"


def test_transparent_placement_needs_namespaces_and_nft(counter_ports):
    scn = load(with_faults("{kind: blackhole}", base=ONE_HOST))
    assert scn.needs_namespaces()
    assert [r.name for r in scn.faults[0].requirements(scn)] == [NAMESPACES.name, "nft"]


@pytest.mark.parametrize("fault, says", [
    ("{kind: blackhole, placement: front}", "placement front stands in front of the store port"),
    ("{kind: blackhole, traffic: store, placement: front, host: b}",
     "placement front stands on the master host"),
    ("{kind: blackhole, host: z}", "no host 'z'"),
    ("{kind: blackhole, direction: up}", "direction"),
    ("{kind: blackhole, probability: 0}", "probability"),
    ("{kind: slicer, size: 0}", "size"),
    ("{kind: latency, delay_ms: 10, engine: netem, direction: in}", "with engine netem give no"),
    ("{kind: bandwidth, traffic: store}", "need engine: proxy"),
    ("{kind: reset_peer, nonsense: 1}", "nonsense"),
])
def test_impossible_proxy_faults_are_located_errors(fault, says):
    text = with_faults(fault)
    found = problems(text)
    assert any(says in p for p in found), found
    assert all("s.yaml:" in p for p in found), found


def test_front_placement_refuses_a_file_store():
    found = problems(with_faults("{kind: blackhole, traffic: store, placement: front}",
                                 base=ONE_HOST + "init: file\n"))
    assert any("needs a store port" in p for p in found), found


def test_one_host_cannot_have_both_placements():
    found = problems(with_faults("{kind: blackhole, traffic: store, placement: front}",
                                 "{kind: reset_peer}"))
    assert any("s.yaml:1:" in p and "one proxy per host" in p for p in found), found


# -- latency: netem or the proxy ---------------------------------------------------------------

def _netem(monkeypatch, missing):
    monkeypatch.setattr(latency_mod, "NETEM", type(latency_mod.NETEM)(
        "netem", check=lambda: missing, cached=False))


def test_latency_auto_takes_netem_where_it_works(counter_ports, monkeypatch):
    _netem(monkeypatch, None)
    p = plan_of(with_faults("{kind: latency, delay_ms: 100, jitter_ms: 10}"), counter_ports)
    (step,) = steps(p)
    assert isinstance(step, Delay) and step.delay_ms == 100 and step.jitter_ms == 10
    assert "engine netem (auto: netem works here)" in " ".join(p.notes)


def test_latency_auto_takes_the_proxy_without_netem_and_says_why(counter_ports, monkeypatch):
    _netem(monkeypatch, "not supported on this kernel: no netem")
    p = plan_of(with_faults("{kind: latency, delay_ms: 100}"), counter_ports)
    up, tox = steps(p)
    assert isinstance(up, ProxyUp) and tox.type == "latency" and tox.direction == "out"
    assert "engine proxy (auto: netem not supported on this kernel: no netem)" in \
        " ".join(p.notes)
    assert skip_reason(load(with_faults("{kind: latency, delay_ms: 100}")), TORCH_ENV) is None \
        or NAMESPACES.missing()


def test_latency_auto_takes_the_proxy_for_what_netem_cannot_do(counter_ports, monkeypatch):
    _netem(monkeypatch, None)
    p = plan_of(with_faults("{kind: latency, delay_ms: 100, traffic: store}"), counter_ports)
    assert isinstance(steps(p)[1], ToxicStep)
    assert "netem cannot do this fault's traffic" in " ".join(p.notes)


def test_latency_engine_netem_is_a_requirement(monkeypatch):
    _netem(monkeypatch, "not supported on this kernel: no netem")
    scn = load(with_faults("{kind: latency, delay_ms: 100, engine: netem}"))
    assert [r.name for r in scn.faults[0].requirements(scn)] == ["namespaces", "netem"]


# -- small parts ----------------------------------------------------------------------------------

def test_rates_in_tc_words_become_bytes_per_second():
    assert rate_bytes("8bit") == 1.0
    assert rate_bytes("1mbit") == 125000.0
    assert rate_bytes("100kbps") == 100000.0
    assert rate_bytes("1bit") == 1.0        # at least a byte a second
    with pytest.raises(ValueError):
        rate_bytes("fast")


def test_the_proxy_service_and_its_mark_are_named_once():
    assert proxy_name("a") == "proxy@a"
    assert 0 < MARK < 2**32


def test_without_namespaces_a_transparent_proxy_fault_is_skipped_with_the_reason(monkeypatch):
    from harness.net import topology

    monkeypatch.setattr(topology, "missing", lambda: ["not running as root (euid 1000)"])
    scn = load(with_faults("{kind: blackhole}", base=ONE_HOST))
    assert skip_reason(scn, TORCH_ENV) == ("the fault blackhole needs network namespaces, and: "
                                           "not running as root (euid 1000)")
    front = load(with_faults("{kind: blackhole, traffic: store, placement: front}",
                             base=ONE_HOST))
    assert not front.needs_namespaces()
    assert all(r.name != NAMESPACES.name for r in front.faults[0].requirements(front))

"""Where the job's store is (harness.jobstore), pure: one answer per source of the port (the
lease, init_url, torchrun's rdzv_endpoint, master_port, a per-agent option, a verbatim flag,
the case's env), and the faults, the probe's plan, the diagnosis and `harness show` reading it
instead of the leased port."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.core.jobstore import UNVERIFIED, JobStore, flag_value, split_endpoint
from harness.faults.firewall import FirewallRule
from harness.judge.classify import Verdict
from harness.judge.diagnose import RankContext, no_store_there
from harness.judge.observation import RunObservation
from harness.run.plan import make_plan
from harness.scenario.loader import ScenarioFileError, load_text

SCRIPT = Path(__file__).resolve().parent.parent / "scenarios" / "programs" / "train.py"
TWO = "name: t\nabout: a\nhosts: [{name: node0}, {name: node1}]\n"
ONE = "name: t\nabout: a\nworld_size: 2\n"


def plan_of(text: str, ports, netns: bool = True):
    (scn,) = load_text(textwrap.dedent(text), "jobstore.yaml")
    return make_plan(scn, "/tmp/torchdist-harness/run-x", ports, netns=netns, run_id="x")


def rules(plan):
    return [s for s in plan.steps if isinstance(s, FirewallRule)]


# -- each source of the port -------------------------------------------------------------------

def test_the_lease_is_the_store_of_ranks_the_harness_starts(counter_ports):
    plan = plan_of(ONE, counter_ports)
    st = plan.store()
    assert (st.kind, st.port, st.addr, st.host, st.verified) == \
        ("tcp", plan.master_port, "127.0.0.1", "local", True)
    assert st.source.startswith("the run's lease")


def test_init_url_port2_is_the_store_not_the_lease(counter_ports):
    plan = plan_of(ONE + "init_url: 'tcp://{addr}:{port2}'\n", counter_ports)
    assert plan.url_port is not None and plan.url_port != plan.master_port
    assert plan.store().port == plan.url_port
    assert "init_url {port2}" in plan.store().source


def test_init_url_port_is_the_lease(counter_ports):
    plan = plan_of(ONE + "init_url: 'tcp://{addr}:{port}'\n", counter_ports)
    assert plan.store().port == plan.master_port
    assert plan.store().source == "init_url {port}: the run's lease"


# (case text, the store's port, host and source); None: the run's lease
STORES = [
    pytest.param(ONE + "env: {MASTER_PORT: '6100'}\n",
                 (6100, "local", "the case's env MASTER_PORT"), id="case-env-MASTER_PORT"),
    pytest.param(TWO + "launcher: {kind: torchrun, master_addr: node0, master_port: 5973}\n",
                 (5973, "node0", "master_port"), id="torchrun-master_port"),
    pytest.param(TWO + "launcher: {kind: torchrun, rdzv_endpoint: 'node0:5972', "
                 "master_addr: node1, master_port: 5973}\n",
                 (5972, "node0", "rdzv_endpoint"), id="endpoint-wins-over-master_port"),
    pytest.param(TWO + "launcher: {kind: torchrun, rdzv_endpoint: node0}\n",
                 (None, "node0", "rdzv_endpoint"), id="endpoint-without-port-is-the-lease"),
    pytest.param(TWO + "launcher: torchrun\n",
                 (None, "node0", "the run's lease (--master-port)"), id="static-recipe"),
    pytest.param(TWO + "launcher:\n  kind: torchrun\n  rdzv_endpoint: 'node0:6000'\n"
                 "  agents: {node0: {rdzv_endpoint: 'node0:6001'}}\n",
                 (6001, "node0", "agents.node0.rdzv_endpoint"), id="per-agent-endpoint"),
    pytest.param(TWO + "launcher:\n  kind: torchrun\n  master_addr: node0\n"
                 "  agents: {node0: {master_port: 6002}, node1: {master_port: 6002}}\n",
                 (6002, "node0", "agents.node0.master_port"), id="per-agent-master_port"),
    pytest.param(TWO + "launcher: {kind: torchrun, master_addr: node0, "
                 "args: ['--master-port=6300']}\n",
                 (6300, "node0", "args (--master-port)"), id="verbatim-flag"),
    pytest.param(ONE + "launcher: torchrun\nenv: {PET_MASTER_PORT: '6400'}\n",
                 (6400, "local", "the case's env PET_MASTER_PORT"), id="torchrun-env-default"),
]


@pytest.mark.parametrize("text,want", STORES)
def test_each_source_of_the_store_port(text, want, counter_ports):
    plan = plan_of(text, counter_ports)
    st = plan.store()
    port, host, source = want
    assert (st.port, st.host, st.source) == (port or plan.master_port, host, source)


def test_torchrun_rdzv_endpoint_port_is_the_store(counter_ports):
    plan = plan_of(TWO + "launcher: {kind: torchrun, rdzv_endpoint: 'node0:5972'}\n",
                   counter_ports)
    st = plan.store()
    assert (st.port, st.host, st.addr, st.source) == \
        (5972, "node0", plan.host("node0").addr, "rdzv_endpoint")
    assert st.verified


def test_a_port_chosen_at_run_time_is_none_and_says_why(counter_ports):
    single = plan_of(ONE + "launcher: torchrun\n", counter_ports)
    assert single.store().port is None and "localhost:0" in single.store().why
    standalone = plan_of(ONE + "launcher: {kind: torchrun, standalone: true}\n", counter_ports)
    assert standalone.store().port is None and "--standalone" in standalone.store().why


def test_a_users_program_is_as_launched_unverified(counter_ports):
    plan = plan_of(ONE + f"program: {{script: {SCRIPT}}}\n", counter_ports)
    st = plan.store()
    assert st.port == plan.master_port and not st.verified and st.status == UNVERIFIED
    assert UNVERIFIED in st.describe()


def test_a_firewall_on_a_users_programs_store_says_it_is_unverified(counter_ports):
    plan = plan_of(TWO + f"program: {{script: {SCRIPT}}}\n"
                   "faults: [{kind: firewall, host: node0, ports: master}]\n", counter_ports)
    assert rules(plan)[0].ports == [plan.master_port]
    assert plan.notes[-1].endswith(f"master port {plan.master_port} on host node0, from the "
                                   "start (the store's port as launched, unverified)")


def test_init_file_has_no_store_port(counter_ports):
    plan = plan_of(ONE + "init: file\n", counter_ports)
    assert (plan.store().kind, plan.store().port) == ("file", None)


def test_a_second_job_has_its_store(counter_ports):
    plan = plan_of(ONE + "faults: [{kind: concurrent_job}]\n", counter_ports)
    assert plan.store("job2").port == plan.store().port == plan.master_port
    assert plan.to_dict()["stores"]["job2"]["port"] == plan.master_port


def test_the_plan_dict_names_the_store(counter_ports):
    d = plan_of(TWO + "launcher: {kind: torchrun, rdzv_endpoint: 'node0:5972'}\n",
                counter_ports).to_dict()
    assert d["store"]["port"] == 5972 and d["store"]["status"] == "planned"
    assert JobStore.from_dict(d["store"]).endpoint().endswith(":5972")


# -- what reads it ----------------------------------------------------------------------------

def test_firewall_master_drops_the_launchers_port_not_the_lease(counter_ports):
    plan = plan_of(TWO + "launcher: {kind: torchrun, rdzv_endpoint: 'node0:5972'}\n"
                   "faults: [{kind: firewall, host: node0, ports: master}]\n", counter_ports)
    (rule,) = rules(plan)
    assert rule.ports == [5972] and plan.master_port != 5972
    assert "master port 5972" in plan.notes[-1]


def test_firewall_data_keeps_the_launchers_port_open(counter_ports):
    plan = plan_of(TWO + "launcher: {kind: torchrun, master_addr: node0, master_port: 5973}\n"
                   "faults: [{kind: firewall, host: node0, ports: data}]\n", counter_ports)
    assert rules(plan)[0].ports == {"except": [5973]}


def test_firewall_master_follows_init_url(counter_ports):
    plan = plan_of(TWO + "init: tcp\ninit_url: 'tcp://{addr}:{port2}'\n"
                   "faults: [{kind: firewall, ports: master}]\n", counter_ports)
    assert rules(plan)[0].ports == [plan.url_port]


@pytest.mark.parametrize("extra, why", [
    ("launcher: {kind: torchrun, standalone: true}\n", "chosen at run time"),
    ("init: file\n", "init: file has no store"),
])
def test_firewall_master_without_a_known_port_is_refused_at_load(counter_ports, extra, why):
    with pytest.raises(ScenarioFileError) as e:   # located: the fault's line
        plan_of(ONE + extra + "faults: [{kind: firewall, host: local, ports: master}]\n",
                counter_ports)
    text = str(e.value)
    assert "jobstore.yaml:5: faults[0].kind: firewall: ports: master means the job's store " \
        "port" in text and why in text


def test_busy_port_holds_the_launchers_port(counter_ports):
    plan = plan_of(ONE + "env: {MASTER_PORT: '6100'}\nfaults: [{kind: busy_port}]\n",
                   counter_ports)
    (hold,) = [s for s in plan.steps if s.fault == "busy_port"]
    assert hold.port == 6100


def _context(plan_dict, port):
    v = Verdict(label="1", outcome="timeout", phase="init", duration=5.0, role="worker",
                exception="DistNetworkError", message="The client socket has timed out after "
                f"5000ms while trying to connect to (10.0.0.1, {port}).")
    run = RunObservation(plan=plan_dict, torch_version="2.13.0", ranks=[], wall=5.0,
                         run_dir="")
    return RankContext(verdict=v, obs=None, run=run, verdicts=[v])


def test_the_diagnosis_names_the_store_port_not_the_lease(counter_ports):
    plan = plan_of(TWO + "launcher: {kind: torchrun, rdzv_endpoint: 'node0:5972'}\n",
                   counter_ports).to_dict()
    assert _context(plan, 5972).master_port == 5972
    # dialling the endpoint's port is dialling the store: not "a port where no store listened"
    cause = no_store_there(_context(plan, 5972))
    assert cause is None or "where no store listened" not in cause.text
    other = no_store_there(_context(plan, 6001))
    assert other is not None and "(the store's port is 5972)" in other.text
    old = dict(plan)
    old.pop("store")   # a report written before the store was planned: the lease
    assert _context(old, 1).master_port == plan["master_port"]


def test_show_header_names_the_store_and_the_unused_lease(counter_ports):
    from harness.cli import _store_header

    plan = plan_of(TWO + "launcher: {kind: torchrun, rdzv_endpoint: 'node0:5972'}\n",
                   counter_ports).to_dict()
    text = _store_header(plan)
    assert text.startswith(f"store {plan['hosts'][0]['addr']}:5972 on host node0 "
                           "(port from rdzv_endpoint)")
    assert f"leased port {plan['master_port']} is not the store's" in text
    plain = plan_of(ONE, counter_ports).to_dict()
    assert "leased port" not in _store_header(plain)


# -- reading a launch ---------------------------------------------------------------------------

def test_flag_value_reads_both_spellings_and_the_last_wins():
    argv = ["--master-port", "1", "--nnodes", "2", "--master_port=3", "--standalone"]
    assert flag_value(argv, "--master-port", "--master_port") == (True, "3")
    assert flag_value(argv, "--standalone") == (True, None)
    assert flag_value(argv, "--rdzv-endpoint") == (False, None)


@pytest.mark.parametrize("value, parts", [
    ("node0:5972", ("node0", 5972)), ("node0", ("node0", None)),
    ("[::1]:29400", ("::1", 29400)), ("::1", ("::1", None)),
])
def test_split_endpoint(value, parts):
    assert split_endpoint(value) == parts

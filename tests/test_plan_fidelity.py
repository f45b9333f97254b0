"""What `harness show` plans is what each process really gets (issue 39, item 3).

Every catalog case loads (the field table refuses nothing the catalog writes). A few cases per
launcher then run for real: each process the harness starts records, from inside, the argv it
was started with and the values of the variables its plan sets or unsets (harness.observer's
hello, the worker's start phase: harness.protocol.PLANNED_ENV), and these are compared with
the plan `harness show` prints for the case (its ports, run folder and addresses are examples:
each run leases its own, so they are compared as roles, not numbers) and with the run's own.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List

import pytest

from harness.cli import plan_for_show
from harness.net import topology
from harness.run.supervisor import run_scenario
from harness.scenario.loader import load_file, load_text

REPO = Path(__file__).resolve().parents[1]
CATALOG = sorted((REPO / "scenarios").glob("*.yaml"))


def test_every_catalog_case_loads():
    cases = [scn for f in CATALOG for scn in load_file(f)]
    assert len(CATALOG) > 40 and len(cases) > 200


def _roles(plan: Dict[str, Any]) -> Dict[str, str]:
    """The run's own values (ports, folder, addresses, namespaces) -> the role they play."""
    out = {plan["run_dir"]: "<run_dir>", str(plan["master_port"]): "<master_port>"}
    if plan.get("url_port"):
        out[str(plan["url_port"])] = "<url_port>"
    for h in plan["hosts"]:
        for key in ("addr", "addr6", "netns"):
            if h.get(key) and h[key] not in ("127.0.0.1", "::1"):
                out[h[key]] = f"<{h['name']}.{key}>"
    return out


def _as_roles(value: Any, roles: Dict[str, str]) -> Any:
    text = json.dumps(value)
    for real in sorted(roles, key=len, reverse=True):
        text = re.sub(rf"(?<![\w.]){re.escape(real)}(?![\w])", roles[real], text)
    return json.loads(text)


def _processes(plan: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    return {r["label"]: {"argv": r["argv"], "env": r["env"], "unset": r.get("unset", []),
                         "python": r.get("python", ""), "start": r.get("start", "fresh")}
            for r in plan["ranks"] if not r.get("absent")}


def _got(row: Any) -> Dict[str, Any]:
    """What a process recorded of its start: argv and the plan's variables (None: unset)."""
    for e in row.events:
        if e.ev == "hello" and "env" in e.data:
            return {"argv": e.data["argv"], "env": e.data["env"], "observed": True}
        if e.ev == "phase" and e.data.get("phase") == "start" and "launched" in e.data:
            return {**e.data["launched"], "observed": False}
    raise AssertionError(f"{row.label} recorded no start (events: {[e.ev for e in row.events]})")


def _check(scn: Any) -> Any:
    shown = plan_for_show(scn)
    run = run_scenario(scn)
    ran = run.plan
    # harness show's plan is the run's plan, but for the values each run leases for itself
    assert _as_roles(_processes(shown), _roles(shown)) == _as_roles(_processes(ran), _roles(ran))
    rows = {r.label: r for r in run.ranks}
    for label, p in _processes(ran).items():
        got = _got(rows[label])
        want_env = {k: p["env"].get(k) for k in set(p["env"]) | set(p["unset"])}
        assert got["env"] == want_env, label
        python = p["python"] or sys.executable
        if got["observed"]:
            assert got["argv"] == [a[:200] for a in [python, *p["argv"]]][:40], label
        elif p["start"] == "fork":   # forked from its host's server: the server's argv
            assert got["argv"][1:3] == ["-m", "harness.ranks.forkserver"], label
        else:
            assert got["argv"][:3] == [python, "-m", "harness.ranks.worker"], label
            spec = json.loads(got["argv"][3])
            assert spec["label"] == label and spec["timeout"] == ran["timeout"], label
    return run


def _case(file: str, case: str) -> Any:
    return next(s for s in load_file(REPO / "scenarios" / file) if s.case == case)


needs_netns = pytest.mark.skipif(bool(topology.missing()),
                                 reason="namespaces need: " + "; ".join(topology.missing()))


@pytest.mark.timeout(240)
def test_direct_forked_ranks_get_their_planned_environment():
    (scn,) = load_file(REPO / "scenarios" / "healthy.yaml")
    assert scn.start == "fork"
    run = _check(scn)
    assert all(r.returncode == 0 for r in run.ranks)


@needs_netns
@pytest.mark.timeout(240)
def test_direct_fresh_ranks_on_two_hosts_get_their_planned_argv_and_environment():
    scn = _case("net-healthy-hosts.yaml", "two_hosts").model_copy(update={"start": "fresh"})
    run = _check(scn)
    starts = [_got(r) for r in run.ranks]
    assert all(not s["observed"] and s["argv"][1:3] == ["-m", "harness.ranks.worker"]
               for s in starts)
    assert {s["env"]["MASTER_ADDR"] for s in starts} == {run.plan["master_addr"]}


@pytest.mark.timeout(240)
def test_a_spawning_parent_gets_its_planned_argv_and_environment():
    run = _check(_case("spawn.yaml", "healthy_spawn"))
    assert any(r.label == "parent:local" for r in run.ranks)


@pytest.mark.timeout(240)
def test_a_legacy_launch_agent_with_a_program_gets_its_planned_argv():
    run = _check(_case("legacy-launch.yaml", "use_env"))
    agent = _got(next(r for r in run.ranks if r.label == "agent:local"))
    assert agent["argv"][1:3] == ["-m", "torch.distributed.launch"] and "--use-env" in agent["argv"]


@needs_netns
@pytest.mark.timeout(240)
def test_a_per_agent_master_port_keeps_the_master_address_in_the_agents_real_argv():
    # the two agents never meet (node1 dials another port), so the run lasts its deadline:
    # 20 s, not 60, for what is checked here, each agent's argv as it started (a few s in)
    (scn,) = load_text(textwrap.dedent("""\
        name: agent_port
        about: node1's agent names a master port of its own, not the master's address
        nodes: 2
        deadline: 20
        launcher:
          kind: torchrun
          agents:
            node1: {master_port: 29500}
        """), "fidelity.yaml")
    run = _check(scn)
    master = run.plan["master_addr"]
    for label, port in (("agent:node0", str(run.plan["master_port"])),
                        ("agent:node1", "29500")):
        argv: List[str] = _got(next(r for r in run.ranks if r.label == label))["argv"]
        assert argv[argv.index("--master-addr") + 1] == master, label
        assert argv[argv.index("--master-port") + 1] == port, label


@pytest.mark.timeout(240)
def test_two_concurrent_jobs_run_as_rows_of_their_own():
    (scn,) = load_text(textwrap.dedent("""\
        name: two_jobs
        about: two more jobs on the run's port, each with rows of its own
        timeout: 5
        deadline: 10
        workload: init
        faults:
          - {kind: concurrent_job, world_size: 1}
          - {kind: concurrent_job, world_size: 1}
        """), "fidelity.yaml")
    run = _check(scn)
    assert sorted(r.label for r in run.ranks) == ["0", "1", "job2:0", "job3:0"]
    assert len({r.pid for r in run.ranks}) == 4

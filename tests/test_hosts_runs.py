"""Hosts as whole machines in real runs (real torch ranks, real namespaces): what each rank sees
of its host (its name, its hosts file, its kernel settings), and that a SIGKILLed run leaves no
namespace and no pinned UTS namespace behind once the next run sweeps."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest
from orphans import state_dir, supervisor

from harness.machine.procs import alive
from harness.net import topology
from harness.run.supervisor import run_scenario
from harness.scenario.loader import load_text

if topology.missing():
    pytest.skip("hosts as machines need: " + "; ".join(topology.missing()),
                allow_module_level=True)

REPO = Path(__file__).resolve().parents[1]


def scenario(text: str):
    (scn,) = load_text(textwrap.dedent(text), "s.yaml")
    return scn


def _ready(run, label: str) -> dict:
    r = next(r for r in run.ranks if r.label == label)
    return next(e.data for e in r.events if e.ev == "ready")


def test_each_rank_sees_its_hosts_name_files_and_settings():
    run = run_scenario(scenario("""\
        name: machines
        about: each host is a machine of its own
        hosts:
          - {name: a, hostname: alpha, names: {store: b},
             sysctl: {net.core.somaxconn: 7}}
          - {name: b}
        timeout: 10
        deadline: 60
        workload: [barrier]
        """))
    assert _ready(run, "0")["hostname"] == "alpha"
    import socket

    assert _ready(run, "1")["hostname"] == socket.gethostname()   # b shares the machine's
    plan_hosts = {h["name"]: h for h in run.plan["hosts"]}
    assert plan_hosts["a"]["machine"]["sysctl"] == {"net.core.somaxconn": "7"}
    shaped = [s for s in run.step_log if s.fault == "run" and s.action == "do"
              and "a" in (s.info or {})]
    assert shaped and "net.core.somaxconn=7" in shaped[0].info["a"]
    assert set(run.counters) == {"a", "b"}
    assert run.counters["a"].get("Tcp.PassiveOpens", 0) >= 1     # the store was dialed on a


SCENARIO = """\
name: orphaned_machines
about: a run of hosts with names of their own whose supervisor is killed
hostnames: own
nodes: 2
timeout: 60
deadline: 120
workload: [sleep 100]
"""


def test_a_killed_run_of_named_hosts_leaves_nothing_after_the_sweep(tmp_path):
    def pins():
        try:
            return {p.name for p in topology.UTS_DIR.iterdir()}
        except FileNotFoundError:
            return set()

    before_pins, before_ns = pins(), set(topology._list_netns())
    assert all(p.count('-') >= 2 for p in before_pins)   # thx-<run>-<host>
    sup = supervisor(SCENARIO, tmp_path)
    base = state_dir(tmp_path)
    pids = []
    try:
        end = time.monotonic() + 180
        run_dir = None
        while time.monotonic() < end and run_dir is None:
            for d in base.glob("run-*"):
                evs = [d / f"rank-{i}.events" for i in (0, 1)]
                if all(p.exists() and '"workload step 1"' in p.read_text() for p in evs):
                    run_dir = d
            time.sleep(0.2)
        assert run_dir is not None, "the ranks never reached their workload"
        pids = [json.loads(ln)["pid"] for ln in (run_dir / "pids.jsonl").read_text().splitlines()]
        # this run's pins only (thx-<run id>-<host>): other runs on the machine make theirs too
        own = f"{topology.PREFIX}{run_dir.name[len('run-'):]}-"
        new_pins = {p for p in pins() - before_pins if p.startswith(own)}
        assert len(new_pins) == 2                                  # node0's and node1's names
        sup.send_signal(signal.SIGKILL)
        sup.wait(timeout=30)
        end = time.monotonic() + 30
        while any(alive(p) for p in pids) and time.monotonic() < end:
            time.sleep(0.1)
        assert not any(alive(p) for p in pids)
        assert new_pins <= pins()                                  # left until a sweep
        topology.sweep()
        assert not (new_pins & pins())
        runs = {pin.rsplit("-", 1)[0] for pin in new_pins}        # thx-<run>
        ours = [ns for ns in set(topology._list_netns()) - before_ns
                if any(ns.startswith(run + "-") or ns == run + ".sw" for run in runs)]
        assert ours == []                  # the killed run's namespaces (not other runs')
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
        assert sup.stderr is not None
        sup.stderr.close()
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)

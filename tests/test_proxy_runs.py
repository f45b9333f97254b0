"""The fault proxy inside real runs: it is there (its log saw the ranks' connections), it goes
with the run, and a SIGKILLed run leaves no proxy process, namespace, nftables rule or
address behind once the next run's sweep has run. Needs root (namespaces) for the transparent
cases; the front placement runs without namespaces."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from harness.judge.classify import classify_run
from harness.machine.procs import alive
from harness.net import topology
from harness.run.supervisor import run_scenario
from harness.scenario.loader import load_text

_MISSING = topology.missing()
real = pytest.mark.skipif(bool(_MISSING), reason="real network runs need: " + "; ".join(_MISSING))

TWO_HOSTS = """\
name: p
about: proxy in a run
hosts: [{name: a}, {name: b}]
timeout: 5
deadline: 60
workload: [barrier]
"""
ONE_HOST = """\
name: p
about: proxy in front of the store, no namespaces
world_size: 2
isolate: never
timeout: 5
deadline: 60
workload: [barrier]
"""


def load(text: str):
    (scn,) = load_text(text, "p.yaml")
    return scn


def _log(obs_dir: Path) -> List[Dict[str, Any]]:
    (path,) = obs_dir.glob("service-proxy_*.err")
    return [json.loads(ln) for ln in path.read_text().splitlines()]


@real
def test_a_transparent_proxy_without_toxic_changes_no_verdict_and_sees_every_connection(
        tmp_path):
    scn = load(TWO_HOSTS + "faults: [{kind: slow_close, delay_ms: 1, probability: 0.001}]\n")
    obs = run_scenario(scn, keep=tmp_path)
    assert [v.outcome for v in classify_run(obs)] == ["ok", "ok"]
    log = _log(tmp_path)
    opened = [e for e in log if e["ev"] == "open"]
    # the store connections of both ranks and gloo's mesh between a and b
    assert {e["kind"] for e in opened} == {"in", "out"}, opened
    assert any(e["dst"][1] == obs.plan["master_port"] for e in opened)
    assert any(e["dst"][1] != obs.plan["master_port"] for e in opened)
    assert any(e["ev"] == "stop" for e in log)          # stopped by the run, not killed


@pytest.mark.skipif(sys.platform != "linux", reason="Linux only")
def test_a_front_proxy_runs_without_namespaces_and_delays_the_store(tmp_path):
    scn = load(ONE_HOST + "faults: [{kind: latency, delay_ms: 300, traffic: store, "
                          "placement: front, engine: proxy}]\n")
    assert not scn.needs_namespaces()
    obs = run_scenario(scn, keep=tmp_path)
    verdicts = classify_run(obs)
    assert [v.outcome for v in verdicts] == ["ok", "ok"]
    # rank 1 went through the proxy: its store round trips carry 300 ms each
    assert verdicts[1].duration is not None and verdicts[1].duration > 0.6
    log = _log(tmp_path)
    opened = [e for e in log if e["ev"] == "open"]
    assert opened and all(e["kind"] == "in" for e in opened)   # rank 1's store connections


CHILD = """
import sys
from harness.run.supervisor import run_scenario
from harness.scenario.loader import load_text
(scn,) = load_text(sys.stdin.read(), "k.yaml")
run_scenario(scn)
"""


def _killed_run(tmp_path: Path, text: str) -> Dict[str, Any]:
    """Start a run in a child, wait until its proxy met a connection, SIGKILL the child
    (only it: its children are left to what the harness does about a killed run)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HARNESS_"))}
    env["HARNESS_TMP"] = str(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    assert child.stdin is not None
    child.stdin.write(text.encode())
    child.stdin.close()
    base = tmp_path / f"torchdist-harness-{os.geteuid()}"
    end = time.monotonic() + 180
    run = None
    while time.monotonic() < end and child.poll() is None:
        runs = list(base.glob("run-*"))
        logs = list(runs[0].glob("service-proxy_*.err")) if runs else []
        if logs and '"ev": "toxic_applies"' in logs[0].read_text():
            run = runs[0]
            break
        time.sleep(0.05)
    if run is None:
        child.kill()
        assert child.stdout is not None
        pytest.fail("the run's proxy met no connection: " +
                    child.stdout.read().decode(errors="replace")[-3000:])
    recs = [json.loads(ln) for ln in (run / "pids.jsonl").read_text().splitlines()]
    state = topology.STATE_DIR / f"thx-{run.name[len('run-'):]}.json"
    namespaces = json.loads(state.read_text())["namespaces"] if state.exists() else []
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    return {"run": run, "procs": recs, "namespaces": namespaces}


def _wait_dead(recs: List[Dict[str, Any]], limit: float = 30.0) -> List[int]:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        left = [r["pid"] for r in recs if alive(r)]
        if not left:
            return []
        time.sleep(0.05)
    return [r["pid"] for r in recs if alive(r)]


def _netns() -> List[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.strip()]


@real
def test_a_sigkilled_run_leaves_no_proxy_rule_or_namespace_after_the_sweep(tmp_path):
    text = TWO_HOSTS + "faults: [{kind: blackhole, traffic: store}]\n"
    made = _killed_run(tmp_path, text)
    proxies = [r for r in made["procs"] if str(r.get("name", "")).startswith("proxy@")]
    assert proxies, made["procs"]
    # the proxy dies with its supervisor (PR_SET_PDEATHSIG), so do the ranks
    assert _wait_dead(made["procs"]) == []
    # its namespaces (and so its nftables tables and addresses) are there until the sweep
    assert set(made["namespaces"]) <= set(_netns())
    topology.sweep()
    assert set(made["namespaces"]) & set(_netns()) == set()
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert all(ns not in tables for ns in made["namespaces"])
    assert not any(Path("/etc/netns").glob(f"*{made['run'].name[len('run-'):]}*"))


@pytest.mark.skipif(sys.platform != "linux", reason="Linux only")
def test_a_sigkilled_run_leaves_no_front_proxy(tmp_path):
    text = ONE_HOST + "faults: [{kind: blackhole, traffic: store, placement: front}]\n"
    made = _killed_run(tmp_path, text)
    assert any(str(r.get("name", "")).startswith("proxy@") for r in made["procs"])
    assert _wait_dead(made["procs"]) == []

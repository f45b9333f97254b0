"""harness explore for real with every kind of run it can draw: namespace hosts with a
firewall fault, spawn's parents, torchrun's agents; each exploration runs its draws in
parallel (--jobs 2, pytest-xdist's workers) and must leave nothing behind: no process, no
network namespace, /etc/netns folder, topology state or nft table of any of its runs, no run
directory, no batch folder.

The spaces are small on purpose (2-4 draws, short deadlines): each test takes 20-60 s on a
loaded 2-core machine. The broken invariants here are real: spawn's ``method: process``
parent exits 0 after a child was SIGKILLed (the catalog's ``spawn.yaml``
killed_child_process), and a torchrun agent with ``--monitor-interval 60`` is still asleep
at the deadline although its worker ended ok long before.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import psutil
import pytest

from harness.cli import main
from harness.machine.rundir import base_dir
from harness.net import topology
from harness.scenario.loader import load_file

pytestmark = pytest.mark.timeout(600)

_MISSING = topology.missing()
needs_netns = pytest.mark.skipif(bool(_MISSING), reason="namespace hosts need: "
                                 + "; ".join(map(str, _MISSING)))


def explore(tmp_path: Path, text: str, *args: str) -> Dict[str, Any]:
    space = tmp_path / "space.yaml"
    space.write_text(text)
    rep = tmp_path / "report.json"
    rc = main(["explore", str(space), "--jobs", "2", "--keep", str(tmp_path / "evidence"),
               "--out", str(tmp_path / "found"), "--report", str(rep), *args])
    report = json.loads(rep.read_text())
    report["rc"] = rc
    return report


def leftovers(report: Dict[str, Any]) -> List[str]:
    """What any run of the exploration left: found through each run's kept evidence (its run
    id), the process tree, and the batch folders of this process."""
    ids = []
    for d in report["draws"]:
        if d.get("evidence"):
            obs = json.loads((Path(d["evidence"]) / "observation.json").read_text())
            ids.append(obs["plan"]["run_id"])
    assert ids, "no run kept its evidence"
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout \
        if not _MISSING else ""
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout \
        if not _MISSING else ""
    left = []
    for rid in ids:
        left += [f"netns {line.split()[0]}" for line in netns.splitlines() if rid in line]
        left += [f"nft {line}" for line in tables.splitlines() if rid in line]
        left += [str(p) for p in topology.NETNS_ETC_DIR.glob(f"*{rid}*")]
        left += [str(p) for p in topology.STATE_DIR.glob(f"*{rid}*")]
        left += [str(p) for p in base_dir().glob(f"run-{rid}*")]
    for own in base_dir().glob("cli-*"):   # the batch's folder (harness.rundir.own_folder)
        try:
            if json.loads((own / "owner.json").read_text()).get("pid") == os.getpid():
                left.append(str(own))
        except (OSError, ValueError):
            pass
    left += [f"process {p.pid} {' '.join(p.cmdline())[:100]}"
             for p in psutil.Process().children(recursive=True)]
    return left


@needs_netns
def test_hosts_with_a_namespace_firewall_fault(tmp_path):
    """Two namespace hosts; the fault: host a rejects new connections to every port but the
    store's (gloo's mesh), drawn or not. 2 distinct draws, run together."""
    rep = explore(tmp_path, """\
name: hosts_firewall
about: namespace hosts with a firewall fault, explored
hosts: [{name: a}, {name: b}]
timeout: 2
deadline: 30
workload: [barrier]
explore:
  max_faults: 1
  faults:
    - kind: firewall
      host: a
      ports: data
      action: reject
  invariants: [ok_without_faults, no_hang]
""", "--seed", "1", "--runs", "4")
    assert rep["rc"] == 0, rep
    runs = {bool(d["scenario"]["faults"]): d for d in rep["draws"] if d.get("verdicts")}
    assert set(runs) == {False, True}
    assert runs[False]["job"] == "ok"
    ranks = {v["label"]: v for v in runs[True]["verdicts"]}
    assert runs[True]["job"] != "ok" and ranks["0"]["outcome"] in ("timeout", "error")
    assert all(v["outcome"] != "hang" for v in ranks.values())
    assert leftovers(rep) == []


def test_spawn_parent_that_disagrees_with_its_children_is_found(tmp_path):
    """spawn, method drawn (torch's spawn or plain processes), a child SIGKILLed in its
    barrier, drawn or not: the plain-process parent exits 0 with a dead child, and the
    explorer shrinks to exactly that."""
    rep = explore(tmp_path, """\
name: spawn_agree
about: spawn's parents against their children, explored
timeout: 5
deadline: 40
workload: [barrier, "sleep 1", barrier]
explore:
  world_size: 2
  fields:
    launcher: {one_of: [{kind: spawn, method: spawn}, {kind: spawn, method: process}]}
  max_faults: 1
  faults:
    - kind: kill_rank
      rank: 1
      phase: workload step 2
  invariants: [agents_agree_with_workers, no_hang]
""", "--seed", "3", "--runs", "6", "--max-shrinks", "4", "--confirm", "0")
    assert rep["rc"] == 1, rep
    found = rep["found"]
    assert found["invariant"] == "agents_agree_with_workers"
    assert found["why"].startswith("parent:local ended ok while its worker")
    assert "1 ended in crash" in found["why"]
    assert found["scenario"]["launcher"] == {"kind": "spawn", "method": "process"}
    assert [f["kind"] for f in found["scenario"]["faults"]] == ["kill_rank"]
    # torch's spawn, the same kill: the parent raises, the rows agree
    same = [d for d in rep["draws"] if d["phase"] == "draw" and d.get("verdicts")
            and d["scenario"]["launcher"]["method"] == "spawn" and d["scenario"]["faults"]]
    for d in same:
        rows = {v["label"]: v for v in d["verdicts"]}
        assert rows["parent:local"]["outcome"] == "error" and not d["broken"], d
    (scn,) = load_file(found["file"])
    assert scn.launcher.kind == "spawn"
    assert leftovers(rep) == []


def test_torchrun_agent_asleep_after_its_workers_is_found(tmp_path):
    """torchrun, its --monitor-interval drawn (0.5 s or 60 s), one worker: with 60 s the agent
    sleeps through its worker's ok end and is still alive at the 25 s deadline (hang): agent
    and worker disagree. With 0.5 s they agree."""
    rep = explore(tmp_path, """\
name: torchrun_agree
about: torchrun's agent against its worker, explored
timeout: 5
deadline: 25
workload: [barrier]
explore:
  world_size: 1
  fields:
    launcher: {one_of: [{kind: torchrun, monitor_interval: 0.5},
                        {kind: torchrun, monitor_interval: 60}]}
  invariants: [agents_agree_with_workers]
""", "--seed", "0", "--runs", "3", "--max-shrinks", "2", "--confirm", "0")
    assert rep["rc"] == 1, rep
    found = rep["found"]
    assert found["scenario"]["launcher"]["monitor_interval"] == 60
    assert found["why"].startswith("agent:local ended in hang") and "(0)" in found["why"]
    quick = [d for d in rep["draws"] if d.get("verdicts")
             and d["scenario"]["launcher"]["monitor_interval"] == 0.5]
    assert quick and all(d["job"] == "ok" and not d["broken"] for d in quick)
    slow = next(d for d in rep["draws"] if d["scenario"] == found["scenario"])
    rows = {v["label"]: v for v in slow["verdicts"]}
    assert rows["agent:local"]["role"] == "agent" and rows["0"]["node"] == "agent:local"
    assert "after all its workers had ended ok" in (rows["agent:local"]["cause"] or "")
    assert leftovers(rep) == []

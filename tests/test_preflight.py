"""harness preflight: the pure parts (node lists, gloo's interface, the collective's verdict,
judging the nodes' files) and real runs across the Slurm test cluster: healthy, then one problem
injected on one node (its name on 127.0.1.1, its master port dropped by nftables), and that node,
and only that node, flagged. The real runs skip, naming what is missing, where Slurm or root is
not there."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from harness.net import topology
from harness.services import slurm as svc
from harness.tools import preflight as pf


# -- the pure parts ---------------------------------------------------------------------------
def test_node_lists_expand_as_slurm_writes_them(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")          # no scontrol: the parser
    assert pf.expand_nodelist("node[0-2,05],gpu7") == ["node0", "node1", "node2", "node05",
                                                       "gpu7"]
    assert pf.expand_nodelist("a1") == ["a1"]


def test_gloo_interface_follows_the_host_name_or_the_variable(monkeypatch):
    ifs = {"lo": ["127.0.0.1/8"], "eth0": ["10.0.0.2/24"], "ib0": ["10.1.0.2/24"]}
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    g = pf.gloo_interface("n1", ["10.0.0.2"], ifs)
    assert (g["ifname"], g["addr"], g["problem"]) == ("eth0", "10.0.0.2", None)
    g = pf.gloo_interface("n1", ["127.0.1.1"], ifs)             # the Debian trap: lo's /8
    assert g["ifname"] == "lo" and "advertise loopback" in g["problem"]
    g = pf.gloo_interface("n1", ["10.9.9.9"], ifs)
    assert g["ifname"] is None and "none of this node's interfaces" in g["problem"]
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "ib0")
    assert pf.gloo_interface("n1", ["127.0.1.1"], ifs)["addr"] == "10.1.0.2"
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth9")
    assert "no interface 'eth9'" in pf.gloo_interface("n1", [], ifs)["problem"]


def _raised(cls, message, mro=("builtins.RuntimeError", "builtins.Exception")):
    return {"ok": False, "exception": cls, "message": message, "mro": [cls, *mro]}


def test_the_collective_is_classified_in_the_harness_words():
    assert pf.classify_collective(0, {"ok": True, "s": 0.4}, False)[0] == "ok"
    assert pf.classify_collective(None, None, True)[0] == "hang"
    v, why = pf.classify_collective(1, _raised(
        "torch.distributed.DistStoreError", "Timed out after 6 seconds waiting for clients. "
        "1/2 clients joined."), False)
    assert v == "timeout" and "1/2 clients joined" in why
    # the harness's table, not the words: gloo's refused connect says "timed out" too
    assert pf.classify_collective(1, _raised(
        "RuntimeError", "Gloo connectFullMesh failed ... timed out connecting: SO_ERROR: "
        "Connection refused"), False)[0] == "error"
    assert pf.classify_collective(1, _raised("ValueError", "a timeout of -1",
                                             ("builtins.Exception",)), False)[0] == "error"
    assert pf.classify_collective(-9, None, False)[0] == "crash"
    assert pf.classify_collective(0, None, False)[0] == "error"     # exit 0 without the result


def _facts(node, torch="2.13.0", own=("10.0.0.1",), names=None, ports=(29500, 40000)):
    return {"node": node, "hostname": node, "own": list(own), "own_error": None,
            "names": names or {}, "gloo": {"ifname": "eth0", "addr": own[0], "problem": None},
            "ports": {"master": ports[0], "ephemeral": ports[1]},
            "versions": {"python": "3.11.2", "executable": "/py", "torch": torch, "cuda": None,
                         "nccl": None}}


def _ok(node):
    return {"node": node, "collective": {"verdict": "ok", "reason": "", "s": 1.0}, "s": 2.0}


def test_judging_flags_the_stale_image_and_only_it():
    nodes = ["a", "b", "c"]
    facts = {"a": _facts("a"), "b": _facts("b", torch="2.4.0"), "c": _facts("c")}
    rep = pf.judge(nodes, facts, {}, {n: _ok(n) for n in nodes})
    assert [r["ok"] for r in rep["nodes"]] == [True, False, True] and not rep["ok"]
    assert "torch 2.4.0 (others 2.13.0)" in rep["nodes"][1]["reasons"][0]
    # a tie between two nodes: the first node's image is the reference
    rep = pf.judge(["a", "b"], {"a": _facts("a"), "b": _facts("b", torch="2.4.0")}, {},
                   {n: _ok(n) for n in "ab"})
    assert [r["ok"] for r in rep["nodes"]] == [True, False]


def test_judging_blames_the_target_nobody_reaches_and_the_source_that_reaches_nothing():
    nodes = ["a", "b", "c"]
    facts = {n: _facts(n) for n in nodes}
    ok, bad = {"ok": True, "s": 0.01}, {"ok": False, "s": 2.0, "error": "TimeoutError"}
    reach = {"a": {"reach": {"b master": ok, "c master": bad}},
             "b": {"reach": {"a master": ok, "c master": bad}},
             "c": {"reach": {"a master": ok, "b master": ok}}}
    rep = pf.judge(nodes, facts, reach, {n: _ok(n) for n in nodes})
    assert [r["node"] for r in rep["nodes"] if not r["ok"]] == ["c"]
    assert "master port 29500 not reachable from a" in rep["nodes"][2]["reasons"][0]
    reach = {"a": {"reach": {"b master": bad, "c master": bad}},
             "b": {"reach": {"a master": ok, "c master": ok}},
             "c": {"reach": {"a master": ok, "b master": ok}}}
    rep = pf.judge(nodes, facts, reach, {n: _ok(n) for n in nodes})
    assert [r["node"] for r in rep["nodes"] if not r["ok"]] == ["a"]
    assert "cannot reach b:29500 (master) that c reach" in rep["nodes"][0]["reasons"][0]


def test_a_node_that_never_answers_is_flagged():
    rep = pf.judge(["a", "b"], {"a": _facts("a")}, {}, {"a": _ok("a")})
    assert rep["nodes"][1]["reasons"] == ["no answer (its task never wrote its facts)"]
    assert "flagged: b" in pf.table(rep)


def test_show_prints_a_finished_reports_table_and_its_status(tmp_path, capsys):
    from harness.cli import main

    rep = pf.judge(["a", "b"], {"a": _facts("a")}, {}, {"a": _ok("a")})
    (tmp_path / "report.json").write_text(json.dumps(rep))
    assert main(["preflight", "--show", str(tmp_path)]) == 1
    assert "preflight: 1/2 nodes pass; flagged: b" in capsys.readouterr().out
    assert main(["preflight", "--show", str(tmp_path / "nothing")]) == 2
    assert "not a preflight report" in capsys.readouterr().err


def test_outside_an_allocation_it_says_so(monkeypatch, capsys):
    from harness.cli import main

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert main(["preflight"]) == 2
    assert "not inside a Slurm allocation" in capsys.readouterr().err


def test_more_than_one_task_per_node_is_refused(monkeypatch, tmp_path, capsys):
    from harness.cli import main

    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert main(["preflight", "--task", "--dir", str(tmp_path)]) == 2
    assert "run exactly one task per node" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


# -- real runs across the test cluster ----------------------------------------------------------
MISSING = svc.missing() + topology.missing()
real = pytest.mark.skipif(bool(MISSING), reason="the Slurm test cluster needs: "
                          + "; ".join(MISSING))


def preflight_on_cluster(out: Path, nodes: int = 3, loop: str = "", launcher: str = "slurm",
                         faults: str = "", extra: str = "", deadline: int = 150) -> dict:
    """Start the run's own test cluster (a Slurm scenario) whose one task per node is
    ``harness preflight --task``; return the report rank 0 wrote."""
    from harness.run.supervisor import run_scenario
    from harness.scenario.loader import load_text

    hosts = "".join(f"  - {{name: node{i}, ranks: 1{', resolves_self: 127.0.1.1' if i == 1 and loop else ''}}}\n"  # noqa: E501
                    for i in range(nodes))
    text = textwrap.dedent(f"""\
        name: preflight
        about: harness preflight across the run's own Slurm cluster
        hostnames: own
        deadline: {deadline}
        launcher: {launcher}
        program: {{module: harness.tools.preflight, args: ["--task", "--dir", "{out}", "--timeout",
                  "5", "--grace", "20", "--wait", "40"{extra}]}}
    """) + "hosts:\n" + hosts + faults
    (scn,) = load_text(text, "preflight.yaml")
    run_scenario(scn)
    report = json.loads((out / "report.json").read_text())
    return report


def _flagged(report):
    return [r["node"] for r in report["nodes"] if not r["ok"]]


@real
def test_a_healthy_cluster_passes_every_node(tmp_path):
    rep = preflight_on_cluster(tmp_path / "pf")
    assert rep["ok"] and _flagged(rep) == [], pf.table(rep)
    assert [r["collective"] for r in rep["nodes"]] == ["ok", "ok", "ok"]
    assert all(r["gloo"].startswith("eth0 10.") for r in rep["nodes"])
    assert rep["nccl"] == "skipped: no CUDA device (on node0)"     # a CPU-only test cluster
    assert "NCCL collective: skipped: no CUDA device (on node0)" in pf.table(rep)


@real
def test_a_node_whose_name_resolves_to_loopback_is_flagged_alone(tmp_path):
    rep = preflight_on_cluster(tmp_path / "pf", loop="127.0.1.1",
                               launcher="{kind: slurm, interface: unset}")
    assert _flagged(rep) == ["node1"], pf.table(rep)
    why = " ".join(rep["nodes"][1]["reasons"])
    assert "node1 resolves to 127.0.1.1 here (loopback)" in why
    assert "gloo would advertise loopback" in why
    assert "a loopback address reaches the dialler itself" in why


@real
def test_a_node_with_its_master_port_dropped_is_flagged_alone(tmp_path):
    rep = preflight_on_cluster(tmp_path / "pf", faults="faults:\n  - {kind: firewall, host: "
                               "node1, ports: master, direction: in}\n")
    assert _flagged(rep) == ["node1"], pf.table(rep)
    why = " ".join(rep["nodes"][1]["reasons"])
    assert "master port" in why and "not reachable from node0" in why \
        and "not reachable from node2" in why


@real
def test_inside_an_allocation_preflight_starts_its_own_step(tmp_path):
    from harness.run.supervisor import run_scenario
    from harness.scenario.loader import load_text

    out = tmp_path / "pf"
    script = Path(__file__).parent / "data" / "preflight_in_allocation.py"
    (scn,) = load_text(textwrap.dedent(f"""\
        name: preflight_outer
        about: task 0 runs harness preflight as a user in an allocation
        hostnames: own
        hosts: [{{name: node0, ranks: 1}}, {{name: node1, ranks: 1}}]
        deadline: 150
        launcher: slurm
        program: {{script: {script}, args: ["{out}", "29611"]}}   # in the run's namespaces
    """), "preflight_outer.yaml")
    run = run_scenario(scn)
    rep = json.loads((out / "report.json").read_text())
    assert rep["ok"] and [r["node"] for r in rep["nodes"]] == ["node0", "node1"], pf.table(rep)
    assert {r.label: r.returncode for r in run.ranks}["0"] == 0
    assert not list(out.glob("stacks-*"))


def _stop_when_armed(stacks: Path, bound: float, seen: dict) -> None:
    """Find the collective child of one node (its argv names ``stacks``), wait until it catches
    SIGUSR1 (faulthandler is armed, so its stacks can be taken), then SIGSTOP it; all bounded.

    It is stopped while it imports torch, before it dials the store: waiting for it to hold a
    socket (inside init_process_group) lost a race in CI, where the 50 ms poll saw the socket
    only after the three nodes had finished their all_reduce (all three ``ok``)."""
    import os
    import signal
    import time

    usr1 = 1 << (signal.SIGUSR1 - 1)
    end = time.monotonic() + bound
    while time.monotonic() < end and "stopped" not in seen:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if len(argv) < 4 or argv[3] != str(stacks).encode():
                    continue
                status = Path(f"/proc/{pid}/status").read_text()
                caught = int(status.split("SigCgt:")[1].split()[0], 16)
                if caught & usr1:
                    os.kill(int(pid), signal.SIGSTOP)
                    seen["stopped"] = (int(pid), time.monotonic())
            except (OSError, IndexError, ValueError):
                continue
        time.sleep(0.01)


@real
def test_a_node_frozen_in_its_collective_check_is_the_hang_the_others_wait_for(tmp_path):
    import threading
    import time

    out = tmp_path / "pf"
    seen: dict = {}
    t = threading.Thread(target=_stop_when_armed, args=(out / "stacks-node1.txt", 120, seen))
    t.start()
    t0 = time.monotonic()
    try:
        rep = preflight_on_cluster(out, extra=f', "--html", "{tmp_path / "pf.html"}"')
    finally:
        seen.setdefault("stopped", None)      # ends the poller whatever happened
        t.join()
    wall = time.monotonic() - t0
    verdicts = {r["node"]: r["collective"] for r in rep["nodes"]}
    print(pf.table(rep), f"\nwall {wall:.1f} s", json.dumps(verdicts))
    assert seen["stopped"], "node1's collective child was never seen with faulthandler armed"
    assert verdicts["node1"] == "hang", pf.table(rep)
    n1 = rep["nodes"][1]
    assert "state T" in " ".join(n1["reasons"]) and "File " in (n1["stacks"] or "")
    assert _flagged(rep) == ["node1"], pf.table(rep)
    assert all(r["collective"] in ("timeout", "hang") for r in rep["nodes"])
    assert all("waiting for node1" in r["notes"][0] for r in rep["nodes"] if r["node"] != "node1")
    assert all(r["collective_s"] < 5 + 20 + 10 for r in rep["nodes"])     # bounded
    assert wall < 140
    page = (tmp_path / "pf.html").read_text()                   # written by rank 0's task
    assert "2/3 nodes pass · flagged: node1" in page and "Stacks of node1 (hang)" in page


def test_the_others_timeouts_are_blamed_on_the_node_that_hung():
    nodes = ["a", "b", "c"]
    facts = {n: _facts(n) for n in nodes}
    res = {n: _ok(n) for n in nodes}
    res["a"]["collective"] = {"verdict": "timeout", "reason": "Timed out waiting 5000ms"}
    res["b"]["collective"] = {"verdict": "hang", "reason": "outlived its timeout"}
    res["c"]["collective"] = {"verdict": "timeout", "reason": "Timed out waiting 5000ms"}
    rep = pf.judge(nodes, facts, {}, res)
    assert _flagged(rep) == ["b"]
    assert "waiting for b, flagged" in rep["nodes"][0]["notes"][0]
    assert "note: init_process_group" in pf.table(rep)
    # two hang, one of them stopped (state T): the stopped one is the cause
    res["a"]["collective"] = {"verdict": "hang", "reason": "outlived its timeout"}
    res["b"]["collective"] = {"verdict": "hang", "reason": "outlived", "stopped": True}
    rep = pf.judge(nodes, facts, {}, res)
    assert _flagged(rep) == ["b"] and "waiting for b" in rep["nodes"][0]["notes"][0]
    # two hang, none stopped: both are flagged, nothing tells them apart
    res["b"]["collective"] = {"verdict": "hang", "reason": "outlived"}
    assert _flagged(pf.judge(nodes, facts, {}, res)) == ["a", "b"]
    # none hung, but a check flagged b (its ports): the others' timeouts wait for b
    res["a"]["collective"] = dict(res["c"]["collective"])
    res["b"]["collective"] = dict(res["c"]["collective"])
    bad = {"ok": False, "s": 2.0, "error": "TimeoutError"}
    rep = pf.judge(nodes, facts, {"a": {"reach": {"b ephemeral": bad}},
                                  "c": {"reach": {"b ephemeral": bad}}}, res)
    assert _flagged(rep) == ["b"] and "waiting for b" in rep["nodes"][2]["notes"][0]
    # everyone timing out names no cause: every node is flagged
    res["a"]["collective"] = dict(res["c"]["collective"])
    res["b"]["collective"] = dict(res["a"]["collective"])
    assert _flagged(pf.judge(nodes, facts, {}, res)) == nodes


def test_show_writes_the_html_that_names_the_flagged_node(tmp_path, capsys):
    from harness.cli import main

    nodes = ["a", "b", "c"]
    res = {n: _ok(n) for n in nodes}
    res["b"]["collective"] = {"verdict": "hang", "reason": "outlived its timeout",
                              "stacks": 'File "<string>", line 8 in <module>'}
    ok, bad = {"ok": True, "s": 0.01}, {"ok": False, "s": 2.0, "error": "TimeoutError"}
    reach = {"a": {"reach": {"b master": bad, "b ephemeral": ok, "c master": ok,
                             "c ephemeral": ok}}}
    rep = pf.judge(nodes, {n: _facts(n, torch="2.4.0" if n == "c" else "2.13.0")
                           for n in nodes}, reach, res)
    rep["nodes"][1]["stacks"] = res["b"]["collective"]["stacks"]
    (tmp_path / "report.json").write_text(json.dumps(rep))
    page = tmp_path / "out" / "pf.html"
    assert main(["preflight", "--show", str(tmp_path), "--html", str(page)]) == 1
    assert f"preflight: HTML {page}" in capsys.readouterr().out
    text = page.read_text()
    assert "1/3 nodes pass · flagged: b, c" in text
    assert "master: FAIL ephemeral: ok" in text and 'title="TimeoutError"' in text
    assert "2.4.0" in text and "line 8 in &lt;module&gt;" in text and ">hang<" in text


def test_nccl_interface_follows_nccls_rules():
    ifs = {"lo": ["127.0.0.1/8"], "docker0": ["172.17.0.1/16"], "eth0": ["10.0.0.2/24"],
           "ib0": ["10.1.0.2/24"], "eth1": ["10.2.0.2/24"]}
    assert pf.nccl_interface(ifs, "")["ifname"] == "ib0"                  # ib* first
    no_ib = {k: v for k, v in ifs.items() if k != "ib0"}
    assert pf.nccl_interface(no_ib, "")["ifname"] == "eth0"               # not lo, not docker
    g = pf.nccl_interface({"lo": ["127.0.0.1/8"]}, "")
    assert g["ifname"] == "lo" and "only loopback" in g["problem"]
    assert pf.nccl_interface(ifs, "eth")["ifname"] == "eth0"              # a prefix
    assert pf.nccl_interface(ifs, "=eth1")["addr"] == "10.2.0.2"          # an exact name
    assert pf.nccl_interface(ifs, "=eth")["problem"].startswith("NCCL_SOCKET_IFNAME==eth "
                                                                 "matches none")
    assert pf.nccl_interface(ifs, "^docker,lo,ib,eth0")["ifname"] == "eth1"   # exclusions
    assert pf.nccl_interface(ifs, "^=eth0,ib0,lo,docker0")["ifname"] == "eth1"


def test_the_nccl_collective_is_skipped_with_the_reason():
    cpu = {"gpu": {"cuda_devices": 0, "torch_nccl": False}}
    gpu = {"gpu": {"cuda_devices": 8, "torch_nccl": True}}
    assert pf.nccl_skip({"a": gpu, "b": cpu}) == "no CUDA device (on b)"
    assert pf.nccl_skip({"a": gpu, "b": {"gpu": {"cuda_devices": 8, "torch_nccl": False}}}) \
        == "torch built without NCCL (on b)"
    assert pf.nccl_skip({"a": gpu, "b": gpu}) is None
    assert pf.nccl_skip({}) == "no node answered"
    assert pf.gpu() == {"cuda_devices": 0, "torch_nccl": False}       # this CPU-only build
    rep = pf.judge(["a"], {"a": _facts("a")}, {}, {"a": {"collective": {
        "verdict": "ok", "reason": "", "nccl": "skipped: no CUDA device (on a)"}}})
    assert pf.table(rep).endswith("1/1 nodes pass; NCCL collective: skipped: no CUDA device "
                                  "(on a)")


@real
def test_a_node_that_never_reports_is_flagged_alone_and_not_waited_for_twice(tmp_path):
    """node1's ephemeral port range dropped inbound: its Slurm task never gets going (srun's
    traffic to it is dropped too), so it never writes its facts: flagged "no answer", the
    others' collective timeouts noted against it, and rank 0 waits for it once, not per
    phase."""
    import time

    t0 = time.time()
    # srun's own traffic to node1 is dropped too, so the Slurm step outlives the report (the
    # run ends at its deadline): rank 0 wrote the report 24 s in (measured), at most
    # 5 + 20 + 40 s of waits when node1 never answers, so 100 s and not the default 150
    rep = preflight_on_cluster(tmp_path / "pf", faults="faults:\n  - {kind: firewall, host: "
                               "node1, port_range: [32768, 60999], direction: in}\n",
                               deadline=100)
    written = (tmp_path / "pf" / "report.json").stat().st_mtime - t0
    print(pf.table(rep), f"\nreport written {written:.1f} s in")
    assert _flagged(rep) == ["node1"], pf.table(rep)
    why = " ".join(rep["nodes"][1]["reasons"])
    # racy: node1's task either never wrote its facts or wrote them and its ports were dropped
    assert why == "no answer (its task never wrote its facts)" or \
        "ephemeral port" in why and "not reachable from node0" in why, why
    assert all("waiting for node1" in rep["nodes"][i]["notes"][0] for i in (0, 2))
    assert all((r["collective_s"] or 0) < 5 + 20 + 10 for r in rep["nodes"])
    assert written < 90       # its waits (5 + 20 + 40 s) once, not once per phase

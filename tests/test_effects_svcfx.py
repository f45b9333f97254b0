"""A name or service fault proves it acted (issue 39, the name and service probes): the pure
readers (a hosts file, dnsmasq's query log, scontrol's records, a process's sockets as the
kernel counts them), then real runs and real services, each once where the fault acts and once
where it has none: master_name's hosts files and glibc's answer in a host's view, dns_name's
NXDOMAIN answers in dnsmasq's log, dns_server's queries waiting on a frozen dnsmasq or its
dropped packets, and the run's etcd killed, frozen, slowed or never started."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
from servicert import ServiceRuntime

from harness.faults import _probe
from harness.faults._dns import nxdomain_answers
from harness.faults._names import WriteHosts, hosts_file_names
from harness.faults.slurm_node_down import NodeState, scontrol_fields
from harness.judge.classify import classify_run
from harness.net import topology
from harness.run.plan import make_plan
from harness.run.supervisor import run_scenario
from harness.scenario.loader import load_text
from harness.services.etcd import ETCD, SERVICE

_MISSING = topology.missing()
real = pytest.mark.skipif(bool(_MISSING) or sys.platform != "linux",
                          reason="real network runs need: " + "; ".join(_MISSING))
needs_dnsmasq = pytest.mark.skipif(
    not any(os.access(os.path.join(d, "dnsmasq"), os.X_OK)
            for d in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/sbin", "/sbin"]),
    reason="needs dnsmasq")
_NO_ETCD = ETCD.missing()
needs_etcd = pytest.mark.skipif(bool(_NO_ETCD), reason=f"needs: {_NO_ETCD}")


# -- the pure readers ----------------------------------------------------------------------------
def test_a_log_reader_skips_what_is_not_a_whole_json_line_and_a_window_keeps_whole_lines(
        tmp_path):
    log = tmp_path / "service-x.err"
    log.write_text('{"ev": "open", "conn": 1}\nnot json\n[1, 2]\n{"ev": "close", "con')
    assert list(_probe.json_lines(log)) == [{"ev": "open", "conn": 1}]
    assert list(_probe.json_lines(tmp_path / "none.err")) == []
    mark = _probe.size(log)
    with open(log, "a") as f:
        f.write('n": 1}\nsecond\nthird (still being writ')
    assert _probe.text_lines(log, (mark, -1)) == ['n": 1}', "second"]
    assert _probe.text_lines(log, (0, mark)) == ['{"ev": "open", "conn": 1}', "not json",
                                                 "[1, 2]"]
    assert _probe.size(tmp_path / "none.err") == 0


def test_dnsmasq_log_lines_give_the_nxdomain_answers_per_client():
    lines = ["dnsmasq[7]: query[PTR] 254.27.213.10.in-addr.arpa from 10.213.27.1",
             "dnsmasq[7]: config 254.27.213.10.in-addr.arpa is NXDOMAIN",
             "dnsmasq[7]: inotify: /tmp/r/dns/records/master.c.test removed",
             "dnsmasq[7]: query[AAAA] master.c.test from 10.213.27.1",
             "dnsmasq[7]: config master.c.test is NXDOMAIN",
             "dnsmasq[7]: query[A] Master.c.test. from 10.213.27.2",
             "dnsmasq[7]: config master.c.test is NXDOMAIN",
             "dnsmasq[7]: query[A] master from 10.213.27.2",
             "dnsmasq[7]: config error is REFUSED (EDE: not ready)",
             "dnsmasq[7]: query[A] master.c.test from 10.213.27.1",
             "dnsmasq[7]: /tmp/r/dns/records/master.c.test master.c.test is 10.213.27.1"]
    assert nxdomain_answers(lines, "master.c.test") == {"10.213.27.1": 1, "10.213.27.2": 1}
    assert nxdomain_answers(lines, "node1.c.test") == {}


def test_scontrol_records_keep_values_with_spaces():
    out = scontrol_fields("NodeName=node1 Arch=x86_64 State=DOWN+ALLOCATED "
                          "Reason=harness: slurm_node_down [root@2026-11-25T10:00:00] "
                          "Comment=(null)\nJobId=1 JobState=NODE_FAIL Reason=NodeDown "
                          "NodeList=node[0-1]\n\n")
    assert out[0]["State"] == "DOWN+ALLOCATED"
    assert out[0]["Reason"] == "harness: slurm_node_down [root@2026-11-25T10:00:00]"
    assert out[1] == {"JobId": "1", "JobState": "NODE_FAIL", "Reason": "NodeDown",
                      "NodeList": "node[0-1]"}


class _SlurmRt:
    """scontrol as the controller answers it: the node's record, then the jobs it knows."""

    def __init__(self, node: str, jobs: str):
        self.node, self.jobs = node, jobs

    def now(self) -> float:
        return 4.0

    def run_helper(self, name: str, argv: List[str], host: str, timeout: float) -> Any:
        import subprocess

        out = ""
        if argv[1:3] == ["show", "-o"]:
            out = self.node if argv[3] == "node" else self.jobs
        elif argv[1:3] == ["show", "hostnames"]:
            out = "node0\nnode1\n"
        return subprocess.CompletedProcess(argv, 0, out, "")


def test_a_node_set_down_acted_only_when_a_job_was_on_it():
    node = "NodeName=node1 State=DOWN+ALLOCATED Reason=harness: slurm_node_down [root@x]\n"
    step = NodeState(node="node1", controller="node0")
    rt = _SlurmRt(node, "JobId=1 JobState=NODE_FAIL Reason=NodeDown NodeList=node[0-1]\n")
    assert step.do(rt)["read_back"] == "DOWN+ALLOCATED"
    eff = step.effect(rt)
    assert eff.acted and eff.summary == ("node node1 read back DOWN at 4.00 s; job 1 NODE_FAIL "
                                         "(NodeDown)")
    # DOWN, but the only job had ended before (or ran elsewhere): nothing was failed
    rt = _SlurmRt(node, "JobId=1 JobState=COMPLETED Reason=None NodeList=node[0-1]\n"
                        "JobId=2 JobState=NODE_FAIL Reason=NodeDown NodeList=node0\n")
    step.do(rt)
    eff = step.effect(rt)
    assert not eff.acted and eff.summary.endswith("no job was on the node")
    # running on the node as it went down, then ended by srun's failure before the controller
    # wrote NODE_FAIL (Slurm's own race, seen under load): it acted, said so
    step.do(_SlurmRt(node, "JobId=3 JobState=RUNNING Reason=None NodeList=node[0-1]\n"))
    eff = step.effect(_SlurmRt(node, "JobId=3 JobState=FAILED Reason=NonZeroExitCode "
                                     "NodeList=node[0-1]\n"))
    assert eff.acted and eff.summary.endswith("job 3 RUNNING (None) as it went down"), eff
    # the controller did not take it: not DOWN
    step.do(_SlurmRt("NodeName=node1 State=IDLE Reason=(null)\n", ""))
    eff = step.effect(_SlurmRt("", ""))
    assert not eff.acted and eff.summary == "node node1 read back State=IDLE, not DOWN"
    # the read-back came before the update showed, and the controller then failed the job on
    # the node all the same (the fresh-clone catalog run of 2026-11-28, load 20): it acted
    step.do(_SlurmRt("NodeName=node1 State=IDLE Reason=(null)\n", ""))
    eff = step.effect(_SlurmRt("", "JobId=1 JobState=NODE_FAIL Reason=NodeDown "
                                   "NodeList=node[0-1]\n"))
    assert eff.acted and eff.summary == ("node node1 read back State=IDLE at 4.00 s, yet job 1 "
                                         "NODE_FAIL (NodeDown) by the end")


def test_a_hosts_file_gives_each_name_its_addresses_in_order():
    text = ("127.0.0.1 localhost\n10.0.0.9 Master.h.test  # dead first\n"
            "10.0.0.1 master.h.test m\n# 10.0.0.2 master.h.test\n")
    assert hosts_file_names(text) == {"localhost": ["127.0.0.1"],
                                      "master.h.test": ["10.0.0.9", "10.0.0.1"],
                                      "m": ["10.0.0.1"]}


def test_the_kernel_counts_what_waits_on_a_port_a_process_does_not_read():
    lis = socket.socket()
    lis.bind(("127.0.0.1", 0))
    lis.listen()
    port = lis.getsockname()[1]
    one = socket.create_connection(("127.0.0.1", port))
    srv, _ = lis.accept()
    waiting = socket.create_connection(("127.0.0.1", port))   # never accepted
    one.sendall(b"GET /v2/keys HTTP/1.0\r\n\r\n")           # never read
    end = time.monotonic() + 5
    while time.monotonic() < end:
        socks = _probe.sockets(os.getpid(), port, "tcp")
        if any(s["state"] == "ESTABLISHED" and s["rx"] for s in socks):
            break
        time.sleep(0.01)
    assert {"state": "LISTEN", "rx": 1, "tx": 0} in [{k: s[k] for k in ("state", "rx", "tx")}
                                                  for s in socks]
    assert any(s["state"] == "ESTABLISHED" and s["rx"] == 25 for s in socks), socks
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"q" * 30, udp.getsockname())
    time.sleep(0.05)
    (u,) = _probe.sockets(os.getpid(), udp.getsockname()[1], "udp")
    assert u["rx"] > 0 and u["drops"] == 0
    assert _probe.process_state(os.getpid()) in ("R", "S")
    with pytest.raises(OSError):
        _probe.sockets(2 ** 22 + 7, port)
    for s in (lis, one, srv, udp, waiting):
        s.close()


class _HostsRt:
    """A run whose hosts files are in a folder, and whose write may be lost (for the probe's
    'no effect'); the resolver is asked in this process's view."""

    def __init__(self, etc: Path, lose: bool):
        self.etc, self.lose = etc, lose
        self.net = self

    def now(self) -> float:
        return 1.5

    def host_entry(self, host: str) -> Dict[str, str]:
        return {"etc": str(self.etc / host)}

    def set_hosts_file(self, host: str, entries: Dict[str, List[str]], in_place: bool) -> None:
        (self.etc / host).mkdir(exist_ok=True)
        lines = "" if self.lose else "".join(f"{a} {n}\n" for n, aa in entries.items()
                                              for a in aa)
        (self.etc / host / "hosts").write_text("127.0.0.1 localhost\n" + lines)

    def run_helper(self, name: str, argv: List[str], host: str, timeout: float) -> Any:
        import subprocess

        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def test_a_hosts_file_that_does_not_say_the_name_is_no_effect(tmp_path):
    step = WriteHosts(hosts=["node0", "node1"], entries={"master.h.test": ["10.9.9.1"]})
    step.do(_HostsRt(tmp_path, lose=True))
    eff = step.effect(_HostsRt(tmp_path, lose=True))
    assert not eff.acted
    assert eff.summary == ("hosts files read back otherwise: node0: master.h.test -> nothing; "
                           "node1: master.h.test -> nothing")


# -- real runs ---------------------------------------------------------------------------------
TWO_HOSTS = """\
name: e
about: a name or service fault's effect in a real run
hosts: [{name: node0}, {name: node1}]
timeout: 3
deadline: 30
workload: [barrier]
"""


def _run(text: str, tmp_path: Path):
    (scn,) = load_text(text, "e.yaml")
    obs = run_scenario(scn, keep=tmp_path)
    return obs, obs.effects


@real
def test_master_name_reads_back_the_hosts_files_and_glibc_answers_the_name(tmp_path):
    # the job's outcome is not this test's point (timeout: 3 timed out once under load)
    obs, (e,) = _run(TWO_HOSTS + "faults: [{kind: master_name, dead: last}]\n", tmp_path)
    assert e["status"] == "acted", e
    (t,) = e["targets"]
    evs = [ev["what"] for ev in t["steps"][0]["events"]]
    assert evs[0].startswith("hosts files of node0, node1 read back: master.harness.test -> ")
    # glibc in node1's view gives both addresses, the master's and the dead one
    assert evs[1].startswith("getaddrinfo(master.harness.test) in node1's view: ") \
        and evs[1].count(", ") == 1, evs


@real
def test_master_name_late_the_unknown_name_acted_and_the_late_record_never_came(tmp_path):
    obs, (e,) = _run(TWO_HOSTS + "faults: [{kind: master_name, resolves_after: 25}]\n",
                     tmp_path)
    assert [v.outcome for v in classify_run(obs)] == ["timeout", "timeout"]
    unknown, late = e["targets"][0]["steps"]
    assert unknown["status"] == "acted"
    assert "master.harness.test -> nothing" in unknown["summary"]
    assert "answered the same at the end" in unknown["summary"]
    assert late["status"] == "no effect" and late["summary"].startswith("never fired")


DNS = """\
dns:
  domain: cluster.test
  records: {master: node0, node0: node0, node1: node1, spare: node1}
  master: master
"""


@real
@needs_dnsmasq
def test_an_nxdomain_record_counts_the_queries_dnsmasq_answered_nxdomain(tmp_path):
    obs, (e,) = _run(TWO_HOSTS + DNS + "faults: [{kind: dns_name, name: master, answer: "
                     "nxdomain, heal_after: 2}]\n", tmp_path / "a")
    assert e["status"] == "acted", e
    (step,) = e["targets"][0]["steps"]
    assert step["numbers"]["queries"] > 0 and step["numbers"]["clients"] == 2
    assert "dnsmasq saw it go (inotify)" in step["events"][0]["what"]
    assert "(healed)" in e["summary"]
    obs, (e,) = _run(TWO_HOSTS + DNS + "faults: [{kind: dns_name, name: spare, answer: "
                     "nxdomain}]\n", tmp_path / "b")
    assert [v.outcome for v in classify_run(obs)] == ["ok", "ok"]
    assert e["status"] == "no effect"
    assert e["summary"].startswith("0 queries for spare.cluster.test answered NXDOMAIN by "
                                   "dnsmasq, from 0.00 s until the end of the run")


@real
@needs_dnsmasq
def test_a_frozen_name_server_holds_the_queries_and_a_late_freeze_holds_none(tmp_path):
    obs, (e,) = _run(TWO_HOSTS + DNS + "faults: [{kind: dns_server, mode: frozen, "
                     "heal_after: 4}]\n", tmp_path / "a")
    assert e["status"] == "acted", e
    (step,) = e["targets"][0]["steps"]
    assert step["numbers"]["udp_bytes"] > 0
    assert "the kernel says stopped" in step["events"][0]["what"]
    # frozen once both ranks are in their last workload step: nobody asks a name any more
    obs, (e,) = _run(TWO_HOSTS.replace("[barrier]", '[barrier, "sleep 2"]') + DNS
                     + "faults: [{kind: dns_server, mode: frozen, phase: 'workload step 2', "
                       "rank: 1, after: 0.5}]\n", tmp_path / "b")
    assert [v.outcome for v in classify_run(obs)] == ["ok", "ok"]
    assert e["status"] == "no effect", e
    assert "but no query waited in its sockets at the end of the run" in e["summary"]


@real
@needs_dnsmasq
def test_a_dropped_name_server_counts_the_packets_dropped(tmp_path):
    obs, (e,) = _run(TWO_HOSTS + DNS + "faults: [{kind: dns_server, mode: dropped, "
                     "heal_after: 3}]\n", tmp_path)
    assert e["status"] == "acted", e
    assert e["targets"][0]["steps"][0]["numbers"]["packets"] > 0
    assert "rule counters read when healed" in e["targets"][0]["steps"][0]["events"][0]["what"]


# -- the run's etcd, for real (no namespaces: etcd on the machine's loopback) --------------------


def _etcd(tmp_path: Path, faults: str):
    from harness.machine.ports import PortLease

    single = "name: e\nabout: etcd\nworld_size: 2\ntimeout: 5\nworkload: [barrier]\n"
    (scn,) = load_text(single + "etcd: {host: loopback}\n"
                       "launcher: {kind: torchrun, rdzv_backend: etcd}\n"
                       f"faults: [{faults}]\n", "e.yaml")
    lease = PortLease()
    plan = make_plan(scn, str(tmp_path), lease.take, netns=False, run_id="t9")
    return lease, plan, ServiceRuntime(tmp_path, plan)


def _request(plan: Any) -> socket.socket:
    """A client's request to etcd (an HTTP GET), left waiting for its answer."""
    s = socket.create_connection((plan.etcd.addr, plan.etcd.client_port), 5)
    s.sendall(b"GET /v2/keys/rdzv?wait=false HTTP/1.0\r\nHost: x\r\n\r\n")
    return s


@needs_etcd
def test_a_frozen_etcd_counts_the_requests_that_waited_and_none_when_nobody_asked(tmp_path):
    lease, plan, rt = _etcd(tmp_path, "{kind: etcd_server, mode: frozen, at: 1}, "
                                      "{kind: etcd_server, mode: killed, at: 2}")
    try:
        up = next(s for s in plan.steps if type(s).__name__ == "EtcdUp")
        freeze, kill = [s for s in plan.steps if s.fault == "etcd_server"]
        up.do(rt)
        try:
            freeze.do(rt)
            eff = freeze.effect(rt)     # nobody asked anything while it was stopped
            assert not eff.acted, eff
            assert eff.summary.endswith("but no request waited on its client port at the "
                                        "end of the run")
            # the harness's own readiness request, unanswered while frozen (its 43 bytes
            # stay unread), is no client's: it once made this effect claim 'acted'
            svc = rt.service(SERVICE)
            assert not svc.spec.ready.ready(svc)
            assert len(svc.spec.ready.asked_from) >= 2
            eff = freeze.effect(rt)
            assert not eff.acted, eff
            client = _request(plan)
            end = time.monotonic() + 5
            while time.monotonic() < end and not freeze.effect(rt).acted:
                time.sleep(0.05)
            freeze.undo(rt)             # read before SIGCONT, kept
            eff = freeze.effect(rt)
            assert eff.acted and eff.numbers["unread_connections"] == 1, eff
            assert eff.numbers["unread_bytes"] == 50
            assert "when healed: 1 connection with 50 unread request bytes" in eff.summary
            client.recv(1024)           # thawed: answered
            client.close()
            pid = rt.service(SERVICE).pid
            kill.do(rt)
            eff = kill.effect(rt)
            assert eff.acted and eff.summary.startswith(f"etcd (pid {pid}) ended by SIGKILL")
        finally:
            assert rt.services.stop_all() == []
    finally:
        lease.release()


@needs_etcd
def test_an_absent_etcd_refuses_and_a_slow_one_counts_the_stops_a_request_waited_in(tmp_path):
    lease, plan, rt = _etcd(tmp_path / "a", "{kind: etcd_server, mode: absent}")
    try:
        (absent,) = [s for s in plan.steps if s.fault == "etcd_server"]
        absent.do(rt)
        eff = absent.effect(rt)
        assert eff.acted and eff.summary.endswith(": connection refused"), eff
    finally:
        lease.release()
    lease, plan, rt = _etcd(tmp_path / "b", "{kind: etcd_server, mode: slow, stopped_ms: 200,"
                                            " running_ms: 20, at: 1}")
    try:
        up = next(s for s in plan.steps if type(s).__name__ == "EtcdUp")
        (slow,) = [s for s in plan.steps if s.fault == "etcd_server"]
        up.do(rt)
        try:
            slow.do(rt)
            time.sleep(0.7)             # stops go by with no client: none waited
            eff = slow.effect(rt)
            assert not eff.acted and eff.numbers["stops"] >= 1, eff
            clients = []
            end = time.monotonic() + 10
            while time.monotonic() < end and not slow.effect(rt).acted:
                clients.append(_request(plan))   # each waits for the next run of etcd
                time.sleep(0.1)
            slow.undo(rt)
            eff = slow.effect(rt)
            assert eff.acted and eff.numbers["stops_with_requests"] >= 1, eff
            for c in clients:
                c.close()
        finally:
            assert rt.services.stop_all() == []
    finally:
        lease.release()


@needs_etcd
def test_etcds_own_gateway_connection_is_no_clients_request(tmp_path):
    """etcd dials its own client port (its gRPC gateway): that connection is found as its own
    and never counted as a request that waited, while a client's unread request is."""
    from harness.faults._etcd import STOP_WAIT, _wait_state, _waiting

    lease, plan, rt = _etcd(tmp_path, "{kind: etcd_server, mode: frozen, at: 1}")
    try:
        up = next(s for s in plan.steps if type(s).__name__ == "EtcdUp")
        up.do(rt)
        try:
            pid = rt.service(plan.etcd.service).pid
            assert _probe.own_connections(pid, plan.etcd.client_port), \
                _probe.sockets(pid, plan.etcd.client_port)
            os.kill(pid, signal.SIGSTOP)
            try:
                # the stop takes effect when etcd is next scheduled: under load it read and
                # answered the request first (1 failure in a -n 3 suite run beside a catalog
                # run, 2026-11-29); the request goes once the kernel says etcd is stopped
                assert _wait_state(pid, "T", STOP_WAIT)
                client = _request(plan)
                end = time.monotonic() + 5
                while time.monotonic() < end and not _waiting(rt, plan.etcd)["unread_bytes"]:
                    time.sleep(0.05)
                w = _waiting(rt, plan.etcd)
                assert w["unread_connections"] == 1 and w["unread_bytes"] > 0, w
            finally:
                os.kill(pid, signal.SIGCONT)
            client.close()
        finally:
            assert rt.services.stop_all() == []
    finally:
        lease.release()


def test_an_own_dial_still_in_the_accept_queue_is_no_clients_request():
    """A dial of etcd's to its own client port that etcd has not accepted yet has no inode on
    the server's side, and its HTTP/2 preface (33 bytes) sits unread there: it is etcd's own,
    told by its endpoints, and no request that waited (1 in about 17 suite runs read "1
    connection with 33 unread request bytes" for an etcd frozen right after it came up). A
    real process plays etcd: it listens, dials itself, writes 33 bytes and never accepts."""
    from types import SimpleNamespace

    from harness.faults._etcd import EtcdPlan, _waiting

    code = ("import socket, sys, time\n"
            "l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen(8)\n"
            "c = socket.create_connection(l.getsockname()); c.sendall(b'x' * 33)\n"
            "print(l.getsockname()[1], flush=True); time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())
        etcd = EtcdPlan(host="", addr="127.0.0.1", client_port=port, peer_port=0,
                        directory="")
        svc = SimpleNamespace(pid=p.pid, spec=SimpleNamespace(ready=None))
        rt = SimpleNamespace(service=lambda name: svc, now=lambda: 1.0)
        end = time.monotonic() + 5
        while time.monotonic() < end and not any(
                s["rx"] for s in _probe.sockets(p.pid, port) if s["state"] != "LISTEN"):
            time.sleep(0.02)
        queued = [s for s in _probe.sockets(p.pid, port) if s["state"] != "LISTEN"]
        assert [(s["inode"], s["rx"]) for s in queued] == [(0, 33)], queued
        w = _waiting(rt, etcd)
        assert (w["unread_connections"], w["unread_bytes"], w["not_accepted"]) == (0, 0, 0), w
        # a client's request beside it is still counted
        client = socket.create_connection(("127.0.0.1", port), 5)
        client.sendall(b"y" * 50)
        while time.monotonic() < end and _waiting(rt, etcd)["unread_bytes"] < 50:
            time.sleep(0.02)
        w = _waiting(rt, etcd)
        assert (w["unread_connections"], w["unread_bytes"], w["not_accepted"]) == (1, 50, 1), w
        client.close()
    finally:
        p.kill()
        p.wait()

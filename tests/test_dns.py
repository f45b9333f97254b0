"""The run's own name server (a dns: block): the format and the plan (pure), then dnsmasq for
real in a topology (A, AAAA, PTR, the faults' answers, stop), and a SIGKILLed run that leaves
no dnsmasq, responder or namespace once the next sweep has run. The real tests need root
(namespaces) and dnsmasq (Debian's dnsmasq-base)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, List

import pytest

from harness.machine.procs import ManagedProcess, alive
from harness.net import resolver, topology
from harness.run.plan import make_plan
from harness.scenario.loader import ScenarioFileError, load_text
from harness.services import Services
from harness.services.dns import DNSMASQ, RESPONDER, SERVICE, DnsAnswers, ask
from harness.services.dnswire import DnsError

_MISSING = topology.missing() + ([DNSMASQ.missing()] if DNSMASQ.missing() else [])
real = pytest.mark.skipif(bool(_MISSING), reason="needs: " + "; ".join(map(str, _MISSING)))

BASE = """\
name: d
about: dns
hosts: [{name: node0}, {name: node1}]
timeout: 5
workload: [barrier]
"""


def _plan(text: str, run_dir: str = "/tmp/run-t1", run_id: str = "t1") -> Any:
    (scn,) = load_text(BASE + text, "d.yaml")
    ports = itertools.count(40000)
    return make_plan(scn, run_dir, lambda: next(ports), netns=True, run_id=run_id)


# ---- the format ------------------------------------------------------------------------------

@pytest.mark.parametrize("block, words", [
    ("dns: {records: {master: node0}}", "short name"),
    ("dns: {domain: c.test, records: {m: 8.8.8.8}}", "outside the run"),
    ("dns: {domain: c.test, records: {m: nodeX}}", "not a host of the scenario"),
    ("dns: {host: node0}", "name server's own host"),
    ("dns: {domain: c.test, records: {m: node0/5}}", "not a host of the scenario"),
    ("dns: {upstream: 8.8.8.8}", "upstream"),
])
def test_a_bad_dns_block_is_a_located_error(block, words):
    with pytest.raises(ScenarioFileError) as e:
        load_text(BASE + block + "\n", "d.yaml")
    text = str(e.value)
    assert "d.yaml:6" in text and words in text, text


def test_a_dns_fault_without_a_dns_block_is_refused_where_it_is_written():
    with pytest.raises(ScenarioFileError) as e:
        load_text(BASE + "faults: [{kind: dns_server}]\n", "d.yaml")
    assert "d.yaml:6" in str(e.value) and "needs the scenario's dns: block" in str(e.value)


def test_a_dns_name_fault_must_name_a_record():
    with pytest.raises(ScenarioFileError) as e:
        load_text(BASE + "dns: {domain: c.test, records: {m: node0}}\n"
                  "faults: [{kind: dns_name, name: other, answer: servfail}]\n", "d.yaml")
    assert "'other' is not a record" in str(e.value)


# ---- the plan (pure) -------------------------------------------------------------------------

def test_the_plan_serves_only_the_runs_own_addresses_and_asks_no_upstream():
    plan = _plan("dns: {domain: cluster.test, records: {master: node0, far: [dead, node1]},"
                 " master: master}\n")
    dns = plan.dns
    conf = dns.config()
    for line in ("no-resolv", "no-hosts", "no-poll", "keep-in-foreground", "bind-interfaces",
                 "local=/cluster.test/"):
        assert line in conf.splitlines()
    assert "server=" not in conf                      # no forwarding without a faulted name
    assert f"listen-address={dns.addr}" in conf and dns.addr.endswith(".254")
    topo = topology.Topology("t1", ["node0", "node1"], link=True, service_hosts=["dns"])
    for addrs in dns.records.values():
        for a in addrs:
            assert __import__("ipaddress").ip_address(a) in topo.network
    assert dns.records["master.cluster.test"] == [plan.host("node0").addr]
    assert dns.records["far.cluster.test"][0] == dns.dead4 != plan.host("node1").addr
    assert all(r.env["MASTER_ADDR"] == "master" for r in plan.ranks)
    assert "dns" not in [h.name for h in plan.hosts]        # no ranks on the server's host
    assert plan.service_hosts() == ["dns"]
    # the scenario hosts keep the addresses they have without a dns block
    assert [h.addr for h in plan.hosts] == [h.addr for h in _plan("").hosts]


def test_a_faulted_name_is_forwarded_to_the_responder_and_nothing_else_is():
    plan = _plan("dns: {domain: c.test, records: {m: node0, n: node1}, master: m}\n"
                 "faults: [{kind: dns_name, name: m, answer: servfail, at: 2, heal_after: 3}]\n")
    conf = plan.dns.config()
    assert f"server=/m.c.test/127.0.0.1#{plan.dns.responder_port}" in conf
    assert conf.count("server=") == 1
    assert "m.c.test" not in plan.dns.records and "n.c.test" in plan.dns.records
    step = plan.steps[-1]
    assert step.trigger.at == 2 and step.undo_trigger is not None


def test_a_name_faulted_for_some_hosts_goes_through_the_responder_with_their_addresses():
    plan = _plan("dns: {domain: c.test, records: {m: node0}, master: m}\n"
                 "faults: [{kind: dns_name, name: m, answer: nxdomain, hosts: [node1]}]\n")
    conf = plan.dns.config()
    assert "add-subnet=32,128" in conf and "server=/m.c.test/" in conf   # not the record file
    step = plan.steps[-1]
    assert step.hosts == ["node1"] and plan.host("node1").addr in step.only
    assert plan.host("node0").addr not in step.only
    assert "add-subnet" not in _plan("dns: {domain: c.test, records: {m: node0}}\n"
                                     "faults: [{kind: dns_name, name: m, answer: servfail}]\n"
                                     ).dns.config()


@pytest.mark.parametrize("hosts, words", [("[nodeX]", "no host 'nodeX'"),
                                          ("[dns]", "name server's own host")])
def test_a_dns_name_fault_for_a_host_that_is_not_a_client_is_refused(hosts, words):
    with pytest.raises(ScenarioFileError) as e:
        _plan("dns: {domain: c.test, records: {m: node0}}\n"
              f"faults: [{{kind: dns_name, name: m, answer: servfail, hosts: {hosts}}}]\n")
    assert words in str(e.value) and "hosts" in str(e.value)


def _ecs_query(name: str, client: str) -> bytes:
    """A query as dnsmasq forwards it with add-subnet: an OPT record with a Client Subnet."""
    import ipaddress
    import struct

    from harness.services.dnswire import build_query

    q = bytearray(build_query(name, "A", qid=7))
    q[10:12] = struct.pack("!H", 1)                          # ARCOUNT 1
    ip = ipaddress.ip_address(client)
    fam, bits = (1, 32) if ip.version == 4 else (2, 128)
    ecs = struct.pack("!HBB", fam, bits, 0) + ip.packed
    opt = struct.pack("!HH", 8, len(ecs)) + ecs
    return bytes(q) + b"\0" + struct.pack("!HHIH", 41, 4096, 0, len(opt)) + opt


def test_the_responder_answers_the_faulted_way_only_to_the_hosts_named():
    from harness.services.dns_responder import Responder
    from harness.services.dnswire import client_subnet, parse_answer

    assert client_subnet(_ecs_query("m.c.test", "10.1.2.3")) == "10.1.2.3"
    assert client_subnet(_ecs_query("m.c.test", "fd00::2")) == "fd00::2"
    r = Responder({"m.c.test": ("answer", ["10.1.2.1"])}, live={"m.c.test": ["10.1.2.1"]})
    r.set("m.c.test", "servfail", [], only=["10.1.2.3"])
    assert parse_answer(r.reply(_ecs_query("m.c.test", "10.1.2.3"))).rcode == "SERVFAIL"
    other = parse_answer(r.reply(_ecs_query("m.c.test", "10.1.2.2")))
    assert (other.rcode, other.values("A")) == ("NOERROR", ["10.1.2.1"])
    r.set("m.c.test", "servfail", [])                        # every client again
    assert parse_answer(r.reply(_ecs_query("m.c.test", "10.1.2.2"))).rcode == "SERVFAIL"


def test_ptr_false_leaves_no_hosts_line_every_name_goes_to_the_responder():
    plan = _plan("dns: {domain: c.test, records: {m: node0, n: node1}, ptr: false}\n"
                 "faults: [{kind: dns_name, name: m, answer: nxdomain, heal_after: 3}]\n")
    assert plan.dns.records == {} and set(plan.dns.forwarded) == {"m.c.test", "n.c.test"}
    conf = plan.dns.config()
    assert conf.count("server=") == 2 and "local=/c.test/" in conf
    step = plan.steps[-1]
    assert (step.name, step.mode, step.live) == ("m.c.test", "nxdomain",
                                                [plan.host("node0").addr])


@real
def test_ptr_false_answers_names_but_no_reverse_lookup(tmp_path):
    """Watched: with hosts-file records dnsmasq 2.90 answers PTR even with filter-rr=PTR; with
    ptr: false the same names resolve and their addresses do not."""
    import ipaddress

    run_id = f"dp{os.getpid()}"
    plan = _plan("dns: {domain: c.test, records: {m: node0, n: node1}, ptr: false}\n"
                 "faults: [{kind: dns_name, name: m, answer: nxdomain}]\n",
                 run_dir=str(tmp_path), run_id=run_id)
    with topology.Topology(run_id, [h.name for h in plan.hosts], link=True, ip="dual",
                           service_hosts=plan.service_hosts()) as topo:
        rt = _Rt(topo, tmp_path, None)
        try:
            for step in plan.steps:
                if step.trigger.describe() == "at set-up":
                    step.do(rt)
            srv, n1 = plan.dns.addr, plan.host("node1")
            assert ask(topo, "node0", srv, "n.c.test", "A").values("A") == [n1.addr]
            ptr = ask(topo, "node0", srv, ipaddress.ip_address(n1.addr).reverse_pointer, "PTR")
            assert ptr.rcode == "NXDOMAIN" and ptr.values("PTR") == []
            assert ask(topo, "node0", srv, "m.c.test").rcode == "NXDOMAIN"
            plan.steps[-1].undo(rt)     # healed: the responder answers the live address
            assert ask(topo, "node0", srv, "m.c.test").values("A") == \
                [plan.host("node0").addr]
        finally:
            problems = rt.services.stop_all()
        assert problems == []


def test_the_resolver_view_of_a_dns_run_asks_files_then_the_runs_server():
    text = resolver.nsswitch_text("passwd: files\nhosts: files mdns4 dns\n", dns=True)
    assert "hosts:          files dns\n" in text and "mdns" not in text
    assert resolver.dns_resolv_conf_lines("10.213.0.254", "c.test") == [
        "nameserver 10.213.0.254", "search c.test", "options timeout:5 attempts:2"]
    with pytest.raises(ValueError):
        resolver.dns_resolv_conf_lines("not-an-address")


# ---- the server for real ---------------------------------------------------------------------

class _Rt:
    """The little of the supervisor's Runtime that the set-up step uses."""

    def __init__(self, topo: Any, run_dir: Path, pids: Any):
        self.net, self.run_dir, self.services = topo, run_dir, Services(run_dir)
        self.pids = pids

    def now(self) -> float:
        return 0.0

    def python(self, module: str, *args: str) -> List[str]:
        return [sys.executable, "-m", module, *args]

    def start_service(self, spec: Any) -> Any:
        def spawn(argv: Any, out: Any, err: Any) -> ManagedProcess:
            return ManagedProcess(argv, name=spec.name, cwd=str(self.run_dir), stdout=out,
                                  stderr=err, prefix=self.net.exec_prefix(spec.host))
        return self.services.start(spec, spawn).wait_ready()

    def service(self, name: str) -> Any:
        return self.services.get(name)


@real
def test_dnsmasq_answers_a_aaaa_ptr_and_the_faults_then_stops(tmp_path):
    run_id = f"dt{os.getpid()}"
    plan = _plan("ip: dual\n"
                 "dns: {domain: c.test, records: {m: node0, n: node1, s: node0, q: node0}}\n"
                 "faults: [{kind: dns_name, name: m, answer: nxdomain},\n"
                 "         {kind: dns_name, name: s, answer: servfail},\n"
                 "         {kind: dns_name, name: q, answer: silent}]\n",
                 run_dir=str(tmp_path), run_id=run_id)
    with topology.Topology(run_id, [h.name for h in plan.hosts], link=True, ip="dual",
                           service_hosts=plan.service_hosts()) as topo:
        rt = _Rt(topo, tmp_path, None)
        try:
            for step in plan.steps:     # set-up: dnsmasq, the responder, the faults' do
                if step.trigger.describe() == "at set-up":
                    step.do(rt)
            srv, n0 = plan.dns.addr, plan.host("node0")
            a = ask(topo, "node1", srv, "n.c.test", "A")
            assert a.rcode == "NOERROR" and a.values("A") == [plan.host("node1").addr]
            assert ask(topo, "node1", srv, "n.c.test", "AAAA").values("AAAA") == \
                [plan.host("node1").addr6]
            ptr = ask(topo, "node0", srv, __import__("ipaddress").ip_address(
                plan.host("node1").addr).reverse_pointer, "PTR")
            assert ptr.values("PTR") == ["n.c.test"]
            assert ask(topo, "node1", srv, "m.c.test").rcode == "NXDOMAIN"
            assert ask(topo, "node1", srv, "s.c.test").rcode == "SERVFAIL"
            with pytest.raises(DnsError):
                ask(topo, "node1", srv, "q.c.test", timeout=1.5)
            assert ask(topo, "node1", srv, "other.example").rcode == "REFUSED"   # no upstream
            # the heals: the record appears, the responder answers the live address
            nx = next(s for s in plan.steps if s.id.endswith("#2"))
            nx.undo(rt)
            assert ask(topo, "node1", srv, "m.c.test").values("A") == [n0.addr]
            sf = next(s for s in plan.steps if getattr(s, "name", "") == "s.c.test")
            sf.undo(rt)
            assert ask(topo, "node1", srv, "s.c.test").values("A") == [n0.addr]
            # a frozen server: no answer; thawed, answers again
            dnsmasq = rt.service(SERVICE)
            dnsmasq.proc.signal_group(signal.SIGSTOP)
            with pytest.raises(DnsError):
                ask(topo, "node1", srv, "n.c.test", timeout=0.5)
            dnsmasq.proc.signal_group(signal.SIGCONT)
            assert DnsAnswers(topo, "node1", srv, "n.c.test").ready(dnsmasq)
            # the view: hosts ask the run's server, and only it
            view = Path("/etc/netns") / n0.netns
            assert (view / "resolv.conf").read_text().startswith(f"nameserver {srv}\n")
            assert "hosts:          files dns" in (view / "nsswitch.conf").read_text()
            conf = (tmp_path / "dns" / "dnsmasq.conf").read_text()
            assert str(tmp_path) in conf and "/etc/" not in conf
        finally:
            problems = rt.services.stop_all()
        assert problems == []
        assert not rt.service(SERVICE).running and not rt.service(RESPONDER).running


CHILD = """
import sys
from harness.run.supervisor import run_scenario
from harness.scenario.loader import load_text
(scn,) = load_text(sys.stdin.read(), "k.yaml")
run_scenario(scn)
"""


@real
def test_a_sigkilled_run_leaves_no_dnsmasq_responder_or_namespace(tmp_path):
    text = (BASE + "deadline: 60\n"
            "dns: {domain: c.test, records: {m: node0}, master: m}\n"
            "faults: [{kind: dns_name, name: m, answer: silent}]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HARNESS_"))}
    env["HARNESS_TMP"] = str(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    assert child.stdin is not None
    child.stdin.write(text.encode())
    child.stdin.close()
    base = tmp_path / f"torchdist-harness-{os.geteuid()}"
    end, run = time.monotonic() + 180, None
    while time.monotonic() < end and child.poll() is None:
        runs = list(base.glob("run-*"))
        log = runs[0] / "service-dns-responder.err" if runs else None
        if log is not None and log.exists() and '"event": "query"' in log.read_text():
            run = runs[0]         # a rank asked, through dnsmasq, and the responder saw it
            break
        time.sleep(0.05)
    if run is None:
        child.kill()
        assert child.stdout is not None
        pytest.fail("no query reached the responder: " +
                    child.stdout.read().decode(errors="replace")[-3000:])
    recs = [json.loads(ln) for ln in (run / "pids.jsonl").read_text().splitlines()]
    names = {r.get("name") for r in recs}
    assert {SERVICE, RESPONDER} <= names, names
    state = topology.STATE_DIR / f"thx-{run.name[len('run-'):]}.json"
    namespaces = json.loads(state.read_text())["namespaces"]
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    end = time.monotonic() + 30
    while time.monotonic() < end and any(alive(r) for r in recs):
        time.sleep(0.05)
    assert [r["pid"] for r in recs if alive(r)] == []     # the death signal took them along
    topology.sweep()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in listed for ns in namespaces)
    assert not any(Path("/etc/netns").glob(f"*{run.name[len('run-'):]}*"))

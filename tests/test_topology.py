"""Tests of harness.topology against real network namespaces, nftables and tc (no mocks).

Servers and clients are small Python programs started inside the namespaces through
``Topology.exec_prefix``; every connect has a bounded timeout and every server is killed.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence, Tuple

import pytest

from harness.net.topology import (
    NETNS_ETC_DIR,
    NETNS_RUN_DIR,
    PREFIX,
    STATE_DIR,
    UTS_DIR,
    Topology,
    TopologyError,
    capabilities,
    missing,
    sweep,
)

_MISSING = missing()
if _MISSING:
    pytest.skip("topology tests need: " + "; ".join(_MISSING), allow_module_level=True)

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
CONNECT_TIMEOUT_S = 1.5  # for connects that are expected to fail by timing out
READY_TIMEOUT_S = 10.0

# Listens on every given port; answers each connection with b"hi" and closes it.
SERVER = r"""
import selectors, socket, sys
sel = selectors.DefaultSelector()
for port in sys.argv[1:]:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", int(port)))
    s.listen(16)
    sel.register(s, selectors.EVENT_READ)
print("ready", flush=True)
while True:
    for key, _ in sel.select():
        conn, _ = key.fileobj.accept()
        conn.sendall(b"hi")
        conn.close()
"""

# Connects once and prints "<result> <seconds>": ok | timeout | refused | oserror:<errno name>.
CLIENT = r"""
import errno, socket, sys, time
addr, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
t0 = time.monotonic()
try:
    conn = socket.create_connection((addr, port), timeout=timeout)
    data = conn.recv(2)
    result = "ok" if data == b"hi" else "bad:%r" % data
except socket.timeout:
    result = "timeout"
except ConnectionRefusedError:
    result = "refused"
except OSError as exc:
    result = "oserror:%s" % errno.errorcode.get(exc.errno, exc.errno)
print(result, "%.3f" % (time.monotonic() - t0))
"""

# Reads until EOF, then answers b"done".
SINK = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(4)
print("ready", flush=True)
while True:
    conn, _ = s.accept()
    while conn.recv(65536):
        pass
    conn.sendall(b"done")
    conn.close()
"""

# Sends N bytes and waits for the sink's answer; prints the seconds it took.
SEND = r"""
import socket, sys, time
addr, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t0 = time.monotonic()
conn = socket.create_connection((addr, port), timeout=10)
conn.sendall(b"x" * size)
conn.shutdown(socket.SHUT_WR)
assert conn.recv(4) == b"done"
print("%.3f" % (time.monotonic() - t0))
"""


# ---- helpers ---------------------------------------------------------------------------------


def _new_run_id() -> str:
    return "t" + uuid.uuid4().hex[:10]


def _netns_names() -> List[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def _ours(run_id: str) -> List[str]:
    return [ns for ns in _netns_names() if ns.startswith(f"{PREFIX}{run_id}")]


def _root_links() -> List[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True)
    return sorted(line.split(":")[1].strip() for line in out.stdout.splitlines())


def _root_ruleset() -> str:
    return subprocess.run(
        ["nft", "list", "ruleset"], capture_output=True, text=True, check=True
    ).stdout


def _in_ns(topo: Topology, host: str, argv: Sequence[str], timeout: float = 15.0) -> str:
    proc = subprocess.run(
        [*topo.exec_prefix(host), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return proc.stdout


@contextmanager
def _serve(topo: Topology, host: str, program: str, *args: object) -> Iterator[None]:
    """Run a server program inside a host until the block ends; it is always killed."""
    proc = subprocess.Popen(
        [*topo.exec_prefix(host), PY, "-c", program, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            ready = sel.select(READY_TIMEOUT_S)
        line = proc.stdout.readline() if ready else ""
        if line.strip() != "ready":
            proc.kill()
            _, err = proc.communicate(timeout=5)
            pytest.fail(f"server in {host} did not start: {line!r} {err}")
        yield
    finally:
        proc.kill()
        proc.wait(timeout=5)


def _connect_all(
    topo: Topology, probes: Sequence[Tuple[str, str, int]], timeout: float = CONNECT_TIMEOUT_S
) -> List[Tuple[str, float]]:
    """Run connects (source host, destination address, port) at once; (result, seconds) each."""
    started = []
    for src, addr, port in probes:
        argv = [*topo.exec_prefix(src), PY, "-c", CLIENT, addr, str(port), str(timeout)]
        started.append(
            subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    results = []
    for proc in started:
        try:
            out, err = proc.communicate(timeout=timeout + 15)
        finally:
            proc.kill()
            proc.wait()
        words = out.split()
        if len(words) != 2:
            pytest.fail(f"client printed {out!r}; stderr: {err.strip()}")
        results.append((words[0], float(words[1])))
    return results


def _connect(
    topo: Topology, src: str, addr: str, port: int, timeout: float = CONNECT_TIMEOUT_S
) -> Tuple[str, float]:
    return _connect_all(topo, [(src, addr, port)], timeout)[0]


@pytest.fixture
def topology() -> Iterator:
    """Factory: ``topology(hosts, **kwargs)`` enters a Topology with a fresh run id; after the
    test every one of them is closed and must have left no namespace behind."""
    made: List[Topology] = []

    def make(hosts: Sequence[str], **kwargs: object) -> Topology:
        topo = Topology(_new_run_id(), list(hosts), **kwargs)  # type: ignore[arg-type]
        made.append(topo.__enter__())
        return topo

    yield make
    for topo in made:
        topo.__exit__(None, None, None)
        assert _ours(topo.run_id) == []
        assert not topo.state_file.exists()


# ---- making and removing ---------------------------------------------------------------------


def test_two_hosts_reach_each_other_and_nothing_is_made_in_the_root_namespace() -> None:
    links_before, rules_before = _root_links(), _root_ruleset()
    run_id = _new_run_id()
    with Topology(run_id, ["a", "b"]) as topo:
        a, b = topo.host("a"), topo.host("b")
        assert (a.name, a.netns, a.ifname) == ("a", f"thx-{run_id}-a", "eth0")
        assert (b.name, b.netns, b.ifname) == ("b", f"thx-{run_id}-b", "eth0")
        assert a.addr.endswith(".1") and b.addr.endswith(".2")
        assert a.addr.startswith("10.213.") and b.addr.startswith("10.213.")
        assert topo.switch_netns == f"thx-{run_id}.sw"
        assert sorted(_ours(run_id)) == sorted(topo.namespaces)
        assert topo.exec_prefix("a")[1:] == ["netns", "exec", a.netns]
        assert topo.state_file.exists()
        assert json.loads(topo.state_file.read_text())["owner"]["pid"] == os.getpid()
        links = _in_ns(topo, "a", ["ip", "-o", "link", "show"])
        assert " lo:" in links and "UP" in links and " eth0@" in links
        with _serve(topo, "a", SERVER, 29500), _serve(topo, "b", SERVER, 29500):
            results = _connect_all(
                topo, [("a", b.addr, 29500), ("b", a.addr, 29500), ("a", a.addr, 29500)], timeout=5
            )
            assert [r for r, _ in results] == ["ok", "ok", "ok"]
        assert _root_links() == links_before
        assert _root_ruleset() == rules_before
    assert _ours(run_id) == []
    assert _root_links() == links_before
    assert _root_ruleset() == rules_before
    assert not (STATE_DIR / f"thx-{run_id}.json").exists()


def test_single_host_is_loopback_only_with_private_ports(topology) -> None:
    one, two = topology(["local"]), topology(["local"])
    host = one.host("local")
    assert (host.ifname, host.addr) == ("lo", "127.0.0.1")
    assert one.switch_netns is None and one.namespaces == [host.netns]
    links = _in_ns(one, "local", ["ip", "-o", "link", "show"]).splitlines()
    assert len(links) == 1 and " lo:" in links[0] and "UP" in links[0]
    # the same port in two runs at once: each namespace has its own port space
    with _serve(one, "local", SERVER, 29500), _serve(two, "local", SERVER, 29500):
        assert _connect(one, "local", "127.0.0.1", 29500, timeout=5)[0] == "ok"
        assert _connect(two, "local", "127.0.0.1", 29500, timeout=5)[0] == "ok"


def test_exception_in_the_with_block_still_tears_down() -> None:
    run_id = _new_run_id()
    with pytest.raises(KeyError):
        with Topology(run_id, ["a", "b"]):
            assert len(_ours(run_id)) == 3
            raise KeyError("boom")
    assert _ours(run_id) == []


def test_failed_enter_rolls_back_what_it_made_and_spares_what_it_did_not() -> None:
    run_id = _new_run_id()
    squatter = f"thx-{run_id}-b"  # makes the namespace's making fail halfway through __enter__
    subprocess.run(["ip", "netns", "add", squatter], check=True)
    try:
        topo = Topology(run_id, ["a", "b", "c"])
        with pytest.raises(TopologyError, match=r"making the network namespace thx-.*-b "
                                                r"failed: /run/netns/thx-.*-b: File exists"):
            topo.__enter__()
        assert _ours(run_id) == [squatter]
        assert not topo.state_file.exists()
        assert not (NETNS_ETC_DIR / f"thx-{run_id}-a").exists()
    finally:
        subprocess.run(["ip", "netns", "delete", squatter], check=True)
    assert _ours(run_id) == []


def test_a_run_id_in_use_is_refused_without_harming_its_owner(topology) -> None:
    first = topology(["a", "b"])
    second = Topology(first.run_id, ["a", "b"])
    with pytest.raises(TopologyError, match="in use"):
        second.__enter__()
    assert first.state_file.exists()
    assert sorted(_ours(first.run_id)) == sorted(first.namespaces)


@pytest.mark.parametrize(
    "subnet", ["10.213.0.0/25", "fd00::/64", "not a net", "10.213.0.1/16", "127.0.0.0/8"]
)
def test_bad_subnet_is_refused_before_anything_is_made(subnet: str) -> None:
    run_id = _new_run_id()
    with pytest.raises(ValueError, match="subnet"):
        Topology(run_id, ["a", "b"], subnet=subnet)
    assert _ours(run_id) == []


@pytest.mark.parametrize(
    "run_id, hosts",
    [
        ("has-dash", ["a"]),
        ("", ["a"]),
        ("ok", []),
        ("ok", ["a", "a"]),
        ("ok", ["a.b"]),
        ("ok", "ab"),
        ("ok", ["x" * 17]),
    ],
)
def test_bad_names_are_refused(run_id: str, hosts: List[str]) -> None:
    with pytest.raises(ValueError):
        Topology(run_id, hosts)


# ---- firewall --------------------------------------------------------------------------------


def test_firewall_drop_inbound_times_out_and_removal_restores(topology) -> None:
    topo = topology(["a", "b"])
    b = topo.host("b")
    with _serve(topo, "b", SERVER, 29600):
        handle = topo.filter_rule("b", action="drop", direction="in", ports=[29600])
        assert _connect(topo, "a", b.addr, 29600)[0] == "timeout"
        topo.remove_rule("b", handle)
        assert _connect(topo, "a", b.addr, 29600)[0] == "ok"
        assert "29600" not in topo.rules("b")


def test_firewall_reject_inbound_is_refused_at_once(topology) -> None:
    topo = topology(["a", "b"])
    b = topo.host("b")
    with _serve(topo, "b", SERVER, 29600):
        topo.filter_rule("b", action="reject", direction="in", ports=(29590, 29610))
        result, seconds = _connect(topo, "a", b.addr, 29600, timeout=5)
        assert result == "refused" and seconds < 2


def test_firewall_outbound_only_hits_the_given_peer(topology) -> None:
    topo = topology(["a", "b", "c"])
    with _serve(topo, "b", SERVER, 29600), _serve(topo, "c", SERVER, 29600):
        handle = topo.filter_rule("a", action="drop", direction="out", ports="all", peer="b")
        results = _connect_all(
            topo, [("a", topo.host("b").addr, 29600), ("a", topo.host("c").addr, 29600)]
        )
        assert [r for r, _ in results] == ["timeout", "ok"]
        topo.remove_rule("a", handle)
        topo.filter_rule("a", action="reject", direction="out", ports=29600)
        assert _connect(topo, "a", topo.host("b").addr, 29600)[0] == "refused"


def test_firewall_except_master_port_lets_the_store_through_and_blocks_new_mesh_links(
    topology,
) -> None:
    topo = topology(["a", "b"])
    a, b = topo.host("a"), topo.host("b")
    with _serve(topo, "a", SERVER, 29601), _serve(topo, "b", SERVER, 29500, 29601):
        handle = topo.filter_rule("b", action="drop", direction="in", ports={"except": [29500]})
        assert "ct state new" in topo.rules("b")
        results = _connect_all(
            topo,
            [
                ("a", b.addr, 29500),  # the store port still works
                ("a", b.addr, 29601),  # a new connection to any other port of b is dropped
                ("b", a.addr, 29601),  # b's own outgoing connections get their replies
            ],
        )
        assert [r for r, _ in results] == ["ok", "timeout", "ok"]
        topo.remove_rule("b", handle)
        assert _connect(topo, "a", b.addr, 29601)[0] == "ok"


def test_firewall_rejects_bad_arguments(topology) -> None:
    topo = topology(["a", "b"])
    bad: List[Dict[str, Any]] = [
        dict(ports=[0]),
        dict(ports=(5, 1)),
        dict(ports={"only": [1]}),
        dict(ports="some"),
        dict(ports=[]),
        dict(ports=[1], peer="nohost"),
        dict(ports=[1], action="accept"),
        dict(ports=[1], direction="both"),
    ]
    for kwargs in bad:
        args: Dict[str, Any] = {"action": "drop", "direction": "in", **kwargs}
        with pytest.raises(ValueError):
            topo.filter_rule("b", **args)
    with pytest.raises(KeyError):
        topo.filter_rule("z", action="drop", direction="in", ports="all")
    handle = topo.filter_rule("b", action="drop", direction="in", ports=[1])
    with pytest.raises(ValueError, match="does not belong"):
        topo.remove_rule("a", handle)


def test_firewall_rule_text_for_each_kind(topology) -> None:
    topo = topology(["a", "b"])
    topo.filter_rule("a", action="reject", direction="in", ports="all", proto="udp")
    topo.filter_rule("a", action="reject", direction="out", ports=[29500, 29400], peer="b")
    topo.filter_rule("a", action="drop", direction="in", ports=(1000, 2000), new_only=True)
    rules = topo.rules("a")
    # icmpx port-unreachable is the default of reject in an inet table: nft prints it bare
    assert "meta l4proto udp reject comment" in rules
    assert (
        f"ip daddr {topo.host('b').addr} tcp dport {{ 29400, 29500 }} reject with tcp reset"
        in rules
    )
    assert "tcp dport 1000-2000 ct state new drop" in rules


# ---- partition, loss, bandwidth --------------------------------------------------------------


def test_partition_cuts_both_ways_and_heal_restores(topology) -> None:
    topo = topology(["a", "b", "c"])
    a, b, c = (topo.host(n) for n in "abc")
    with (
        _serve(topo, "a", SERVER, 29500),
        _serve(topo, "b", SERVER, 29500),
        _serve(topo, "c", SERVER, 29500),
    ):
        handle = topo.cut(["a"], ["b", "c"])
        results = _connect_all(
            topo,
            [
                ("a", b.addr, 29500),
                ("b", a.addr, 29500),
                ("c", a.addr, 29500),
                ("b", c.addr, 29500),
            ],
        )
        assert [r for r, _ in results] == ["timeout", "timeout", "timeout", "ok"]
        topo.heal(handle)
        results = _connect_all(topo, [("a", b.addr, 29500), ("b", a.addr, 29500)], timeout=5)
        assert [r for r, _ in results] == ["ok", "ok"]


def test_partition_needs_a_link(topology) -> None:
    topo = topology(["local"])
    with pytest.raises(ValueError, match="link"):
        topo.cut(["local"], ["local"])


def test_packet_loss_of_100_percent_blocks_and_0_percent_does_not(topology) -> None:
    topo = topology(["a", "b"])
    b = topo.host("b")
    with _serve(topo, "b", SERVER, 29500):
        none = topo.random_drop("b", 0)
        assert _connect(topo, "a", b.addr, 29500, timeout=5)[0] == "ok"
        topo.remove_rule("b", none)
        full = topo.random_drop("b", 100, direction="in")
        assert _connect(topo, "a", b.addr, 29500)[0] == "timeout"
        topo.remove_rule("b", full)
        assert _connect(topo, "a", b.addr, 29500, timeout=5)[0] == "ok"
    half = topo.random_drop("a", 12.5, direction="out")
    assert "numgen random mod 10000 < 1250" in topo.rules("a")
    topo.remove_rule("a", half)


def _root_qdisc(netns: str, dev: str) -> Dict[str, Any]:
    """The root qdisc of a link as the kernel dumps it over netlink: its kind and, for tbf,
    its parameters; {} when only the kernel's default (handle 0) is there."""
    from harness.net.topology import _in_netns, _index, _root_qdisc

    def read(ipr: Any) -> Dict[str, Any]:
        q = _root_qdisc(ipr, _index(ipr, dev))
        if q is None:
            return {}
        out: Dict[str, Any] = {"kind": q.get_attr("TCA_KIND")}
        if out["kind"] == "tbf":
            parms = q.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")
            out.update({k: parms[k] for k in ("rate", "buffer", "limit")})
        return out

    return _in_netns(netns, "reading a qdisc", read) or {}


def test_bandwidth_installs_tbf_on_the_link_and_slows_a_transfer(topology) -> None:
    topo = topology(["a", "b"])
    a, b = topo.host("a"), topo.host("b")
    size = 160_000  # 1.28 Mbit: about a second at 1mbit, a few ms unshaped
    with _serve(topo, "b", SINK, 29500):
        fast = float(_in_ns(topo, "a", [PY, "-c", SEND, b.addr, "29500", str(size)]))
        topo.rate_limit("a", "1mbit")
        qdisc = _root_qdisc(a.netns, "eth0")
        assert qdisc["kind"] == "tbf" and qdisc["rate"] == 125_000   # bytes per second
        slow = float(_in_ns(topo, "a", [PY, "-c", SEND, b.addr, "29500", str(size)]))
        topo.clear_rate_limit("a")
        assert _root_qdisc(a.netns, "eth0") == {}
        topo.clear_rate_limit("a")                       # nothing there: no error
    assert fast < 0.5 < slow, (fast, slow)
    topo.rate_limit("b", "2mbit", direction="in")
    assert topo.switch_netns is not None
    assert _root_qdisc(topo.switch_netns, "p1")["rate"] == 250_000
    assert _root_qdisc(b.netns, "eth0") == {}          # "in" shapes the bridge's side only


@pytest.mark.skipif(not shutil.which("tc", path=os.pathsep.join(
    [os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])), reason="tc (iproute2) not installed")
@pytest.mark.parametrize("rate,burst,bound", [("1mbit", "16kb", "400ms"),
                                              ("100kbit", "80kb", "400ms"),
                                              ("2.5mbit", "32kb", "50ms"),
                                              ("100kbps", "16kb", "1s")])
def test_the_kernel_gets_from_the_harness_what_tc_would_give_it(topology, rate, burst,
                                                                 bound) -> None:
    """The qdiscs went from running `tc` to netlink: the kernel's tbf parameters (rate in
    bytes/s, buffer in ticks, limit in bytes), dumped back, are those `tc qdisc replace`
    makes from the same words, but for the buffer's rounding: pyroute2 cuts the burst's
    transmit time to whole microseconds before turning it into ticks, tc rounds the ticks up
    (2.5mbit with 32kb: 1638390 ticks against 1638400, 0.6 µs less)."""
    from pyroute2.netlink.rtnl.tcmsg.common import tick_in_usec  # from /proc/net/psched

    topo = topology(["a", "b"])
    a, b = topo.host("a"), topo.host("b")
    topo.rate_limit("a", rate, burst=burst, queue_bound=bound)
    tc = shutil.which("tc", path=os.pathsep.join(
        [os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
    subprocess.run([str(tc), "-n", b.netns, "qdisc", "replace", "dev", "eth0", "root", "tbf",
                    "rate", rate, "burst", burst, "latency", bound], check=True, timeout=30)
    ours, theirs = _root_qdisc(a.netns, "eth0"), _root_qdisc(b.netns, "eth0")
    assert ours["kind"] == theirs["kind"] == "tbf"
    assert (ours["rate"], ours["limit"]) == (theirs["rate"], theirs["limit"]), (ours, theirs)
    assert 0 <= theirs["buffer"] - ours["buffer"] <= tick_in_usec, (ours, theirs)


def test_tc_units_are_read_as_tc_reads_them() -> None:
    from harness.net.topology import tc_rate, tc_size, tc_time

    assert tc_rate("1mbit") == 125_000 and tc_rate("100kbit") == 12_500
    assert tc_rate("100kbps") == 100_000 and tc_rate("2.5MBit") == 312_500
    assert tc_rate("8000") == 1000                           # bare: bits per second
    assert tc_size("16kb") == 16384 and tc_size("80k") == 81920 and tc_size("1500") == 1500
    assert tc_time("400ms") == 400_000 and tc_time("1s") == 1_000_000 and tc_time("20") == 20
    for bad in ("1 mbit", "fast", "1mbitz", "", "-1mbit"):
        with pytest.raises(ValueError, match="tc's units"):
            tc_rate(bad)
    with pytest.raises(ValueError, match="tc's units"):
        tc_time("3h")


def test_the_probe_tells_a_qdisc_the_kernel_has_from_one_it_lacks() -> None:
    from harness.net.topology import qdisc_missing

    assert qdisc_missing("tbf") is None
    lacking = qdisc_missing("netem")
    if lacking is not None:                  # this project's kernel: no netem
        assert lacking == ("the netem qdisc is missing (the kernel answered ENOENT: No such "
                           "file or directory)")
    assert not [ns for ns in os.listdir(NETNS_RUN_DIR) if ns == f"{PREFIX}probe{os.getpid()}"]


def test_namespaces_are_pinned_as_ip_netns_pins_them(topology) -> None:
    """Made over netlink from a thread (no `ip netns add`): a mount point under /run/netns,
    listed and entered by iproute2, another namespace than the test's own."""
    topo = topology(["a"])
    ns = topo.host("a").netns
    assert os.path.ismount(NETNS_RUN_DIR / ns)
    ip = shutil.which("ip", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin",
                                                  "/sbin"]))
    listed = subprocess.run([str(ip), "-j", "netns", "list"], capture_output=True, text=True,
                            check=True).stdout
    assert ns in {entry["name"] for entry in json.loads(listed)}
    inside = _in_ns(topo, "a", ["readlink", "/proc/self/ns/net"]).strip()
    assert inside == f"net:[{os.stat(NETNS_RUN_DIR / ns).st_ino}]"
    assert inside != os.readlink("/proc/self/ns/net")   # the maker's own is untouched
    topo.close()
    assert not (NETNS_RUN_DIR / ns).exists()


# ---- name resolution -------------------------------------------------------------------------


def test_hosts_file_and_resolv_conf_apply_inside_the_namespace_only(topology) -> None:
    hosts_before = Path("/etc/hosts").read_bytes()
    resolv_before = Path("/etc/resolv.conf").read_bytes()
    topo = topology(["a", "b"])
    topo.set_hosts_file("a", {"master": "b",
                              "other.example": str(topo.network.network_address + 99)})
    topo.set_resolv_conf("a", ["nameserver 10.213.0.53", "options timeout:1"])
    resolve = "import socket, sys; print(socket.gethostbyname(sys.argv[1]))"
    assert _in_ns(topo, "a", [PY, "-c", resolve, "master"]).strip() == topo.host("b").addr
    assert _in_ns(topo, "a", [PY, "-c", resolve, "localhost"]).strip() == "127.0.0.1"
    assert "nameserver 10.213.0.53" in _in_ns(topo, "a", ["cat", "/etc/resolv.conf"])
    assert "master" not in _in_ns(topo, "b", ["cat", "/etc/hosts"])
    assert Path("/etc/hosts").read_bytes() == hosts_before
    assert Path("/etc/resolv.conf").read_bytes() == resolv_before
    etc_dir = NETNS_ETC_DIR / topo.host("a").netns
    assert etc_dir.is_dir()
    topo.close()
    assert not etc_dir.exists()


def test_a_name_with_several_addresses_keeps_their_order_and_only_the_runs_addresses(
        topology) -> None:
    topo = topology(["a", "b"])
    dead = str(topo.network.network_address + 250)
    topo.set_hosts_file("a", {"master.harness.test": [dead, "b"]})
    lines = [ln for ln in _in_ns(topo, "a", ["cat", "/etc/hosts"]).splitlines()
             if "master.harness.test" in ln]
    assert [ln.split()[0] for ln in lines] == [dead, topo.host("b").addr]
    for outside in ("10.1.2.3", "fd00::1", "192.168.0.1"):
        with pytest.raises(ValueError, match="must be loopback or an address of this run"):
            topo.set_hosts_file("a", {"x.harness.test": outside})


def test_a_hosts_file_changed_in_place_is_seen_by_a_running_process(topology) -> None:
    topo = topology(["a", "b"])
    topo.set_hosts_file("a", {})
    code = ("import socket, time\n"
            "said = False\n"
            "for _ in range(600):\n"
            "    try:\n"
            "        print(socket.gethostbyname('late.harness.test'), flush=True); break\n"
            "    except OSError:\n"
            "        if not said:\n"
            "            print('miss', flush=True); said = True\n"
            "        time.sleep(0.05)\n")
    proc = subprocess.Popen(topo.exec_prefix("a") + [PY, "-c", code], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "miss"    # running, and the name is unknown
        topo.set_hosts_file("a", {"late.harness.test": "b"}, in_place=True)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert out.strip() == topo.host("b").addr


# ---- sweep -----------------------------------------------------------------------------------

OWNER = r"""
import subprocess, sys, time
from harness.net.topology import Topology
topo = Topology(sys.argv[1], ["a", "b"]).__enter__()
topo.set_hosts_file("a", {"master": "b"})
topo.set_hostname("a", "alpha")
rank = subprocess.Popen(topo.exec_prefix("a") + ["sleep", "120"])
print(rank.pid, flush=True)
time.sleep(120)
"""


def test_sweep_removes_a_dead_runs_leftovers_and_spares_a_live_run(topology) -> None:
    live = topology(["a", "b"])
    dead_id = _new_run_id()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    owner = subprocess.Popen(
        [PY, "-c", OWNER, dead_id],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
        start_new_session=True,
    )
    rank_pid = None
    try:
        assert owner.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(owner.stdout, selectors.EVENT_READ)
            assert sel.select(READY_TIMEOUT_S), "the owner process did not make its topology"
        rank_pid = int(owner.stdout.readline())
        dead_ns = _ours(dead_id)
        assert len(dead_ns) == 3
    finally:
        owner.send_signal(signal.SIGKILL)  # __exit__ never runs
        owner.wait(timeout=5)
    assert len(_ours(dead_id)) == 3  # still there after the owner died
    assert (STATE_DIR / f"thx-{dead_id}.json").exists()
    assert (UTS_DIR / f"thx-{dead_id}-a").exists()   # host a's own name, pinned
    removed = sweep()
    assert set(dead_ns) <= set(removed)
    assert _ours(dead_id) == []
    assert not (STATE_DIR / f"thx-{dead_id}.json").exists()
    assert not (NETNS_ETC_DIR / f"thx-{dead_id}-a").exists()
    assert not (UTS_DIR / f"thx-{dead_id}-a").exists()
    # SIGKILLed by the sweep: dead or a zombie once the kernel delivered it (a process still
    # running its exit was seen as 'R' right after the sweep once, under load)
    def gone() -> bool:
        try:
            return Path(f"/proc/{rank_pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    until = time.monotonic() + 10
    while not gone() and time.monotonic() < until:
        time.sleep(0.05)
    assert gone()
    assert sorted(_ours(live.run_id)) == sorted(live.namespaces)
    assert not set(live.namespaces) & set(removed)


# ---- capabilities ----------------------------------------------------------------------------


def test_capabilities_report_tools_and_privileges() -> None:
    caps = capabilities()
    assert caps["root"] and caps["cap_net_admin"] and caps["cap_sys_admin"]
    assert all(caps[tool] and Path(caps[tool]).is_file() for tool in ("ip", "nft"))
    assert missing() == []


# ---- a host as a whole machine -----------------------------------------------------------------


def _in(topo: Topology, host: str, *argv: str) -> str:
    return subprocess.run(topo.exec_prefix(host) + list(argv), capture_output=True, text=True,
                          timeout=30, check=True).stdout.strip()


def test_a_host_with_a_name_of_its_own_is_seen_so_by_its_processes_only(topology) -> None:
    import socket

    topo = topology(["a", "b"])
    topo.set_hostname("a", "alpha")
    assert _in(topo, "a", "hostname") == "alpha"
    assert _in(topo, "a", PY, "-c", "import socket; print(socket.gethostname())") == "alpha"
    assert _in(topo, "b", "hostname") == socket.gethostname()   # b shares the machine's
    assert socket.gethostname() != "alpha"                        # the machine is untouched
    assert topo.uts_file("a").exists() and not topo.uts_file("b").exists()
    with pytest.raises(TopologyError, match="already has the name"):
        topo.set_hostname("a", "again")
    pinned = topo.uts_file("a")
    topo.close()
    assert not pinned.exists()


def test_a_hosts_file_keeps_what_each_change_set_and_names_the_own_host(topology) -> None:
    from harness.net.hostspec import MACHINE
    from harness.net.resolver import machine_hostname, parse_hosts

    topo = topology(["a", "b"])
    topo.set_hostname("a", "alpha")
    a, b = topo.host("a"), topo.host("b")
    topo.set_hosts_file("a", {"alpha": [a.addr], "beta": "b"})
    topo.set_hosts_file("a", {"store": "b"})                      # merges, does not replace
    names = parse_hosts((NETNS_ETC_DIR / a.netns / "hosts").read_text())
    assert names["alpha"] == [a.addr] and names["beta"] == [b.addr]
    assert names["store"] == [b.addr]
    assert (machine_hostname() or "").lower() not in names        # a is not the machine
    topo.set_hosts_file("a", {"beta": []})                        # [] makes a name unknown
    assert "beta" not in parse_hosts((NETNS_ETC_DIR / a.netns / "hosts").read_text())
    topo.set_hosts_file("b", {MACHINE: ["127.0.1.1"]})            # b shares the machine's name
    if machine_hostname():
        names_b = parse_hosts((NETNS_ETC_DIR / b.netns / "hosts").read_text())
        assert names_b[machine_hostname().lower()] == ["127.0.1.1"]   # type: ignore[union-attr]


def test_sysctl_and_mtu_change_the_hosts_namespace_only(topology) -> None:
    topo = topology(["a", "b"])
    root = Path("/proc/sys/net/core/somaxconn").read_text().strip()
    topo.set_sysctl("a", "net.core.somaxconn", "7")
    topo.set_sysctl("a", "net.ipv4.ip_local_port_range", "40000 40100")
    assert topo.sysctl("a", "net.core.somaxconn") == "7"
    assert topo.sysctl("a", "net.ipv4.ip_local_port_range").split() == ["40000", "40100"]
    assert topo.sysctl("b", "net.core.somaxconn") != "7" or root == "7"
    assert Path("/proc/sys/net/core/somaxconn").read_text().strip() == root
    with pytest.raises(ValueError, match="not a kernel setting"):
        topo.set_sysctl("a", "kernel.hostname", "x")
    with pytest.raises(ValueError, match="an integer"):
        topo.set_sysctl("a", "net.core.somaxconn", "1; reboot")
    topo.set_mtu("b", 1280)
    assert "mtu 1280" in _in(topo, "b", "ip", "link", "show", "eth0")
    assert "mtu 1280" not in _in(topo, "a", "ip", "link", "show", "eth0")


def test_counters_count_a_hosts_own_connections() -> None:
    from harness.net.topology import parse_counters

    text = ("Tcp: RtoMin ActiveOpens OutRsts\nTcp: 200 3 0\n"
            "TcpExt: ListenOverflows Other\nTcpExt: 12 9\n")
    assert parse_counters(text) == {"Tcp.ActiveOpens": 3, "TcpExt.ListenOverflows": 12}

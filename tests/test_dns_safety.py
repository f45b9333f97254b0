"""No DNS query ever leaves the machine: real runs traced with strace, and controls that show
the trace does catch a query when one is made.

Each test runs real scenarios (real ranks importing real torch) in one process traced with
``strace -f`` on the socket calls that can carry a query (connect, sendto, sendmsg, sendmmsg)
and on ``unshare`` (which namespaces the ranks made), then counts every call aimed at port 53,
whatever the address: there must be none, not even to loopback. The controls run the same
kinds of lookups (glibc's, and a torch TCPStore pair) outside the harness's resolver view, in a
fresh network namespace with no route out, so their queries cannot leave either: they must show
up in the trace as attempts. Before this view existed a healthy two-rank run with
``isolate: never`` made 8 such attempts, all to the machine's resolver.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

from harness.net import resolver, topology

REPO = Path(__file__).resolve().parents[1]
SYSCALLS = "trace=connect,sendto,sendmsg,sendmmsg,unshare"
# strace -f: "PID  connect(5, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr(...
PORT_53 = re.compile(r"^\d+\s+(connect|sendto|sendmsg|sendmmsg)\(.*\bsin6?_port=htons\(53\)")
ADDR = re.compile(r'inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)"')

pytestmark = pytest.mark.timeout(300)

# Runs every scenario file named on the command line, in order, and prints one JSON line of
# what each did: the harness's own API, as the pytest plugin uses it.
DRIVER = textwrap.dedent("""\
    import json, sys
    from harness.judge.classify import classify_run, job_outcome
    from harness.run.supervisor import run_scenario
    from harness.scenario.loader import load_file
    out = []
    for path in sys.argv[1:]:
        for scn in load_file(path):
            observed = run_scenario(scn)
            obs, verdicts = observed.to_dict(), classify_run(observed)
            out.append({"id": scn.test_id, "job": job_outcome(verdicts),
                        "ranks": [v.outcome for v in verdicts],
                        "port": obs["plan"]["master_port"], "netns": obs["plan"]["netns"],
                        "dns": str(obs["plan"].get("dns") or ""),
                        "warm": [s["warm"] for s in obs["servers"]]})
    print(json.dumps(out))
    """)

# The lookups torch makes, without torch: c10d's reverse lookup of a peer, gloo's of the host
# name, and a forward lookup of a name no hosts file maps.
LOOKUPS = textwrap.dedent("""\
    import socket
    for a in [("::ffff:127.0.0.1", 0, 0, 0), ("192.0.2.1", 0)]:
        try:
            socket.getnameinfo(a, 0)
        except OSError:
            pass
    for n in [socket.gethostname(), "master.harness.invalid"]:
        try:
            socket.getaddrinfo(n, None)
        except OSError:
            pass
    """)

# A real torch store pair: the server reverse-resolves the client's address.
STORE_PAIR = textwrap.dedent("""\
    from datetime import timedelta
    import torch.distributed as dist
    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=20),
                           wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, None, False,
                           timeout=timedelta(seconds=20))
    client.set("k", "v")
    assert server.get("k") == b"v"
    print("store pair ok")
    """)


def scenario(name: str, *lines: str, isolate: str = "never") -> str:
    return "\n".join([f"name: {name}", "about: traced for DNS queries", "world_size: 2",
                      "timeout: 5", "deadline: 40", "workload: [barrier, all_reduce]",
                      *lines] + ([f"isolate: {isolate}"] if "nodes: 2" not in lines else [])) \
        + "\n"


OK = "expect: {job: ok}"
# the ranks run in the machine's own network namespace, where the resolver is reachable
MACHINE = {
    "localhost": scenario("localhost", "master_addr: localhost", OK),
    "localhost_localdomain_tcp": scenario("localhost_localdomain_tcp", "init: tcp",
                                          "master_addr: localhost.localdomain", OK),
    "ip6_localhost": scenario("ip6_localhost", "master_addr: ip6-localhost", OK),
    "v6_loopback": scenario("v6_loopback", 'master_addr: "::1"', OK),
}
MACHINE_FAULTS = {
    "wrong_addr": scenario("wrong_addr", "master_addr: localhost",
                           "faults: [{kind: wrong_addr, ranks: [1], addr: 127.0.0.2}]", OK),
    # the name that never resolves: looked up in the machine's namespace, still no query
    "unresolvable": scenario("unresolvable", "faults: [{kind: unresolvable_host}]",
                             "expect: {job: timeout}").replace("timeout: 5", "timeout: 2"),
}
NAMESPACES = {   # the harness's own network namespaces (root)
    "isolated": scenario("isolated", "master_addr: localhost.localdomain", OK, isolate="auto"),
    "two_hosts": scenario("two_hosts", "nodes: 2", OK),
}
USERNS = {k: MACHINE[k] for k in ("localhost_localdomain_tcp", "ip6_localhost")}
# the run's own name server: MASTER_ADDR is a name only it knows, so an ok job means the ranks
# asked it; the late one is NXDOMAIN for its first 2 s
DNS_BLOCK = ("dns: {domain: cluster.test, records: {master: node0, node0: node0, node1: node1},"
             " master: master}")
WITH_DNS = {
    "dns_short_name": scenario("dns_short_name", "nodes: 2", DNS_BLOCK, OK),
    "dns_late_record": scenario(
        "dns_late_record", "nodes: 2", DNS_BLOCK,
        "faults: [{kind: dns_name, name: master, answer: nxdomain, heal_after: 2}]",
        OK).replace("timeout: 5", "timeout: 10"),
}


# start: fork, the servers forked from the driver's zygotes (one process: the second run of a
# kind reuses the first's). A zygote imported torch in the machine's namespaces, outside any
# view; DDP's zygote's import even asked NSS (getpwuid, with the machine's nsswitch.conf,
# whose hosts line says dns) before its servers entered their views
DDP = 'workload: [barrier, "ddp 1MB"]'
WARM = {
    "warm_first": scenario("warm_first", "master_addr: localhost", "start: fork", OK),
    "warm_again_tcp": scenario("warm_again_tcp", "init: tcp", "start: fork",
                               "master_addr: localhost.localdomain", OK),
    "warm_unresolvable": scenario("warm_unresolvable", "faults: [{kind: unresolvable_host}]",
                                  "start: fork", "expect: {job: timeout}")
    .replace("timeout: 5", "timeout: 2"),
    "warm_ddp_unresolvable": scenario("warm_ddp_unresolvable",
                                      "faults: [{kind: unresolvable_host}]", "start: fork",
                                      "expect: {job: timeout}")
    .replace("timeout: 5", "timeout: 2").replace("workload: [barrier, all_reduce]", DDP),
    "warm_ddp": scenario("warm_ddp", "master_addr: localhost", "start: fork", OK)
    .replace("workload: [barrier, all_reduce]", DDP),
}


# -- the trace ---------------------------------------------------------------------------------

def port_53(trace: str) -> List[str]:
    """Every traced call aimed at port 53 (a DNS query or the connect before one)."""
    return [ln for ln in trace.splitlines() if PORT_53.match(ln)]


def off_machine(lines: Sequence[str]) -> List[str]:
    out = []
    for ln in lines:
        m = ADDR.search(ln)
        if m and not ipaddress.ip_address(m.group(1) or m.group(2)).is_loopback:
            out.append(ln)
    return out


@functools.cache
def strace_argv() -> List[str]:
    """strace with the options this one supports; skips the test when it cannot trace."""
    exe = shutil.which("strace")
    if exe is None:
        pytest.skip("strace is not installed: apt-get install strace (./.ci/setup installs it "
                    "as root); without it no test can show that no DNS query leaves")
    base = [exe, "-f", "-qq", "-e", SYSCALLS]
    for extra in (["--seccomp-bpf"], []):   # seccomp-bpf: far less overhead (strace >= 5.3)
        p = subprocess.run(base + extra + ["-o", "/dev/null", "true"], capture_output=True,
                           text=True, timeout=60)
        if p.returncode == 0:
            return base + extra
    pytest.skip(f"strace cannot trace here (ptrace not permitted?): {p.stderr.strip()[-300:]}")


def traced(argv: Sequence[str], trace: Path, env: Optional[Dict[str, str]] = None,
           timeout: float = 280) -> subprocess.CompletedProcess:
    return subprocess.run(strace_argv() + ["-o", str(trace), *argv], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd="/")


def run_traced(folder: Path, cases: Dict[str, str], prefix: Sequence[str] = (),
               python: str = sys.executable, env: Optional[Dict[str, str]] = None):
    files = []
    for name, text in cases.items():
        f = folder / f"{name}.yaml"
        f.write_text(text)
        files.append(str(f))
    trace = folder / "trace"
    p = traced([*prefix, python, "-c", DRIVER, *files], trace, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    runs = json.loads(p.stdout.strip().splitlines()[-1])
    return runs, trace.read_text()


def check(runs, text: str, cases: Dict[str, str]) -> None:
    queries = port_53(text)
    assert not off_machine(queries), "DNS left the machine:\n" + "\n".join(queries[:20])
    assert queries == [], "DNS queries (to loopback):\n" + "\n".join(queries[:20])
    assert [r["id"] for r in runs] == list(cases)
    for r in runs:   # every rank really ran, and resolved its names: the job is what it was
        want = "timeout" if "job: timeout" in cases[r["id"]] else "ok"
        assert r["job"] == want, r
        # the trace saw the ranks: someone dialled this run's store port (unless the ranks'
        # MASTER_ADDR is a name that never resolves)
        if "unresolvable_host" not in cases[r["id"]]:
            assert re.search(rf"connect\(.*htons\({r['port']}\)", text), r


def unshares(text: str) -> List[str]:
    return sorted({m.group(1) for m in re.finditer(r"unshare\(([A-Z_|]+)\)\s+= 0", text)})


def _environment(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HARNESS_"))}
    env.update(extra)
    return env


@pytest.fixture
def shared_tmp():
    """A folder other users can read (pytest's tmp_path is private to its user)."""
    path = Path(tempfile.mkdtemp(prefix="harness-dns-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _skip_without_view(env: Optional[Dict[str, str]] = None) -> None:
    p = subprocess.run([sys.executable, "-m", "harness.net.resolver", "--check"], env=env,
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        pytest.skip(p.stdout.strip())


def _fresh_netns() -> List[str]:
    """A prefix that runs a command in a new network namespace with only lo up: nothing
    there can reach any name server, so a control's queries stay attempts."""
    if not shutil.which("unshare") or not shutil.which("ip", path="/usr/sbin:/sbin:/usr/bin"):
        pytest.skip("the controls need unshare (util-linux) and ip (iproute2)")
    ip = shutil.which("ip", path="/usr/sbin:/sbin:/usr/bin")
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--net", "--", "sh", "-c", f'{ip} link set lo up && exec "$@"',
            "sh"]


# -- the controls: the trace does see queries --------------------------------------------------

def test_control_glibc_lookups_outside_the_view_are_seen_inside_they_are_not(tmp_path):
    """The same lookups c10d and gloo make: outside the view the trace shows DNS attempts
    (to the machine's resolver address, unreachable from the fresh namespace); inside, none."""
    netns = _fresh_netns()
    _skip_without_view()
    trace = tmp_path / "outside"
    p = traced([*netns, sys.executable, "-c", LOOKUPS], trace)
    assert p.returncode == 0, p.stderr
    outside = port_53(trace.read_text())
    assert len(outside) >= 2, trace.read_text()[-2000:]   # at least the two reverse lookups
    view = resolver.write_view(tmp_path / "view")
    p = traced([*netns, *resolver.exec_prefix(view), sys.executable, "-c", LOOKUPS],
               tmp_path / "inside")
    assert p.returncode == 0, p.stderr
    assert port_53((tmp_path / "inside").read_text()) == []


def test_control_a_torch_store_pair_outside_the_view_queries_dns(tmp_path):
    """torch itself: a TCPStore server reverse-resolves its client (::ffff:127.0.0.1)."""
    netns = _fresh_netns()
    trace = tmp_path / "trace"
    p = traced([*netns, sys.executable, "-c", STORE_PAIR], trace)
    assert p.returncode == 0 and "store pair ok" in p.stdout, p.stderr[-2000:]
    assert port_53(trace.read_text()), "the trace saw no DNS attempt of a bare store pair"


# -- real runs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("cases", [MACHINE, MACHINE_FAULTS], ids=["names", "faults"])
def test_runs_in_the_machines_namespace_send_no_dns_query(tmp_path, cases):
    """isolate: never: the resolver IS reachable from here; the ranks' view keeps them off it.
    As root each rank makes a private mount namespace (unshare(CLONE_NEWNS))."""
    env = _environment()
    _skip_without_view(env)
    runs, text = run_traced(tmp_path, cases, env=env)
    check(runs, text, cases)
    assert not any(r["netns"] for r in runs)
    want = "CLONE_NEWNS" if os.geteuid() == 0 else "CLONE_NEWNS|CLONE_NEWUSER"
    assert want in unshares(text)


def test_runs_forked_from_warm_zygotes_send_no_dns_query(tmp_path):
    env = _environment()
    _skip_without_view(env)
    runs, text = run_traced(tmp_path, WARM, env=env)
    check(runs, text, WARM)
    assert all(r["warm"] and all(r["warm"]) for r in runs), runs


def test_runs_in_a_user_namespace_send_no_dns_query(tmp_path):
    """The path a user without root takes (forced here with HARNESS_RESOLVER_USERNS=1)."""
    env = _environment(**{resolver.ENV_USERNS: "1"})
    _skip_without_view(env)
    runs, text = run_traced(tmp_path, USERNS, env=env)
    check(runs, text, USERNS)
    assert unshares(text) == ["CLONE_NEWNS|CLONE_NEWUSER"]


def test_runs_in_the_harness_namespaces_send_no_dns_query(tmp_path):
    gaps = topology.missing()
    if gaps:
        pytest.skip("network namespaces: " + "; ".join(gaps))
    runs, text = run_traced(tmp_path, NAMESPACES, env=_environment())
    check(runs, text, NAMESPACES)
    assert all(r["netns"] for r in runs)


@pytest.mark.parametrize("start", ["fresh", "fork"])
def test_runs_of_a_user_without_root_send_no_dns_query(shared_tmp, nobody_python, start):
    """fork: without root there is no host to enter (no namespaces of the harness's), so the
    servers still come warm from the zygote; each enters its view in a user namespace."""
    cmd = nobody_python
    state = shared_tmp / "state"
    state.mkdir()
    shutil.chown(state, "nobody", "nogroup")
    cases = {k: MACHINE[k] for k in ("localhost_localdomain_tcp", "v6_loopback")}
    if start == "fork":
        cases = {k: WARM[k] for k in ("warm_first", "warm_again_tcp", "warm_unresolvable")}
    env = _environment(HARNESS_TMP=str(state))
    env.pop("TMPDIR", None)
    p = subprocess.run(cmd[:-1] + [f"HARNESS_TMP={state}", cmd[-1], "-m", "harness.net.resolver",
                                   "--check"], capture_output=True, text=True, timeout=60,
                       cwd="/", env=env)
    if p.returncode != 0:
        pytest.skip(f"the user nobody cannot enter a resolver view: {p.stdout.strip()}")
    runs, text = run_traced(shared_tmp, cases, prefix=cmd[:-1] + [f"HARNESS_TMP={state}"],
                            python=cmd[-1], env=env)
    check(runs, text, cases)
    assert unshares(text) == ["CLONE_NEWNS|CLONE_NEWUSER"]
    if start == "fork":
        assert all(r["warm"] == [True] for r in runs), runs


def test_runs_with_a_dns_block_query_only_the_runs_own_name_server(tmp_path):
    """dns: every port-53 call of the run (the ranks' lookups, the supervisor's readiness
    query) goes to the run's dns host; the jobs are ok only if the ranks' queries reached it
    (MASTER_ADDR is a name no hosts file has)."""
    from harness.services.dns import DNSMASQ

    gaps = topology.missing()
    if gaps:
        pytest.skip("network namespaces: " + "; ".join(gaps))
    why = DNSMASQ.missing()
    if why:
        pytest.skip(why)
    runs, text = run_traced(tmp_path, WITH_DNS, env=_environment())
    assert [r["id"] for r in runs] == list(WITH_DNS)
    assert [r["job"] for r in runs] == ["ok", "ok"], runs
    servers = set()
    for r in runs:
        m = re.search(r"addrs=\[([^\]]*)\]", r["dns"])
        assert m, r["dns"]
        servers |= set(re.findall(r"'([^']+)'", m.group(1)))
    assert servers and all(ipaddress.ip_address(a).is_private for a in servers), servers
    queries = port_53(text)
    addrs = [ADDR.search(q) for q in queries]
    elsewhere = [q for q, m in zip(queries, addrs) if not m or (m.group(1) or m.group(2))
                 not in servers]
    assert not elsewhere, "port 53 other than the run's name server:\n" + \
        "\n".join(elsewhere[:20])
    # glibc connect()s its UDP socket to the server (the supervisor's readiness query uses
    # sendto): 2 runs x 2 ranks looked master up at least once each
    glibc = [q for q in queries if re.match(r"^\d+\s+connect\(", q)]
    assert len(glibc) >= 4, "\n".join(queries)

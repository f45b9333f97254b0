"""The resolver view (harness.resolver) and the safety rule built on it.

The files are checked as text; entering the view is checked for real: a child process enters
it (a private mount namespace as root, a user namespace when forced or without root) and asks
glibc, and the machine's own /etc files and mount table must be untouched afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Dict

import pytest

from harness.net import resolver
from harness.net.safety import refuse_address
from harness.scenario.loader import ScenarioFileError, load_text

ETC = ("/etc/hosts", "/etc/nsswitch.conf", "/etc/resolv.conf")

pytestmark = pytest.mark.timeout(120)

# What a child asks glibc inside the view: forward lookups of the accepted names and the
# reverse lookups c10d makes (a peer as ::ffff:127.0.0.1), and what /etc shows.
LOOKUPS = textwrap.dedent("""\
    import json, os, socket
    out = {"uid": os.getuid(), "fwd": {}, "rev": {}}
    for n in ["localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback",
              "LOCALHOST", "master.harness.invalid", "example.com"]:
        try:
            out["fwd"][n] = sorted({a[4][0] for a in socket.getaddrinfo(n, None)})
        except socket.gaierror as e:
            out["fwd"][n] = "gai %d" % e.errno
    for a in [("::ffff:127.0.0.1", 0, 0, 0), ("127.0.0.1", 0), ("::1", 0, 0, 0)]:
        out["rev"][a[0]] = socket.getnameinfo(a, socket.NI_NAMEREQD)[0]
    out["nsswitch"] = [l for l in open("/etc/nsswitch.conf") if l.startswith("hosts")]
    print(json.dumps(out))
    """)


def _etc_state() -> Dict[str, str]:
    """The machine's name files and every mount on /etc (other mounts come and go with
    concurrent runs: `ip netns add` mounts under /run/netns)."""
    state = {p: Path(p).read_text() for p in ETC if os.path.exists(p)}
    mounts = subprocess.run(["findmnt", "-n", "-l", "-o", "TARGET,SOURCE"],
                            capture_output=True, text=True).stdout.splitlines()
    state["mounts"] = "\n".join(m for m in mounts if m.startswith("/etc"))
    return state


# -- the files ---------------------------------------------------------------------------------

def test_hosts_text_maps_loopback_names_the_mapped_peer_and_the_hostname():
    text = resolver.hosts_text(hostname="node7")
    assert text.startswith("# torchdist-harness")
    lines = [ln.split("\t") for ln in text.splitlines() if not ln.startswith("#")]
    assert lines == [["127.0.0.1", "localhost"], ["127.0.0.1", "localhost.localdomain"],
                     ["::1", "localhost"], ["::1", "ip6-localhost"], ["::1", "ip6-loopback"],
                     ["::ffff:127.0.0.1", "localhost"], ["127.0.0.1", "node7"]]


def test_hosts_text_hostname_already_mapped_is_not_repeated():
    assert resolver.hosts_text(hostname="LocalHost").count("LocalHost") == 0


def test_hosts_text_entries_replace_the_lines_of_their_name():
    text = resolver.hosts_text({"master": "10.213.0.1", "localhost.localdomain": "127.0.0.9"})
    names = resolver.parse_hosts(text)
    assert names["master"] == ["10.213.0.1"]
    assert names["localhost.localdomain"] == ["127.0.0.9"]
    assert names["localhost"] == ["127.0.0.1", "::1", "::ffff:127.0.0.1"]


@pytest.mark.parametrize("entries, says", [
    ({"bad name": "127.0.0.1"}, "not a host name"),
    ({"x": "somewhere"}, "must map to an IP address"),
])
def test_hosts_text_refuses_bad_entries(entries, says):
    with pytest.raises(ValueError, match=says):
        resolver.hosts_text(entries)


def test_loopback_names_are_those_mapped_to_loopback_only():
    text = resolver.hosts_text({"master": "10.213.0.1", "lo2": "127.0.0.2"}, hostname="vm9")
    assert set(resolver.loopback_names(text)) == {
        "localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", "lo2", "vm9"}
    # the default: the view's own lines, the same on every machine
    assert set(resolver.loopback_names()) == {
        "localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


def test_parse_hosts_reads_aliases_and_comments_like_glibc():
    got = resolver.parse_hosts("# c\n127.0.0.1 a b # c d\n\n10.0.0.1\tB\nbroken\n")
    assert got == {"a": ["127.0.0.1"], "b": ["127.0.0.1", "10.0.0.1"]}


def test_nsswitch_keeps_every_database_but_hosts():
    machine = "passwd: files systemd\nhosts:   files mdns4_minimal [NOTFOUND=return] dns\n" \
              "networks: files\nhosts: dns\n"
    text = resolver.nsswitch_text(machine)
    assert [ln for ln in text.splitlines() if not ln.startswith("#")] == \
        ["passwd: files systemd", "hosts:          files", "networks: files"]
    # glibc reads a '#' after a service as more of the line: no note on the hosts line
    assert "#" not in next(ln for ln in text.splitlines() if ln.startswith("hosts"))


def test_nsswitch_without_a_hosts_line_gets_one():
    assert resolver.nsswitch_text("passwd: files\n").splitlines()[-1] == "hosts:          files"


def test_resolv_conf_points_at_loopback():
    assert resolver.resolv_conf_text() == "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
    with pytest.raises(ValueError):
        resolver.resolv_conf_text(["nameserver 1.1.1.1\nnameserver 8.8.8.8"])


def test_write_view_writes_the_three_files(tmp_path):
    view = resolver.write_view(tmp_path / "v", hostname="h1")
    assert sorted(p.name for p in view.iterdir()) == sorted(resolver.FILES)
    assert (view / "hosts").read_text() == resolver.hosts_text(hostname="h1")
    assert "hosts:          files\n" in (view / "nsswitch.conf").read_text()
    assert oct((view / "hosts").stat().st_mode & 0o777) == "0o644"


def test_exec_prefix_runs_the_module():
    assert resolver.exec_prefix("/v", "py") == ["py", "-m", "harness.net.resolver", "--view", "/v",
                                                "--"]


# -- the safety rule ---------------------------------------------------------------------------

@pytest.mark.parametrize("addr", ["localhost", "LocalHost", "localhost.localdomain",
                                  "ip6-localhost", "ip6-loopback", "127.0.0.1", "127.0.0.2",
                                  "::1"])
def test_names_and_addresses_the_view_maps_to_loopback_are_accepted(addr):
    assert refuse_address(addr) is None


# spellings users write (issue 41): judged by what they stand for; the value reaches torch as
# written (a lookup of "localhost." or "[::1]" fails in the view: loopback or nowhere)
@pytest.mark.parametrize("addr", ["[::1]", " 127.0.0.1", "127.0.0.1 ", "localhost.",
                                  "LOCALHOST.", "ip6-localhost.", "::ffff:127.0.0.1",
                                  "[::ffff:127.0.0.1]", "[ ::1 ]", "127.0.0.1."])
def test_spellings_of_loopback_are_judged_by_where_they_lead(addr):
    assert refuse_address(addr) is None


@pytest.mark.parametrize("addr, says", [
    ("localhost6", "does not map to loopback"),
    ("localhost..", "does not map to loopback"),
    ("trainer-0.example.com", "could send a DNS query off this machine"),
    ("trainer-0.example.com.", "could send a DNS query off this machine"),
    ("::ffff:10.0.0.1", "is not a loopback address"),
    ("[fd00::1]", "is not a loopback address"),
    (" 10.0.0.1", "is not a loopback address"),
    ("10.0.0.1", "is not a loopback address"),
    ("169.254.169.254", "is not a loopback address"),
    ("10.1.2.3", "is not a loopback address"),
    ("127.0.0.1 example.com", "does not map to loopback"),
])
def test_other_names_are_refused(addr, says):
    why = refuse_address(addr)
    assert why is not None and says in why


def test_the_machines_hostname_is_refused_as_not_portable(monkeypatch):
    monkeypatch.setattr("harness.net.safety.machine_hostname", lambda: "trainer7")
    why = refuse_address("trainer7")
    assert why is not None and "this machine's host name" in why and "127.0.0.1" in why


@pytest.mark.parametrize("where, field", [
    ("master_addr: localhost6\n", "master_addr"),
    ("env: {MASTER_ADDR: db.example.com}\n", "env.MASTER_ADDR"),
    ("faults: [{kind: wrong_addr, addr: ip6-localhost6}]\n", "faults[0].addr"),
])
def test_every_place_a_scenario_names_a_host_is_checked(where, field):
    with pytest.raises(ScenarioFileError) as e:
        load_text("name: s\nabout: why\n" + where, "s.yaml")
    (p,) = e.value.problems
    assert p.field == field
    assert "does not map to loopback" in p.message and "DNS query" in p.message


@pytest.mark.parametrize("name", ["localhost.localdomain", "ip6-localhost"])
def test_accepted_names_load(name):
    (scn,) = load_text(f"name: s\nabout: why\nmaster_addr: {name}\n"
                       f"faults: [{{kind: wrong_addr, addr: {name}}}]\n", "s.yaml")
    assert scn.master_addr == name


# -- entering it, for real ---------------------------------------------------------------------

def _in_view(view: Path, code: str, *extra: str, env=None) -> Dict:
    p = subprocess.run([sys.executable, "-m", "harness.net.resolver", *extra, "--view", str(view),
                        "--", sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, cwd="/", env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _needs_a_view(userns: bool) -> None:
    env = dict(os.environ, **({resolver.ENV_USERNS: "1"} if userns else {}))
    p = subprocess.run([sys.executable, "-m", "harness.net.resolver", "--check"], env=env,
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        pytest.skip(p.stdout.strip())


@pytest.mark.parametrize("userns", [False, True], ids=["mount-ns", "user-ns"])
def test_inside_the_view_names_resolve_from_its_hosts_file_only(tmp_path, userns):
    if not userns and os.geteuid() != 0:
        pytest.skip("a plain mount namespace needs root; without root the user-ns case runs")
    _needs_a_view(userns)
    before = _etc_state()
    view = resolver.write_view(tmp_path / "view", hostname="dnstest-host")
    got = _in_view(view, LOOKUPS, *(["--userns"] if userns else []))
    assert got["uid"] == os.getuid()   # a user namespace maps the user to itself
    fwd = got["fwd"]
    assert fwd["localhost"] == ["127.0.0.1", "::1", "::ffff:127.0.0.1"]
    assert fwd["LOCALHOST"] == fwd["localhost"]
    assert fwd["localhost.localdomain"] == ["127.0.0.1"]
    assert fwd["ip6-localhost"] == fwd["ip6-loopback"] == ["::1"]
    # not in the file: fails at once, "Name or service not known", not a DNS timeout
    assert fwd["master.harness.invalid"] == fwd["example.com"] == f"gai {socket.EAI_NONAME}"
    assert got["rev"] == {"::ffff:127.0.0.1": "localhost", "127.0.0.1": "localhost",
                          "::1": "localhost"}
    assert got["nsswitch"] == ["hosts:          files\n"]
    assert _etc_state() == before   # nothing of the machine's files or mounts changed


def test_entering_needs_a_single_thread(tmp_path):
    view = resolver.write_view(tmp_path / "view")
    code = textwrap.dedent(f"""\
        import threading, time, sys
        from harness.net import resolver
        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()
        try:
            resolver.enter({str(view)!r})
        except resolver.ViewError as e:
            print(e)
        """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "must be entered while single-threaded" in p.stdout, p.stderr


def test_a_view_folder_without_its_files_is_refused(tmp_path):
    (tmp_path / "hosts").write_text("127.0.0.1 localhost\n")
    p = subprocess.run([sys.executable, "-m", "harness.net.resolver", "--view", str(tmp_path), "--",
                        "true"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 125 and "has no nsswitch.conf" in p.stderr


def test_worker_enters_the_view_before_anything_else(tmp_path):
    """The worker's first step is the view: a rank whose view cannot be entered stops there
    (exit 4, a clear line), before it reads its event fd or imports torch."""
    env = dict(os.environ, **{resolver.ENV_VIEW: str(tmp_path / "missing")})
    env.pop("HARNESS_EVENT_FD", None)
    p = subprocess.run([sys.executable, "-m", "harness.ranks.worker", "{}"], capture_output=True,
                       text=True, timeout=60, env=env, cwd="/")
    assert p.returncode == 4, p.stderr
    assert p.stderr.strip() == (f"harness worker: cannot enter the resolver view: the resolver "
                                f"view {tmp_path / 'missing'} has no hosts")




@pytest.fixture
def shared_tmp():
    """A folder other users can read (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="harness-test-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path)


def test_the_view_works_for_a_user_without_root(shared_tmp, nobody_python):
    cmd = nobody_python
    view = resolver.write_view(shared_tmp / "view")
    p = subprocess.run(cmd + ["-m", "harness.net.resolver", "--view", str(view), "--", cmd[-1],
                              "-c", LOOKUPS], capture_output=True, text=True, timeout=60, cwd="/")
    if "user namespaces are not allowed" in p.stderr:
        pytest.skip(p.stderr.strip())
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["uid"] == 65534
    assert got["fwd"]["localhost.localdomain"] == ["127.0.0.1"]
    assert got["rev"]["::ffff:127.0.0.1"] == "localhost"


def test_without_user_namespaces_machine_namespace_scenarios_are_skipped_with_the_reason(
        tmp_path):
    """The path of a user without root where unprivileged user namespaces are off: made real
    inside a user namespace whose own limit allows no further one (the machine's limit is not
    touched), with the user-namespace mode forced. The isolate: never case is skipped with the
    reason, the namespace case is not asked about the view, and doctor says the same."""
    if not shutil.which("unshare"):
        pytest.skip("unshare (util-linux) is not installed")
    (tmp_path / "s.yaml").write_text(textwrap.dedent("""\
        name: s
        about: runs in the machine's own network namespace
        isolate: never
        expect: {job: ok}
        """))
    report = tmp_path / "r.json"
    limited = ["unshare", "--user", "--map-root-user", "sh", "-c",
               'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"', "sh", "env",
               f"{resolver.ENV_USERNS}=1", sys.executable, "-m", "harness.cli"]
    p = subprocess.run(limited + ["run", str(tmp_path / "s.yaml"), "--no-progress", "--report",
                                  str(report)], capture_output=True, text=True, timeout=120)
    if "unshare failed" in p.stderr or "Operation not permitted" in p.stderr:
        pytest.skip(f"cannot make a user namespace here: {p.stderr.strip()[-200:]}")
    (case,) = json.loads(report.read_text())["cases"]
    assert case["status"] == "skipped", p.stdout[-2000:]
    assert case["reason"].startswith("cannot keep torch's DNS lookups on this machine: the "
                                     "ranks' private resolver view needs root or unprivileged "
                                     "user namespaces (unshare(CLONE_NEWUSER|CLONE_NEWNS): ")
    assert "user.max_user_namespaces is 0 (needs > 0)" in case["reason"]
    p = subprocess.run(limited + ["doctor", "--json"], capture_output=True, text=True,
                       timeout=120)
    assert json.loads(p.stdout)["resolver_view_missing"] == case["reason"]


@pytest.mark.parametrize("text, topology_gaps, skipped", [
    ("isolate: never\n", [], True),
    ("isolate: auto\n", [], False),                        # runs in a harness namespace
    ("isolate: auto\n", ["not running as root"], True),    # falls back to the machine's
    ("nodes: 2\n", [], False),
    ("faults: [{kind: unresolvable_host}]\nisolate: never\n", [], True),
])
def test_skip_reason_asks_for_the_view_only_where_ranks_use_the_machines_namespace(
        monkeypatch, text, topology_gaps, skipped):
    from harness.net import topology
    from harness.run import requirements

    monkeypatch.setattr(topology, "missing", lambda: list(topology_gaps))
    monkeypatch.setattr(resolver, "missing", lambda: "no view here")
    (scn,) = load_text("name: s\nabout: why\n" + text, "s.yaml")
    env = {"torch": "2.13.0", "distributed": True, "gloo": True}
    assert requirements.skip_reason(scn, env) == ("no view here" if skipped else None)

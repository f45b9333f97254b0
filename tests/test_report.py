"""The JSON session report: message families, the environment fingerprint, reading, and real
pytest sessions (plain and pytest-xdist) writing it through ``--harness-report``."""

import ast
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.machine.torch_probe import probe
from harness.reports import fields, report

DATA = Path(__file__).parent / "data"
SCENARIOS = DATA / "report_scenarios"
COMMITTED = DATA / "report-gloo.json"


def child_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HARNESS_"))}
    env["COLUMNS"] = "200"
    return env


def pytest_session(tmp: Path, files, *extra):
    """A real pytest session in ``tmp`` on copies of the named scenario files."""
    scen = tmp / "scenarios"
    scen.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy(SCENARIOS / f, scen / f)
    cmd = [sys.executable, "-m", "pytest", "scenarios", "-p", "no:cacheprovider", "-q",
           "--harness-report", str(tmp / "report.json"), *extra]
    return subprocess.run(cmd, cwd=tmp, env=child_env(), capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def xdist_session(tmp_path_factory):
    """healthy, a failing expectation, a skipped nccl case, a hang, and a broken file, with
    ``-n 2``: the controller gathers what the workers attach and writes the report once."""
    pytest.importorskip("xdist")
    tmp = tmp_path_factory.mktemp("xdist")
    (tmp / "scenarios").mkdir()
    (tmp / "scenarios" / "broken.yaml").write_text("name: broken\nabout: x\nworld_size: 0\n")
    p = pytest_session(tmp, ["healthy.yaml", "expect_hang.yaml", "stopped.yaml"], "-n", "2",
                       "--harness-html", str(tmp / "report.html"))
    rep = json.loads((tmp / "report.json").read_text())
    return p, rep, tmp


def _case(rep, test_id):
    return next(c for c in rep["cases"] if c["test_id"] == test_id)


# -- message families ----------------------------------------------------------------------------

def test_family_ignores_ports_addresses_and_numbers():
    a = ("The client socket has timed out after 5000ms while trying to connect to "
         "(127.0.0.1, 29500).")
    b = ("The client socket has timed out after 2000ms while trying to connect to "
         "(10.1.2.3, 23456).")
    assert report.message_family(a) == report.message_family(b)
    assert report.message_family(a) == ("the client socket has timed out after <n>ms while "
                                        "trying to connect to (<addr>, <n>).")


def test_family_replaces_paths_and_keeps_the_first_line_only():
    msg = ("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
           "waiting 2000ms for recv operation to complete\nException raised from ... frame #0")
    assert report.message_family(msg) == "timed out waiting <n>ms for recv operation to complete"
    keys = "wait timeout after 5000ms, keys: /default_pg/0//cpu//0/0"
    assert report.message_family(keys) == "wait timeout after <n>ms, keys: <path>"


def test_family_of_gloos_connect_timeout_ignores_the_uninitialised_peer_it_prints():
    """net_data_ports_blocked[reject], rank 0, real runs: every fresh interpreter printed
    "[none]", a forked rank once printed junk from its reused heap (gloo's tcp::Address()
    leaves its sockaddr uninitialised and str() prints whatever family it finds there)."""
    head = ("Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/gloo/"
            "transport/tcp/pair.h:311] Connect timeout ")
    fresh = report.message_family(head + "[none]")
    assert fresh == "gloo connectfullmesh failed with [<path>] connect timeout <peer>"
    for junk in ("[efd0:0:a00:200:ffff:ffff:ffff:0]:1", "[10.213.1.1]:29500", "[::1]:5"):
        assert report.message_family(head + junk) == fresh, junk
    # a refusal that names its peer stays a different family
    assert report.message_family(
        "Gloo connectFullMesh failed with [/x/pair.cc:152] timed out connecting: SO_ERROR: "
        "Connection refused, remote=[10.213.1.1]:55729") != fresh


def test_family_replaces_ipv6_addresses_in_every_form_gloo_and_the_store_print():
    v6 = "connect to <addr>:<n> failed: connection refused"
    for addr in ("[::1]", "[fd00::1]", "[::ffff:127.0.0.1]", "[fd00:0:0:0:0:0:0:1]"):
        assert report.message_family(f"connect to {addr}:29500 failed: Connection refused") \
            == v6, addr
    assert report.message_family("Connection refused (::1, 29500)") == \
        "connection refused (<addr>, <n>)"
    # not addresses: a "host]:port:" run, C++ scopes, a clock
    assert report.message_family("Read error [10.213.148.1]:2434: Connection reset") == \
        "read error [<addr>]:<n>: connection reset"
    assert report.message_family("std::runtime_error in gloo::transport::tcp::Pair") == \
        "std::runtime_error in gloo::transport::tcp::pair"
    assert report.message_family("at 12:30:01") == "at <n>:<n>:<n>"


def test_family_tells_different_messages_apart():
    joined = "Timed out after 6 seconds waiting for clients. 1/2 clients joined."
    assert report.message_family(joined) == ("timed out after <n> seconds waiting for clients. "
                                             "<n>/<n> clients joined.")
    assert report.message_family(joined) != report.message_family(
        "The server socket has failed to listen on any local network address.")
    assert report.message_family("") == "" and report.message_family(None) == ""
    assert len(report.message_family("x " * 500)) <= report.FAMILY_MAX


# -- environment ---------------------------------------------------------------------------------

def test_relevant_env_keeps_the_variables_that_change_start_up():
    env = {"TORCH_CPP_LOG_LEVEL": "INFO", "NCCL_DEBUG": "WARN", "GLOO_SOCKET_IFNAME": "eth0",
           "MASTER_PORT": "1", "USE_LIBUV": "0", "HOME": "/root", "PATH": "/bin"}
    assert report.relevant_env(env) == {k: env[k] for k in sorted(env)
                                        if k not in ("HOME", "PATH")}


def test_environment_fingerprint_names_torch_backends_and_kernel():
    env = report.environment()
    info = probe()
    assert env["torch"] == info["torch"] and env["torch_git"] == info.get("torch_git")
    assert env["kernel"] == platform.release()
    for key in ("gloo", "nccl", "mpi", "nccl_version", "libuv_store_default", "python", "env"):
        assert key in env
    json.dumps(env)


# -- reading -------------------------------------------------------------------------------------

@pytest.mark.parametrize("content,words", [
    (None, "no such file"),
    ("{not json", "not JSON"),
    ('{"hello": 1}', "not a harness session report"),
    ('{"format": 99, "cases": []}', "newer"),
    ('{"format": 1, "cases": [{"no": "id"}]}', "cases[0]"),
])
def test_read_says_what_is_wrong_with_a_file(tmp_path, content, words):
    p = tmp_path / "r.json"
    if content is not None:
        p.write_text(content)
    with pytest.raises(report.ReportError, match=words.replace("[", r"\[").replace("]", r"\]")):
        report.read(p)


def test_write_then_read_round_trips(tmp_path):
    rep = report.build([], env={"torch": "x"}, argv=["a"], duration=1.23456)
    p = report.write(rep, tmp_path / "sub" / "r.json")
    back = report.read(p)
    assert back["format"] == report.FORMAT == 2
    assert back["summary"] == {"total": 0, "passed": 0, "failed": 0, "skipped": 0, "error": 0,
                               "collect_errors": 0}
    assert back["duration"] == 1.235 and back["environment"] == {"torch": "x"}
    assert not list((tmp_path / "sub").glob(".*tmp"))


def test_committed_report_is_a_current_report():
    rep = report.read(COMMITTED)
    assert rep["format"] == report.FORMAT
    ran = [c for c in rep["cases"] if c["status"] != "skipped"]
    assert ran and all(c["ranks"] and c["timeline"]["ranks"] for c in ran)


# -- real sessions -------------------------------------------------------------------------------

def test_plain_session_reports_failures_and_skips(tmp_path):
    p = pytest_session(tmp_path, ["expect_hang.yaml"])
    assert p.returncode == 1, p.stdout + p.stderr
    assert "harness: wrote" in p.stdout
    rep = report.read(tmp_path / "report.json")
    assert rep["source"] == "pytest" and rep["summary"]["total"] == 2
    hang = _case(rep, "wrong_expectation[hang]")
    assert hang["id"] == "scenarios/expect_hang.yaml::wrong_expectation[hang]"
    assert hang["file"] == "scenarios/expect_hang.yaml" and hang["case"] == "hang"
    assert hang["status"] == "failed" and hang["reason"] == "ranks did not end as expected"
    (job,) = [m for m in hang["mismatches"] if m["label"] == "job"]
    assert (job["field"], job["expected"], job["observed"]) == ("outcome", "hang", "ok")
    assert isinstance(job["line"], int)   # the line of the expectation in the scenario file
    assert "did not end as expected" in hang["failure"]
    assert hang["expectation"] == {"job": ["hang"], "ranks": {}}
    nccl = _case(rep, "wrong_expectation[nccl]")
    if not probe().get("nccl"):
        assert nccl["status"] == "skipped" and "nccl" in nccl["reason"].lower()
        assert nccl["ranks"] == [] and nccl["timeline"] is None


def test_xdist_session_gathers_every_case_on_the_controller(xdist_session):
    p, rep, tmp = xdist_session
    assert p.returncode == 1, p.stdout + p.stderr
    assert rep["summary"]["total"] == 4 and rep["summary"]["collect_errors"] == 1
    assert {c["test_id"]: c["status"] for c in rep["cases"]} == {
        "healthy": "passed", "wrong_expectation[hang]": "failed",
        "wrong_expectation[nccl]": "skipped" if not probe().get("nccl") else "passed",
        "stopped_rank": "passed"}
    broken = rep["collect_errors"][0]
    assert broken["file"].endswith("broken.yaml") and "world_size" in broken["message"]
    assert (tmp / "report.html").stat().st_size > 5000


def test_passed_case_has_ranks_duration_and_evidence(xdist_session):
    _, rep, _ = xdist_session
    healthy = _case(rep, "healthy")
    assert healthy["status"] == "passed" and healthy["job"] == "ok"
    assert healthy["id"] == "scenarios/healthy.yaml::healthy" and healthy["case"] is None
    assert healthy["duration"] > 0.5          # the run happens in setup: its time counts
    assert healthy["torch_version"] == probe()["torch"]
    assert [r["outcome"] for r in healthy["ranks"]] == ["ok", "ok"]
    for r in healthy["ranks"]:
        assert r["phase"] == "exit" and 0 <= r["duration"] < 5 and r["host"] == "local"
        assert r["exception"] is None and r["family"] == "" and r["pid"] > 0
        # forked from a warm server (start: fork, the default) a rank imports nothing itself
        assert r["import_s"] > 0 or healthy["start"] == "fork"
    assert healthy["started"]["fork"] + healthy["started"]["fresh"] == 2
    assert healthy["evidence"] and Path(healthy["evidence"]).is_dir()


def test_hung_rank_carries_its_stacks_and_the_timeline_its_signal(xdist_session):
    _, rep, _ = xdist_session
    c = _case(rep, "stopped_rank")
    r0, r1 = c["ranks"]
    assert r0["outcome"] == "timeout" and r0["exception"] and r0["family"]
    assert "traceback" in r0 and r0["exception"] in r0["traceback"]
    assert r1["outcome"] == "hang" and r1["duration"] >= c["deadline"]
    assert "most recent call first" in r1["stacks"]
    tl = c["timeline"]
    assert tl["deadline"] == 3 and tl["timeout"] == 1
    t1 = next(r for r in tl["ranks"] if r["label"] == "1")
    assert t1["killed_at_deadline"] and t1["signals"][0]["signal"] == "STOP"
    phases = [e["phase"] for e in t1["events"] if e["ev"] == "phase"]
    assert phases[:4] == ["start", "import", "init", "workload step 1"]
    released = next(e["t"] for e in t1["events"] if e["ev"] == "released")
    assert 0 <= released < 0.5          # times are seconds from the start line
    assert c["notes"] and "stop_rank" in c["notes"][0]


# -- every field has a meaning (harness.reports.fields), every meaning a field ------------------

# where the report code fills a case or a rank record: (function, the variable it fills) ->
# the record kind; a key only some records get (a repeated case's, a launcher row's, a field
# left out when empty) is written here even where the real session below never makes it
WRITERS = {("case_record", "rec"): "case", ("item_record", "rec"): "case",
           ("repeated_record", "rec"): "case", ("pytest_runtest_logreport", "rec"): "case",
           ("rank_record", "rec"): "rank", ("repeated_record", "r"): "rank"}


def _keys_written(fn: ast.AST, var: str):
    """The keys ``fn`` writes into the dict ``var``: the keys of a dict literal assigned to
    it, ``var["key"] = ...``, ``var.update(key=...)`` and ``var.update({"key": ...})``, and
    ``var[name] = ...`` where ``name`` runs over a literal tuple of ``("key", value)`` pairs.
    Any other ``var[expr] = ...`` is returned as unreadable (the test then says so)."""
    loops = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.For) and isinstance(node.target, ast.Tuple) \
                and isinstance(node.iter, ast.Tuple) and isinstance(node.target.elts[0], ast.Name):
            loops[node.target.elts[0].id] = {
                e.elts[0].value for e in node.iter.elts
                if isinstance(e, ast.Tuple) and isinstance(e.elts[0], ast.Constant)}
    keys, unreadable = set(), []
    for node in ast.walk(fn):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name) and t.id == var and isinstance(node.value, ast.Dict):
                    keys |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
                elif isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) \
                        and t.value.id == var:
                    if isinstance(t.slice, ast.Constant):
                        keys.add(t.slice.value)
                    elif isinstance(t.slice, ast.Name) and t.slice.id in loops:
                        keys |= loops[t.slice.id]
                    else:
                        unreadable.append(f"line {node.lineno}: {ast.unparse(t)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "update" and isinstance(node.func.value, ast.Name) \
                and node.func.value.id == var:
            keys |= {k.arg for k in node.keywords if k.arg}
            for a in node.args:
                if isinstance(a, ast.Dict):
                    keys |= {k.value for k in a.keys if isinstance(k, ast.Constant)}
    return keys, unreadable


def written_keys():
    """The case and rank keys harness.reports.report writes (read from its source)."""
    tree = ast.parse(Path(report.__file__).read_text())
    funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    out = {"case": set(), "rank": set()}
    for (name, var), kind in WRITERS.items():
        assert name in funcs, f"harness.reports.report.{name} is gone: re-point WRITERS"
        keys, unreadable = _keys_written(funcs[name], var)
        assert keys and not unreadable, (f"{name}: no key read from {var} (re-point WRITERS)"
                                         if not keys else f"{name}: keys not literal: "
                                         f"{unreadable}")
        out[kind] |= keys
    return out


def seen_keys(rep):
    """Every key each kind of record has somewhere in a report."""
    seen = {k: set() for k in ("report", "case", "rank", "timeline", "timeline rank",
                               "timeline step")}
    seen["report"] |= set(rep)
    for c in rep["cases"]:
        seen["case"] |= set(c)
        for r in c["ranks"]:
            seen["rank"] |= set(r)
        tl = c.get("timeline") or {}
        seen["timeline"] |= set(tl)
        for r in tl.get("ranks", []):
            seen["timeline rank"] |= set(r)
        for s in tl.get("steps", []):
            seen["timeline step"] |= set(s)
    return seen


def test_every_report_field_has_a_meaning_and_every_meaning_a_field(xdist_session):
    """A real session's report (xdist_session: passed, failed, skipped and hung cases) against
    harness.reports.fields, the source of docs/reference/report.md: every key a record has
    is described; a session, timeline, timeline row and step record always has every field,
    so each described field must be in it; a case or rank field that only some records have
    (repeats, launcher rows, claims, fields left out when empty) must be written by the
    report code (read from its source), and everything that code writes is described."""
    _, rep, _ = xdist_session
    described = {"report": fields.REPORT_FIELDS, "case": fields.CASE_FIELDS,
                 "rank": fields.RANK_FIELDS, "timeline": fields.TIMELINE_FIELDS,
                 "timeline rank": fields.TIMELINE_RANK_FIELDS,
                 "timeline step": fields.TIMELINE_STEP_FIELDS}
    seen, written = seen_keys(rep), written_keys()
    assert seen["timeline step"], "no case of the session drew a fault step"
    for kind, meanings in described.items():
        wrote = written.get(kind, set())
        unexplained = sorted((seen[kind] | wrote) - set(meanings))
        assert not unexplained, f"{kind} fields without a meaning in harness.reports.fields: " \
            f"{unexplained}"
        stale = sorted(set(meanings) - seen[kind] - wrote)
        assert not stale, f"{kind} fields described in harness.reports.fields that no report " \
            f"has: {stale}"

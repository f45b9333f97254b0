"""``harness diff``'s comparison (pure): a real report against hand-edited copies of itself."""

import copy
import io
import json
from pathlib import Path

import pytest

from harness.reports import report
from harness.reports.diff import KINDS, diff_reports, duration_changed, render_table

COMMITTED = Path(__file__).parent / "data" / "report-gloo.json"


@pytest.fixture
def old():
    return report.read(COMMITTED)


@pytest.fixture
def new(old):
    return copy.deepcopy(old)


def case(rep, test_id):
    return next(c for c in rep["cases"] if c["test_id"] == test_id)


def rank(rep, test_id, label):
    return next(r for r in case(rep, test_id)["ranks"] if r["label"] == label)


def say(r, message, **kw):
    """The rank now says ``message`` (its family follows, as a real report's would)."""
    r.update(message=message, family=report.message_family(message), **kw)


def kinds(res):
    return [(c.case.split("::")[-1], c.rank, c.kind) for c in res.changes]


def test_a_report_has_no_change_against_itself(old, new):
    res = diff_reports(old, new)
    assert res.changes == [] and res.compared == len(old["cases"]) and res.environment == []


def test_outcome_change_is_one_change_with_the_new_exception_in_the_note(old, new):
    r = rank(new, "healthy", "1")
    r.update(outcome="timeout", exception="DistStoreError",
             message="Timed out after 6 seconds waiting for clients. 1/2 clients joined.")
    r["family"] = report.message_family(r["message"])
    res = diff_reports(old, new)
    assert kinds(res) == [("healthy", "1", "outcome")]
    ch = res.changes[0]
    assert (ch.old, ch.new) == ("ok", "timeout")
    assert "DistStoreError" in ch.note and "clients joined" in ch.note


def test_exception_class_change_with_the_same_outcome(old, new):
    rank(new, "busy_port_released", "1")["exception"] = "DistStoreError"
    res = diff_reports(old, new)
    assert kinds(res) == [("busy_port_released", "1", "exception")]
    assert (res.changes[0].old, res.changes[0].new) == ("DistNetworkError", "DistStoreError")


def test_other_port_and_timeout_in_the_message_is_the_same_family(old, new):
    r = rank(new, "busy_port_released", "1")
    r["message"] = ("The client socket has timed out after 9000ms while trying to connect to "
                    "(127.0.0.1, 12345).")
    r["family"] = report.message_family(r["message"])
    assert r["family"] == rank(old, "busy_port_released", "1")["family"]
    # the family is the same; the timeout torch names (9 s, not 2 s) is the rank's setting
    assert kinds(diff_reports(old, new)) == [("busy_port_released", "1", "settings")]
    r["message"] = r["message"].replace("9000ms", "2000ms")
    assert diff_reports(old, new).changes == []


def test_other_words_in_the_message_are_a_family_change(old, new):
    r = rank(new, "busy_port_released", "1")
    r["message"] = "wait timeout after 2000ms, keys: /default_pg/0//cpu//0/0"
    r["family"] = report.message_family(r["message"])
    res = diff_reports(old, new)
    assert kinds(res) == [("busy_port_released", "1", "family")]
    assert res.changes[0].new == "wait timeout after <n>ms, keys: <path>"
    assert "wait timeout after 2000ms" in res.changes[0].note


def test_phase_change(old, new):
    rank(new, "stopped_rank", "0")["phase"] = "init"
    assert kinds(diff_reports(old, new)) == [("stopped_rank", "0", "phase")]


@pytest.mark.parametrize("old_d,new_d,changed", [
    (0.05, 0.9, False),      # 18x slower, but under the 2 s absolute tolerance: noise
    (7.0, 9.5, False),       # +2.5 s, but within 50 %
    (7.0, 13.0, True),       # +6 s and +86 %
    (13.0, 7.0, True),       # faster counts too
    (None, 3.0, False),
])
def test_duration_needs_both_tolerances_exceeded(old_d, new_d, changed):
    assert duration_changed(old_d, new_d, 0.5, 2.0) is changed


def test_duration_change_in_a_report_and_the_tolerance_options(old, new):
    rank(new, "delayed_rank", "0")["duration"] = 9.0
    res = diff_reports(old, new)
    assert kinds(res) == [("delayed_rank", "0", "duration")]
    assert res.changes[0].note.startswith("+7.9")
    assert diff_reports(old, new, abs_tol=10.0).changes == []
    assert diff_reports(old, new, rel_tol=10.0).changes == []


def test_newly_skipped_and_unskipped(old, new):
    c = case(new, "healthy")
    c.update(status="skipped", reason="backend gloo: missing", ranks=[], job=None)
    res = diff_reports(old, new)
    assert kinds(res) == [("healthy", None, "skipped")]
    assert res.changes[0].note == "backend gloo: missing"
    back = diff_reports(new, old)
    assert kinds(back) == [("healthy", None, "unskipped")]


def test_added_and_removed_cases_and_ranks(old, new):
    gone = case(new, "healthy")
    new["cases"].remove(gone)
    extra = copy.deepcopy(gone)
    extra["id"] = "scenarios/other.yaml::other"
    new["cases"].append(extra)
    case(new, "delayed_rank")["ranks"].pop()
    res = diff_reports(old, new)
    assert set(kinds(res)) == {("healthy", None, "removed"), ("other", None, "added"),
                               ("delayed_rank", "1", "rank_removed")}


def test_status_and_job_changes(old, new):
    c = case(new, "stopped_rank")
    c.update(status="failed", job="timeout", reason="ranks did not end as expected")
    rank(new, "stopped_rank", "1").update(outcome="timeout")
    got = kinds(diff_reports(old, new))
    assert got == [("stopped_rank", None, "status"), ("stopped_rank", None, "job"),
                   ("stopped_rank", "1", "outcome")]


def test_ignore_drops_kinds_and_counts_them(old, new):
    rank(new, "delayed_rank", "0")["duration"] = 9.0
    rank(new, "stopped_rank", "0")["phase"] = "init"
    res = diff_reports(old, new, ignore=["duration"])
    assert kinds(res) == [("stopped_rank", "0", "phase")] and res.ignored == 1
    with pytest.raises(ValueError, match="unknown change kind"):
        diff_reports(old, new, ignore=["durations"])


def test_environment_differences_are_context_not_changes(old, new):
    new["environment"]["torch"] = "2.4.1+cpu"
    new["environment"]["env"] = {"USE_LIBUV": "0"}
    res = diff_reports(old, new)
    assert res.changes == []
    assert {"key": "torch", "old": old["environment"]["torch"], "new": "2.4.1+cpu"} in \
        res.environment
    assert {"key": "env USE_LIBUV", "old": None, "new": "0"} in res.environment


def test_json_form_and_table(old, new):
    rank(new, "healthy", "0")["outcome"] = "hang"
    res = diff_reports(old, new)
    d = json.loads(json.dumps(res.to_dict()))
    assert d["summary"]["changes"] == 1 and d["summary"]["by_kind"] == {"outcome": 1}
    assert d["changes"][0]["case"] == "scenarios/healthy.yaml::healthy"
    assert set(KINDS) >= {c["kind"] for c in d["changes"]}
    from rich.console import Console

    buf = io.StringIO()
    render_table(res, "a.json", "b.json", old["environment"], new["environment"],
                 console=Console(file=buf, width=200, no_color=True))
    out = buf.getvalue()
    assert "scenarios/healthy.yaml::healthy" in out and "outcome" in out and "hang" in out
    assert "1 behaviour change in 1 case" in out


# -- compared as the expectation allows ----------------------------------------------------------

def _declare(rep, test_id, label, **exp):
    c = case(rep, test_id)
    c["expectation"] = {"ranks": {label: exp}}


def test_a_move_inside_a_declared_outcome_race_is_variation_not_a_change(old, new):
    for rep in (old, new):
        _declare(rep, "busy_port_released", "1", outcome=["timeout", "error"])
    r = rank(new, "busy_port_released", "1")
    say(r, "Connection reset by peer", outcome="error", exception="RuntimeError")
    res = diff_reports(old, new)
    assert res.changes == []
    assert [(c.rank, c.kind) for c in res.within] == [("1", "outcome")]
    assert "within the declared race" in res.within[0].note


def test_leaving_a_declared_race_is_still_a_change(old, new):
    for rep in (old, new):
        _declare(rep, "busy_port_released", "1", outcome=["timeout", "error"])
    rank(new, "busy_port_released", "1").update(outcome="hang")
    assert kinds(diff_reports(old, new)) == [("busy_port_released", "1", "outcome")]


def test_a_declared_phase_race_takes_the_other_paths_message_and_duration_with_it(old, new):
    _declare(old, "busy_port_released", "1", phase=["init", "workload step 1"])
    r = rank(new, "busy_port_released", "1")
    say(r, "Timed out waiting 5000ms for recv", phase="workload step 1",
             duration=(r["duration"] or 0) + 20)
    res = diff_reports(old, new)
    assert res.changes == []
    assert sorted(c.kind for c in res.within) == ["duration", "family", "phase"]


def test_varies_declares_only_the_kinds_it_names(old, new):
    for rep in (old, new):
        _declare(rep, "busy_port_released", "1", varies=["message"])
    r = rank(new, "busy_port_released", "1")
    say(r, "something else entirely", exception="DistStoreError")
    res = diff_reports(old, new)
    assert kinds(res) == [("busy_port_released", "1", "exception")]
    assert [c.kind for c in res.within] == ["family"]


def test_a_store_client_rank_may_end_anywhere_in_its_retry_band(old, new):
    c = case(old, "busy_port_released")
    r_old, r_new = rank(old, "busy_port_released", "1"), rank(new, "busy_port_released", "1")
    assert r_old["outcome"] == "timeout" and c["timeout"] == 2
    assert r_old["family"].startswith("the client socket has timed out")
    # band 1-3 x T = 2..6 s, widened by the 2 s noise: 0..8 s
    r_old["duration"], r_new["duration"] = 3.0, 7.9     # +4.9 s, +163%: the loop's own draw
    assert diff_reports(old, new).changes == []
    r_new["duration"] = 8.6                              # beyond the band: compared, a change
    res = diff_reports(old, new)
    assert kinds(res) == [("busy_port_released", "1", "duration")]
    assert "store client band 0..8 s" in res.changes[0].note


def test_another_timeout_outcome_gets_one_and_a_half_timeouts(old, new):
    r_old, r_new = rank(old, "stopped_rank", "0"), rank(new, "stopped_rank", "0")
    assert r_old["outcome"] == "timeout" and case(old, "stopped_rank")["timeout"] == 1.0
    assert "client socket" not in r_old["family"]        # a collective's wait, not a retry
    r_old["duration"], r_new["duration"] = 1.5, 4.9     # +3.4 s: inside 2 s + 1.5 x 1 s
    assert diff_reports(old, new).changes == []
    r_new["duration"] = 5.1                              # +3.6 s: beyond it
    res = diff_reports(old, new)
    assert kinds(res) == [("stopped_rank", "0", "duration")]
    assert "2 s noise + 1.5 x timeout 1 s" in res.changes[0].note


def _imports(rep, test_id, label, seconds):
    """The row starts its interpreter and imports torch for ``seconds`` after the start line
    (as a rank that torchrun or launch starts fresh does)."""
    row = next(r for r in case(rep, test_id)["timeline"]["ranks"] if r["label"] == label)
    row["events"] = [{"ev": "phase", "t": 0.4, "phase": "start"},
                     {"ev": "phase", "t": 0.41, "phase": "import"},
                     {"ev": "phase", "t": 0.4 + seconds, "phase": "init"}] + \
        [e for e in row["events"] if e.get("ev") != "phase"]


def test_a_move_that_is_the_ranks_own_start_up_is_not_a_change(old, new):
    # a fresh rank under a loaded machine: 5.8 s of import in one run, 1.3 s in the other
    # (legacy_launch[worker_under_launch] in the fork fidelity runs: 7.27 s against 1.72 s)
    _imports(old, "healthy", "0", 5.8)
    _imports(new, "healthy", "0", 1.3)
    rank(old, "healthy", "0")["duration"] = 7.27
    rank(new, "healthy", "0")["duration"] = 1.72
    rank(old, "healthy", "1")["duration"] = 7.2      # the other rank waited for it in init
    rank(new, "healthy", "1")["duration"] = 1.7
    res = diff_reports(old, new)
    assert res.changes == []
    # the same move with the same start-up both times is a change, and the note says why
    _imports(new, "healthy", "0", 5.8)
    res = diff_reports(old, new)
    assert kinds(res) == [("healthy", "0", "duration"), ("healthy", "1", "duration")]
    assert res.changes[0].note == "-5.55 s; allowance 2 s = 2 s noise"


def test_a_rank_that_ends_with_its_peer_carries_the_peers_move(old, new):
    # rank 1 is a store client (its own end: inside its band); rank 0 reads "reset by peer"
    for rep in (old, new):
        say(rank(rep, "busy_port_released", "0"), "Connection reset by peer")
    rank(old, "busy_port_released", "1")["duration"] = 3.0
    rank(new, "busy_port_released", "1")["duration"] = 7.5
    rank(old, "busy_port_released", "0")["duration"] = 3.0
    rank(new, "busy_port_released", "0")["duration"] = 7.4
    assert diff_reports(old, new).changes == []
    for rep in (old, new):   # the same move of a rank whose end is its own is a change
        say(rank(rep, "busy_port_released", "0"), "something of its own")
    assert kinds(diff_reports(old, new)) == [("busy_port_released", "0", "duration")]


def test_the_expectations_within_window_does_not_widen_the_tolerance(old, new):
    for rep in (old, new):
        _declare(rep, "healthy", "0", outcome=["ok"], within=[0, 60])
    rank(new, "healthy", "0")["duration"] = 30.0
    assert kinds(diff_reports(old, new)) == [("healthy", "0", "duration")]


def test_a_changed_timeout_is_a_change_and_a_move_beyond_the_band_still_counts(old, new):
    case(new, "busy_port_released")["timeout"] = 4.0
    res = diff_reports(old, new)
    assert kinds(res) == [("busy_port_released", None, "settings")]
    assert (res.changes[0].old, res.changes[0].new) == ("timeout: 2.0", "timeout: 4.0")
    # the doubled timeout moved the retrying rank beyond the old band (0..8 s): seen without
    # the setting too
    rank(old, "busy_port_released", "1")["duration"] = 2.7
    rank(new, "busy_port_released", "1")["duration"] = 9.3
    res = diff_reports(old, new, ignore=["settings"])
    assert kinds(res) == [("busy_port_released", "1", "duration")]


def test_the_start_method_is_not_a_setting(old, new):
    for c in new["cases"]:
        c["start"] = "fork"
    assert diff_reports(old, new).changes == []


def test_a_restart_attempts_rank_is_compared_by_its_wildcard_key(old, new):
    # torchrun_restarts[one_restart]: "*@1": [ok, crash, error, timeout]
    for rep in (old, new):
        c = case(rep, "healthy")
        c["expectation"] = {"ranks": {"*@1": {"outcome": ["ok", "crash", "error", "timeout"]}}}
        for r in c["ranks"]:
            r["label"] = f"{r['label']}@1"
    say(rank(new, "healthy", "1@1"), "Gloo connectFullMesh failed", outcome="error",
        exception="RuntimeError")
    res = diff_reports(old, new)
    assert res.changes == [] and [(c.rank, c.kind) for c in res.within] == [("1@1", "outcome")]
    rank(new, "healthy", "1@1").update(outcome="hang")
    assert kinds(diff_reports(old, new)) == [("healthy", "1@1", "outcome")]


def test_durations_of_a_case_whose_fault_draws_at_random_are_not_compared(old, new):
    rank(new, "healthy", "1")["duration"] = 9.0
    assert kinds(diff_reports(old, new)) == [("healthy", "1", "duration")]
    case(new, "healthy")["random"] = True
    res = diff_reports(old, new)
    assert res.changes == [] and [c.kind for c in res.within] == ["duration"]


# -- real reports: two unchanged runs, the legacy store, a changed timeout -----------------------
# tests/data/diff: the busy_port cases of real `harness run --start fork -n 2` session reports
# (trimmed by the quiet-diff work): two runs of the unchanged catalog, a run with USE_LIBUV=0,
# and a run of the same file with `timeout: 10` instead of 5.

DIFF_DATA = Path(__file__).parent / "data" / "diff"


def real(name):
    return report.read(DIFF_DATA / f"busy_port-{name}.json")


def test_two_real_runs_of_the_unchanged_file_are_quiet():
    a, b = real("default"), real("default-again")
    res = diff_reports(a, b)
    assert res.compared == 4 and res.changes == []
    # they did move: a store client's draw (bound: 8.9 s against 7.2 s), a released holder
    assert rank(a, "busy_port[bound]", "1")["duration"] != rank(b, "busy_port[bound]", "1")[
        "duration"]


def test_the_legacy_store_with_USE_LIBUV_0_is_still_a_change():
    res = diff_reports(real("default"), real("USE_LIBUV_0"))
    # rank 0's EADDRINUSE is worded by the store server that failed to listen
    assert sorted(kinds(res)) == sorted((c, "0", "family") for c in (
        "busy_port[bound]", "busy_port[listening]", "busy_port[accepting]",
        "busy_port[accepting_released]"))
    assert all("failed to bind" in c.new for c in res.changes)
    assert {"key": "env USE_LIBUV", "old": None, "new": "0"} in res.environment


def test_a_changed_timeout_is_still_a_change_in_real_runs():
    old, new = real("default"), real("timeout_10")
    res = diff_reports(old, new)
    assert {(c.case.split("::")[-1], c.kind) for c in res.changes} >= {
        (t, "settings") for t in ("busy_port[bound]", "busy_port[listening]",
                                   "busy_port[accepting]", "busy_port[accepting_released]")}
    # the doubled timeout took the retrying client beyond its band at T = 5 (3..17 s): seen
    # without the setting too
    res = diff_reports(old, new, ignore=["settings"])
    assert ("busy_port[bound]", "1", "duration") in kinds(res)
    ch = next(c for c in res.changes if c.kind == "duration")
    # torch names 5000ms on one side and 10000ms on the other: no common band, no allowance
    # for the timeout (the band at T = 5, 3..17 s, held the old run only)
    assert ch.old < 10 < 17 < ch.new and "band" not in ch.note


def test_a_banner_line_is_not_the_family():
    # torchrun's ChildFailedError: the banner is as wide as the widest line (it holds a pid)
    def msg(pid):
        body = f"  traceback : Signal 15 (SIGTERM) received by PID {pid}"
        return f"\n{'=' * len(body)}\nharness.worker FAILED\n{'-' * len(body)}\n{body}\n"
    assert report.message_family(msg(30131)) == report.message_family(msg(884)) == \
        "harness.worker failed"


def test_families_are_derived_again_by_todays_rules(old, new):
    # a report written before the banner rule: its stored family is the banner
    banner = "\n" + "=" * 55 + "\nharness.worker FAILED\n"
    say(rank(old, "healthy", "0"), banner, outcome="error", exception="ChildFailedError")
    say(rank(new, "healthy", "0"), banner.replace("=" * 55, "=" * 53), outcome="error",
        exception="ChildFailedError")
    rank(old, "healthy", "0")["family"] = "=" * 55
    assert diff_reports(old, new).changes == []


def test_the_load_a_rank_waited_for_is_allowed_but_a_changed_timeout_is_not():
    """cpu_wait: seconds the case's ranks waited for a CPU after the start line. An ok rank
    0.4 s -> 3.0 s with 2.8 s of CPU wait in the slower run is load; 2 s -> 9 s (a retry's
    backoff, blocked time) whose slower run waited 0.3 s is a change."""
    def rep(d, wait, outcome="ok"):
        return {"environment": {}, "cases": [{
            "id": "s.yaml::s[c]", "name": "s[c]", "status": "passed", "job": outcome,
            "timeout": 5, "expectation": {"job": [outcome], "ranks": {}},
            "ranks": [{"label": "0", "outcome": outcome, "phase": "exit", "duration": d,
                       "exception": None, "message": "", "family": "", "cpu_wait": wait}]}]}
    quiet = diff_reports(rep(0.4, 0.1), rep(3.0, 2.8))
    assert quiet.changes == [], quiet.changes
    loud = diff_reports(rep(0.4, 0.1), rep(3.0, 0.2))
    assert [c.kind for c in loud.changes] == ["duration"]
    assert "waited for a CPU" in loud.changes[0].note
    blocked = diff_reports(rep(2.0, 0.1), rep(9.0, 0.3))
    assert [c.kind for c in blocked.changes] == ["duration"]


def test_runqueue_wait_reads_the_kernels_schedstat():
    import os
    import subprocess
    import sys

    from harness.machine.procs import runqueue_wait

    mine = runqueue_wait()
    assert mine is not None and mine >= 0
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert runqueue_wait(p.pid) is not None
    finally:
        p.kill()
        p.wait()
    assert runqueue_wait(p.pid) is None
    assert os.path.exists("/proc/self/task")


def test_a_row_of_one_path_of_a_declared_race_is_not_a_change():
    """scale_up_own_store: the restarted workers 0@1 and 1 exist only when node1 joins in
    time; '*' declares their race, so their coming and going is variation. A row named by
    its own key that goes missing is still a change."""
    def rep(rows, exp):
        return {"environment": {}, "cases": [{
            "id": "s.yaml::s[c]", "name": "s[c]", "status": "passed", "job": "error",
            "timeout": 10, "expectation": {"job": ["error", "ok"], "ranks": exp},
            "ranks": [{"label": lb, "outcome": oc, "phase": "init", "duration": 9.0,
                       "exception": None, "message": "", "family": ""} for lb, oc in rows]}]}
    race = {"agent:node0": {"outcome": ["error", "ok"]},
            "*": {"outcome": ["timeout", "crash"]}}
    one = rep([("agent:node0", "ok")], race)
    other = rep([("agent:node0", "error"), ("0@1", "timeout"), ("1", "crash")], race)
    res = diff_reports(one, other)
    assert [c.kind for c in res.changes] == [], res.changes
    assert {c.kind for c in res.within} >= {"rank_added"}
    named = {"agent:node0": {"outcome": ["error", "ok"]}, "1": {"outcome": ["crash", "ok"]}}
    res = diff_reports(rep([("agent:node0", "ok"), ("1", "ok")], named),
                       rep([("agent:node0", "ok")], named))
    assert [c.kind for c in res.changes] == ["rank_removed"]


def test_a_wildcard_row_on_one_path_of_a_named_ranks_race_is_not_a_change():
    """killed_in_destroy_own_store: rank 1 is killed at destroy and the agent restarts the
    workers ("*@1" rows), or rank 1 had already ended ok and no restart comes ('1' declares
    [crash, ok]). The restart's rows come and go with rank 1's race; with rank 1 the same on
    both sides their going is a change."""
    def rep(rows, agent=9.5):
        return {"environment": {}, "cases": [{
            "id": "s.yaml::s[c]", "name": "s[c]", "status": "passed", "job": "ok",
            "timeout": 10, "expectation": {"job": "ok", "ranks": {
                "agent:local": {"outcome": "ok"},
                "1": {"outcome": ["crash", "ok"], "phase": ["destroy", "exit"]},
                "0": {"outcome": "ok"}, "*@1": {"outcome": "ok", "phase": "exit"}}},
            "ranks": [{"label": lb, "outcome": oc, "phase": ph,
                       "duration": agent if lb.startswith("agent") else 3.3,
                       "exception": None, "message": "", "family": ""}
                      for lb, oc, ph in [("agent:local", "ok", "exit"), *rows]]}]}
    restarted = rep([("0", "ok", "exit"), ("1", "crash", "destroy"), ("1@1", "ok", "exit"),
                     ("0@1", "ok", "exit")])
    # no restart: the agent ends 5 s sooner (9.5 -> 4.3 s in two catalog runs)
    too_late = rep([("0", "ok", "exit"), ("1", "ok", "exit")], agent=4.3)
    for a, b in ((restarted, too_late), (too_late, restarted)):
        res = diff_reports(a, b)
        assert res.changes == [], res.changes
        assert sorted(c.rank for c in res.within if c.kind.startswith("rank_")) \
            == ["0@1", "1@1"]
        assert [c.rank for c in res.within if c.kind == "duration"] == ["agent:local"]
    # rank 1 crashed both times, yet no restart: a change
    gone = rep([("0", "ok", "exit"), ("1", "crash", "destroy")])
    res = diff_reports(restarted, gone)
    assert sorted((c.rank, c.kind) for c in res.changes) \
        == [("0@1", "rank_removed"), ("1@1", "rank_removed")]
    # the same path both times: the agent's 5 s is a change
    res = diff_reports(restarted, rep([("0", "ok", "exit"), ("1", "crash", "destroy"),
                                       ("1@1", "ok", "exit"), ("0@1", "ok", "exit")], agent=4.3))
    assert [(c.rank, c.kind) for c in res.changes] == [("agent:local", "duration")]


def _faulted(fired: float, ended: float) -> dict:
    """A report of one case whose fault (a step fired by the ranks' progress) fired at
    ``fired`` s and whose rank 1 ended (crash, stopped for it) at ``ended`` s."""
    c = {"id": "s.yaml::s[k]", "test_id": "s[k]", "status": "passed", "job": "crash",
         "timeout": 5, "deadline": 60,
         "ranks": [{"label": "1", "outcome": "crash", "phase": "workload step 3",
                    "duration": ended, "exception": None, "message": "", "family": ""}],
         "timeline": {"ranks": [{"label": "1", "released_at": 0.0, "ended_at": ended,
                                 "events": []}]},
         "effects": [{"n": 1, "kind": "etcd_server", "targets": [{"steps": [
             {"step": "etcd_server#2", "done_at": fired}]}]}]}
    return {"format": 2, "environment": {}, "cases": [c]}


def test_a_row_that_ends_for_a_fault_is_compared_from_when_the_fault_fired():
    """A fault that fires when the ranks get somewhere fires later on a slower run: the rows
    that end for it end that much later, which is no change of the case; ending later after
    the fault still is."""
    same = diff_reports(_faulted(3.0, 3.5), _faulted(10.3, 10.9))
    assert same.changes == []
    slower = diff_reports(_faulted(3.0, 3.5), _faulted(3.0, 10.9))
    assert [(c.rank, c.kind) for c in slower.changes] == [("1", "duration")]
    moved = diff_reports(_faulted(3.0, 3.5), _faulted(4.0, 10.9))
    assert [(c.rank, c.kind) for c in moved.changes] == [("1", "duration")]
    assert "1.00 s the fault's firing moved" in moved.changes[0].note


def _agent_case(agent_end: float, notes) -> dict:
    c = {"id": "p.yaml::p[k]", "test_id": "p[k]", "status": "passed", "job": "error",
         "timeout": 5, "deadline": 60, "notes": notes,
         "ranks": [{"label": "agent:local", "outcome": "error", "phase": "workers",
                    "duration": agent_end, "exception": "ChildFailedError",
                    "message": "", "family": ""}]}
    return {"format": 2, "environment": {}, "cases": [c]}


def test_an_agent_ends_on_its_monitor_tick_and_the_diff_allows_one_tick():
    """torchrun --monitor-interval 5: the agent sees its workers' end on its next tick, so its
    end falls on a 5 s grid (5.1 or 10.4 s for the same workers): one tick is no change; with
    torch's default interval the same move is one."""
    flag = ["torchrun: agent:local: torchrun --nnodes 1 --monitor-interval 5 train.py"]
    assert diff_reports(_agent_case(5.1, flag), _agent_case(10.4, flag)).changes == []
    res = diff_reports(_agent_case(5.1, ["torchrun: agent:local: torchrun train.py"]),
                       _agent_case(10.4, ["torchrun: agent:local: torchrun train.py"]))
    assert [(c.rank, c.kind) for c in res.changes] == [("agent:local", "duration")]


def test_a_program_s_store_client_is_banded_by_the_timeout_torch_names(old, new):
    # torchrun_init_method[own_port] on one image, twice (detection.py's control, 2026-11-29):
    # the script passes its own 10 s to the store client; the case's `timeout:` (30 here) does
    # not know it. At T = 30 the band (28..92 s) held neither run and the move was a "change".
    c_old, c_new = case(old, "busy_port_released"), case(new, "busy_port_released")
    c_old["timeout"] = c_new["timeout"] = 30.0
    msg = ("The client socket has timed out after 10000ms while trying to connect to "
           "(localhost, 29431).")
    r_old, r_new = rank(old, "busy_port_released", "1"), rank(new, "busy_port_released", "1")
    say(r_old, msg, duration=23.315)
    say(r_new, msg.replace("29431", "24118"), duration=14.708)
    assert diff_reports(old, new).changes == []            # both inside 1-3 x 10 s
    r_new["duration"] = 36.0                                # beyond 30 s + 2 s noise
    assert kinds(diff_reports(old, new)) == [("busy_port_released", "1", "duration")]


def test_torch_naming_another_timeout_is_a_settings_change_of_the_rank(old, new):
    # a start-up patch doubled init_process_group's timeout (benchmarks/detection.py
    # timeout_doubled): the case's `timeout:` is the same on both sides, torch's message is not
    r_old, r_new = rank(old, "busy_port_released", "1"), rank(new, "busy_port_released", "1")
    msg = "The client socket has timed out after {}ms while trying to connect to (m, 1)."
    say(r_old, msg.format(2000), duration=4.0)
    say(r_new, msg.format(4000), duration=5.5)               # within 2 s noise: no duration
    res = diff_reports(old, new)
    assert kinds(res) == [("busy_port_released", "1", "settings")]
    assert (res.changes[0].old, res.changes[0].new) == ("torch's timeout 2 s",
                                                          "torch's timeout 4 s")
    r_new["duration"] = 12.0         # no common band, no timeout's allowance: a duration too
    assert sorted(k for _, _, k in kinds(diff_reports(old, new))) == ["duration", "settings"]

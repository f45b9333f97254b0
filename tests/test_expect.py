"""Expectations (harness.expect): verdicts vs an Expect block -> mismatches and a table. Pure."""

from __future__ import annotations

import time

import pytest

from harness.judge.classify import Verdict, classify_run
from harness.scenario.expect import (
    PATTERN_TIMEOUT,
    Mismatch,
    check,
    check_rank,
    failure_table,
    innermost_frames,
)
from harness.scenario.schema import Expect, RankExpect

STORE_MSG = "Timed out after 6 seconds waiting for clients. 1/2 clients joined."
CLIENT_MSG = ("The client socket has timed out after 5000ms while trying to connect to "
              "(127.0.0.1, 29500).")


def expect(**fields):
    return Expect.model_validate(fields)


def rank(**fields):
    return RankExpect.model_validate(fields)


@pytest.fixture
def store_timeout(obs):
    """Rank 0 as torch really ends when rank 1 never comes: DistStoreError after ~7 s."""
    (v,) = classify_run(obs.run(obs.rank("0", reached="init", end=7.0,
                                         exc=obs.exc("DistStoreError", STORE_MSG))))
    return v


@pytest.fixture
def ok_rank(obs):
    (v,) = classify_run(obs.run(obs.rank("1", end=1.1)))
    return v


# -- outcome ------------------------------------------------------------------------------------

def test_outcome_in_the_allowed_list_matches(store_timeout):
    assert check_rank(rank(outcome=["error", "timeout"]), store_timeout) == []


def test_outcome_not_allowed_is_a_mismatch(store_timeout):
    assert check_rank(rank(outcome="ok"), store_timeout) == \
        [Mismatch("0", "outcome", "ok", "timeout")]


def test_outcome_list_is_said_with_or(ok_rank):
    (m,) = check_rank(rank(outcome=["timeout", "hang"]), ok_rank)
    assert m.expected == "timeout or hang"


# -- exception, through the MRO ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["DistStoreError", "DistError", "RuntimeError", "Exception",
                                  "torch.distributed.DistStoreError", "builtins.RuntimeError"])
def test_exception_matches_any_class_in_the_mro(store_timeout, name):
    assert check_rank(rank(exception=name), store_timeout) == []


@pytest.mark.parametrize("name", ["DistNetworkError", "ValueError", "TimeoutError",
                                  "torch.DistStoreError", "distributed.DistStoreError"])
def test_exception_not_in_the_mro_is_a_mismatch(store_timeout, name):
    assert check_rank(rank(exception=name), store_timeout) == \
        [Mismatch("0", "exception", name, "DistStoreError")]


def test_expected_exception_of_a_rank_that_raised_none(ok_rank):
    assert check_rank(rank(exception="RuntimeError"), ok_rank) == \
        [Mismatch("1", "exception", "RuntimeError", "(none)")]


# -- message --------------------------------------------------------------------------------------

@pytest.mark.parametrize("pattern", [r"1/2 clients joined", r"timed out after \d+ seconds",
                                     r"CLIENTS JOINED", r"^Timed out", r"joined\.$"])
def test_message_regex_is_searched_case_insensitively(store_timeout, pattern):
    assert check_rank(rank(message=pattern), store_timeout) == []


def test_message_regex_not_found_is_a_mismatch(store_timeout):
    assert check_rank(rank(message=r"2/3 clients"), store_timeout) == \
        [Mismatch("0", "message", "/2/3 clients/", STORE_MSG)]


def test_message_regex_spans_lines(obs):
    (v,) = classify_run(obs.run(obs.rank(reached="init", exc=obs.exc(
        "RuntimeError", "Gloo connectFullMesh failed with\n[pair.cc:446] Connect timeout"))))
    assert check_rank(rank(message="failed with.*Connect timeout"), v) == []


def test_message_expected_of_a_rank_without_one(ok_rank):
    assert check_rank(rank(message="joined"), ok_rank) == \
        [Mismatch("1", "message", "/joined/", "(none)")]


def test_the_backtracking_pattern_of_issue_7_no_longer_spins(store_timeout):
    """`(\\S+\\s*)*QQQ` spun at 100% CPU under `re` until pytest-timeout; `regex` answers."""
    start = time.monotonic()
    (m,) = check_rank(rank(message=r"(\S+\s*)*QQQ"), store_timeout)
    assert (m.field, m.observed) == ("message", STORE_MSG)
    assert time.monotonic() - start < 30      # a bound with slack, not a benchmark


def test_a_pattern_that_backtracks_without_end_is_a_mismatch_saying_so(obs):
    (v,) = classify_run(obs.run(obs.rank(reached="init", exc=obs.exc(
        "RuntimeError", "a" * 80 + "b"))))
    start = time.monotonic()
    (m,) = check_rank(rank(message=r"(a|aa)+$"), v)
    assert time.monotonic() - start < 30
    assert m.field == "message" and m.expected == "/(a|aa)+$/"
    assert m.observed.startswith(f"(pattern gave up after {PATTERN_TIMEOUT:g} s of "
                                 "backtracking on the message: simplify it) aaaa")


def test_validation_and_matching_use_one_engine(obs):
    r"""`\p{L}` is not `re` syntax; `regex` has it: valid in the file means it works in a run."""
    (v,) = classify_run(obs.run(obs.rank(reached="init", exc=obs.exc(
        "RuntimeError", "Connexion refusée"))))
    assert check_rank(rank(message=r"refus\p{L}e"), v) == []


# -- within ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("window", [(5, 9), (7, 7), (0, 7), (7, 100)])
def test_within_holds_inclusive(store_timeout, window):
    assert check_rank(rank(within=list(window)), store_timeout) == []


@pytest.mark.parametrize("window,said", [((0, 6.9), "0..6.9 s"), ((7.1, 20), "7.1..20 s")])
def test_within_outside_the_window(store_timeout, window, said):
    assert check_rank(rank(within=list(window)), store_timeout) == \
        [Mismatch("0", "within", said, "7.0 s")]


def test_within_of_a_rank_without_duration():
    v = Verdict(label="3", outcome="crash", phase="start", duration=None)
    assert check_rank(rank(within=[0, 5]), v) == [Mismatch("3", "within", "0..5 s", "unknown")]


# -- phase ---------------------------------------------------------------------------------------

def test_phase_matches(store_timeout):
    assert check_rank(rank(phase="init"), store_timeout) == []


def test_phase_differs(store_timeout):
    assert check_rank(rank(phase="workload step 1"), store_timeout) == \
        [Mismatch("0", "phase", "workload step 1", "init")]


def test_every_failed_field_is_one_mismatch(store_timeout):
    ms = check_rank(rank(outcome="ok", exception="ValueError", message="nope", within=[0, 1],
                         phase="exit"), store_timeout)
    assert [m.field for m in ms] == ["outcome", "exception", "message", "within", "phase"]


def test_rank_expectation_without_fields_checks_nothing(store_timeout):
    assert check_rank(rank(), store_timeout) == []


# -- the whole block: job, '*', missing ranks -----------------------------------------------------

def _verdicts(*outcomes):
    return [Verdict(label=str(i), outcome=o, phase="init", duration=1.0)
            for i, o in enumerate(outcomes)]


def test_job_outcome_mismatch():
    assert check(expect(job="ok"), _verdicts("ok", "timeout")) == \
        [Mismatch("job", "outcome", "ok", "timeout")]


def test_job_outcome_of_the_most_severe_rank_matches():
    assert check(expect(job=["hang"]), _verdicts("timeout", "hang", "ok")) == []


def test_star_applies_to_every_rank_not_listed():
    assert check(expect(ranks={"*": "ok"}), _verdicts("ok", "error", "ok")) == \
        [Mismatch("1", "outcome", "ok", "error")]


def test_listed_rank_replaces_star():
    exp = expect(ranks={"*": {"outcome": "ok", "phase": "exit"}, "1": "timeout"})
    vs = [Verdict("0", "ok", "exit", 1.0), Verdict("1", "timeout", "init", 6.0)]
    assert check(exp, vs) == []


def test_rank_expected_but_not_run():
    assert check(expect(ranks={"0": "ok", "1": "ok"}), _verdicts("ok")) == \
        [Mismatch("1", "rank", "a rank with this label", "no such rank ran")]


def test_rank_run_but_not_expected_is_not_checked():
    assert check(expect(ranks={"0": "ok"}), _verdicts("ok", "crash")) == []


def test_empty_expectation_accepts_anything():
    assert check(Expect(), _verdicts("hang", "crash")) == []


def test_second_job_rank_by_label():
    vs = [Verdict("0", "ok", "exit", 1.0), Verdict("job2:0", "error", "init", 0.1)]
    assert check(expect(ranks={"job2:0": "timeout"}), vs) == \
        [Mismatch("job2:0", "outcome", "timeout", "error")]


# -- innermost frames of a hang ------------------------------------------------------------------

def test_innermost_frames_of_the_main_thread(obs):
    frames = innermost_frames(obs.hung_stacks, n=2).splitlines()
    assert frames == [
        'File "/site-packages/torch/distributed/rendezvous.py", line 189 in _create_c10d_store',
        'File "/site-packages/torch/distributed/rendezvous.py", line 268 in '
        '_env_rendezvous_handler']


def test_innermost_frames_skip_other_threads_when_main_is_not_current(obs):
    stacks = obs.hung_stacks.replace("Current thread 0x00007f3a2f1b5740",
                                     "Thread 0x00007f3a2f1b5740")
    stacks = stacks.replace("Thread 0x00007f3a1c7fe640", "Current thread 0x00007f3a1c7fe640")
    assert "threading.py" not in innermost_frames(stacks)
    assert "_create_c10d_store" in innermost_frames(stacks)


def test_innermost_frames_of_nothing():
    assert innermost_frames("") == ""


# -- the failure table -----------------------------------------------------------------------------

@pytest.fixture
def mismatched(obs):
    run = obs.run(
        obs.rank("0", reached="init", end=7.0, exc=obs.exc("DistStoreError", STORE_MSG)),
        obs.rank("1", reached="init", result=False, killed_at_deadline=True, end=30.0,
                 stacks=obs.hung_stacks))
    vs = classify_run(run)
    exp = expect(job="timeout", ranks={"0": {"outcome": "ok", "exception": "DistNetworkError"},
                                       "1": {"outcome": "timeout", "message": "clients joined",
                                             "within": [10, 20]}})
    return vs, exp, check(exp, vs)


def test_failure_table_has_a_row_per_rank_with_expected_and_observed(mismatched):
    vs, exp, ms = mismatched
    table = failure_table(vs, exp, ms, width=400)
    rows = [ln for ln in table.splitlines() if ln.startswith("│ ✗ ")]
    assert len(rows) == 2
    assert "✗ 0" in rows[0] and "ok" in rows[0] and "timeout" in rows[0]
    assert "✗ 1" in rows[1] and "hang" in rows[1]


def test_failure_table_header(mismatched):
    table = failure_table(*mismatched, width=400)
    for col in ("rank", "expected", "observed", "duration", "phase", "host",
                "exception: message"):
        assert col in table


def test_failure_table_shows_the_exception_and_its_message(mismatched):
    table = failure_table(*mismatched, width=400)
    assert f"DistStoreError: {STORE_MSG}" in table


def test_failure_table_shows_innermost_frames_of_a_hang(mismatched):
    table = failure_table(*mismatched, width=400)
    assert "innermost frames:" in table
    assert "_create_c10d_store" in table and "threading.py" not in table


def test_failure_table_lists_each_mismatch_in_words(mismatched):
    text = failure_table(*mismatched, width=400)
    tail = text.split("\n")
    assert "  job: expected timeout, observed hang" in tail
    assert "  0: outcome: expected ok, observed timeout" in tail
    assert "  0: exception: expected DistNetworkError, observed DistStoreError" in tail
    assert "  1: within: expected 10..20 s, observed 30.0 s" in tail


def test_failure_table_at_default_width_still_names_every_rank(mismatched):
    table = failure_table(*mismatched)
    assert "✗ 0" in table and "✗ 1" in table


def test_failure_table_without_mismatch_on_a_rank_has_no_cross():
    vs = [Verdict("0", "ok", "exit", 1.0), Verdict("1", "error", "init", 0.2,
                                                   exception="ValueError", message="bad")]
    exp = expect(ranks={"*": "ok"})
    table = failure_table(vs, exp, check(exp, vs), width=400)
    assert "✗ 1" in table and "✗ 0" not in table


def test_failure_table_says_the_reason_of_a_crash():
    v = Verdict("1", "crash", "workload step 1", 0.4, reason="killed by SIGKILL (sent by the "
                "fault)")
    table = failure_table([v], expect(ranks={"1": "ok"}),
                          [Mismatch("1", "outcome", "ok", "crash")], width=400)
    assert "killed by SIGKILL (sent by the fault)" in table


# -- tally --------------------------------------------------------------------------------------
def _row(label: str, outcome: str) -> Verdict:
    return Verdict(label=label, outcome=outcome, phase="exit", duration=5.0)


AGENTS = [("agent:node0", "ok"), ("agent:node0#2", "error"), ("agent:node1", "error"),
          ("agent:node1#2", "ok"), ("0", "ok"), ("1", "ok")]


def test_a_tally_counts_the_rows_its_key_covers_a_second_agent_of_a_host_too():
    exp = expect(tally={"agent:*": {"ok": 2, "error": 2}},
                 ranks={"agent:*": {"outcome": ["ok", "error"]}})
    assert check(exp, [_row(label, o) for label, o in AGENTS]) == []


def test_a_tally_that_does_not_hold_is_one_mismatch_saying_both_counts():
    exp = expect(tally={"agent:*": {"ok": 2, "error": 2}})
    rows = [_row(label, "ok" if label == "agent:node1" else o) for label, o in AGENTS]
    (m,) = check(exp, rows)
    assert (m.label, m.field, m.expected, m.observed) == ("agent:*", "tally", "error 2, ok 2",
                                                      "error 1, ok 3")


def test_a_tally_of_ranks_does_not_count_the_agents():
    exp = expect(tally={"*": {"ok": 2}})
    assert check(exp, [_row(label, o) for label, o in AGENTS]) == []

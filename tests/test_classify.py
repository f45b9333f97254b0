"""Classification (harness.classify): one rank's observation -> one Verdict. Pure.

Observations are typed, built from dicts shaped like RunObservation.to_dict() (tests/conftest.py
builds them; the shape is checked against a real run in tests/test_launch.py). Exception classes
and messages are those torch 2.2 .. 2.13 really raise, as docs/FIELD_NOTES quote them.
"""

from __future__ import annotations

import pytest

from harness.core.outcomes import OUTCOMES
from harness.judge.classify import (
    Verdict,
    classify,
    classify_run,
    is_timeout,
    job_outcome,
    mro_names,
)

# (exception class, message, outcome): what torch says at start-up, and what it is
TORCH_FAILURES = [
    ("DistStoreError", "Timed out after 6 seconds waiting for clients. 1/2 clients joined.",
     "timeout"),
    ("DistStoreError", "Timed out after 6 seconds waiting for clients. 2/3 clients joined.",
     "timeout"),
    ("DistStoreError", "wait timeout after 5000ms, keys: /default_pg/0//cpu//0/0", "timeout"),
    ("DistStoreError", "Socket Timeout", "timeout"),
    ("DistNetworkError", "The client socket has timed out after 5000ms while trying to connect "
     "to (127.0.0.1, 29500).", "timeout"),
    ("DistNetworkError", "The server socket has failed to listen on any local network address. "
     "port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use",
     "error"),
    ("RuntimeError", "[../third_party/gloo/gloo/transport/tcp/pair.cc:446] Connect timeout "
     "[127.0.0.1]:45678", "timeout"),
    ("RuntimeError", "Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/"
     "pair.cc:144] Connect timeout", "timeout"),
    ("RuntimeError", "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc"
     ":78] Timed out waiting 5000ms for recv operation to complete", "timeout"),
    ("RuntimeError", "[../torch/csrc/distributed/c10d/FileStore.cpp:355] Wait timeout", "timeout"),
    ("RuntimeError", "[enforce fail at ../third_party/gloo/gloo/context.cc:23] rank < size. "
     "2 vs 2", "error"),
    ("RuntimeError", "Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/"
     "pair.cc:144] Connection refused", "error"),
    ("ValueError", "Error initializing torch.distributed using env:// rendezvous: environment "
     "variable WORLD_SIZE expected, but not set", "error"),
    ("ValueError", "invalid literal for int() with base 10: 'abc'", "error"),
    ("DistBackendError", "[Rank 0] Watchdog caught collective operation timeout: "
     "WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for 5000 milliseconds before timing out.",
     "timeout"),
    ("DistBackendError", "NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
     "unhandled system error", "error"),
    ("TimeoutError", "", "timeout"),
    ("AssertionError", "all_reduce sum is 3.0, expected 6.0 (world_size 3)", "error"),
    ("KeyboardInterrupt", "", "error"),
]


@pytest.mark.parametrize("cls,message,outcome", TORCH_FAILURES,
                         ids=[f"{c}-{o}-{i}" for i, (c, _, o) in enumerate(TORCH_FAILURES)])
def test_torch_exception_outcome(obs, cls, message, outcome):
    v = classify(obs.rank("0", reached="init", exc=obs.exc(cls, message)), obs.t0)
    assert v.outcome == outcome


def test_exception_verdict_keeps_class_mro_and_message(obs):
    msg = "Timed out after 6 seconds waiting for clients. 1/2 clients joined."
    v = classify(obs.rank("0", reached="init", exc=obs.exc("DistStoreError", msg)), obs.t0)
    assert (v.exception, v.message) == ("DistStoreError", msg)
    assert v.exception_mro[:3] == ["torch.distributed.DistStoreError",
                                   "torch.distributed.DistError", "builtins.RuntimeError"]


def test_timeout_reason_says_torchs_timeout(obs):
    v = classify(obs.rank(reached="init", exc=obs.exc("DistStoreError", "Socket Timeout")),
                 obs.t0)
    assert v.reason == "torch's own timeout fired"


def test_error_reason_says_raised(obs):
    v = classify(obs.rank(reached="init", exc=obs.exc("ValueError", "x")), obs.t0)
    assert v.reason == "raised an exception"


# -- the timeout rules themselves ----------------------------------------------------------------

def test_timeout_rule_needs_the_class_in_the_mro():
    assert not is_timeout(["builtins.ValueError", "builtins.Exception"], "timed out")


def test_timeout_rule_matches_a_subclass_through_its_mro():
    # an unknown subclass of DistStoreError that says "timeout" (a future torch)
    mro = ["torch.distributed.DistFutureError", "torch.distributed.DistStoreError",
           "builtins.RuntimeError"]
    assert is_timeout(mro, "store wait timeout")


def test_timeout_rule_matches_qualified_and_short_names():
    assert is_timeout(["DistNetworkError"], "client socket has timed out")
    assert is_timeout(["torch.distributed.DistNetworkError"], "client socket has timed out")


def test_timeout_pattern_is_case_insensitive():
    assert is_timeout(["builtins.RuntimeError"], "SOCKET TIMEOUT")


def test_timeout_word_inside_another_word_is_not_a_timeout():
    assert not is_timeout(["builtins.RuntimeError"], "invalid timeoutMs argument")


def test_mro_names_gives_short_and_qualified():
    assert mro_names(["torch.distributed.DistStoreError", "builtins.RuntimeError"]) == \
        ["torch.distributed.DistStoreError", "DistStoreError", "builtins.RuntimeError",
         "RuntimeError"]


# -- ok, crash, hang ----------------------------------------------------------------------------

def test_ok_result_is_ok(obs):
    v = classify(obs.rank("1", end=0.8), obs.t0)
    assert (v.outcome, v.phase, v.reason) == ("ok", "exit", "finished its workload")


def test_duration_is_measured_from_the_start_line_to_the_result(obs):
    assert classify(obs.rank(end=2.5), obs.t0).duration == 2.5


def test_duration_without_start_line_falls_back_to_ended_at(obs):
    assert classify(obs.rank(end=2.5), 0.0).duration == 2.54


def test_killed_by_the_faults_signal_is_crash(obs):
    r = obs.rank("1", reached="workload step 1", result=False, returncode=-9,
                 signals=[{"signal": "KILL", "t": 0.4, "why": "kill_rank"}])
    v = classify(r, obs.t0)
    assert (v.outcome, v.reason, v.phase) == \
        ("crash", "killed by SIGKILL (sent by the fault)", "workload step 1")


def test_killed_by_a_signal_nobody_sent_is_crash_without_blame(obs):
    v = classify(obs.rank(reached="init", result=False, returncode=-11), obs.t0)
    assert (v.outcome, v.reason) == ("crash", "killed by SIGSEGV")


def test_abort_is_crash(obs):
    assert classify(obs.rank(reached="init", result=False, returncode=-6), obs.t0).reason == \
        "killed by SIGABRT"


def test_exit_without_result_record_is_crash(obs):
    v = classify(obs.rank(reached="init", result=False, returncode=0), obs.t0)
    assert (v.outcome, v.reason) == ("crash", "exited with code 0 without a result record")


def test_exit_code_of_a_rank_whose_supervisor_went_away_is_crash(obs):
    v = classify(obs.rank(reached="import", result=False, returncode=3), obs.t0)
    assert v.outcome == "crash" and v.phase == "import"


def test_unknown_signal_number_is_named_by_number(obs):
    v = classify(obs.rank(reached="init", result=False, returncode=-200), obs.t0)
    assert v.reason == "killed by signal 200"


def test_alive_at_the_deadline_is_hang(obs):
    r = obs.rank("1", reached="init", result=False, killed_at_deadline=True, end=9.0,
                 stacks=obs.hung_stacks)
    v = classify(r, obs.t0)
    assert (v.outcome, v.phase, v.duration) == ("hang", "init", r.ended_at)
    assert v.reason == "alive at the harness's deadline; killed"
    assert v.stacks == obs.hung_stacks


def test_hang_of_a_stopped_rank_says_when_it_was_stopped(obs):
    r = obs.rank("1", reached="workload step 1", result=False, killed_at_deadline=True,
                 signals=[{"signal": "STOP", "t": 0.25, "why": "stop_rank"}])
    assert "sent SIGSTOP at 0.25 s" in classify(r, obs.t0).reason


def test_hang_wins_over_a_result_written_before_the_deadline_kill(obs):
    r = obs.rank("0", killed_at_deadline=True)
    assert classify(r, obs.t0).outcome == "hang"


# -- phase ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("reached", ["import", "init", "workload step 1", "workload step 2",
                                     "destroy"])
def test_phase_is_the_last_phase_entered(obs, reached):
    v = classify(obs.rank(reached=reached, result=False, returncode=-9), obs.t0)
    assert v.phase == reached


def test_phase_of_an_exception_is_the_one_the_result_names(obs):
    r = obs.rank(reached="workload step 2", exc=obs.exc("RuntimeError", "Connection reset"))
    assert classify(r, obs.t0).phase == "workload step 2"


def test_no_events_at_all_is_crash_at_start(obs):
    r = obs.rank(result=False, returncode=-9)
    r.events = []
    v = classify(r, obs.t0)
    assert (v.outcome, v.phase) == ("crash", "start")


# -- where the rank ran -------------------------------------------------------------------------

def test_verdict_keeps_host_addr_and_returncode(obs):
    v = classify(obs.rank("2", host="node1", addr="10.77.0.3"), obs.t0)
    assert (v.label, v.host, v.addr, v.returncode) == ("2", "node1", "10.77.0.3", 0)


def test_verdict_to_dict_round_trips():
    v = Verdict(label="0", outcome="ok", phase="exit", duration=1.0)
    assert Verdict(**v.to_dict()) == v


# -- the job ---------------------------------------------------------------------------------------

def _v(*outcomes):
    return [Verdict(label=str(i), outcome=o, phase="init", duration=1.0)
            for i, o in enumerate(outcomes)]


def test_severity_order_is_hang_crash_timeout_error_ok():
    assert OUTCOMES == ("ok", "error", "timeout", "crash", "hang")


@pytest.mark.parametrize("outcomes,job", [
    (("ok", "ok"), "ok"), (("ok", "error"), "error"), (("error", "timeout"), "timeout"),
    (("timeout", "crash", "error"), "crash"), (("crash", "hang", "ok"), "hang"),
    (("hang", "timeout"), "hang"), (("timeout", "error", "ok"), "timeout"),
])
def test_job_outcome_is_the_most_severe(outcomes, job):
    assert job_outcome(_v(*outcomes)) == job


def test_job_without_ranks_is_ok():
    assert job_outcome([]) == "ok"


def test_classify_run_gives_one_verdict_per_rank_in_order(obs):
    run = obs.run(obs.rank("0", reached="init",
                           exc=obs.exc("DistStoreError", "Timed out after 6 seconds waiting for "
                                       "clients. 1/2 clients joined."), end=7.0),
                  obs.rank("1", reached="init",
                           exc=obs.exc("DistNetworkError", "The client socket has timed out "
                                       "after 5000ms while trying to connect to (127.0.0.1, "
                                       "29500)."), end=13.0))
    vs = classify_run(run)
    assert [(v.label, v.outcome, v.duration) for v in vs] == \
        [("0", "timeout", 7.0), ("1", "timeout", 13.0)]


def test_a_rank_that_told_torch_another_rank_shows_the_rank_it_claimed(obs):
    # issue 41: two processes with RANK=0; the table ties the row to the claimed number
    from harness.core.protocol import row_name

    honest = obs.rank("1")
    assert classify(honest).claims is None
    by_env = obs.rank_dict("1")
    by_env["events"][0]["launched"]["env"] = {"RANK": "0"}
    for e in by_env["events"]:
        if e.get("phase") == "init":
            e["init_rank"] = None          # env:// passes no rank: the one it started with
    from harness.judge.observation import RankObservation
    v = classify(RankObservation.from_dict(by_env))
    assert v.claims == 0 and row_name(v.label, v.claims) == "1 (claims rank 0)"
    by_arg = obs.rank_dict("0")
    for e in by_arg["events"]:
        if e.get("phase") == "init":
            e["init_rank"] = 1             # tcp:// with rank=1: what it passed wins
    assert classify(RankObservation.from_dict(by_arg)).claims == 1
    agent = obs.rank("agent:node0", role="agent")
    assert classify(agent).claims is None and row_name("agent:node0") == "agent:node0"

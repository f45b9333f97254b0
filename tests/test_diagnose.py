"""Diagnosis (harness.diagnose): each rule on built observations; sockets parsed from /proc text;
identical stacks grouped; the cause: expectation. The real runs that show the causes are in
the catalog's scenarios (busy_port, net-store-port-blocked, ...: their expectations pin cause:)."""

from __future__ import annotations

import socket
import textwrap

import pytest

from harness.core.protocol import Event
from harness.judge.classify import classify_run
from harness.judge.diagnose import UNKNOWN, RankContext, diagnose, explain_run
from harness.net.sockets import SocketRecord, parse_proc_net_tcp, snapshot
from harness.scenario.expect import check_rank, failure_table, label_ranges, stack_groups
from harness.scenario.schema import RankExpect

IN_USE = ("The server socket has failed to listen on any local network address. port: 29500, "
          "useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")
CLIENT = ("The client socket has timed out after 5000ms while trying to connect to "
          "(10.0.0.1, 29500).")
JOINED = "Timed out after 6 seconds waiting for clients. 1/2 clients joined."


def _run(obs, *ranks, **extra):
    run = obs.run(*ranks)
    run.plan.update({"master_port": 29500, "ranks": [
        {"label": r.label, "env": {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
                                   "RANK": r.label}} for r in ranks]})
    for k, v in extra.items():
        setattr(run, k, v)
    return run, explain_run(run, classify_run(run))


def _squatted(obs, peer="port holder#1 (pid 77, the harness's)", accepted=True):
    r0 = obs.rank("0", reached="init", end=0.01, exc=obs.exc("DistNetworkError", IN_USE))
    r1 = obs.rank("1", reached="init", killed_at_deadline=True, end=12.0,
                  stacks=obs.hung_stacks)
    r1.sockets = [SocketRecord("ESTABLISHED", "127.0.0.1:40000", "127.0.0.1:29500",
                               peer_pid=77, peer=peer, peer_accepted=accepted)]
    return _run(obs, r0, r1, port_owners=[{"pid": 77, "status": "LISTEN",
                                           "laddr": "0.0.0.0:29500", "cmdline": "squatter"}])


def test_a_rank_connected_to_a_squatter_is_said_connected_to_a_non_store(obs):
    _, (v0, v1) = _squatted(obs)
    assert v1.cause.startswith("connected to a process that is not a torch store: port holder")
    assert "accepting and never answering" in v1.cause
    assert "rank 0 failed with EADDRINUSE at" in v1.cause
    assert any("ESTABLISHED 127.0.0.1:40000 -> 127.0.0.1:29500" in e for e in v1.cause_evidence)


def test_a_listener_that_never_accepts_is_said_so(obs):
    _, (_, v1) = _squatted(obs, accepted=False)
    assert "never accepting: the connection waits in its listen backlog" in v1.cause


def test_a_rank_connected_to_rank_0_is_not_blamed_on_a_squatter(obs):
    _, (_, v1) = _squatted(obs, peer="rank 0")
    assert not v1.cause.startswith("connected to a process that is not a torch store")


def test_the_store_host_with_eaddrinuse_names_the_port_holder(obs):
    _, (v0, _) = _squatted(obs)
    assert v0.cause == "could not start the store: port 29500 was already in use by pid 77 " \
        "(squatter)"


def test_a_client_of_a_store_that_never_started_says_why(obs):
    r0 = obs.rank("0", reached="init", end=0.01, exc=obs.exc("DistNetworkError", IN_USE))
    r1 = obs.rank("1", reached="init", end=9.0, exc=obs.exc("DistNetworkError", CLIENT))
    _, (_, v1) = _run(obs, r0, r1)
    assert v1.cause.startswith("the store never started: rank 0 failed with EADDRINUSE")


def test_a_dropped_syn_names_the_rule_that_dropped_it(obs):
    r1 = obs.rank("1", reached="init", end=9.0, exc=obs.exc("DistNetworkError", CLIENT))
    rules = {"a": "table inet thx {\n chain input {\n  tcp dport 29500 drop\n }\n}"}
    _, (v1,) = _run(obs, r1, rules=rules, counters={"b": {"TcpExt.TCPSynRetrans": 3}})
    assert v1.cause == "its SYN to 10.0.0.1:29500 was never answered: dropped by the nft " \
        "rule on host a: tcp dport 29500 drop"
    assert "TCPSynRetrans: b 3" in v1.cause_evidence


def test_a_syn_sent_socket_without_a_rule_is_still_unanswered(obs):
    r1 = obs.rank("1", reached="init", killed_at_deadline=True, end=12.0)
    r1.sockets = [SocketRecord("SYN_SENT", "10.0.0.2:40000", "10.0.0.9:29500", retransmits=4)]
    _, (v1,) = _run(obs, r1)
    assert v1.cause == "its SYN to 10.0.0.9:29500 was never answered"
    assert "4 retransmissions" in v1.cause_evidence[0]


def test_an_unresolved_name_is_taken_from_stderr(obs):
    r1 = obs.rank("1", reached="init", end=9.0, exc=obs.exc("DistNetworkError", CLIENT))
    r1.stderr_tail = "[W socket.cpp:752] [c10d] The IPv6 network addresses of (nohost, " \
        "29500) cannot be retrieved (gai error: -2 - Name or service not known).\n"
    _, (v1,) = _run(obs, r1)
    assert v1.cause.startswith("a name did not resolve")
    assert "gai error: -2" in v1.cause_evidence[0]


def test_an_unresolved_name_is_found_when_stack_frames_filled_the_tail(obs):
    """The gai line is only in the key lines (harness.stderrlines): the tail is C++ frames."""
    r1 = obs.rank("1", reached="init", end=9.0, exc=obs.exc("DistNetworkError", CLIENT))
    r1.stderr_tail = "".join(f"frame #{i}: c10d::TCPStore::doWait() + 0x10\n" for i in range(60))
    r1.stderr_key = "[W socket.cpp:752] [c10d] The IPv6 network addresses of (nohost, 29500) " \
        "cannot be retrieved (gai error: -2 - Name or service not known)."
    _, (v1,) = _run(obs, r1)
    assert v1.cause.startswith("a name did not resolve")
    assert "gai error: -2" in v1.cause_evidence[0]


def test_the_store_host_says_which_rank_never_joined_and_why(obs):
    r0 = obs.rank("0", reached="init", end=7.0, exc=obs.exc("DistStoreError", JOINED))
    r1 = obs.rank("1", reached="init", end=17.0, exc=obs.exc("DistNetworkError", CLIENT))
    r1.released_at = 9.0
    _, (v0, _) = _run(obs, r0, r1)
    assert v0.cause == "waited for 1 of 2 clients: rank 1 was started only at 9 s, after " \
        "this rank gave up at 7 s"


def test_a_rank_dialling_another_port_is_named(obs):
    r0 = obs.rank("0", reached="init", end=7.0, exc=obs.exc("DistStoreError", JOINED))
    r1 = obs.rank("1", reached="init", end=13.0, exc=obs.exc("DistNetworkError", CLIENT))
    run, _ = _run(obs, r0, r1)
    run.plan["ranks"][1]["env"]["MASTER_PORT"] = "29501"
    v0 = explain_run(run, classify_run(run))[0]
    assert v0.cause == "waited for 1 of 2 clients: rank 1 dialled port 29501, not 29500"


def test_refused_connects_are_said_refused_and_retried(obs):
    r1 = obs.rank("1", reached="init", end=9.0, exc=obs.exc("DistNetworkError", CLIENT))
    _, (v1,) = _run(obs, r1, counters={"local": {"Tcp.AttemptFails": 12}})
    assert v1.cause.startswith("nothing listened on 10.0.0.1:29500: connects were refused")


def test_a_reject_rule_is_said_refused_and_retried_not_dropped(obs):
    r1 = obs.rank("1", reached="init", end=9.0, exc=obs.exc("DistNetworkError", CLIENT))
    rules = {"a": "table inet thx {\n chain input {\n  tcp dport 29500 reject with tcp reset\n"
                  " }\n}"}
    _, (v1,) = _run(obs, r1, rules=rules)
    assert v1.cause == "its connects to 10.0.0.1:29500 were refused by the nft rule on host a " \
        "and retried until the client's timeout: tcp dport 29500 reject with tcp reset"
    assert v1.cause_evidence[-1] == "nft on a: tcp dport 29500 reject with tcp reset"


def test_a_rule_on_another_port_explains_nothing(obs):
    r1 = obs.rank("1", reached="init", end=9.0, exc=obs.exc("DistNetworkError", CLIENT))
    rules = {"a": "table inet thx {\n chain input {\n  tcp dport 29501 drop\n }\n}"}
    _, (v1,) = _run(obs, r1, rules=rules)
    assert v1.cause == UNKNOWN


def test_a_client_dialling_another_port_than_the_store_is_said_so(obs):
    other = CLIENT.replace("29500", "29501")
    r1 = obs.rank("1", reached="init", end=9.0, exc=obs.exc("DistNetworkError", other))
    _, (v1,) = _run(obs, r1)
    assert v1.cause.startswith("dialled port 29501, where no store listened (the store's port "
                               "is 29500)")


def test_a_client_whose_store_host_had_ended_says_when(obs):
    r0 = obs.rank("0", reached="init", end=2.0, exc=obs.exc("DistStoreError", JOINED))
    r1 = obs.rank("1", reached="init", end=9.0, exc=obs.exc("DistNetworkError", CLIENT))
    run, (v0, v1) = _run(obs, r0, r1)
    assert v1.cause == "the store's host, rank 0, had ended (timeout) at 2 s; connects to " \
        "port 29500 were retried until the client's timeout"


def test_a_client_whose_store_host_ended_after_it_is_not_blamed_on_it(obs):
    r0 = obs.rank("0", reached="init", end=12.0, exc=obs.exc("DistStoreError", JOINED))
    r1 = obs.rank("1", reached="init", end=9.0, exc=obs.exc("DistNetworkError", CLIENT))
    _, (_, v1) = _run(obs, r0, r1)
    assert "had ended" not in v1.cause


def test_no_rule_gives_unknown_said_as_such(obs):
    r1 = obs.rank("1", reached="init", end=9.0, exc=obs.exc("DistNetworkError", CLIENT))
    _, (v1,) = _run(obs, r1)
    assert v1.cause == UNKNOWN
    assert v1.cause_evidence[0].startswith("rank 1: DistNetworkError")


def test_an_ok_rank_has_no_cause(obs):
    run, (v,) = _run(obs, obs.rank("0"))
    assert v.cause == "" and diagnose(RankContext(v, run.ranks[0], run, [v])) is None


# -- sockets ------------------------------------------------------------------------------------

PROC_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:7334 00000000:0000 0A 00000000:00000001 00:00000000 00000000     0        0 111
   1: 0200000A:9C40 0900000A:7334 02 00000001:00000000 01:00000300 00000004     0        0 222
"""


def test_proc_net_tcp_is_parsed_into_states_addresses_and_retransmissions():
    t = parse_proc_net_tcp(PROC_TCP)
    assert (t[111].state, t[111].local, t[111].recv_queue) == ("LISTEN", "127.0.0.1:29492", 1)
    assert (t[222].state, t[222].local, t[222].remote, t[222].retransmits) == \
        ("SYN_SENT", "10.0.0.2:40000", "10.0.0.9:29492", 4)


def test_a_snapshot_names_the_process_holding_the_remote_end():
    import os

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    cli = socket.create_connection(srv.getsockname())
    acc, _ = srv.accept()
    try:
        recs = snapshot({os.getpid(): "me"})[os.getpid()]
        mine = [r for r in recs if r.local == "{}:{}".format(*cli.getsockname())]
        assert len(mine) == 1 and mine[0].state == "ESTABLISHED"
        assert mine[0].peer == "me" and mine[0].peer_accepted is True
    finally:
        for s in (acc, cli, srv):
            s.close()


# -- grouping and expectations ------------------------------------------------------------------

def test_identical_stacks_are_grouped_and_labelled_as_ranges():
    g = stack_groups({str(i): ("X" if i else "") + "File \"a.py\", line 1 in f" for i in range(8)})
    assert g["1"] == ["1", "2", "3", "4", "5", "6", "7"] and g["0"] == ["0"]
    assert label_ranges(["1", "2", "3", "5", "agent:a"]) == "1-3, 5, agent:a"


def test_an_eight_rank_hang_prints_one_stack_in_the_failure_table(obs):
    ranks = [obs.rank(str(i), reached="init", killed_at_deadline=True, end=12.0,
                      stacks=obs.hung_stacks) for i in range(8)]
    run, vs = _run(obs, *ranks)
    text = failure_table(vs, None, [])
    assert text.count("innermost frames") == 1
    assert "ranks 0-7, same stack" in text and text.count("same stack as rank 0") == 7


def test_a_cause_expectation_matches_the_diagnosis(obs):
    _, (_, v1) = _squatted(obs)
    assert check_rank(RankExpect.model_validate({"cause": "not a torch store"}), v1) == []
    (m,) = check_rank(RankExpect.model_validate({"cause": "SYN .* never answered"}), v1)
    assert (m.field, m.expected) == ("cause", "/SYN .* never answered/")


def test_a_cause_per_outcome_pins_each_path_of_a_race(obs):
    """cause: {hang: ..., error: ...}: the pattern of the outcome the row ended with; an
    outcome the mapping does not name is not checked (a path not watched yet)."""
    _, (_, v1) = _squatted(obs)
    assert v1.outcome == "hang"
    ok = RankExpect.model_validate({"outcome": ["hang", "error"],
                                    "cause": {"hang": "not a torch store", "error": "x"}})
    assert check_rank(ok, v1) == []
    bad = RankExpect.model_validate({"outcome": ["hang", "error"],
                                     "cause": {"hang": "SYN", "error": "not a torch store"}})
    assert [m.field for m in check_rank(bad, v1)] == ["cause"]
    unpinned = RankExpect.model_validate({"outcome": ["hang", "error"],
                                          "cause": {"error": "anything"}})
    assert check_rank(unpinned, v1) == []
    with pytest.raises(Exception, match="regular expression"):
        RankExpect.model_validate({"cause": {"hang": "(unclosed"}})
    with pytest.raises(ValueError, match="error.*timeout.*hang.*crash"):
        RankExpect.model_validate({"cause": {"ok": "no cause for ok"}})


def test_a_cause_expectation_is_not_checked_on_a_rank_that_ended_ok(obs):
    """A race between ok and a failure pins the failure's cause: an ok row has none."""
    run = obs.run(obs.rank("0"))
    (v,) = explain_run(run, classify_run(run))
    assert v.outcome == "ok" and v.cause in (None, "")
    exp = RankExpect.model_validate({"outcome": ["ok", "timeout"], "cause": "not a torch store"})
    assert check_rank(exp, v) == []


def test_two_rows_that_would_explain_each_other_end_in_a_cause(obs):
    # rank 0 waits for clients; rank 1 waits for rank 0's process-group key: each rule asks the
    # other row for its cause, and the guard stops the circle
    r0 = obs.rank("0", reached="init", end=7.0, exc=obs.exc("DistStoreError", JOINED))
    r1 = obs.rank("1", reached="init", end=7.0, exc=obs.exc(
        "DistStoreError", "wait timeout after 5000ms, keys: /default_pg/0//cpu//0/0"))
    _, (v0, v1) = _run(obs, r0, r1)
    assert v1.cause.startswith("waited 5 s for rank 0's key /default_pg/0//cpu//0/0, which rank 0 "
                               "never set")
    assert v0.cause   # whatever it says, it was worked out without running round in a circle


def test_a_rule_that_raises_leaves_unknown_and_never_fails_the_run(obs):
    from harness.judge import diagnose as d

    def boom(ctx):
        raise ValueError("a rule's own bug")

    d.RULES.insert(0, boom)
    try:
        _, (v1,) = _run(obs, obs.rank("1", reached="init", end=9.0,
                                      exc=obs.exc("DistNetworkError", CLIENT)))
    finally:
        d.RULES.remove(boom)
    assert v1.cause == "unknown: harness.diagnose failed on this row (ValueError: a rule's own bug)"


MESH = ("Gloo connectFullMesh failed with [.../gloo/transport/tcp/pair.cc:152] timed out "
        "connecting: SO_ERROR: Connection refused, remote=[10.0.0.1]:33193")
BUT_STORE = {"a": "table inet thx {\n chain input {\n  tcp dport != 29500 ct state new reject "
                  "with tcp reset comment \"fw1\"\n }\n}"}


def test_a_blocked_gloo_mesh_names_the_rule_that_spares_only_the_store(obs):
    r1 = obs.rank("1", reached="init", end=0.1, exc=obs.exc("DistNetworkError", MESH))
    _, (v1,) = _run(obs, r1, rules=BUT_STORE)
    assert v1.cause.startswith("gloo's full mesh could not connect: the nft rule on host a "
                               "rejects new connections to every port but 29500 (the store's)")
    assert "its connect to 10.0.0.1:33193 was refused" in v1.cause_evidence


def test_a_rule_sparing_the_store_port_is_not_said_to_drop_it(obs):
    # 'dport != 29500 ... reject' lets the store through: a store client's timeout is not it
    r1 = obs.rank("1", reached="init", end=9.0, exc=obs.exc("DistNetworkError", CLIENT))
    _, (v1,) = _run(obs, r1, rules=BUT_STORE)
    assert "nft rule" not in v1.cause


REFUSED = ("Gloo connectFullMesh failed with [.../pair.cc:152] timed out connecting: SO_ERROR: "
           "Connection refused, remote=[127.0.0.1]:42890")
WAITED = "Gloo connectFullMesh failed with [.../pair.h:311] Connect timeout [none]"


def _two_hosts(obs, hosts=(("a", "10.0.0.1"), ("b", "10.0.0.2"))):
    r0 = obs.rank("0", reached="init", end=25.0, exc=obs.exc("RuntimeError", WAITED))
    r1 = obs.rank("1", reached="init", end=0.4, exc=obs.exc("RuntimeError", REFUSED))
    run = obs.run(r0, r1)
    run.plan.update({"master_port": 29500, "hosts": [{"name": n, "addr": a} for n, a in hosts],
                     "ranks": [{"label": r, "env": {"RANK": r, "MASTER_PORT": "29500"}}
                               for r in ("0", "1")]})
    return explain_run(run, classify_run(run))


def test_a_gloo_pair_dialling_an_address_no_host_has_is_named_on_both_sides(obs):
    v0, v1 = _two_hosts(obs)
    assert v1.cause.startswith("its gloo pair dialled 127.0.0.1:42890, an address no host of "
                               "the run has (a 10.0.0.1, b 10.0.0.2): the peer advertised it "
                               "(GLOO_SOCKET_IFNAME unset)")
    assert v0.cause.startswith("gloo's full mesh never connected: rank 1 dialled "
                               "127.0.0.1:42890, the address this rank advertised")


def test_on_one_machine_127_0_0_1_is_no_wrong_address(obs):
    v0, v1 = _two_hosts(obs, hosts=(("local", "127.0.0.1"),))
    assert "no host" not in v0.cause and "no host" not in v1.cause


# -- a real 8-rank hang, read on one screen ------------------------------------------------------

@pytest.mark.timeout(240)
def test_a_real_eight_rank_hang_prints_one_stack_for_ranks_1_to_7():
    """busy_port accepting, 8 ranks: rank 0 fails with EADDRINUSE, ranks 1-7 hang connected to
    the squatter. The failure table gives each of them the cause and prints their stack once."""
    from harness.run.supervisor import run_scenario
    from harness.scenario.loader import load_text

    (scn,) = load_text(textwrap.dedent("""
        name: eight_behind_a_squatter
        about: 8 ranks, the master port held by a process that accepts and never answers
        world_size: 8
        timeout: 5
        deadline: 12
        workload: [barrier]
        faults:
          - {kind: busy_port, mode: accepting}
    """), "eight.yaml")
    run = run_scenario(scn)
    vs = explain_run(run, classify_run(run))
    by = {v.label: v for v in vs}
    assert by["0"].outcome == "error" and by["0"].cause.startswith(
        "could not start the store: port")
    for r in "1234567":
        assert by[r].outcome == "hang", (r, by[r].reason)
        assert by[r].cause.startswith("connected to a process that is not a torch store: port "
                                      "holder"), (r, by[r].cause)
    text = failure_table(vs, None, [])
    assert text.count("innermost frames") == 1
    assert text.count("ranks 1-7, same stack") == 1
    assert text.count("same stack as rank 1") == 6
    assert text.count("cause: connected to a process that is not a torch store") == 1
    assert text.count("cause: the same as rank 1") == 6


def test_harness_explain_says_alike_rows_once(obs, tmp_path):
    import json
    import os
    import subprocess
    import sys

    r0 = obs.rank("0", reached="init", end=0.01, exc=obs.exc("DistNetworkError", IN_USE))
    hung = []
    for i in range(1, 8):
        r = obs.rank(str(i), reached="init", killed_at_deadline=True, end=12.0,
                     stacks=obs.hung_stacks)
        r.sockets = [SocketRecord("ESTABLISHED", f"127.0.0.1:4000{i}", "127.0.0.1:29500",
                                  peer_pid=77, peer="port holder#1", peer_accepted=True)]
        hung.append(r)
    run, _ = _run(obs, r0, *hung, port_owners=[{"pid": 77, "status": "LISTEN"}])
    (tmp_path / "case").mkdir()
    (tmp_path / "case" / "observation.json").write_text(json.dumps(run.to_dict()))
    p = subprocess.run([sys.executable, "-m", "harness", "explain", str(tmp_path)],
                       capture_output=True, text=True, timeout=120,
                       env={"COLUMNS": "400", "PATH": "",   # a harness installed by path too
                            **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}})
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("ranks 1-7: hang at 12.04 s in init - connected to a process that is "
                          "not a torch store") == 1
    assert "rank 2:" not in p.stdout
    assert p.stdout.count("stack (ranks 1-7, same stack)") == 1


# -- what the rank itself was told or did ---------------------------------------------------------
def _told(obs, exc, env, reached="init", variation=None, **kw):
    r0 = obs.rank("0", reached=reached, end=0.05, exc=exc, **kw)
    run = obs.run(r0)
    run.plan.update({"master_port": 29500, "world_size": 2, "ranks": [
        {"label": "0", "env": env, "variation": variation or {}}]})
    return explain_run(run, classify_run(run))[0]


def test_a_variable_not_set_is_named(obs):
    v = _told(obs, obs.exc("ValueError", "Error initializing torch.distributed using env:// "
                           "rendezvous: environment variable WORLD_SIZE expected, but not set"),
              {"RANK": "0"})
    assert v.cause.startswith("torch refused the set-up: WORLD_SIZE was not set for this rank")


def test_a_variable_that_is_not_a_number_is_named_with_its_value(obs):
    v = _told(obs, obs.exc("ValueError", "invalid literal for int() with base 10: '28D'"),
              {"RANK": "0", "WORLD_SIZE": "28D"})
    assert v.cause == "torch refused the set-up: WORLD_SIZE='28D' is not a number"


def test_a_rank_outside_the_world_is_said_from_gloos_check(obs):
    msg = ("[enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/context.cc:23] rank < "
           "size. 2 vs 2")
    v = _told(obs, obs.exc("RuntimeError", msg), {"RANK": "2", "WORLD_SIZE": "2"})
    assert v.cause == ("torch refused the set-up: gloo's check rank < size failed (2 vs 2): "
                       "RANK=2 is outside WORLD_SIZE=2")


def test_a_network_error_in_init_is_not_called_a_refused_set_up(obs):
    v = _told(obs, obs.exc("DistNetworkError", "Connection reset by peer"), {"RANK": "0"})
    assert not v.cause.startswith("torch refused")


def test_an_exception_the_fault_raised_is_said_so(obs):
    v = _told(obs, obs.exc("ValueError", "a bug in rank 0"), {}, reached="workload step 1",
              variation={"raise_at": {"phase": "workload step 1", "exception": "ValueError",
                                      "message": "a bug in rank 0"}})
    assert v.cause.startswith("raised ValueError in workload step 1: the scenario's "
                              "raise_exception fault")


def test_a_collective_timeout_names_the_peer_the_fault_slowed(obs):
    msg = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] Timed "
           "out waiting 5000ms for send operation to complete")
    r0 = obs.rank("0", reached="workload step 2", end=6.4, exc=obs.exc("RuntimeError", msg))
    r1 = obs.rank("1", reached="exit", end=9.0)
    run = obs.run(r0, r1)
    run.plan.update({"master_port": 29500, "ranks": [
        {"label": "0", "env": {}, "variation": {}},
        {"label": "1", "env": {}, "variation": {"slow_at": {"workload step 2": 8.0}}}]})
    v0 = explain_run(run, classify_run(run))[0]
    assert v0.cause == ("its collective in workload step 2 timed out after 5 s: rank 1 slept 8 s "
                        "in workload step 2 (the scenario's slow_rank fault)")


def test_glooss_other_wording_of_a_collective_timeout_names_the_skipped_collective(obs):
    # ddp_training skip_allreduce in a catalog run of 2026-11-26: gloo said the 5 s wait as
    # "Application timeout caused pair closure" (no ms in it): the group's timeout is the wait
    msg = "Application timeout caused pair closure"
    r0 = obs.rank("0", reached="workload step 2", end=6.7, exc=obs.exc("RuntimeError", msg))
    r1 = obs.rank("1", reached="exit", end=6.8)
    run = obs.run(r0, r1)
    run.plan.update({"master_port": 29500, "timeout": 5, "ranks": [
        {"label": "0", "env": {}, "variation": {}},
        {"label": "1", "env": {}, "variation": {"skip": ["workload step 1"]}}]})
    v0 = explain_run(run, classify_run(run))[0]
    assert v0.cause.startswith("its collective in workload step 2 timed out after 5 s: rank 1 "
                               "skipped its collective in workload step 1")


def test_a_keyboard_interrupt_from_the_faults_sigint_is_said_so(obs):
    v = _told(obs, obs.exc("KeyboardInterrupt", ""), {},
              signals=[{"signal": "INT", "t": 1.0, "why": ""}])
    assert v.cause.startswith("interrupted: SIGINT, sent by the scenario's fault at 1 s")


# -- the network the scenario's faults shaped ---------------------------------------------------
def test_an_address_nobody_answers_for_is_said_no_route_to_host(obs):
    msg = ("The client socket has failed to connect to any network address of (10.0.0.250, "
           "29500). The client socket has failed to connect to 10.0.0.250:29500 (errno: 113 - No "
           "route to host).")
    r0 = obs.rank("0", reached="init", end=3.0, exc=obs.exc("DistNetworkError", msg))
    run = obs.run(r0)
    run.plan.update({"master_port": 29500, "hosts": [{"name": "a", "addr": "10.0.0.1"},
                                                     {"name": "b", "addr": "10.0.0.2"}],
                     "ranks": [{"label": "0", "env": {}}]})
    v = explain_run(run, classify_run(run))[0]
    assert v.cause.startswith("no host answers for 10.0.0.250 (No route to host): it dialled "
                              "10.0.0.250:29500, an address in no host of the run (a 10.0.0.1")


def test_a_partition_is_named_from_the_saddr_rules(obs):
    r0 = obs.rank("0", reached="init", killed_at_deadline=True, end=12.0, stacks=obs.hung_stacks)
    run = obs.run(r0)
    run.plan.update({"master_port": 29500, "hosts": [{"name": "a", "addr": "10.0.0.1"},
                                                     {"name": "b", "addr": "10.0.0.2"}],
                     "ranks": [{"label": "0", "env": {}}]})
    run.rules = {"a": 'ip saddr 10.0.0.2 drop comment "cut1" # handle 3', "b": ""}
    v = explain_run(run, classify_run(run))[0]
    assert v.cause.startswith("the hosts were partitioned by nft rules (a drops every packet "
                              "from b)")


def test_a_proxy_fault_says_which_ports_and_what_it_did(obs):
    from harness.judge.observation import StepRecord

    r0 = obs.rank("0", reached="init", killed_at_deadline=True, end=12.0, stacks=obs.hung_stacks)
    run = obs.run(r0)
    run.plan.update({"master_port": 29500, "ranks": [{"label": "0", "env": {}}]})
    run.step_log = [
        StepRecord("blackhole#1", "blackhole", "do", "start the fault proxy; redirect [29500] "
                   "through it (in :1, out :2)", "", 0.0),
        StepRecord("blackhole#1", "blackhole", "do", "proxy: black hole (both)", "", 0.0)]
    v = explain_run(run, classify_run(run))[0]
    assert v.cause == ("the traffic of port 29500 (the store's) went through the harness's "
                       "fault proxy: black hole (both) (the scenario's blackhole fault, from 0 s)")


def test_a_model_with_another_parameter_count_is_said_so(obs):
    msg = ("DDP expects same model across all ranks, but Rank 0 has 8 params, while rank 1 has "
           "inconsistent 10 params.")
    v = _told(obs, obs.exc("RuntimeError", msg), {}, reached="workload step 1")
    assert v.cause == ("the model differs between ranks: rank 0 has 8 parameters, rank 1 has 10 "
                       "(DDP's check at construction)")


def test_running_out_of_descriptors_names_the_faults_limit(obs):
    from harness.judge.observation import StepRecord

    msg = ("[enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/device.cc:"
           "186] rv != -1. -1 vs -1. Too many open files")
    r0 = obs.rank("0", reached="init", end=0.3, exc=obs.exc("RuntimeError", msg))
    run = obs.run(r0)
    run.plan.update({"master_port": 29500, "ranks": [{"label": "0", "env": {}}]})
    run.step_log = [StepRecord("ofl#1", "open_files_limit", "do", "open-files limit 8 on rank 0",
                               "rank 0", 0.0)]
    v = explain_run(run, classify_run(run))[0]
    assert v.cause == ("ran out of file descriptors in init (Too many open files): the scenario's "
                       "open_files_limit fault (open-files limit 8 on rank 0)")


def test_a_member_that_never_calls_new_group_is_named(obs):
    r0 = obs.rank("0", reached="workload step 1", killed_at_deadline=True, end=30.0,
                  stacks=obs.hung_stacks)
    r1 = obs.rank("1", reached="exit", end=1.0)
    run = obs.run(r0, r1)
    run.plan.update({"master_port": 29500, "workload": ["new_group 0,1", "barrier"], "ranks": [
        {"label": "0", "env": {}, "variation": {}},
        {"label": "1", "env": {}, "variation": {"skip": ["workload step 1"]}}]})
    v0 = explain_run(run, classify_run(run))[0]
    assert v0.cause == ("waiting in workload step 1 for a peer that will not come: rank 1 never "
                        "called new_group 0,1 (the scenario's skip_collective fault)")


def test_ranks_making_groups_in_another_order_are_said_to_deadlock(obs):
    r0 = obs.rank("0", reached="workload step 1", killed_at_deadline=True, end=30.0,
                  stacks=obs.hung_stacks)
    r1 = obs.rank("1", reached="workload step 1", killed_at_deadline=True, end=30.0,
                  stacks=obs.hung_stacks)
    run = obs.run(r0, r1)
    steps = ["new_group 0,1", "new_group 1,2"]
    run.plan.update({"master_port": 29500, "workload": steps, "ranks": [
        {"label": "0", "env": {}, "variation": {}},
        {"label": "1", "env": {}, "variation": {"steps": steps[::-1]}}]})
    v0, v1 = explain_run(run, classify_run(run))
    assert v0.cause.startswith("waiting in workload step 1 for a peer that will not come: rank 1 "
                               "makes its steps in another order (new_group 1,2, new_group 0,1")
    assert v1.cause.startswith("this rank makes its steps in another order")


def _frames(*names):
    return [{"function": n, "file": "libtorch_cpu.so", "line": 0} for n in names]


# what harness.pyspy keeps of `py-spy dump --native --json`
TEARDOWN = [
    {"thread": 17395, "name": "MainThread", "state": "idle", "frames": _frames(
        "std::thread::join", "c10d::ProcessGroupGloo::~ProcessGroupGloo",
        "c10d::ProcessGroup::~ProcessGroup", "c10d::Reducer::~Reducer", "run_rank")},
    {"thread": 17519, "name": None, "state": "idle", "frames": _frames(
        "pthread_cond_timedwait", "pybind11::gil_scoped_acquire::gil_scoped_acquire",
        "c10d::ProcessGroupGloo::AsyncWork::~AsyncWork", "c10d::ProcessGroupGloo::runLoop")},
]


def test_a_gil_deadlock_in_torchs_teardown_is_read_from_the_native_stacks(obs):
    """Watched once in the catalog (small_mtu): the stacks above are a real rank's, trimmed."""
    r1 = obs.rank("1", reached="destroy", killed_at_deadline=True, end=60.0,
                  stacks=obs.hung_stacks)
    run = obs.run(r1)
    run.ranks[0].native_threads = TEARDOWN
    run.plan.update({"master_port": 29500, "ranks": [{"label": "1", "env": {}}]})
    (v,) = explain_run(run, classify_run(run))
    assert v.cause.startswith("deadlocked in torch's teardown (destroy): the main thread, "
                              "freeing a DDP Reducer, joins ProcessGroupGloo's worker thread")
    run.ranks[0].native_threads = TEARDOWN[:1]          # one side: no deadlock
    (v,) = explain_run(run, classify_run(run))
    assert not v.cause.startswith("deadlocked")
    # the words alone (the text a person reads) prove nothing: the rule reads the threads
    from harness.judge.pyspy import render

    run.ranks[0].native_threads, run.ranks[0].native_stacks = [], render(TEARDOWN)
    (v,) = explain_run(run, classify_run(run))
    assert not v.cause.startswith("deadlocked")


def test_py_spy_json_is_trimmed_and_shown_in_py_spys_own_layout():
    from harness.judge.pyspy import render, trim

    raw = [{"pid": 7, "thread_id": 140, "thread_name": "MainThread", "os_thread_id": 7,
            "active": False, "owns_gil": False, "frames": [
                {"name": "clock_nanosleep", "filename": "/usr/lib/libc.so.6",
                 "short_filename": "libc.so.6", "line": 0, "locals": None},
                {"name": "<module>", "filename": "/x/<string>", "short_filename": "<string>",
                 "line": 1}]},
           {"pid": 7, "thread_id": 141, "thread_name": None, "os_thread_id": 9,
            "active": True, "owns_gil": True, "frames": [
                {"name": "pybind11::" + "x" * 5000, "short_filename": "libtorch_python.so",
                 "line": 0}]},
           "not a thread"]
    threads = trim(raw)
    assert [t["thread"] for t in threads] == [7, 9]
    text = render(threads)
    assert text.splitlines()[:3] == ['Thread 7 (idle): "MainThread"',
                                     "    clock_nanosleep (libc.so.6)",
                                     "    <module> (<string>:1)"]
    assert text.splitlines()[3] == "Thread 9 (active+gil)"
    assert len(text.splitlines()[4]) < 200 and text.splitlines()[4].endswith(
        " ... (libtorch_python.so)")


# ranks a launcher started itself (srun's tasks: role "worker", not in the plan)

def _srun_tasks(obs, r1_msg, r1_host="node1"):
    r0 = obs.rank("0", reached="init", end=13.0, role="worker", host="node0", addr="10.0.0.1",
                  exc=obs.exc("DistStoreError", JOINED))
    r1 = obs.rank("1", reached="init", end=12.0, role="worker", host=r1_host,
                  addr="10.0.0.2", exc=obs.exc("DistNetworkError", r1_msg))
    run = obs.run(r0, r1)
    run.plan.update({"master_port": 29500, "ranks": [{"label": "parent:srun", "role": "parent"}]})
    return explain_run(run, classify_run(run))


def test_a_store_host_among_srun_tasks_names_the_task_that_never_joined(obs):
    v0, v1 = _srun_tasks(obs, CLIENT.replace("10.0.0.1", "node1"))
    assert v1.cause.startswith("dialled node1 (host node1), where no store listened: the "
                               "store's host is rank 0's, node0 (10.0.0.1)")
    assert v0.cause.startswith("waited for 1 of 2 clients: rank 1 never reached it: dialled "
                               "node1 (host node1)")


def test_a_client_that_dialled_the_store_host_is_not_said_to_have_dialled_elsewhere(obs):
    _, v1 = _srun_tasks(obs, CLIENT.replace("10.0.0.1", "node0"))
    assert not v1.cause.startswith("dialled node0")


ROUND_KEYS = "wait timeout after 10000ms, keys: /torch.rendezvous.none.1/"


def test_elastic_scale_up_deadlock_is_named_on_both_agents(obs):
    a0 = obs.rank("agent:node0", reached="init", end=19.4, role="agent", host="node0",
                  exc=obs.exc("DistStoreError", ROUND_KEYS + "torchelastic/role_info/0, "
                              "/torch.rendezvous.none.1/torchelastic/role_info/1"))
    a1 = obs.rank("agent:node1", reached="init", end=19.2, role="agent", host="node1",
                  exc=obs.exc("DistStoreError", ROUND_KEYS + "MASTER_ADDR"))
    run = obs.run(a0, a1)
    v0, v1 = explain_run(run, classify_run(run))
    assert v0.cause.startswith("rendezvous round 1: this rank-0 agent waited for the role info "
                               "of agent:node1, which waited for the round's MASTER_ADDR")
    assert v1.cause.startswith("rendezvous round 1: this agent, new in that round, waited for "
                               "the round's MASTER_ADDR, which the rank-0 agent agent:node0")


def test_a_first_round_store_wait_is_not_the_scale_up_deadlock(obs):
    a1 = obs.rank("agent:node1", reached="init", end=19.2, role="agent", host="node1",
                  exc=obs.exc("DistStoreError", ROUND_KEYS.replace(".1/", ".0/") + "MASTER_ADDR"))
    a0 = obs.rank("agent:node0", reached="init", end=19.4, role="agent", host="node0",
                  exc=obs.exc("DistStoreError", ROUND_KEYS.replace(".1/", ".0/")
                              + "torchelastic/role_info/1"))
    run = obs.run(a0, a1)
    for v in explain_run(run, classify_run(run)):
        assert "scale-up" not in v.cause


def test_a_connect_timeout_behind_a_silenced_name_server_is_the_reverse_lookup(obs):
    from harness.judge.observation import StepRecord
    r1 = obs.rank("1", reached="init", end=10.0, exc=obs.exc("DistNetworkError", CLIENT))
    r1.stderr_tail = "[W] socket.cpp] The hostname of the client socket cannot be retrieved. err=-3"
    step = StepRecord(step="dns1", t=0.0, fault="dns_server", action="do", target="dns",
                      what="the server is frozen (SIGSTOP)")
    _, (v1,) = _run(obs, r1, step_log=[step])
    assert v1.cause.startswith("c10d's reverse lookup of its store peer hung on the name server")
    _, (plain,) = _run(obs, obs.rank("1", reached="init", end=10.0,
                                     exc=obs.exc("DistNetworkError", CLIENT)), step_log=[step])
    assert "reverse lookup" not in plain.cause


def _in_step(obs, label, step, **kw):
    """A rank whose last phase is workload step 2, named ``step``."""
    d = obs.rank_dict(label, reached="workload step 2", **kw)
    for e in d["events"]:
        if e.get("phase") == "workload step 2":
            e["step"] = step
    from harness.judge.observation import RankObservation
    return RankObservation.from_dict(d)


FAILED_RECV = "Failed to recv, got 0 bytes. Connection was likely closed."


def test_a_reinit_on_the_same_port_that_met_the_old_store_going_away(obs):
    r0 = _in_step(obs, "0", "reinit", end=6.0, exc=obs.exc("DistStoreError", JOINED))
    r1 = _in_step(obs, "1", "reinit", end=0.1, exc=obs.exc("DistNetworkError", FAILED_RECV))
    _, (v0, v1) = _run(obs, r0, r1)
    assert v1.cause.startswith("in its re-init (workload step 2) it dialled MASTER_PORT 29500 "
                               "again while the old store on that port was going away")
    assert v0.cause.startswith("waited for 1 of 2 clients: rank 1 never reached it: in its "
                               "re-init")
    r1 = _in_step(obs, "1", "reinit new_port", end=0.1,
                  exc=obs.exc("DistNetworkError", FAILED_RECV))
    _, (v1,) = _run(obs, r1)
    assert "re-init" not in v1.cause


# gloo's errors name its source file: peer_died reads that to tell them from the store's
PAIR = "/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc"
GLOO_CONNECT_TIMEOUT = ("Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/"
                        "tcp/pair.h:311] Connect timeout [none]")


def test_a_reinit_that_joined_the_old_store_and_read_its_gloo_keys(obs):
    # catalog run of 2026-11-26 (-n 4): rank 1's new client reached rank 0's old store before
    # the destroy closed it, read the old pair addresses and waited out gloo's connect timeout;
    # rank 0's new store on the same port waited for it in vain
    r0 = _in_step(obs, "0", "reinit", end=6.4, exc=obs.exc("DistStoreError", JOINED))
    r1 = _in_step(obs, "1", "reinit", end=25.4, exc=obs.exc("RuntimeError", GLOO_CONNECT_TIMEOUT))
    _, (v0, v1) = _run(obs, r0, r1)
    assert v1.cause.startswith("in its re-init (workload step 2) its client reached the old "
                               "store on MASTER_PORT 29500 before rank 0's destroy closed it")
    assert v0.cause.startswith("waited for 1 of 2 clients: rank 1 never reached it: in its "
                               "re-init (workload step 2) its client reached the old store")
    # a rank that re-initialises alone (its peer went on with the old group) is out of step
    r0 = _in_step(obs, "0", "all_reduce", end=1.0, exc=obs.exc("RuntimeError", "Connection "
                                                                   "closed by peer"))
    r1 = _in_step(obs, "1", "reinit", end=25.4, exc=obs.exc("RuntimeError", GLOO_CONNECT_TIMEOUT))
    _, (_, v1) = _run(obs, r0, r1)
    assert "reached the old store" not in v1.cause
    # the same message outside a re-init is not this cause
    r1 = obs.rank("1", reached="init", end=25.4,
                  exc=obs.exc("RuntimeError", GLOO_CONNECT_TIMEOUT))
    _, (v1,) = _run(obs, r1)
    assert "re-init" not in v1.cause


def test_a_peer_that_reinitialised_closed_this_ranks_pair(obs):
    r0 = obs.rank("0", reached="workload step 2", end=1.0,
                  exc=obs.exc("RuntimeError", f"[{PAIR}:553] Connection closed by peer "
                              "[127.0.0.1]:7565"))
    r1 = _in_step(obs, "1", "reinit", end=2.0, killed_at_deadline=True)
    _, (v0, _) = _run(obs, r0, r1)
    assert v0.cause.startswith("its gloo connection to rank 1 was closed: rank 1 destroyed the "
                               "process group to initialise a new one")


def test_a_client_late_for_a_store_whose_job_had_finished(obs):
    r0 = obs.rank("0", end=2.9)
    r2 = obs.rank("2", reached="init", end=13.0,
                  exc=obs.exc("DistNetworkError", CLIENT))
    _, (_, v2) = _run(obs, r0, r2)
    assert v2.cause.startswith("the store's host, rank 0, had finished its job (ok at")


def test_a_redundant_agent_that_torchs_launcher_failed_on(obs):
    bug = "'NoneType' object has no attribute 'is_failed'"
    a0 = obs.rank("agent:node0", reached="init", end=4.5, role="agent",
                  exc=obs.exc("RuntimeError", bug))
    a1 = obs.rank("agent:node1", reached="init", end=5.2, role="agent")
    run = obs.run(a0, a1)
    v0, _ = explain_run(run, classify_run(run))
    assert v0.cause.startswith("one of 2 agents of a rendezvous that admits fewer")
    assert "RendezvousGracefulExitError" in v0.cause


def test_a_restarted_worker_that_read_the_last_attempts_keys_and_its_agent(obs):
    """one_restart (the agents' shared store): 0@1 fails in init dialling the previous
    attempt's pair; the agent's root cause rank 0 is 0@1, not the first attempt's rank 0."""
    mesh = ("Gloo connectFullMesh failed with [pair.cc:152] timed out connecting: SO_ERROR: "
            "Connection refused, remote=[127.0.0.1]:1453")
    r0 = obs.rank("0", reached="workload step 2", end=1.9, role="worker", node="agent:local",
                  returncode=-15, result=False)
    r01 = obs.rank("0@1", reached="init", end=3.7, role="worker", node="agent:local",
                   attempt=1, exc=obs.exc("RuntimeError", mesh))
    for r, rank in ((r0, 0), (r01, 0)):
        r.info.update(rank=rank, use_agent_store="True")
    agent = obs.rank("agent:local", reached="init", end=4.3, role="agent",
                     exc=obs.exc("RuntimeError", "ChildFailedError"))
    run = obs.run(agent, r0, r01)
    vs = {v.label: v for v in classify_run(run)}
    vs["agent:local"].root_cause = 0
    explain_run(run, list(vs.values()))
    assert vs["0@1"].cause.startswith("a worker of restart 1: its gloo mesh dialled a pair "
                                      "address the previous attempt published")
    assert vs["agent:local"].cause.startswith("its worker rank 0 failed first: a worker of "
                                              "restart 1")


def _kept(name):
    """A real run's observation, kept from the catalog run that showed it: an entry of the
    diagnosis corpus (tests/data/diagnosis/, tests/test_diagnosis_corpus.py)."""
    import json
    from pathlib import Path

    from harness.judge.observation import RunObservation

    path = Path(__file__).parent / "data" / "diagnosis" / name
    return RunObservation.from_dict(json.loads(path.read_text())["observation"])


def _own_store_run(obs, share_store):
    """torchrun_restart_phases killed_in_init_own_store as watched (catalog run of 2026-11-26):
    worker 0 SIGKILLed in init; worker 1, a client of the store worker 0 hosted, lost it."""
    w0 = obs.rank("0", reached="init", end=0.89, role="worker", node="agent:local",
                  returncode=-9, result=False)
    w1 = obs.rank("1", reached="init", end=0.948, role="worker", node="agent:local",
                  exc=obs.exc("DistNetworkError", FAILED_RECV))
    w01 = obs.rank("0@1", end=4.7, role="worker", node="agent:local", attempt=1)
    w11 = obs.rank("1@1", end=4.7, role="worker", node="agent:local", attempt=1)
    agent = obs.rank("agent:local", end=5.7, role="agent")
    run = obs.run(agent, w0, w1, w01, w11)
    run.plan["launcher"] = {"kind": "torchrun", "max_restarts": 1}
    # what the agent ran with (share_store: false, or an environment's value passed on)
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} if not share_store else {}
    run.plan["ranks"] = [{"label": "agent:local", "env": env}]
    return {v.label: v for v in explain_run(run, classify_run(run))}


def test_a_worker_that_lost_the_store_its_own_rank_0_hosted(obs):
    vs = _own_store_run(obs, share_store=False)
    assert vs["1"].cause.startswith("the store's host, rank 0, had ended (crash) at 0.9")
    # with the agents' shared store, worker 0 hosted no store: not this cause
    vs = _own_store_run(obs, share_store=True)
    assert not vs["1"].cause.startswith("the store's host")


CLOSED_BY = ("Gloo connectFullMesh failed with [pair.cc:553] Connection closed by peer "
             "[127.0.0.1]:30951")


def test_a_peer_that_finished_and_exited_closed_the_pair_of_a_rank_still_in_init(obs):
    # subgroups non_member_skips_new_group, as watched: rank 2 skipped its work and exited ok
    # while rank 0 was still connecting its mesh; rank 1 raised only later (it is not the cause)
    r0 = obs.rank("0", reached="init", end=0.07, exc=obs.exc("RuntimeError", CLOSED_BY))
    r1 = obs.rank("1", reached="workload step 1", end=0.27,
                  exc=obs.exc("DistNetworkError", FAILED_RECV))
    r2 = obs.rank("2", end=0.06)
    _, (v0, v1, _) = _run(obs, r0, r1, r2)
    assert v0.cause.startswith("its gloo connection to rank 2 ([127.0.0.1]:30951) was closed: "
                               "rank 2 had finished its work and exited (ok) at 0.06 s while "
                               "this rank was still in init")
    # rank 1, a store client after init, lost the store when its host (rank 0) failed
    assert v1.cause.startswith("the store's host, rank 0, had ended (error) at 0.07 s and its "
                               "store with it: its gloo connection to rank 2")


def test_a_failed_peer_that_ended_before_is_preferred_to_one_inside_the_slack(obs):
    msg = f"[{PAIR}:537] Read error [10.0.0.2]:46287: Connection reset by peer"
    r2 = obs.rank("2", reached="workload step 1", addr="10.0.0.2", end=1.073,
                  exc=obs.exc("RuntimeError", msg))
    r4 = obs.rank("4", reached="workload step 1", addr="10.0.0.2", end=1.101,
                  exc=obs.exc("RuntimeError", msg))
    r6 = obs.rank("6", reached="workload step 1", addr="10.0.0.2", end=1.087,
                  exc=obs.exc("RuntimeError", msg))
    _, (_, _, v6) = _run(obs, r2, r4, r6)
    assert v6.cause.startswith("its gloo connection to rank 2 ([10.0.0.2]:46287) was closed: "
                               "rank 2 had ended (error) at 1.073 s")


def test_a_gloo_error_after_init_is_not_blamed_on_the_store(obs):
    msg = f"[{PAIR}:537] Read error [127.0.0.1]:4000: Connection reset by peer"
    r0 = obs.rank("0", reached="init", end=0.07, exc=obs.exc("RuntimeError", CLOSED_BY))
    r1 = obs.rank("1", reached="workload step 1", end=0.27, exc=obs.exc("RuntimeError", msg))
    _, (_, v1) = _run(obs, r0, r1)
    assert not v1.cause.startswith("the store's host")


def test_a_reset_on_the_stores_socket_is_not_a_gloo_pair(obs):
    """net-proxy-faults slicer_store_tolerated, as watched (kept in the corpus too): rank 0's
    store client was reset through the proxy while rank 1 timed out waiting for its key; the
    same words on a TCPStore socket are not gloo's, so no peer is blamed for them."""
    r0 = obs.rank("0", reached="init", end=15.2,
                  exc=obs.exc("DistNetworkError", "Connection reset by peer"))
    r1 = obs.rank("1", reached="init", end=15.05,
                  exc=obs.exc("DistStoreError", "wait timeout after 15000ms, keys: /k"))
    _, (v0, _) = _run(obs, r0, r1)
    assert not v0.cause.startswith("its gloo connection")
    msg = f"[{PAIR}:537] Read error [127.0.0.1]:4000: Connection reset by peer"
    r0 = obs.rank("0", reached="init", end=15.2, exc=obs.exc("RuntimeError", msg))
    _, (v0, _) = _run(obs, r0, r1)
    assert v0.cause.startswith("its gloo connection to rank 1")


def test_a_stale_file_store_is_named_for_the_rank_it_sent_to_a_dead_address(obs):
    from harness.judge.observation import StepRecord

    msg = ("Gloo connectFullMesh failed with [pair.cc:152] timed out connecting: SO_ERROR: "
           "Connection refused, remote=[127.0.0.1]:16257")
    r1 = obs.rank("1", reached="init", end=0.04, exc=obs.exc("RuntimeError", msg))
    run = obs.run(r1)
    run.plan.update({"master_port": 29500, "ranks": [
        {"label": "1", "env": {}, "init": {"method": "file", "url": "file:///tmp/x/pg"}}]})
    run.step_log = [StepRecord("file_init#1", "file_init", "do",
                               "leave a stale FileStore at /tmp/x/pg", "", 0.0)]
    v = explain_run(run, classify_run(run))[0]
    assert v.cause.startswith("gloo's full mesh dialled [127.0.0.1]:16257 and was refused: the "
                              "file store file:///tmp/x/pg was left by a killed earlier job")
    run.step_log = []   # no stale file in this run: not said
    assert "stale" not in explain_run(run, classify_run(run))[0].cause


def test_a_listen_queue_the_scenario_shrank_and_that_overflowed_is_named(obs):
    msg = "[unbound_buffer.cc:78] Timed out waiting 10000ms for recv operation to complete"
    r1 = obs.rank("1", reached="workload step 1", end=11.1, exc=obs.exc("RuntimeError", msg))
    run, _ = _run(obs, r1)
    run.plan["hosts"] = [{"name": "node0", "machine": {"sysctl": {
        "net.core.somaxconn": "1", "net.ipv4.tcp_abort_on_overflow": "1"}}}, {"name": "node1"}]
    run.counters = {"node0": {"TcpExt.ListenOverflows": 14, "TcpExt.ListenDrops": 14}}
    v = explain_run(run, classify_run(run))[0]
    assert v.cause.startswith("node0's listen queue overflowed (TcpExt.ListenOverflows 14, "
                              "ListenDrops 14; the scenario's sysctl net.core.somaxconn=1, "
                              "net.ipv4.tcp_abort_on_overflow=1)")
    run.counters = {"node0": {"TcpExt.ListenOverflows": 0}}   # it did not overflow: not said
    assert "listen queue" not in explain_run(run, classify_run(run))[0].cause


def test_a_rank_hung_in_a_collective_after_its_one_failed_peer_died(obs):
    kill = [{"signal": "SIGKILL", "t": 0.025, "by": "fault"}]
    r0 = _in_step(obs, "0", "group_all_reduce", end=30.0, killed_at_deadline=True)
    r2 = obs.rank("2", reached="workload step 1", end=0.07, returncode=-9, result=False,
                  signals=kill)
    run, _ = _run(obs, r0, r2)
    run.plan["ranks"][0]["env"]["TORCH_GLOO_LAZY_INIT"] = "1"
    v0 = explain_run(run, classify_run(run))[0]
    assert v0.outcome == "hang"
    assert v0.cause.startswith("waited in workload step 2 for rank 2, which had ended (crash) "
                               "at 0.025 s")
    assert "TORCH_GLOO_LAZY_INIT=1" in v0.cause


def test_a_monitored_barrier_failed_on_a_dead_rank_names_the_death_not_a_wait(obs):
    # gloo's monitoredBarrier (wait_all_ranks) reads the same whether rank 1 never came in 5 s
    # or had been killed: a recv from a dead peer fails at once and torch drops that error
    msg = "[Rank 0]: Ranks 1 failed to pass monitoredBarrier in 5000 ms"
    kill = [{"signal": "SIGKILL", "t": 0.85, "by": "fault"}]
    r0 = obs.rank("0", reached="workload step 2", end=0.9, exc=obs.exc("RuntimeError", msg))
    r1 = obs.rank("1", reached="workload step 1", end=0.95, returncode=-9, result=False,
                  signals=kill)
    run, (v0, _) = _run(obs, r0, r1)
    assert v0.outcome == "timeout"          # the classifier's table: the words are a wait's
    assert v0.cause.startswith("its monitored_barrier failed before its 5 s were up, on a rank "
                               "that could no longer come: rank 1 had died at 0.85 s: killed by "
                               "SIGKILL"), v0.cause
    # the same words after a frozen (alive) rank 1: a wait, not this rule
    r1 = obs.rank("1", reached="workload step 1", end=20.0, killed_at_deadline=True,
                  signals=[{"signal": "SIGSTOP", "t": 0.85, "by": "fault"}])
    r0 = obs.rank("0", reached="workload step 2", end=5.9, exc=obs.exc("RuntimeError", msg))
    _, (v0, _) = _run(obs, r0, r1)
    assert "monitored_barrier failed before" not in v0.cause
    assert v0.cause.startswith("waited in workload step 2 for rank 1, frozen by SIGSTOP")


def test_a_rank_starved_of_cpu_before_it_reached_the_store_is_named_by_both(obs):
    from harness.judge.observation import StepRecord

    r0 = obs.rank("0", reached="init", end=6.0, exc=obs.exc("DistStoreError", JOINED))
    r1 = obs.rank("1", reached="init", end=15.4, exc=obs.exc("DistNetworkError", CLIENT))
    run, _ = _run(obs, r0, r1)
    run.step_log = [StepRecord("cpu_contention#1", "cpu_contention", "do",
                               "pin rank 1 to the busy processes' CPU", "rank 1", 0.0)]
    v0, v1 = explain_run(run, classify_run(run))
    assert v0.cause == ("waited for 1 of 2 clients: rank 1 never reached it: it was starved of "
                        "CPU (the scenario's cpu_contention fault: pin rank 1 to the busy "
                        "processes' CPU)")
    assert v1.cause.startswith("starved of CPU by the scenario's cpu_contention fault (pin rank "
                               "1 to the busy processes' CPU), it was still in init when the "
                               "others had given up: the store's host, rank 0, had ended")


def test_a_late_agent_meeting_a_closed_rendezvous_names_the_agent_that_closed_it(obs):
    a0 = obs.rank("agent:node0", reached="init", end=11.7, role="agent", host="node0")
    a1 = obs.rank("agent:node1", reached="init", end=8.3, role="agent", host="node1",
                  exc=obs.exc("RuntimeError", "The rendezvous 'x' is closed"))
    a1.released_at = 8.0
    w0 = obs.rank("0", end=8.1, role="worker", host="node0", node="agent:node0")
    run = obs.run(a0, a1, w0)
    run.plan.update({"ranks": []})
    vs = classify_run(run)
    for v in vs:   # the exception class a real agent raises
        if v.label == "agent:node1":
            v.exception = "RendezvousClosedError"
    a1v = next(v for v in explain_run(run, vs) if v.label == "agent:node1")
    assert a1v.cause.startswith("the rendezvous was already closed: agent:node0 had run its "
                                "job to the end (its workers ended by 8.14 s)")


def test_an_unresolved_name_says_what_the_runs_name_server_was_made_to_answer(obs):
    from harness.judge.observation import StepRecord

    r1 = obs.rank("1", reached="init", end=9.0, exc=obs.exc("DistNetworkError", CLIENT))
    r1.stderr_tail = "(gai error: -2 - Name or service not known)\n"
    run, _ = _run(obs, r1)
    run.step_log = [StepRecord("dns_name#1", "dns_name", "do", "dns: master.cluster.test -> "
                               "SERVFAIL", "dns", 0.0)]
    v = explain_run(run, classify_run(run))[0]
    assert v.cause == ("a name did not resolve (MASTER_ADDR=127.0.0.1): the run's name server: "
                       "master.cluster.test -> SERVFAIL (the scenario's dns_name fault, from 0 s)")
    run.step_log.append(StepRecord("dns_name#1", "dns_name", "undo", "", "dns", 3.0))
    assert explain_run(run, classify_run(run))[0].cause == \
        "a name did not resolve (MASTER_ADDR=127.0.0.1)"   # healed before this rank gave up


def test_ranks_that_called_different_collectives_are_named_with_their_calls(obs):
    msg = "[unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation to complete"
    runs = []
    for label, op in (("0", "barrier"), ("1", "all_reduce")):
        d = obs.rank_dict(label, reached="init", end=5.7, exc=obs.exc("RuntimeError", msg))
        for e in d["events"]:
            if e.get("ev") == "result":
                e["phase"] = "collective 1"
        d["events"].insert(-1, {"ev": "phase", "t": obs.t0 + 0.5, "phase": "collective 1",
                                "op": op})
        from harness.judge.observation import RankObservation
        runs.append(RankObservation.from_dict(d))
    _, (v0, v1) = _run(obs, *runs)
    assert v0.phase == "collective 1"
    assert v0.cause.startswith("the ranks called different collectives at their collective 1 "
                               "(rank 0 barrier, rank 1 all_reduce: a rank-dependent branch")
    runs[1].events[-2].data["op"] = "barrier"   # the same call on both: not said
    _, (v0, _) = _run(obs, *runs)
    assert "different collectives" not in v0.cause


def test_ddp_parameters_that_got_no_gradient_are_named(obs):
    msg = ("Expected to have finished reduction in the prior iteration before starting a new "
           "one. ...\nParameter indices which did not receive grad for rank 1: 2 3\n In addition")
    v = _told(obs, obs.exc("RuntimeError", msg), {}, reached="workload step 1")
    assert v.cause.startswith("DDP's previous step never finished its reduction: some "
                              "parameters took no part in this rank's loss (parameters 2 3 got "
                              "no gradient on rank 1)")


NO_ROUTE = ("Gloo connectFullMesh failed with [.../pair.cc:152] timed out connecting: SO_ERROR: "
            "No route to host, remote=[10.9.0.1]:41383$1")


def test_a_gloo_pair_dialling_a_second_cards_address_names_the_card_on_both_sides(obs):
    from harness.judge.observation import StepRecord

    r0 = obs.rank("0", reached="init", end=29.0, exc=obs.exc("RuntimeError", WAITED),
                  host="node0", addr="10.0.0.1")
    r1 = obs.rank("1", reached="init", end=10.0, exc=obs.exc("RuntimeError", NO_ROUTE),
                  host="node1", addr="10.0.0.2")
    run = obs.run(r0, r1)
    run.plan.update({"master_port": 29500, "hosts": [{"name": "node0", "addr": "10.0.0.1"},
                                                     {"name": "node1", "addr": "10.0.0.2"}],
                     "ranks": [{"label": r, "env": {"RANK": r, "GLOO_SOCKET_IFNAME": "eth1"}}
                               for r in ("0", "1")]})
    run.step_log = [StepRecord(f"second_nic#{i}", "second_nic", "do", f"add eth1 (up) on {h}",
                               f"host {h}", 0.0, info={"addr": a})
                    for i, (h, a) in enumerate((("node0", "10.9.0.1"), ("node1", "10.9.0.2")))]
    v0, v1 = explain_run(run, classify_run(run))
    assert v1.cause == ("its gloo pair dialled 10.9.0.1:41383, the address of host node0's "
                        "second card eth1, on a network no other host is on (No route to "
                        "host): rank 0 advertised it (GLOO_SOCKET_IFNAME=eth1)")
    assert v0.cause.startswith("gloo's full mesh never connected: rank 1 dialled "
                               "10.9.0.1:41383, the address this rank advertised on node0's "
                               "second card eth1 (GLOO_SOCKET_IFNAME=eth1)")
    assert "node0 eth1: 10.9.0.1" in v1.cause_evidence


def test_a_name_the_ranks_own_hosts_file_does_not_list_is_said_unresolved_there(obs):
    msg = "The client socket has timed out after 10000ms while trying to connect to (node0, 42889)."
    r1 = obs.rank("1", reached="init", end=12.9, host="node1",
                  exc=obs.exc("DistNetworkError", msg))
    run, _ = _run(obs, r1)
    run.plan["master_port"] = 20512
    run.plan["hosts"] = [{"name": "node0", "machine": {"hostname": "node0", "entries": {
        "node0": ["10.0.0.1"], "node1": ["10.0.0.2"]}}},
        {"name": "node1", "machine": {"hostname": "node1", "entries": {"node1": ["10.0.0.2"]}}}]
    v = explain_run(run, classify_run(run))[0]
    assert v.cause.startswith("it dialled node0, a name host node1's hosts file does not list "
                              "(it knows node1; the run has no name server)")


def test_a_second_jobs_rank_that_joined_the_first_jobs_store_is_said_so(obs):
    msg = "[unbound_buffer.cc:78] Timed out waiting 2000ms for recv operation to complete"
    a0 = obs.rank("0", end=3.5)
    a1 = obs.rank("1", end=3.5)
    b0 = obs.rank("job2:0", reached="init", end=1.04, exc=obs.exc("DistNetworkError", IN_USE))
    b1 = obs.rank("job2:1", reached="workload step 1", end=3.03,
                  exc=obs.exc("RuntimeError", msg))
    run, _ = _run(obs, a0, a1, b0, b1)
    run.plan["ranks"][2]["env"]["RANK"] = "0"
    run.plan["ranks"][3]["env"]["RANK"] = "1"
    v = explain_run(run, classify_run(run))[3]
    assert v.cause.startswith("it joined another job's store: its own rank 0 (job2:0) could not "
                              "start one on port 29500 (EADDRINUSE at 1.04 s)")


def test_an_agent_that_dialled_the_rendezvous_store_as_its_host_ended():
    """torchrun_rendezvous scale_up_own_store as watched in a catalog run (2026-11-26, -n 4):
    agent:node1 (8 s late) dialled node0's rendezvous store 0.1 s after agent:node0 had
    finished its job and entered exit; agent:node0 ended before any socket snapshot, so its
    completed rendezvous on that endpoint shows it hosted the store. The observation is the
    real one, kept from that run."""
    run = _kept("scale_up_own_store_node1_after_node0_ended.json")
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    assert vs["agent:node1"].cause.startswith(
        "lost the rendezvous store at 10.213.53.1:27143: its host, agent:node0, had ended (ok) "
        "at 8.311 s (it was in exit from 7.92 s, when this agent dialled at 8.03 s)")
    # without the host's completed rendezvous nothing shows it hosted the store: no guess
    for o in run.ranks:
        if o.label == "agent:node0":
            o.events = [e for e in o.events if e.ev != "rendezvous_done"]
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    assert not vs["agent:node1"].cause.startswith("lost the rendezvous store")


def test_an_agents_first_failed_worker_when_torchrun_names_the_one_it_took_down():
    """program_ddp crash_in_step_3_torchrun as watched (catalog run of 2026-11-26, -n 4): rank 1
    exited with status 3, rank 0's gloo pair closed 0.011 s later; torchrun reaped both in one
    monitor pass and named rank 0 as its root cause. The observation is the real one."""
    run = _kept("crash_in_step_3_torchrun_root_cause_rank_0.json")
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    assert vs["agent:local"].root_cause == 0
    assert vs["agent:local"].cause.startswith(
        "its worker rank 1 failed first: the program itself exited with status 3 in train step 3")
    assert "torchrun's report names rank 0, which failed 0.011 s later" in vs["agent:local"].cause


def test_a_restarted_worker_whose_pair_closed_names_its_own_attempts_peer():
    """torchrun_restarts one_restart as watched (catalog run of 2026-11-27, -n 4): after the
    restart, 1@1 dialled a pair address the first attempt had published and failed in init
    (11.396 s); 0@1, through init, got "Read error ... Connection reset by peer" from 1@1's
    pair. The first attempt's workers (killed, stopped) had ended long before, and are not
    its peers: the cause names 1@1. The observation is the real one."""
    run = _kept("one_restart_worker_0_met_its_failed_peer.json")
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    assert vs["0@1"].cause.startswith("its gloo connection to rank 1@1 ([127.0.0.1]:34223) was "
                                      "closed: rank 1@1 had ended (error) at 11.396 s: a worker "
                                      "of restart 1: its gloo mesh dialled a pair address"), \
        vs["0@1"].cause
    assert vs["agent:local"].cause.startswith("its worker rank 1 failed first: a worker of "
                                              "restart 1")


def test_a_worker_stopped_for_a_restart_logged_just_after_its_reap_is_stopped_to_restart():
    """torchrun_restarts one_restart as watched (catalog run of 2026-11-27, -n 4): the agent
    reaped rank 0's SIGTERM at 3.0946 s and logged the restart 0.5 ms later (3.0951 s); rounded
    to 10 ms the two read 3.09 and 3.10, and the rule took the agent's final failure as why rank
    0 was stopped. The observation is the real one."""
    run = _kept("one_restart_stopped_for_the_restart_0_5_ms_before.json")
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    assert vs["0"].cause.startswith("stopped by its agent agent:local in workload step 3 to "
                                    "restart its workers (restart 1 at 3.1 s) after rank 1 "
                                    "failed: killed by SIGKILL"), vs["0"].cause


def test_a_mesh_that_waited_for_a_peer_which_gave_up_waiting_for_this_ranks_key():
    """net_gloo_connect_timeout late_by_the_timeout_three_hosts as watched (fresh-clone catalog,
    2026-11-26): rank 1 gave up in the store waiting for rank 0's key (2 s), rank 0 then waited
    for its pair with rank 1 until gloo's Connect timeout (12 s). No fault acted on the run.
    The observation is the real one."""
    run = _kept("late_by_the_timeout_rank_2_through_init.json")
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    assert vs["0"].cause.startswith("gloo's full mesh never connected: rank 1 gave up (timeout) "
                                    "in init at 2.027 s (waited 2 s for rank 0's key")
    # a fault step in the run (a proxy's delay, say) has its own rule: not this one
    from harness.judge.observation import StepRecord
    run.step_log = [StepRecord(step="lat", t=0.0, fault="latency", action="do", target="a",
                               what="delay 200 ms")]
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    assert "gave up (timeout)" not in vs["0"].cause


def test_a_redundant_agent_on_the_store_hosts_node_is_redundant_not_just_storeless():
    """slurm torchrun_two_agents_per_node as watched (catalog run of 2026-11-26, -n 4): four
    agents for --nnodes 2; agent:node0#2, on the store host's node, lost the store when the
    job finished. Its cause is the redundancy (why the host went away), like its twin's on
    node1, not only the lost store. The observation is the real one."""
    run = _kept("redundant_agent_on_the_store_hosts_node.json")
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    for label in ("agent:node0#2", "agent:node1#2"):
        assert vs[label].cause.startswith("one of 4 agents of a rendezvous that admits 2: it "
                                          "waited as a redundant node"), vs[label].cause


def test_a_stale_file_store_whose_mesh_timed_out_is_the_stale_file():
    """file_init stale_file as watched (catalog run of 2026-11-26, -n 4): both ranks timed out
    in init with gloo's "Connect timeout [none]" (10 s, 5x the 2 s timeout) instead of the
    refused connect: the same stale file, read the slow way. The observation is the real one."""
    run = _kept("stale_file_connect_timeout.json")
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    for label in ("0", "1"):
        assert vs[label].outcome == "timeout"
        assert vs[label].cause.startswith("gloo's full mesh never connected (gloo's connect "
                                          "timeout): the file store"), vs[label].cause
        assert "left by a killed earlier job (the scenario's file_init stale_file fault)" \
            in vs[label].cause
    # without the scenario's stale file it is not this rule's to say
    run.step_log = [s for s in run.step_log if not (s.what or "").startswith("leave a stale")]
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    assert "stale_file" not in (vs["0"].cause or "")


def test_a_reinit_whose_pairs_joined_the_old_group_fails_in_the_next_collective():
    """reinit tcp_same_port as watched (catalog run of 2026-11-26, -n 4): rank 1's re-init went
    through in a few ms on the old store and the old group's gloo keys; its next all_reduce got
    "Connection reset by peer" as rank 0's destroy closed the old pairs, and rank 0's new store
    timed out waiting for it. The observation is the real one."""
    run = _kept("reinit_pairs_joined_the_old_group.json")
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    assert vs["1"].cause.startswith("in its re-init (workload step 2) its client reached the old "
                                    "store on MASTER_PORT"), vs["1"].cause
    assert "its pairs joined rank 0's old group" in vs["1"].cause
    assert "its next collective (workload step 3) failed" in vs["1"].cause
    assert vs["0"].cause.startswith("waited for 1 of 2 clients: rank 1 never reached it: in its "
                                    "re-init (workload step 2) its client reached the old store")


def test_a_kept_store_reinit_whose_pairs_joined_the_old_group():
    """reinit store_kept_same_port as watched (the -n auto catalog run of 2026-11-26): rank 0's
    re-init read the old keys from the store the program kept, its pairs joined rank 1's old
    group and its next all_reduce was reset, while rank 1 waited out gloo's connect timeout in
    its own re-init. The observation is the real one."""
    run = _kept("reinit_kept_store_pairs_joined_the_old_group.json")
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    assert vs["0"].cause.startswith("in its re-init (workload step 3) the new group read the old "
                                    "group's gloo addresses from the store the program kept"), \
        vs["0"].cause
    assert "its pairs joined rank 1's old group" in vs["0"].cause
    assert vs["1"].cause.startswith("in its re-init (workload step 3) the new group read the old")


def test_nccl_ranks_on_one_gpu_on_a_real_h200_run():
    """nccl two_ranks_share_one_gpu as watched on an H200 (torch 2.11.0+cu130, NCCL 2.28.9, 4
    of 4 runs): both ranks given LOCAL_RANK=0, NCCL refuses the communicator at the first
    collective with "Duplicate GPU detected". The observation is the real one."""
    run = _kept("nccl_two_ranks_share_one_gpu_h200.json")
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    for label in ("0", "1"):
        assert (vs[label].outcome, vs[label].phase) == ("error", "workload step 1")
        assert vs[label].cause.startswith("ranks 0 and 1 are both on CUDA device 60 (both were "
                                          "given LOCAL_RANK=0): NCCL needs one GPU per rank"), \
            vs[label].cause
    # ranks given their own LOCAL_RANK, yet on one device (a program that never set it): the
    # cause does not blame LOCAL_RANK
    for r in run.plan["ranks"]:
        r["env"]["LOCAL_RANK"] = r["label"]
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    assert vs["0"].cause.startswith("ranks 0 and 1 are both on CUDA device 60: NCCL needs"), \
        vs["0"].cause


def test_nccl_without_an_interface_on_a_real_h200_run():
    """nccl wrong_interface as watched on an H200 (4 of 4 runs): NCCL_SOCKET_IFNAME=nosuch0,
    NCCL's bootstrap finds no interface at the first collective. The observation is real."""
    run = _kept("nccl_wrong_interface_h200.json")
    (v,) = explain_run(run, classify_run(run))
    assert v.cause == ("NCCL found no network interface to bootstrap on in workload step 1: "
                       "NCCL_SOCKET_IFNAME=nosuch0 matches none of this machine's interfaces")
    assert "Bootstrap : no socket interface found" in " ".join(v.cause_evidence)


def test_a_failed_worker_the_supervisor_saw_end_just_after_the_restart_still_failed_first():
    """The same real run as above, with worker 1's end as the supervisor saw it moved to 9 ms
    after the agent's restart event (3.0952 s): a loaded supervisor notices an end late. The
    restart still followed rank 1's failure; rounded to 10 ms (3.10 against 3.104) the rule
    read "none of its workers had failed". Times are compared unrounded, 10 ms apart at most."""
    run = _kept("one_restart_stopped_for_the_restart_0_5_ms_before.json")
    w1 = next(r for r in run.ranks if r.label == "1")
    w1.ended_at = 3.104
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    assert "after rank 1 failed" in vs["0"].cause, vs["0"].cause
    assert "none of its workers had failed" not in vs["0"].cause


def test_the_scale_up_deadlock_is_named_though_the_rank_0_agents_first_worker_ended_ok():
    """torchrun_rendezvous scale_up as watched (catalog run of 2026-11-27, -n 4, 1 in 33): node0's
    round-0 worker ended ok at 9.3 s before node1 joined, so every worker of agent:node0 was ok
    and the generic "after all its workers had ended ok" rule named the agent's timeout; the
    timeout is the round-1 deadlock (node0 waits for node1's role info, node1 for the round's
    MASTER_ADDR node0 never writes). The observation is the real one."""
    run = _kept("scale_up_round_0_worker_ended_ok.json")
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    assert vs["agent:node0"].cause.startswith(
        "rendezvous round 1: this rank-0 agent waited for the role info of agent:node1"), \
        vs["agent:node0"].cause
    assert vs["agent:node1"].cause.startswith("rendezvous round 1: this agent, new in that round")


# -- the hang path with torch's default timeouts: live evidence at the deadline --------------------
def _hang_kept(name):
    """A real run of scenarios/hang-defaults.yaml (timeout 1800, deadline 20), kept trimmed
    (the rows' native threads, sockets, stderr lines; no faulthandler text)."""
    run = _kept(f"hang_defaults_{name}.json")
    return run, {v.label: v for v in explain_run(run, classify_run(run))}


def test_hang_wrong_port_names_both_ports_from_the_live_stacks_and_sockets():
    run, vs = _hang_kept("wrong_port")
    store, told = run.plan["store"]["port"], run.plan["ranks"][1]["env"]["MASTER_PORT"]
    assert vs["1"].cause.startswith(f"dials port {told} (its MASTER_PORT), where no store "
                                    f"listens (the store's port is {store}: rank 0 listens "
                                    "there); it retries until the client's timeout (1800 s")
    assert vs["0"].cause == f"waiting for 1 of 2 clients at the deadline: rank 1 dials port " \
        f"{told} (its MASTER_PORT), not {store}"
    assert vs["0"].cause_evidence[-1].startswith(f"its store on port {store}: 1 of 2 clients")


def test_hang_rules_read_the_native_stack_not_the_plan_alone():
    run, _ = _hang_kept("wrong_port")
    for o in run.ranks:
        o.native_threads = []      # no stack taken: the plan's env says nothing about a hang
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    assert vs["0"].cause.startswith("unknown") and vs["1"].cause.startswith("unknown")


def test_hang_a_dialler_whose_port_has_a_listener_is_not_explained():
    run, _ = _hang_kept("wrong_port")
    told = int(run.plan["ranks"][1]["env"]["MASTER_PORT"])
    run.ranks[0].sockets.append(SocketRecord("LISTEN", f"0.0.0.0:{told}", "0.0.0.0:0"))
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    assert not vs["1"].cause.startswith("dials port")


def test_hang_nobody_claimed_rank_0_reads_as_its_short_timeout_twin():
    run, vs = _hang_kept("master_claims_1")
    for label in ("0", "1"):
        assert vs[label].cause.startswith("no process claimed RANK=0, so no store was started "
                                          "(ranks 0, 1 both claimed RANK=1): every rank dials "
                                          "127.0.0.1:")


def test_hang_two_ranks_claiming_rank_0_on_two_hosts():
    run, vs = _hang_kept("rank_claims_0_two_hosts")
    for label in ("0", "1"):
        assert vs[label].cause.startswith(
            "ranks 0 and 1 both claimed RANK=0 (the scenario's rank_collision fault: rank 1 "
            "started with RANK='0'): both joined the store as rank 0")
    # the store shows rank 1's address published: then it is not this cause
    run.store.update(answered=True, gloo={"0": "10.0.0.1:1", "1": "10.0.0.2:1"})
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    assert not vs["1"].cause.startswith("ranks 0 and 1 both claimed")


def test_hang_c10d_agents_that_are_all_clients():
    run, vs = _hang_kept("c10d_endpoint_not_own")
    for label in ("agent:node0", "agent:node1"):
        assert vs[label].cause.startswith("nobody hosted the rendezvous store at ")
        assert "even agent:node0, whose address it is" in vs[label].cause
    # an agent given is_host=true would host it: say nothing
    argv = run.plan["ranks"][0]["argv"]
    argv[argv.index("--rdzv-endpoint"):argv.index("--rdzv-endpoint")] = \
        ["--rdzv-conf", "is_host=true"]
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    assert not vs["agent:node1"].cause.startswith("nobody hosted")


def test_hang_a_worker_whose_host_cannot_resolve_master_addr():
    run, vs = _hang_kept("c10d_worker_cannot_resolve_master")
    assert vs["1"].cause.startswith("it dialled node0, a name host node1's hosts file does not "
                                    "list")
    assert vs["0"].cause.startswith("waiting in gloo's rendezvous for the address of rank 1, "
                                    "never published in the store (rank 1: it dialled node0")


def test_hang_static_rendezvous_waiting_for_a_node_never_started():
    run, vs = _hang_kept("static_node_never_comes")
    assert vs["agent:node0"].cause == "waiting for 1 of 2 clients at the deadline: agent:node1 " \
        "was not started before the deadline (its release, at 100 s, was still to come)"


def test_hang_torchrun_agent_given_another_master_port():
    run, vs = _hang_kept("torchrun_agent_other_master_port")
    store = run.plan["store"]["port"]
    assert vs["agent:node0"].cause == "waiting for 1 of 2 clients at the deadline: " \
        f"agent:node1 dials port 29511 (its --master-port), not {store}"
    assert vs["agent:node1"].cause.startswith("dials port 29511 (its --master-port), where no "
                                              f"store listens (the store's port is {store}: "
                                              "agent:node0 listens there)")


def _stepping(obs, ago, cpu):
    """A rank alive at the deadline (20 s) that entered train steps 1 s apart, the last ``ago``
    s before the deadline; ``cpu``: its CPU seconds read at 18 s and at 20 s."""
    r = obs.rank("1", reached="init", killed_at_deadline=True, end=20.5, stacks=obs.hung_stacks,
                 result=False)
    for k in range(1, 6):
        r.events.append(Event("phase", obs.t0 + 20.0 - ago - (5 - k),
                              {"phase": f"train step {k}", "step": "train 100"}))
    r.cpu_samples = [(18.0, cpu[0]), (20.0, cpu[1])]
    run = obs.run(r)
    run.plan.update({"deadline": 20, "master_port": 29500,
                     "ranks": [{"label": "1", "env": {"RANK": "1"}}]})
    return explain_run(run, classify_run(run))[0]


def test_a_rank_still_stepping_at_the_deadline_is_slow_not_stuck(obs):
    v = _stepping(obs, ago=0.3, cpu=(40.0, 41.8))
    assert v.outcome == "hang"
    assert v.cause.startswith("still progressing at the deadline (20 s): its last step, train "
                              "step 5 (train 100), began 0.30 s before it; 5 steps in its last "
                              "10 s; its CPU time rose from 40 to 41.8 s between 18 and 20 s")


def test_a_rank_whose_last_step_is_long_past_is_not_progressing(obs):
    assert not _stepping(obs, ago=6.0, cpu=(40.0, 41.8)).cause.startswith("still progressing")


def test_a_single_recent_step_without_cpu_is_not_progress(obs):
    r = obs.rank("1", reached="init", killed_at_deadline=True, end=20.5,
                 stacks=obs.hung_stacks, result=False)
    r.events.append(Event("phase", obs.t0 + 19.5, {"phase": "workload step 1",
                                                   "step": "barrier"}))   # then blocked
    r.cpu_samples = [(18.0, 5.0), (20.0, 5.0)]
    run = obs.run(r)
    run.plan.update({"deadline": 20, "ranks": [{"label": "1", "env": {"RANK": "1"}}]})
    (v,) = explain_run(run, classify_run(run))
    assert not v.cause.startswith("still progressing")


def test_hang_a_sigint_held_by_torchs_connect_loop_says_so_and_why_it_blocks():
    from harness.judge.observation import SignalSent

    run, _ = _hang_kept("wrong_port")
    run.ranks[1].signals.append(SignalSent("INT", 3.0, "kill_rank"))
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    assert vs["1"].cause.startswith("SIGINT, sent by the scenario's fault at 3 s, did not end "
                                    "it: it blocks in torch's C++ (c10d::")
    assert "; it dials port " in vs["1"].cause
    run.ranks[1].native_threads = []        # no native stack: where it blocked is not known
    vs = {v.label: v for v in explain_run(run, classify_run(run))}
    assert not vs["1"].cause.startswith("SIGINT")


def test_hang_a_real_training_run_cut_by_the_deadline_is_still_progressing():
    """A real run (ddp 1MB, train 100000, deadline 20 s, on the shared 2 cores): both ranks
    were entering train steps ~50 a 10 s and using CPU when the deadline cut them."""
    run, vs = _hang_kept("still_training")
    for label in ("0", "1"):
        assert vs[label].outcome == "hang"
        assert vs[label].cause.startswith("still progressing at the deadline (20.35 s): its "
                                          f"last step, {vs[label].phase} (train 100000)")
        assert "its CPU time rose from" in vs[label].cause


def test_cpu_seconds_tells_a_process_at_work_from_a_blocked_one():
    """harness.procs.cpu_seconds on real processes: a busy loop's CPU time rises between two
    reads, a sleeper's does not; a process that is gone reads None."""
    import subprocess
    import sys
    import time

    from harness.machine.procs import cpu_seconds

    busy = subprocess.Popen([sys.executable, "-c", "print('up', flush=True)\nwhile True: pass"],
                            stdout=subprocess.PIPE, text=True)
    idle = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); "
                             "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout.readline() == idle.stdout.readline() == "up\n"   # both started
        b0, i0 = cpu_seconds(busy.pid), cpu_seconds(idle.pid)
        time.sleep(1.0)
        b1, i1 = cpu_seconds(busy.pid), cpu_seconds(idle.pid)
        assert None not in (b0, b1, i0, i1)
        assert b1 - b0 >= 0.1          # even on 2 shared cores it got a tenth of a second
        assert i1 - i0 <= 0.02
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()
    assert cpu_seconds(busy.pid) is None


def test_cpu_samples_survive_the_observations_json_edge(obs):
    from harness.judge.observation import RankObservation

    r = obs.rank("1", reached="init", killed_at_deadline=True, result=False)
    r.cpu_samples = [(18.0, 9.41), (20.353, 9.87)]
    back = RankObservation.from_dict(r.to_dict())
    assert back.cpu_samples == [(18.0, 9.41), (20.353, 9.87)]
    assert RankObservation.from_dict({"label": "0"}).cpu_samples == []

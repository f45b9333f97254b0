"""What the store held (harness.storeprobe): parsed from bytes (pure), asked of a real TCPStore
over its wire protocol, of a listener that is no store, and taken by a real run at its deadline
and read by the diagnosis."""

from __future__ import annotations

import socket
import struct
import textwrap
import threading
from datetime import timedelta

import pytest

from harness.judge.classify import classify_run
from harness.judge.diagnose import RankContext, explain_run, the_store_shows_who_is_missing
from harness.net.storeprobe import StoreSnapshot, connect_and_ask, decode_sockaddr, parse


def _gloo_blob(ip: str, port: int, header: bool = True) -> bytes:
    """A rank's gloo key as torch 2.13's gloo packs it (an 16-byte header in newer gloo, then
    a sockaddr_in: family, port in network order, the address)."""
    head = struct.pack("<Q", 2) + b"vm\x88\x00\x00\x00\x00\x00" if header else b""
    return head + struct.pack("<H", socket.AF_INET) + struct.pack("!H", port) + \
        socket.inet_aton(ip) + b"\x00" * 8 + b"\x01" + b"\x00" * 7


def test_a_gloo_key_is_decoded_to_the_address_the_rank_published():
    assert decode_sockaddr(_gloo_blob("10.0.0.2", 41234)) == "10.0.0.2:41234"
    assert decode_sockaddr(_gloo_blob("127.0.0.1", 5000, header=False)) == "127.0.0.1:5000"
    six = struct.pack("<H", socket.AF_INET6) + struct.pack("!H", 6000) + b"\0" * 4 + \
        socket.inet_pton(socket.AF_INET6, "fd00::2") + b"\0" * 4
    assert decode_sockaddr(six) == "[fd00::2]:6000"
    assert decode_sockaddr(b"not an address") == ""


def test_a_snapshot_counts_joined_clients_and_the_gloo_addresses():
    snap = parse("127.0.0.1:29500", {
        b"init/": b"2",
        b"/default_pg/0//cpu//0/0": _gloo_blob("10.0.0.1", 40000),
        b"/default_pg/0//cpu//0/1": _gloo_blob("10.0.0.2", 40001),
        b"/other": None})
    assert snap.answered and snap.joined == 2 and snap.num_keys == 4
    assert snap.gloo == {"0": "10.0.0.1:40000", "1": "10.0.0.2:40001"}
    assert snap.keys["/other"] == "" and snap.keys["init/"] == "2"
    assert snap.lines()[1] == "gloo addresses published: rank 0 10.0.0.1:40000, rank 1 " \
        "10.0.0.2:40001"
    assert StoreSnapshot.from_dict(snap.to_dict()) == snap


def test_a_real_tcpstore_says_its_keys_over_the_wire():
    dist = pytest.importorskip("torch.distributed")
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=5), wait_for_workers=False)
    store.set("default_pg/0//cpu//0/0", "x")
    store.add("counter", 3)
    addr = f"127.0.0.1:{store.port}"
    snap = connect_and_ask(socket.socket(), addr)
    assert snap.answered, snap.error
    assert set(snap.keys) == {"/counter", "/default_pg/0//cpu//0/0"}
    assert snap.num_keys == 2 and snap.joined is None
    assert snap.gloo == {}     # "x" is no address
    # asking changed nothing: a torch client still reads the same
    assert store.get("counter") == b"3" and store.num_keys() == 2


def test_a_listener_that_is_no_store_is_said_not_to_answer():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    held = []
    t = threading.Thread(target=lambda: held.append(srv.accept()), daemon=True)
    t.start()
    addr = f"127.0.0.1:{srv.getsockname()[1]}"
    snap = connect_and_ask(socket.socket(), addr, timeout=0.3)
    assert not snap.answered and "no answer within 0.3 s" in snap.error
    assert snap.lines() == [f"store {addr}: no answer ({snap.error})"]
    srv.close()
    snap = connect_and_ask(socket.socket(), addr, timeout=0.3)   # nothing listens there now
    assert not snap.answered and snap.error.startswith("connect failed")


def test_the_rule_names_the_ranks_whose_gloo_address_never_reached_the_store(obs):
    r0 = obs.rank("0", reached="init", killed_at_deadline=True, end=10.0, stacks=obs.hung_stacks)
    r1 = obs.rank("1", reached="init", killed_at_deadline=True, end=10.0, stacks=obs.hung_stacks)
    r2 = obs.rank("2", reached="init", killed_at_deadline=True, end=10.0, stacks=obs.hung_stacks)
    run = obs.run(r0, r1, r2)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    run.plan.update({"world_size": 3, "master_port": 29500, "ranks": [
        {"label": str(r), "env": env} for r in range(3)]})
    run.store = parse("127.0.0.1:29500", {
        b"init/": b"3", b"/default_pg/0//cpu//0/0": _gloo_blob("127.0.0.1", 40000),
        b"/default_pg/0//cpu//0/1": _gloo_blob("127.0.0.1", 40001)}).to_dict()
    vs = classify_run(run)
    cause = the_store_shows_who_is_missing(RankContext(vs[0], run.ranks[0], run, vs))
    assert cause is not None
    assert cause.text.startswith("waiting in gloo's rendezvous for the address of rank 2, "
                                 "never published in the store")
    assert "store 127.0.0.1:29500: 3 keys, 3 clients joined" in cause.evidence
    # rank 2 itself is not said to wait for itself
    assert the_store_shows_who_is_missing(RankContext(vs[2], run.ranks[2], run, vs)) is None
    # a rank told another store is not judged by this one
    run.plan["ranks"][1]["env"] = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29600"}
    assert the_store_shows_who_is_missing(RankContext(vs[1], run.ranks[1], run, vs)) is None
    explain_run(run, vs)
    assert vs[0].cause


def _run(text: str):
    from harness.run.supervisor import run_scenario
    from harness.scenario.loader import load_text

    (scn,) = load_text(textwrap.dedent(text), "store.yaml")
    run = run_scenario(scn)
    return run, explain_run(run, classify_run(run))


def test_a_real_run_asks_the_store_at_its_deadline():
    """Rank 1 sleeps in its second step: rank 0 hangs in the barrier. At the deadline the store
    holds both ranks' gloo addresses (the mesh was made) and both clients joined."""
    run, vs = _run("""
        name: store_at_deadline
        about: rank 1 sleeps in step 2; rank 0 waits in the barrier until the deadline
        world_size: 2
        timeout: 60
        deadline: 8
        workload: [barrier, barrier]
        faults:
          - {kind: slow_rank, rank: 1, seconds: 100, phase: "workload step 2"}
    """)
    by = {v.label: v for v in vs}
    assert by["0"].outcome == "hang", by["0"].reason
    snap = StoreSnapshot.from_dict(run.store)
    assert snap.answered, snap.error
    assert snap.joined == 2
    assert sorted(snap.gloo) == ["0", "1"], snap.keys
    assert all(a.startswith("127.0.0.1:") for a in snap.gloo.values()), snap.gloo
    assert snap.t is not None and snap.t >= 8


def test_a_real_run_behind_a_squatter_says_the_listener_is_no_store():
    run, vs = _run("""
        name: store_squatted
        about: the master port held by a process that accepts and never answers
        world_size: 2
        timeout: 30
        deadline: 6
        workload: [barrier]
        faults:
          - {kind: busy_port, mode: accepting}
    """)
    snap = StoreSnapshot.from_dict(run.store)
    assert not snap.answered
    assert "no answer" in snap.error, snap.error


def test_a_torchrun_run_asks_the_store_its_workers_host_themselves_too():
    """share_store: false: torchrun's workers host their own store (rank 0's TCPStore on the
    MASTER_PORT the agent handed them), apart from the agent's rendezvous store. At the
    deadline both are asked; the workers' one holds both workers' gloo addresses."""
    run, vs = _run("""
        name: workers_store
        about: two workers of one agent, their own store; worker 1 is stopped in step 2
        world_size: 2
        timeout: 60
        deadline: 12
        launcher: {kind: torchrun, share_store: false}
        workload: [barrier, "sleep 1", barrier]
        faults:
          - {kind: stop_rank, rank: 1, phase: "workload step 2"}
    """)
    by = {v.label: v for v in vs}
    assert by["0"].outcome == "hang", by["0"].reason
    (snap,) = [StoreSnapshot.from_dict(s) for s in run.stores]
    assert snap.answered, snap.error
    assert sorted(snap.gloo) == ["0", "1"], snap.keys
    # the agents' rendezvous store is c10d on localhost:0 (a single-node launch): its port is
    # chosen at run time, and no leased port stands in for it (harness.jobstore)
    assert run.plan["store"]["port"] is None and run.store == {}


def test_a_torchrun_store_port_chosen_at_run_time_is_asked_where_the_workers_were_sent():
    """A single-node torchrun: c10d on localhost:0, the port unknown to the plan. The probe
    asks the store at the MASTER_PORT the agent handed worker 0 (observed), not a lease."""
    run, vs = _run("""
        name: agent_store
        about: two workers of one agent on its shared store; worker 1 is stopped in step 2
        world_size: 2
        timeout: 60
        deadline: 12
        launcher: torchrun
        workload: [barrier, "sleep 1", barrier]
        faults:
          - {kind: stop_rank, rank: 1, phase: "workload step 2"}
    """)
    by = {v.label: v for v in vs}
    assert by["0"].outcome == "hang", by["0"].reason
    assert run.plan["store"]["port"] is None
    told = next(r.info["master_port"] for r in run.ranks
                if r.role == "worker" and r.info.get("rank") == 0)
    snap = StoreSnapshot.from_dict(run.store)
    assert snap.addr == f"127.0.0.1:{told}" and str(told) != str(run.plan["master_port"])
    assert snap.answered, snap.error
    assert sorted(snap.gloo) == ["0", "1"], snap.keys

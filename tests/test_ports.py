"""Port leases (harness.ports): no two runs get one port, a foreign listener's port is skipped,
and a run that dies frees its ports. Real locks, real sockets, real processes; each test has its
own lock directory (tmp_path), so only the sockets are shared with the rest of the machine.
"""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap

import pytest

from harness.machine.ports import LOW, PortLease, ephemeral_range, port_is_free


def free_run(n: int, low: int = LOW, high: int = 28999) -> int:
    """The first port p in [low, high] such that p .. p+n-1 are all free right now."""
    p = low
    while p + n - 1 <= high:
        if all(port_is_free(q) for q in range(p, p + n)):
            return p
        p += n
    pytest.skip(f"no {n} consecutive free ports in {low}..{high}")


def test_lease_gives_a_port_below_the_ephemeral_range(tmp_path):
    with PortLease(tmp_path) as lease:
        port = lease.take()
    assert LOW <= port < ephemeral_range()[0]


def test_ports_of_one_lease_are_distinct(tmp_path):
    base = free_run(30)
    with PortLease(tmp_path, base, base + 29) as lease:
        ports = [lease.take() for _ in range(20)]
    assert len(set(ports)) == 20


def test_two_leases_never_share_a_port(tmp_path):
    base = free_run(20)
    a, b = PortLease(tmp_path, base, base + 19), PortLease(tmp_path, base, base + 19)
    try:
        taken = [lease.take() for _ in range(10) for lease in (a, b)]
        assert len(set(taken)) == 20 and not set(a.ports) & set(b.ports)
    finally:
        a.release()
        b.release()


def test_a_full_range_is_an_error_not_a_shared_port(tmp_path):
    base = free_run(1)
    with PortLease(tmp_path, base, base) as a, PortLease(tmp_path, base, base) as b:
        assert a.take() == base
        with pytest.raises(RuntimeError, match="no free port"):
            b.take()


def test_released_port_can_be_taken_again(tmp_path):
    base = free_run(1)
    a = PortLease(tmp_path, base, base)
    a.take()
    a.release()
    with PortLease(tmp_path, base, base) as b:
        assert b.take() == base


def _take_many(base_dir, low, high, n, barrier, out):
    lease = PortLease(base_dir, low, high)
    got = [lease.take() for _ in range(n)]
    out.put(got)
    barrier.wait(timeout=60)      # hold them until the other process has taken its own
    lease.release()


def test_two_processes_never_share_a_port(tmp_path):
    base = free_run(40)
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_take_many, args=(tmp_path, base, base + 39, 18, barrier, out))
             for _ in range(2)]
    for p in procs:
        p.start()
    try:
        a, b = out.get(timeout=120), out.get(timeout=120)
    finally:
        for p in procs:
            p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert len(set(a)) == len(set(b)) == 18 and not set(a) & set(b)


@pytest.mark.parametrize("family,addr", [(socket.AF_INET, "127.0.0.1"),
                                         (socket.AF_INET, "0.0.0.0")])
def test_port_held_by_a_foreign_listener_is_skipped(tmp_path, family, addr):
    base = free_run(2)
    foreign = socket.socket(family, socket.SOCK_STREAM)
    foreign.bind((addr, base))
    foreign.listen(1)
    try:
        with PortLease(tmp_path, base, base) as only_that_one:
            with pytest.raises(RuntimeError, match="no free port"):
                only_that_one.take()
        with PortLease(tmp_path, base, base + 1) as lease:
            assert lease.take() == base + 1
    finally:
        foreign.close()


def test_port_bound_without_listen_is_not_free():
    base = free_run(1)
    s = socket.socket()
    s.bind(("127.0.0.1", base))
    try:
        assert not port_is_free(base)
    finally:
        s.close()


HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from harness.machine.ports import PortLease
    lease = PortLease(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[2]))
    print(lease.take(), flush=True)
    time.sleep(600)
""")


def test_a_killed_holder_frees_its_ports(tmp_path):
    base = free_run(1)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path), str(base)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == str(base)
        with PortLease(tmp_path, base, base) as lease, pytest.raises(RuntimeError):
            lease.take()
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        with PortLease(tmp_path, base, base) as lease:
            assert lease.take() == base
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        holder.stdout.close()


def test_a_lock_file_exists_while_held_and_is_removed_on_release(tmp_path):
    base = free_run(1)
    with PortLease(tmp_path, base, base) as lease:
        lease.take()
        assert (tmp_path / f"{base}.lock").exists()
    assert list(tmp_path.iterdir()) == []


def test_lock_files_do_not_pile_up(tmp_path):
    base = free_run(20)
    for _ in range(50):
        with PortLease(tmp_path, base, base + 19) as lease:
            lease.take()
            lease.take()
    assert list(tmp_path.iterdir()) == []


def test_a_lock_on_an_unlinked_lock_file_is_not_taken_for_the_port(tmp_path):
    """The flock/unlink race: B opened the lock file just before A released (unlinked) it, and
    C has taken the port since (a new file). B's flock on the old inode succeeds, yet the port
    is C's: the inode check must send B round again, where it finds C's lock."""
    from harness.machine.ports import _same_file

    base = free_run(1)
    path = tmp_path / f"{base}.lock"
    a = PortLease(tmp_path, base, base)
    a.take()
    late_opener = os.open(path, os.O_RDONLY)
    try:
        a.release()
        with PortLease(tmp_path, base, base) as c:
            assert c.take() == base
            fcntl.flock(late_opener, fcntl.LOCK_EX | fcntl.LOCK_NB)   # the worthless lock
            assert not _same_file(late_opener, path)
            with PortLease(tmp_path, base, base) as b, pytest.raises(RuntimeError):
                b.take()
    finally:
        os.close(late_opener)


def test_an_existing_lock_file_is_opened_read_only(tmp_path):
    """Another user's lock file in the shared sticky folder cannot be opened with O_CREAT
    (fs.protected_regular) nor for writing (0444): a read-only one must do."""
    base = free_run(1)
    path = tmp_path / f"{base}.lock"
    path.write_text("")
    path.chmod(0o444)
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)   # root would be let in anyway; make it someone else's
    with PortLease(tmp_path, base, base) as lease:
        assert lease.take() == base


def test_a_symlink_lock_file_is_never_followed(tmp_path):
    base = free_run(1)
    target = tmp_path / "elsewhere"
    target.write_text("precious")
    (tmp_path / f"{base}.lock").symlink_to(target)
    with PortLease(tmp_path, base, base) as lease, pytest.raises(RuntimeError):
        lease.take()
    assert target.read_text() == "precious"


def test_the_shared_lock_folder_is_sticky_and_world_writable(tmp_path, monkeypatch):
    from harness.machine.ports import shared_lock_dir

    monkeypatch.setenv("HARNESS_TMP", str(tmp_path))
    d = shared_lock_dir()
    assert d == tmp_path / "torchdist-harness-ports"
    assert stat.S_IMODE(d.stat().st_mode) == 0o1777


def test_a_symlink_as_the_shared_lock_folder_is_refused(tmp_path, monkeypatch):
    from harness.core.errors import HarnessError
    from harness.machine.ports import shared_lock_dir

    monkeypatch.setenv("HARNESS_TMP", str(tmp_path))
    (tmp_path / "target").mkdir()
    (tmp_path / "torchdist-harness-ports").symlink_to(tmp_path / "target")
    with pytest.raises(HarnessError, match="not a folder"):
        shared_lock_dir()


def test_a_run_dir_is_never_visible_without_its_owner(tmp_path):
    """A concurrent sweep must never see run-* without owner.json (it would remove it)."""
    from harness.machine.rundir import RunDir, sweep

    runs = [RunDir(tmp_path) for _ in range(20)]
    assert sweep(tmp_path) == []          # every owner (this process) is alive
    assert all((r.path / "owner.json").exists() for r in runs)
    assert not list(tmp_path.glob(".new-*"))

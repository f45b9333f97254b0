"""torch's warning, error and errno lines are kept from the whole of a rank's stderr, apart from
its tail (harness.stderrlines), so a C++ exception's stack frames or a retry loop's lines
cannot push the line that said why out of the diagnosis's reach."""

from __future__ import annotations

from harness.judge.stderrlines import KEEP_FIRST, KEEP_LAST, key_lines
from harness.run.supervisor import TAIL, _tail

GAI = ("[W1128 09:44:50.269324310 socket.cpp:752] [c10d] The IPv6 network addresses of "
       "(nohost, 29500) cannot be retrieved (gai error: -2 - Name or service not known).")
BIND = ("[W1128 09:44:51.000000001 socket.cpp:460] [c10d] The server socket has failed to "
        "bind to [::]:29500 (errno: 98 - Address already in use).")
FRAMES = "".join(f"frame #{i}: c10d::TCPStore::doWait() + 0x{i:x} (0x7f in libtorch_cpu.so)\n"
                 for i in range(300))


def test_the_line_that_said_why_survives_the_stack_frames(tmp_path):
    err = tmp_path / "rank-1.err"
    err.write_text(f"{GAI}\nException raised from doWait at store.cpp:1\n{FRAMES}"
                   "torch.distributed.DistNetworkError: failed to connect\n")
    assert "gai error" not in _tail(err)            # the tail lost it: 300 frames came after
    assert len(FRAMES) > TAIL
    key = key_lines(err).splitlines()
    assert key == [GAI, "torch.distributed.DistNetworkError: failed to connect"]


def test_repeats_are_counted_once_and_info_lines_are_left_out(tmp_path):
    info = "[I1128 09:44:50.1 socket.cpp:955] [c10d] The client socket has connected to x."
    lines = [info] + [BIND.replace("51.000000001", f"51.{i:09d}") for i in range(7)]
    err = tmp_path / "rank-0.err"
    err.write_text("\n".join(lines + ["an ordinary line of the program", "Epoch 3 done"]) + "\n")
    assert key_lines(err) == f"{lines[1]}  [x 7]"   # the first copy, with its count


def test_a_flood_keeps_its_first_and_last_distinct_lines(tmp_path):
    err = tmp_path / "rank-0.err"
    n = KEEP_FIRST + KEEP_LAST + 25
    err.write_text("".join(f"RuntimeError: attempt {i} refused\n" for i in range(n)))
    key = key_lines(err).splitlines()
    assert len(key) == KEEP_FIRST + KEEP_LAST + 1
    assert key[0] == "RuntimeError: attempt 0 refused" and key[-1].endswith(f"{n - 1} refused")
    assert key[KEEP_FIRST] == "... 25 more distinct lines"


def test_a_file_that_cannot_be_read_has_no_key_lines(tmp_path):
    assert key_lines(tmp_path / "missing.err") == ""

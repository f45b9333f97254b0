"""Capped capture of rank output (harness.capture) and capped stacks, for real.

A real child process writes more than the cap through the drain thread; a real rank run with
``PYTHONVERBOSE=2`` (Python then prints every import: about 1.4 MB on stderr for torch) is cut
to head + marker + tail while the rank still ends ``ok``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from harness.machine import output_caps as capture
from harness.machine.output_caps import Capture

pytestmark = pytest.mark.timeout(180)

WRITER = textwrap.dedent("""
    import os, sys
    n = int(sys.argv[1])
    block = bytes(range(256)) * 256          # 64 KiB, position-dependent bytes
    done = 0
    while done < n:
        chunk = block[: n - done]
        os.write(1, chunk)
        done += len(chunk)
""")


def expected_bytes(n: int) -> bytes:
    block = bytes(range(256)) * 256
    return (block * (n // len(block) + 1))[:n]


def run_through_capture(tmp_path, n: int, head: int, tail: int) -> bytes:
    cap = Capture(head=head, tail=tail)
    path = tmp_path / "out"
    w = cap.pipe(path)
    try:
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(n)], stdout=w)
    finally:
        os.close(w)
    assert child.wait(timeout=120) == 0
    cap.close()
    return path.read_bytes()


def test_a_stream_over_the_cap_keeps_head_and_tail_with_a_marker(tmp_path):
    n, head, tail = 5_000_000, 64 << 10, 16 << 10
    data = run_through_capture(tmp_path, n, head, tail)
    want = expected_bytes(n)
    cut = n - head - tail
    mark = capture.marker(cut, n, head, tail)
    assert data == want[:head] + mark + want[-tail:]
    assert f"[harness: {cut} bytes cut here: this stream wrote {n} bytes".encode() in data


def test_a_stream_under_the_cap_is_kept_whole(tmp_path):
    n = 100_000
    assert run_through_capture(tmp_path, n, 64 << 10, 64 << 10) == expected_bytes(n)


def test_a_rank_that_prints_a_lot_is_cut_and_still_ends_ok(tmp_path, monkeypatch):
    from harness.judge.classify import classify_run
    from harness.run.supervisor import run_scenario
    from harness.scenario.loader import load_text

    monkeypatch.setattr(capture, "HEAD", 64 << 10)
    monkeypatch.setattr(capture, "TAIL", 16 << 10)
    (scn,) = load_text(textwrap.dedent("""
        name: chatty
        about: PYTHONVERBOSE=2 makes the rank print every import (about 1.4 MB on stderr)
        world_size: 1
        timeout: 20
        deadline: 90
        isolate: never
        workload: init
        env: {PYTHONVERBOSE: "2"}
        start: fresh   # every import in the rank itself (a forked rank's torch is imported)
    """), "chatty.yaml")
    keep = tmp_path / "evidence"
    observed = run_scenario(scn, keep=keep)
    obs = observed.to_dict()
    (v,) = classify_run(observed)
    assert v.outcome == "ok"
    err = (keep / "rank-0.err").read_bytes()
    m = re.search(rb"\[harness: (\d+) bytes cut here: this stream wrote (\d+) bytes; kept the "
                  rb"first 65536 and the last 16384\]", err)
    assert m, err[-2000:]
    cut, total = int(m.group(1)), int(m.group(2))
    assert total > 500_000 and cut == total - (64 << 10) - (16 << 10)
    assert len(err) == (64 << 10) + (16 << 10) + len(capture.marker(cut, total, 64 << 10,
                                                                    16 << 10))
    assert "cut here" not in obs["ranks"][0]["stderr_tail"]   # the tail is the stream's end


def test_stacks_beyond_the_cap_are_cut_in_the_file_too(tmp_path, monkeypatch):
    from harness.run import stacks

    monkeypatch.setattr(stacks, "STACKS_MAX", 1000)
    path = tmp_path / "rank-0.stacks"
    path.write_text("x" * 5000)
    text = stacks._read_stacks(path)
    assert text.startswith("x" * 1000) and "[harness: 4000 bytes of stacks cut here]" in text
    assert path.read_text() == text

"""A scenario's verdict does not depend on how the harness was started: under `nohup` (SIGHUP
ignored) or in a shell's background (SIGINT, SIGQUIT ignored), ranks still meet the signals as
a program started from a terminal does (harness.procs.default_signal_dispositions)."""

from __future__ import annotations

import signal
import textwrap

import pytest

from harness.judge.classify import classify_run
from harness.machine.procs import default_signal_dispositions
from harness.run.supervisor import run_scenario
from harness.scenario.loader import load_text


@pytest.fixture
def ignored_like_nohup():
    saved = {s: signal.getsignal(s) for s in (signal.SIGHUP, signal.SIGQUIT)}
    for s in saved:
        signal.signal(s, signal.SIG_IGN)
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_inherited_ignores_are_undone(ignored_like_nohup):
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    saved = signal.getsignal(signal.SIGHUP), signal.getsignal(signal.SIGQUIT)
    try:
        assert default_signal_dispositions() == ["SIGHUP", "SIGQUIT"]
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
        assert default_signal_dispositions() == []     # nothing left to undo
    finally:
        signal.signal(signal.SIGHUP, saved[0])
        signal.signal(signal.SIGQUIT, saved[1])


@pytest.mark.parametrize("start", ["fresh", "fork"])
def test_a_rank_started_by_a_harness_under_nohup_still_dies_of_sighup(ignored_like_nohup, start):
    (scn,) = load_text(textwrap.dedent(f"""
        name: hup_under_nohup
        about: SIGHUP to rank 1 in init while the harness itself ignores SIGHUP (nohup)
        start: {start}
        world_size: 2
        timeout: 4
        deadline: 30
        workload: [barrier]
        faults:
          - {{kind: delayed_rank, ranks: [0], delay: 3}}
          - {{kind: kill_rank, rank: 1, signal: HUP, phase: init, after: 1}}
    """), "hup.yaml")
    run = run_scenario(scn)
    by = {v.label: v for v in classify_run(run)}
    assert by["1"].outcome == "crash", by["1"].reason
    assert "SIGHUP" in by["1"].reason

"""harness.admission: the gate before each run's start line, with real flocks and processes
(the machine's CPU reading is given, so that the test does not depend on this machine's load)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from harness.machine.admission import Gate


def busy(window, cores):
    return 0.0


def idle(window, cores):
    return float(cores)


def _first_run_in_flight(gate, order):
    """A run admitted in a thread and held in flight until the returned event is set; it
    appends "first ended" to ``order`` as its last act inside the gate (appended after leaving,
    a run admitted the moment the place frees could write first: CI saw that once)."""
    first_in = threading.Event()
    release = threading.Event()

    def first():
        with gate.admitted():
            first_in.set()
            release.wait(10)
            order.append("first ended")

    t = threading.Thread(target=first)
    t.start()
    assert first_in.wait(5)
    return t, release


def test_a_run_with_nothing_in_flight_is_admitted_at_once_whatever_the_cpu(tmp_path):
    gate = Gate(tmp_path, cores=2, idle=busy)
    with gate.admitted() as a:
        assert a.beside == 0 and a.waited < 1.0 and a.why_waited == ""


def test_fewer_runs_than_cores_are_admitted_at_once_whatever_the_cpu(tmp_path):
    with Gate(tmp_path, cores=2, idle=busy).admitted():
        with Gate(tmp_path, cores=2, idle=busy).admitted() as b:
            assert b.beside == 1 and b.waited < 1.0


def test_a_second_run_waits_while_the_cpu_is_busy_and_starts_when_the_first_ends(tmp_path):
    gate = Gate(tmp_path, cores=1, idle=busy, spacing=0)
    got = {}
    t, release = _first_run_in_flight(gate, [])

    def second():
        with gate.admitted() as a:
            got["a"] = a
            got["at"] = time.monotonic()

    t2 = threading.Thread(target=second)
    t2.start()
    time.sleep(0.8)
    assert "a" not in got           # held: the CPU reads busy and one run is in flight
    released = time.monotonic()
    release.set()
    t.join(5)
    t2.join(5)
    assert got["at"] >= released
    assert "cores idle" in got["a"].why_waited


def test_a_run_is_admitted_beside_another_when_the_cpu_has_room(tmp_path):
    gate = Gate(tmp_path, cores=1, idle=idle, spacing=0)
    with gate.admitted():
        with Gate(tmp_path, cores=1, idle=idle, spacing=0).admitted() as b:
            assert b.beside == 1 and b.waited < 2.0


def test_a_run_that_must_run_alone_waits_for_the_others_and_holds_new_ones(tmp_path):
    gate = Gate(tmp_path, cores=2, idle=idle, spacing=0)
    order = []
    t1, release = _first_run_in_flight(gate, order)

    def alone():
        with gate.admitted(alone=True) as a:
            order.append(f"alone in beside {a.beside}")
            time.sleep(0.5)
            order.append("alone ended")

    def later():
        with gate.admitted():
            order.append("later in")

    t2 = threading.Thread(target=alone)
    t2.start()
    time.sleep(0.5)       # the alone run is waiting now
    t3 = threading.Thread(target=later)
    t3.start()
    time.sleep(0.5)
    assert order == []    # neither the alone run nor the later one went in beside the first
    release.set()
    for t in (t1, t2, t3):
        t.join(10)
    assert order.index("alone in beside 0") > order.index("first ended")
    assert order.index("later in") > order.index("alone ended")


def test_a_killed_runs_place_is_freed_with_its_process(tmp_path):
    code = ("import sys, time; from pathlib import Path\n"
            "from harness.machine.admission import Gate\n"
            "g = Gate(Path(sys.argv[1]), cores=2, idle=lambda w, c: 0.0)\n"
            "with g.admitted():\n    print('in', flush=True); time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "in"
        assert len(list(tmp_path.glob("run-*"))) == 1
    finally:
        p.kill()
        p.wait()
    with Gate(tmp_path, cores=2, idle=busy).admitted() as a:   # busy CPU, yet nothing in flight
        assert a.beside == 0 and a.waited < 1.0
    assert list(tmp_path.glob("run-*")) == []

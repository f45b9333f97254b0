"""SIGTERM and repeated Ctrl-C (harness.interrupts), for real.

The shield's rules are checked in small Python subprocesses (a signal to this very process
would interrupt the test session itself). Then real sessions, ``pytest`` and ``harness run``,
with and without ``-n 2``, run a scenario that hangs (a port holder accepts and never answers;
the deadline is far), are signalled once their ranks are inside ``init_process_group``, and
must end with the conventional exit code, a last line saying what happened, and nothing of
theirs left: no rank or port holder process, no network namespace, no run directory, no temp
folder. Each session gets private state and temp folders (HARNESS_TMP, TMPDIR), so what is
left is theirs alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)


def py(code: str, **kw):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60, **kw)


# -- the shield ----------------------------------------------------------------------------------

def test_a_sigint_inside_a_shield_waits_for_the_end_of_the_shield():
    p = py("""
        import os, signal
        from harness.machine.interrupts import shield
        log = []
        try:
            with shield():
                os.kill(os.getpid(), signal.SIGINT)
                log.append("cleanup went on")
                with shield():
                    os.kill(os.getpid(), signal.SIGINT)
                    log.append("nested cleanup went on")
                log.append("outer cleanup finished")
        except KeyboardInterrupt:
            log.append("KeyboardInterrupt after the shield")
        print(log, signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    """)
    assert p.stdout.strip() == ("['cleanup went on', 'nested cleanup went on', 'outer cleanup "
                                "finished', 'KeyboardInterrupt after the shield'] True"), p.stderr


def test_a_sigterm_inside_a_shield_ends_the_process_after_the_cleanup():
    """Without a front door, SIGTERM keeps its default action, only later."""
    p = py("""
        import os, signal
        from harness.machine.interrupts import shield
        with shield():
            os.kill(os.getpid(), signal.SIGTERM)
            print("cleanup finished", flush=True)
        print("not reached", flush=True)
    """)
    assert p.returncode == -signal.SIGTERM
    assert p.stdout == "cleanup finished\n"


def test_installed_sigterm_is_an_interrupt_and_a_second_signal_only_waits():
    p = py("""
        import os, signal, time
        from harness.machine import interrupts
        interrupts.install()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except KeyboardInterrupt as e:
            print(type(e).__name__, flush=True)
        with interrupts.shield():
            interrupts.note_cleaned("run1")
        os.kill(os.getpid(), signal.SIGINT)     # a second signal during the unwinding
        print("still here", flush=True)
        print(interrupts.summary(), flush=True)
        interrupts.reraise()
    """)
    assert p.returncode == -signal.SIGTERM
    assert p.stdout.splitlines() == [
        "Terminated", "still here",
        "harness: interrupted by SIGTERM: cleaned up 1 run (ranks, port holders, namespaces, "
        "run directories)"]
    assert "SIGINT again: still cleaning up" in p.stderr


def test_an_error_in_a_shield_with_a_deferred_signal_becomes_the_interrupt():
    p = py("""
        import os, signal
        from harness.machine import interrupts
        interrupts.install()
        try:
            with interrupts.shield():
                os.kill(os.getpid(), signal.SIGINT)
                raise ValueError("cleanup failed")
        except KeyboardInterrupt as e:
            print("interrupt, from", type(e.__context__).__name__)
    """)
    assert p.stdout.strip() == "interrupt, from ValueError", p.stderr


# -- an interrupt that lands on an instruction without a line number ---------------------------

# Python 3.11+ leaves ``tb_lineno`` None for an entry whose instruction the compiler made (here:
# the end of a ``with`` block inside a loop); a signal's KeyboardInterrupt can land on one.
NO_LINE = """
    import os, sys, types

    def landed():
        for _ in range(2):
            with open(os.devnull):
                pass
        return sys._getframe()

    def interrupt_without_a_line():
        frame = landed()
        lasti = next(start for start, _end, line in frame.f_code.co_lines() if line is None)
        tb = types.TracebackType(None, frame, lasti, -1)
        assert tb.tb_lineno is None
        return KeyboardInterrupt().with_traceback(tb), frame, lasti
"""
# Before 3.11 every entry has a line number (3.9 has no co_lines either): nothing to mend.
lineless_entries = pytest.mark.skipif(sys.version_info < (3, 11),
                                      reason="tb_lineno is never None before Python 3.11")


@lineless_entries
def test_mend_traceback_gives_a_lineless_entry_the_line_before_it():
    from harness.machine import interrupts

    ns: dict = {}
    exec(textwrap.dedent(NO_LINE), ns)
    exc, frame, lasti = ns["interrupt_without_a_line"]()
    before = [line for start, _end, line in frame.f_code.co_lines()
              if start <= lasti and line is not None][-1]      # by offset, not the largest
    assert interrupts.mend_traceback(exc) is True
    assert exc.__traceback__.tb_lineno == before and exc.__traceback__.tb_frame is frame
    assert interrupts.mend_traceback(exc) is False      # nothing left to mend


@lineless_entries
def test_pytest_reports_an_interrupt_without_a_line_number_and_exits_2(tmp_path):
    """CI once: the first Ctrl-C's KeyboardInterrupt landed on such an instruction, pytest's
    report of it raised TypeError and the session ended with status 1 instead of 2."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_lineless.py").write_text(textwrap.dedent(NO_LINE) + textwrap.dedent("""
        def test_interrupted():
            raise interrupt_without_a_line()[0]
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HARNESS_"))}
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                        "test_lineless.py"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, env=env)
    out = p.stdout + p.stderr
    assert p.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "KeyboardInterrupt" in out and "TypeError" not in out, out


# -- real sessions --------------------------------------------------------------------------------

HANG = """\
name: hang
about: rank 1 connects to a port holder that accepts and never answers; far deadline
world_size: 2
timeout: 100
deadline: 150
workload: [barrier]
faults:
  - {kind: busy_port, mode: accepting}
cases:
"""


@pytest.fixture
def session_dir(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "scenarios").mkdir()
    for d in ("state", "tmp"):
        (tmp_path / d).mkdir()
    return tmp_path


def _state(root: Path) -> Path:
    return root / "state" / f"torchdist-harness-{os.geteuid()}"


def _hanging_runs(root: Path, n: int):
    """Run dirs whose rank 1 has entered init (released, connected to the holder)."""
    runs = []
    for run in _state(root).glob("run-*"):
        ev = run / "rank-1.events"
        try:
            if '"phase": "init"' in ev.read_text():
                runs.append(run)
        except OSError:
            pass
    return runs if len(runs) >= n else None


def _what_runs_made(runs):
    """Processes (pid, start time) and namespaces each run recorded, read while it runs; and
    the session's zygotes (start: fork), recorded beside the runs."""
    procs, namespaces = [], []
    for run in [*runs, *(runs[0].parent.glob("zygote-*") if runs else [])]:
        if run.name.startswith("zygote-"):
            procs += [json.loads(ln) for ln in (run / "pids.jsonl").read_text().splitlines()]
            continue
        for line in (run / "pids.jsonl").read_text().splitlines():
            rec = json.loads(line)
            procs.append(rec)
        state = Path("/run/thx") / f"thx-{run.name[len('run-'):]}.json"
        if state.exists():
            namespaces += json.loads(state.read_text())["namespaces"]
    return procs, namespaces


def _alive(rec) -> bool:
    from harness.machine.procs import alive

    return alive(rec)


def _netns() -> set:
    try:
        return {p.name for p in Path("/run/netns").iterdir()}
    except OSError:
        return set()


def interrupt(root: Path, argv, signals, *, runs: int, to_group: bool):
    """Start a session, wait until ``runs`` runs hang in init, send ``signals`` (10 ms apart),
    return (returncode, output, what the runs had made)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HARNESS_"))}
    env.update(HARNESS_TMP=str(root / "state"), TMPDIR=str(root / "tmp"), COLUMNS="200")
    proc = subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        end = time.monotonic() + 180
        hanging = None
        while time.monotonic() < end and proc.poll() is None:
            hanging = _hanging_runs(root, runs)
            if hanging:
                break
            time.sleep(0.1)
        assert hanging, f"no {runs} hanging runs; output:\n{proc.communicate()[0]}"
        made = _what_runs_made(hanging)
        assert made[0], "the runs recorded no process"
        for s in signals:
            if to_group:      # Ctrl-C in a terminal: the whole foreground process group
                os.killpg(proc.pid, s)
            else:             # kill PID, a scheduler, a CI runner
                os.kill(proc.pid, s)
            time.sleep(0.01)
        out, _ = proc.communicate(timeout=120)
        return proc.returncode, out, made
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def assert_nothing_left(root: Path, made):
    procs, namespaces = made
    assert [p["pid"] for p in procs if _alive(p)] == []
    assert sorted(set(namespaces) & _netns()) == []
    assert list(_state(root).glob("run-*")) == []
    assert list(_state(root).glob("zygote-*")) == []
    assert list(_state(root).glob("cli-*")) == []      # harness run's own report folder
    # the temp dir of the session: nothing of the harness's (pytest's own basetemp aside)
    assert [p.name for p in (root / "tmp").iterdir() if not p.name.startswith("pytest-of-")] \
        == []


def last_line(out: str) -> str:
    return [ln for ln in out.splitlines() if ln.strip()][-1]


def _scenarios(root: Path, cases: int) -> None:
    text = HANG + "".join(f"  c{i}: {{}}\n" for i in range(cases))
    (root / "scenarios" / "hang.yaml").write_text(text)


PYTEST = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "scenarios"]
HARNESS = [sys.executable, "-m", "harness", "run", "scenarios", "--no-progress"]


@pytest.mark.parametrize("xdist", [False, True], ids=["plain", "n2"])
def test_sigterm_to_pytest_cleans_up_says_so_and_ends_by_sigterm(session_dir, xdist):
    n = 2 if xdist else 1
    _scenarios(session_dir, n)
    rc, out, made = interrupt(session_dir, PYTEST + (["-n", "2"] if xdist else []),
                              [signal.SIGTERM], runs=n, to_group=False)
    assert rc == -signal.SIGTERM, out
    assert last_line(out) == (f"harness: interrupted by SIGTERM: cleaned up {n} run"
                              f"{'s' * (n > 1)} (ranks, port holders, namespaces, run "
                              "directories)"), out
    assert "Traceback" not in out
    assert_nothing_left(session_dir, made)


@pytest.mark.parametrize("xdist", [False, True], ids=["plain", "n2"])
def test_two_quick_ctrl_c_to_pytest_clean_up_like_one(session_dir, xdist):
    n = 2 if xdist else 1
    _scenarios(session_dir, n)
    rc, out, made = interrupt(session_dir, PYTEST + (["-n", "2"] if xdist else []),
                              [signal.SIGINT, signal.SIGINT], runs=n, to_group=True)
    assert rc == pytest.ExitCode.INTERRUPTED, out
    assert last_line(out).startswith(f"harness: interrupted by SIGINT: cleaned up {n} run"), out
    assert_nothing_left(session_dir, made)


FORK = ["--harness-start", "fork"]


def test_sigterm_to_a_forked_pytest_n2_ends_its_zygotes_too(session_dir):
    """start: fork: each worker's runs have warm servers from the worker's zygote; a SIGTERM
    leaves no run, server, rank or zygote."""
    _scenarios(session_dir, 2)
    rc, out, made = interrupt(session_dir, PYTEST + ["-n", "2"] + FORK, [signal.SIGTERM],
                              runs=2, to_group=False)
    assert rc == -signal.SIGTERM, out
    names = [p["name"] for p in made[0]]
    assert names.count("zygote") == 2 and names.count("fork server local (warm)") == 2, names
    assert_nothing_left(session_dir, made)


def test_sigkill_to_a_forked_pytest_leaves_nothing_after_the_next_sweep(session_dir):
    """SIGKILL: nothing of the session can clean up. Its processes die with it (death signals:
    zygote against pytest, server against zygote, ranks against server; the port holder
    against pytest); the next run's sweep removes the run's folder, the zygote's and the
    run's namespace."""
    _scenarios(session_dir, 1)
    rc, out, made = interrupt(session_dir, PYTEST + FORK, [signal.SIGKILL], runs=1,
                              to_group=False)
    assert rc == -signal.SIGKILL, out
    assert [p["name"] for p in made[0]].count("zygote") == 1
    end = time.monotonic() + 30
    while any(_alive(p) for p in made[0]) and time.monotonic() < end:
        time.sleep(0.1)
    assert [p["name"] for p in made[0] if _alive(p)] == []
    assert list(_state(session_dir).glob("zygote-*"))   # left for the sweep
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HARNESS_"))}
    sweep = py("""
        from harness.machine import rundir
        from harness.net import topology
        print(rundir.sweep(), topology.sweep() if not topology.missing() else [])
    """, env=dict(env, HARNESS_TMP=str(session_dir / "state")))
    assert sweep.returncode == 0, sweep.stderr
    assert_nothing_left(session_dir, made)


def test_sigterm_to_harness_run_removes_its_temp_folder_and_ends_by_sigterm(session_dir):
    _scenarios(session_dir, 1)
    rc, out, made = interrupt(session_dir, HARNESS, [signal.SIGTERM], runs=1, to_group=False)
    assert rc == -signal.SIGTERM, out
    assert last_line(out).startswith("harness: interrupted by SIGTERM: cleaned up 1 run"), out
    assert "/cli-" not in out      # no path of a report that is gone
    assert_nothing_left(session_dir, made)


def test_two_quick_ctrl_c_to_harness_run_n2_clean_up_and_end_by_sigint(session_dir):
    _scenarios(session_dir, 2)
    rc, out, made = interrupt(session_dir, HARNESS + ["-n", "2"],
                              [signal.SIGINT, signal.SIGINT], runs=2, to_group=True)
    assert rc == -signal.SIGINT, out
    assert last_line(out).startswith("harness: interrupted by SIGINT: cleaned up 2 runs"), out
    assert "/cli-" not in out
    assert_nothing_left(session_dir, made)


def test_sigkill_to_harness_run_leaves_its_report_folder_to_the_next_sweep(session_dir):
    """A SIGKILLed ``harness run`` cannot remove the folder of the report it was not asked to
    keep: it lies in the state folder, owned, and the next run's sweep removes it (a bare
    temp dir, as it once was, stayed in /tmp for good)."""
    _scenarios(session_dir, 1)
    rc, out, made = interrupt(session_dir, HARNESS, [signal.SIGKILL], runs=1, to_group=True)
    assert rc == -signal.SIGKILL, out
    assert len(list(_state(session_dir).glob("cli-*"))) == 1
    end = time.monotonic() + 30
    while any(_alive(p) for p in made[0]) and time.monotonic() < end:
        time.sleep(0.1)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HARNESS_"))}
    sweep = py("""
        from harness.machine import rundir
        from harness.net import topology
        print(rundir.sweep(), topology.sweep() if not topology.missing() else [])
    """, env=dict(env, HARNESS_TMP=str(session_dir / "state")))
    assert sweep.returncode == 0, sweep.stderr
    assert_nothing_left(session_dir, made)

"""Launch and supervise (harness.launch), for real: real ranks importing real torch, real signals.

Each test runs one small scenario (2 ranks, gloo, a few seconds) and then checks that nothing of
the run is left: no rank or port-holder process, no run directory. Timings are bounds with
slack (the machine is shared), never tight.
"""

from __future__ import annotations

import json
import os
import re
import signal
import textwrap
from pathlib import Path

import psutil
import pytest
from orphans import run_in_workload, state_dir, supervisor, wait_for

from harness.judge.classify import classify_run, job_outcome
from harness.machine.rundir import base_dir, sweep
from harness.run.supervisor import run_scenario
from harness.scenario.loader import load_text

pytestmark = pytest.mark.timeout(180)


def scenario(text: str):
    (scn,) = load_text(textwrap.dedent(text), "launch.yaml")
    return scn


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def harness_descendants():
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if ("harness.ranks.worker" in cmd or "harness.faults" in cmd) and alive(p.pid):
            out.append(f"{p.pid} {cmd[:100]}")
    return out


def our_run_dirs():
    out = []
    for run in base_dir().glob("run-*"):
        try:
            owner = json.loads((run / "owner.json").read_text())
        except (OSError, ValueError):
            continue
        if owner.get("pid") == os.getpid():
            out.append(run.name)
    return out


def assert_nothing_left(o):
    pids = [r["pid"] for r in o["ranks"]] + [s["info"]["pid"] for s in o["step_log"]
                                             if "pid" in s["info"]]
    assert [p for p in pids if alive(p)] == []
    assert harness_descendants() == []
    assert not Path(o["run_dir"]).exists()
    assert our_run_dirs() == []


def run(text: str):
    observed = run_scenario(scenario(text))
    return observed.to_dict(), {v.label: v for v in classify_run(observed)}


def events(o, label):
    return next(r for r in o["ranks"] if r["label"] == label)["events"]


# -- a healthy run ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def healthy():
    return run("""
        name: healthy
        about: two ranks, barrier and all_reduce
        world_size: 2
        timeout: 20
        deadline: 90
        workload: [barrier, all_reduce]
    """)


def test_healthy_run_is_ok(healthy):
    _, vs = healthy
    assert {k: v.outcome for k, v in vs.items()} == {"0": "ok", "1": "ok"}
    assert job_outcome(vs.values()) == "ok"


def test_healthy_ranks_go_through_every_phase(healthy):
    o, _ = healthy
    phases = [e["phase"] for e in events(o, "1") if e["ev"] == "phase"]
    assert phases == ["start", "import", "init", "workload step 1", "workload step 2",
                      "destroy", "exit"]


def test_healthy_run_records_the_torch_version(healthy):
    o, _ = healthy
    from importlib.metadata import version

    assert o["torch_version"] == version("torch")


def test_healthy_run_leaves_nothing(healthy):
    assert_nothing_left(healthy[0])


def test_built_observations_have_the_shape_of_a_real_one(healthy, obs):
    """tests/conftest.py builds the observations classify and expect are tested on: they must
    have the keys, the events and the event fields of a real one."""
    real = healthy[0]
    built = obs.run_dict(obs.rank_dict("0"))
    assert sorted(built) == sorted(real)
    real_rank, built_rank = real["ranks"][0], built["ranks"][0]
    assert sorted(built_rank) == sorted(real_rank)
    assert [(e["ev"], e.get("phase")) for e in built_rank["events"]] == \
        [(e["ev"], e.get("phase")) for e in real_rank["events"]]
    assert [sorted(e) for e in built_rank["events"]] == [sorted(e) for e in real_rank["events"]]


# -- the start line -------------------------------------------------------------------------------

def test_delayed_rank_is_released_after_its_delay_from_the_start_line():
    o, vs = run("""
        name: late
        about: rank 1 starts 3 s late, well within the timeout
        world_size: 2
        timeout: 20
        deadline: 90
        workload: init
        faults:
          - kind: delayed_rank
            ranks: [1]
            delay: 3
    """)
    released = {r["label"]: next(e["t"] for e in r["events"] if e["ev"] == "released") - o["t0"]
                for r in o["ranks"]}
    assert released["1"] >= 3.0
    assert released["0"] < 3.0
    # failed once in 2031 tests of a fresh clone's suite with a catalog run beside it
    # (2026-11-29), 0 of 7 since: say what each rank saw if it fails again
    assert [vs["0"].outcome, vs["1"].outcome] == ["ok", "ok"], \
        {k: (v.outcome, v.phase, v.duration, v.exception, v.message[:300], v.reason)
         for k, v in vs.items()}
    assert_nothing_left(o)


def test_a_signal_gated_on_another_rank_ending_waits_for_that_end():
    """kill_rank ``phase: ended, of: 0``: rank 1 sits in a long sleep; the SIGKILL comes only
    once rank 0 has ended, so rank 0 ends ok and rank 1 is killed in its sleep."""
    o, vs = run("""
        name: gated_kill
        about: rank 1 is SIGKILLed in its sleep once rank 0 has ended
        world_size: 2
        timeout: 20
        deadline: 60
        workload: [barrier]
        faults:
          - {kind: rank_workload, rank: 1, steps: [barrier, sleep 30]}
          - {kind: kill_rank, rank: 1, phase: ended, of: 0}
    """)
    assert (vs["0"].outcome, vs["1"].outcome, vs["1"].phase) == ("ok", "crash", "workload step 2")
    end0 = next(r for r in o["ranks"] if r["label"] == "0")["ended_at"]
    assert end0 is not None and vs["1"].duration >= end0
    assert vs["1"].duration < 25   # killed, not waiting out its sleep
    statuses = {e["kind"]: e["status"] for e in o["effects"]}
    assert statuses.get("kill_rank") == "acted", o["effects"]
    assert_nothing_left(o)


# -- a rank killed mid-workload --------------------------------------------------------------------

@pytest.fixture(scope="module")
def killed():
    return run("""
        name: killed
        about: rank 1 is SIGKILLed as it starts its first workload step
        world_size: 2
        timeout: 10
        deadline: 60
        workload: [sleep 0.5, barrier]
        faults:
          - kind: kill_rank
            rank: 1
            phase: workload step 1
            after: 0.1
    """)


def test_rank_killed_mid_workload_is_crash(killed):
    _, vs = killed
    assert (vs["1"].outcome, vs["1"].reason) == ("crash", "killed by SIGKILL (sent by the fault)")
    assert vs["1"].phase == "workload step 1"


def test_killed_rank_events_before_the_kill_survive(killed):
    o, _ = killed
    evs = [e["ev"] for e in events(o, "1")]
    assert {"ready", "released", "joined"} <= set(evs) and "result" not in evs
    assert any(e.get("phase") == "workload step 1" for e in events(o, "1"))


def test_killed_rank_returncode_is_the_signal(killed):
    o, _ = killed
    assert next(r for r in o["ranks"] if r["label"] == "1")["returncode"] == -signal.SIGKILL


def test_the_peer_of_a_killed_rank_does_not_end_ok(killed):
    _, vs = killed
    assert vs["0"].outcome in ("error", "timeout")


def test_built_exception_record_has_the_shape_of_a_real_one(killed, obs):
    o, _ = killed
    real = next(e for e in events(o, "0") if e["ev"] == "result")
    built = next(e for e in obs.rank_dict("0", reached="workload step 2",
                                          exc=obs.exc("RuntimeError", "x"))["events"]
                 if e["ev"] == "result")
    assert real["status"] == built["status"] == "exception"
    assert sorted(built) == sorted(real) and sorted(built["exc"]) == sorted(real["exc"])
    assert real["exc"]["mro"][-3:] == ["builtins.Exception", "builtins.BaseException",
                                       "builtins.object"]


def test_killed_run_leaves_nothing(killed):
    assert_nothing_left(killed[0])


# -- the deadline ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def stopped():
    return run("""
        name: stopped
        about: rank 1 is SIGSTOPped in its workload; the deadline comes before torch's timeout
        world_size: 2
        timeout: 60
        deadline: 4
        workload: [sleep 0.2, barrier]
        faults:
          - kind: stop_rank
            rank: 1
            phase: workload step 1
    """)


def test_stopped_rank_is_hang_at_the_deadline(stopped):
    _, vs = stopped
    assert vs["1"].outcome == "hang"
    assert "SIGSTOP" in vs["1"].reason


def test_peer_waiting_on_a_stopped_rank_is_hang_too(stopped):
    _, vs = stopped
    assert vs["0"].outcome == "hang"


def test_hung_ranks_have_faulthandler_stacks_of_the_worker(stopped):
    _, vs = stopped
    for label in ("0", "1"):
        assert "harness/ranks/worker.py" in vs[label].stacks, vs[label].stacks


def test_hung_ranks_native_stacks_are_read_from_py_spys_json(stopped):
    """Rank 0 waits in the barrier: py-spy's JSON threads are kept (its main thread in the
    worker's Python and torch's C++ below), and the text shown is rendered from them; rank 1
    is stopped, which py-spy cannot attach to, and says so."""
    from harness.run.supervisor import native_stacks_available

    if not native_stacks_available():
        pytest.skip("py-spy is not installed")
    o, _ = stopped
    r0, r1 = (next(r for r in o["ranks"] if r["label"] == k) for k in ("0", "1"))
    main = next(t for t in r0["native_threads"] if t["name"] == "MainThread")
    files = [f["file"] for f in main["frames"]]
    assert "harness/ranks/worker.py" in files, files
    assert any(f["line"] == 0 and "torch" in f["file"] for f in main["frames"]), files
    assert r0["native_stacks"].startswith("(taken at ")
    assert f'Thread {main["thread"]} ({main["state"]}): "MainThread"' in r0["native_stacks"]
    assert r1["native_threads"] == [] and r1["native_stacks"].startswith(
        "(no native stacks: the rank is stopped")


def test_hung_run_ends_after_the_deadline(stopped):
    o, _ = stopped
    assert o["wall"] >= 4.0


def test_hung_run_leaves_nothing(stopped):
    assert_nothing_left(stopped[0])


# -- a port holder ---------------------------------------------------------------------------------

def test_busy_master_port_fails_rank_0_with_eaddrinuse_and_leaves_no_holder():
    o, vs = run("""
        name: busy
        about: a listener holds MASTER_PORT; rank 0 cannot host the store
        world_size: 1
        timeout: 10
        deadline: 60
        workload: init
        faults:
          - kind: busy_port
            mode: listening
    """)
    holders = [r for r in o["step_log"] if r["fault"] == "busy_port" and r["action"] == "do"]
    assert len(holders) == 1 and holders[0]["info"]["pid"] > 0
    assert (vs["0"].outcome, vs["0"].exception) == ("error", "DistNetworkError")
    assert "EADDRINUSE" in vs["0"].message
    assert_nothing_left(o)


# -- a supervisor that is killed -------------------------------------------------------------------

SCENARIO = """\
name: orphaned
about: a long run whose supervisor is killed
world_size: 2
timeout: 60
deadline: 120
isolate: never
workload: [sleep 100]
"""


def test_killed_supervisor_leaves_ranks_that_die_and_a_dir_that_sweep_removes(tmp_path):
    sup = supervisor(SCENARIO, tmp_path)
    base = state_dir(tmp_path)
    pids = []
    try:
        run_dir = wait_for(lambda: run_in_workload(tmp_path), 120,
                           "both ranks to start their workload")
        pids = [json.loads(ln)["pid"] for ln in (run_dir / "pids.jsonl").read_text().splitlines()]
        # two ranks forked (start: fork, the default) and their host's fork server
        assert len(pids) == 3 and all(alive(p) for p in pids)

        sup.send_signal(signal.SIGKILL)
        sup.wait(timeout=30)
        wait_for(lambda: not any(alive(p) for p in pids), 30, "the orphaned ranks to die")

        assert run_dir.exists()
        removed = [r.split()[0] for r in sweep(base)]
        # the run's folder, and its session zygote's (forked ranks come from a server the
        # zygote forked; the zygote outlives runs, not its supervisor)
        assert removed[0] == run_dir.name and [r.split("-")[0] for r in removed[1:]] == ["zygote"]
        assert not run_dir.exists() and not (base / removed[1]).exists()
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
        sup.stderr.close()
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)


# -- a rank that cannot start ---------------------------------------------------------------------

def _no_run_dir_left(before):
    return sorted(set(our_run_dirs()) - set(before)) == []


def test_a_rank_whose_python_cannot_start_is_a_harness_error_with_the_cause(tmp_path):
    from harness.core.errors import HarnessError

    before = our_run_dirs()
    scn = scenario("""
        name: nopython
        about: PYTHONHOME points nowhere, so the rank's Python cannot even start
        world_size: 2
        timeout: 10
        deadline: 60
        isolate: never
        workload: init
        env: {PYTHONHOME: /nonexistent}
    """)
    with pytest.raises(HarnessError) as e:
        run_scenario(scn, keep=tmp_path / "evidence")
    msg = str(e.value)
    assert re.fullmatch(r"rank [01] exited with status 1 before it was ready: Python or the "
                        r"harness worker could not start: ModuleNotFoundError: No module named "
                        r"'encodings'", msg), msg
    assert "encodings" in (tmp_path / "evidence" / "rank-0.err").read_text()
    assert (tmp_path / "evidence" / "harness-error.txt").read_text().strip() == msg
    assert harness_descendants() == [] and _no_run_dir_left(before)


def test_a_rank_that_cannot_import_torch_is_a_harness_error_with_the_exception(tmp_path):
    from harness.core.errors import HarnessError

    shadow = tmp_path / "shadow" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('this torch is a stand-in')\n")
    scn = scenario(f"""
        name: notorch
        about: a PYTHONPATH entry shadows torch with a package that fails to import
        world_size: 1
        timeout: 10
        deadline: 60
        isolate: never
        workload: init
        env: {{PYTHONPATH: {tmp_path / "shadow"}}}
    """)
    with pytest.raises(HarnessError, match=r"^rank 0 exited with status 1 before it was ready: "
                       r"could not import torch: ImportError: this torch is a stand-in$"):
        run_scenario(scn)
    assert harness_descendants() == []


def test_torch_refusing_the_scenarios_environment_at_import_is_the_ranks_verdict():
    """Real torch: TORCH_DISTRIBUTED_DEBUG with a value torch rejects makes `import torch`
    raise ValueError in every rank; torch imports in a clean interpreter, so that is the
    scenario's result (error in phase import), not a harness error."""
    scn = scenario("""
        name: debugvalue
        about: torch refuses TORCH_DISTRIBUTED_DEBUG=VERBOSE while it is imported
        world_size: 2
        timeout: 10
        deadline: 60
        workload: init
        env: {TORCH_DISTRIBUTED_DEBUG: VERBOSE}
    """)
    obs = run_scenario(scn)
    verdicts = {v.label: v for v in classify_run(obs)}
    for label in ("0", "1"):
        v = verdicts[label]
        assert (v.outcome, v.phase, v.exception) == ("error", "import", "ValueError")
        assert "TORCH_DISTRIBUTED_DEBUG" in v.message and v.duration == 0.0
    assert harness_descendants() == []

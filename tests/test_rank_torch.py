"""A rank runs where the report says: only the harness package goes on a rank's path, each rank
says from inside which interpreter and which torch it runs, the report's torch is that, and a
rank whose torch is not its interpreter's fails the run loudly.

The bug this guards: a wheel-installed harness put the folder above the package (a whole
site-packages, with its torch) first on the ranks' PYTHONPATH, so in ``harness compare A B``
supervised from B's wheel every rank of side A imported B's torch while the report said A's.
An editable checkout hid it (the folder above the package there has no torch), so the test
needs two environments with two different torches: this venv's 2.13 and the 2.14.1 wheel that
lies on the machine (installed once into a per-user cache, skipped with the reason where it
cannot be).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from wheelenv import ROOT, build_wheel, pip_install, purelib, torch_only_venv, wheel_venv

from harness.core import protocol as P

pytestmark = pytest.mark.timeout(1800)

OTHER_TORCH = os.environ.get("HARNESS_TEST_OTHER_TORCH", "2.14.1")
CASE = ("healthy.yaml", "healthy")


def _cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / \
        "torchdist-harness-tests"


def other_torch_site() -> Path:
    """The site-packages of a venv with torch ``OTHER_TORCH`` (built once, kept in the user's
    cache: the CUDA build and its NVIDIA wheels are large); skips with the reason when pip
    cannot install it here."""
    venv = _cache() / f"torch-{OTHER_TORCH}"
    done = venv / "installed"
    venv.parent.mkdir(parents=True, exist_ok=True)
    # one builder at a time: xdist workers reach this at once on a fresh machine, and two
    # pip installs into one venv left files of the NVIDIA wheels missing (libnvrtc.so.13)
    with open(venv.parent / f".torch-{OTHER_TORCH}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            _build_other_torch(venv, done)
    return purelib(venv / "bin" / "python")


def _build_other_torch(venv: Path, done: Path) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    p = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin/python"),
                        "install", "-q", "--disable-pip-version-check",
                        f"torch=={OTHER_TORCH}"],
                       capture_output=True, text=True, timeout=1500)
    if p.returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        pytest.skip(f"cannot install torch=={OTHER_TORCH} into a venv here: "
                    f"{(p.stderr.strip().splitlines() or ['?'])[-1]}")
    check = subprocess.run([str(venv / "bin/python"), "-c", "import torch"],
                           capture_output=True, text=True, timeout=300)
    if check.returncode != 0:   # a broken cache would fail every later session: not kept
        shutil.rmtree(venv, ignore_errors=True)
        pytest.fail(f"torch=={OTHER_TORCH} installed but does not import: "
                    f"{(check.stderr.strip().splitlines() or ['?'])[-1]}")
    done.write_text(OTHER_TORCH)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def side_a(tmp_path_factory, wheel):
    """This venv's torch and the harness's wheel, nothing else: its python."""
    return wheel_venv(tmp_path_factory.mktemp("side-a"), str(wheel))


@pytest.fixture(scope="module")
def side_b(tmp_path_factory, wheel):
    """torch OTHER_TORCH (the cached venv's site-packages through a .pth) and the wheel."""
    site = other_torch_site()
    where = tmp_path_factory.mktemp("side-b")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where / "venv")],
                   check=True)
    py = where / "venv" / "bin" / "python"
    (purelib(py) / "other-torch.pth").write_text(f"{site}\n")
    p = pip_install(py, str(wheel))
    assert p.returncode == 0, p.stderr[-3000:]
    return py


def torch_of(py: Path) -> dict:
    out = subprocess.run([str(py), "-c", "import json, os, torch; print(json.dumps("
                          "{'torch': torch.__version__, 'path': os.path.realpath("
                          "os.path.dirname(torch.__file__))}))"],
                         capture_output=True, text=True, check=True, cwd="/",
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(supervisor: Path, a: Path, b: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{supervisor.parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run([str(supervisor.parent / "harness"), "compare",
                           str(a.parent.parent), str(b.parent.parent),
                           str(ROOT / "scenarios" / CASE[0]), "-k", CASE[1], "--out", "cmp",
                           "-q"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=1200)


def seen(report: Path) -> list:
    rep = json.loads(report.read_text())
    assert rep["cases"], rep
    return [(one["torch"], os.path.realpath(one["torch_path"]))
            for c in rep["cases"] for one in c["torch_seen"]], rep["environment"]


@pytest.mark.parametrize("supervised_by", ["a", "b"])
def test_each_side_of_a_compare_runs_its_own_torch(side_a, side_b, supervised_by, tmp_path):
    """Supervised from either side's installed wheel, every process of side A says (from
    inside) it ran A's torch and every process of side B B's; each report's torch is its
    ranks' word."""
    want = {"a": torch_of(side_a), "b": torch_of(side_b)}
    assert want["a"]["torch"] != want["b"]["torch"], want
    r = compare(side_a if supervised_by == "a" else side_b, side_a, side_b, tmp_path)
    assert r.returncode in (0, 1), r.stdout[-4000:] + r.stderr[-3000:]
    for side in "ab":
        got, env = seen(tmp_path / "cmp" / f"{side}.json")
        assert got and set(got) == {(want[side]["torch"], want[side]["path"])}, (side, got)
        assert env["torch"] == want[side]["torch"]
        assert {os.path.realpath(x["torch_path"]) for x in env["ranks_torch"]} == \
            {want[side]["path"]}


def test_a_rank_whose_torch_is_not_its_interpreters_fails_the_run_loudly(side_b,
                                                                        tmp_path_factory,
                                                                        tmp_path):
    """An interpreter whose start-up puts another torch first only inside a rank (a .pth line
    that reads the worker's own variable): its probe finds this venv's torch, its rank imports
    OTHER_TORCH. The run is a harness error naming the rank, both torches and both places,
    never a report of the wrong torch."""
    other = str(other_torch_site())
    lib = str(purelib(Path(sys.executable)))
    py = torch_only_venv(tmp_path_factory.mktemp("sly"), [
        lib, f"import os, sys; os.environ.get({P.EVENT_FD_ENV!r}) and "
             f"sys.path.insert(0, {other!r})"])
    scn = tmp_path / "scenarios" / "sly.yaml"
    scn.parent.mkdir()
    scn.write_text(f"name: sly\nabout: a rank's torch is not its interpreter's\n"
                   f"world_size: 2\ntimeout: 5\ndeadline: 60\npython: {{\"*\": \"{py}\"}}\n"
                   "expect: {job: ok}\n")
    r = subprocess.run([sys.executable, "-m", "harness", "run", str(scn), "--no-progress"],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    out = r.stdout + r.stderr
    assert r.returncode not in (0, 1) or "harness error" in out.lower(), out[-3000:]
    assert "ran torch " + OTHER_TORCH in out and "shadows the interpreter's own torch" in out, \
        out[-3000:]


def test_a_ranks_path_holds_the_harness_package_and_nothing_else():
    """The folder the launchers put on a rank's PYTHONPATH has one entry, ``harness``, which is
    this package."""
    from harness import launchers
    from harness.machine.rundir import package_path

    d = Path(package_path())
    assert [p.name for p in d.iterdir()] == ["harness"]
    assert (d / "harness").resolve() == Path(launchers.__file__).resolve().parent.parent
    env = launchers.process_env()
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(d)
    assert str(ROOT) not in env["PYTHONPATH"].split(os.pathsep)


def test_the_sweep_removes_the_package_folders_of_packages_that_are_gone(tmp_path):
    """A venv or wheel install removed (the package tests make one per run) leaves its
    ``pkgpath-*`` folder with a link to nowhere: the sweep removes it, and never this one."""
    from harness.machine.rundir import package_path, sweep

    gone = tmp_path / "pkgpath-0123456789ab"
    gone.mkdir()
    (gone / "harness").symlink_to(tmp_path / "removed-venv" / "harness")
    ours = Path(package_path(tmp_path))
    assert "pkgpath-0123456789ab" in sweep(tmp_path)
    assert not gone.exists() and (ours / "harness").exists()


def test_the_sweep_removes_the_probe_answers_of_torches_that_are_gone(tmp_path):
    """torch_probe caches one answer per torch folder and environment: a removed venv or
    clone leaves its answer, which no interpreter can ask for again. The sweep removes those
    (and unreadable ones), never the answer of a torch still there."""
    import json

    from harness.machine.rundir import sweep
    from harness.machine.torch_probe import probe

    here = probe()["torch_path"]
    (tmp_path / "probe2-aaaaaaaaaaaaaaaaaaaa.json").write_text(json.dumps(
        {"torch": "2.13.0+cpu", "torch_path": str(tmp_path / "removed-venv" / "torch")}))
    (tmp_path / "probe2-bbbbbbbbbbbbbbbbbbbb.json").write_text(json.dumps(
        {"torch": "2.13.0+cpu", "torch_path": here}))
    (tmp_path / "probe2-cccccccccccccccccccc.json").write_text("{half")
    assert sweep(tmp_path) == []       # a cache: not reported as a run's leftover
    assert sorted(p.name for p in tmp_path.glob("probe2-*")) == \
        ["probe2-bbbbbbbbbbbbbbbbbbbb.json"]


def test_an_allocations_ranks_find_the_package_in_its_shared_state_folder(tmp_path):
    """On an allocation's nodes this machine's temp folder is not there: the package's path
    folder lies in the shared state folder the run directories use (``--shared-dir``)."""
    from harness import launchers
    from harness.machine.rundir import package_path, shared_base

    shared = shared_base(str(tmp_path))
    d = Path(package_path(shared))
    assert d.parent == shared and [p.name for p in d.iterdir()] == ["harness"]
    env = launchers.process_env(state=shared)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(d) != package_path()


def test_spawned_children_on_another_interpreter_are_judged_by_its_torch(side_b, tmp_path):
    """`harness run --python B` over a spawn launch (what compare runs for an interpreter
    side): the parent runs on B and its children with it. The torch check judged each child
    against its row's plan, which names no interpreter, so every spawn and Slurm case of a
    2.13 -> 2.14.1 comparison was a harness error (detection.py, 2026-11-29); it now asks the
    interpreter the child itself names."""
    scn = tmp_path / "spawned.yaml"
    scn.write_text("name: spawned\nabout: a spawn launch on another interpreter\n"
                   "world_size: 2\ntimeout: 10\ndeadline: 180\nlauncher: spawn\n"
                   "expect: {job: ok}\n")
    r = subprocess.run([sys.executable, "-m", "harness", "run", str(scn), "--python",
                        str(side_b), "--no-progress", "--report", str(tmp_path / "r.json")],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "harness error" not in out.lower(), out[-3000:]
    got, _ = seen(tmp_path / "r.json")
    want = torch_of(side_b)
    assert set(got) == {(want["torch"], want["path"])}, got

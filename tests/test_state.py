"""Per-user state folders (harness.rundir) and port locks shared across users (harness.ports).

The cross-user tests are real: as root they run a second interpreter as ``nobody`` (setpriv)
that imports this harness and torch and starts real ranks. A root run first, then a non-root
run on the same HARNESS_TMP: the non-root run must work, get its own state folder, and never
a port that root holds.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from harness.core.errors import HarnessError
from harness.machine.rundir import base_dir

pytestmark = pytest.mark.timeout(300)

NOBODY = 65534


def test_the_state_folder_is_per_user_and_private(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_TMP", str(tmp_path))
    d = base_dir()
    assert d == tmp_path / f"torchdist-harness-{os.geteuid()}"
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_a_state_folder_with_loose_modes_is_made_private(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_TMP", str(tmp_path))
    d = tmp_path / f"torchdist-harness-{os.geteuid()}"
    d.mkdir(mode=0o777)
    d.chmod(0o777)
    assert stat.S_IMODE(base_dir().stat().st_mode) == 0o700


def test_a_symlinked_state_folder_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_TMP", str(tmp_path))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / f"torchdist-harness-{os.geteuid()}").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(HarnessError, match=r"is a symbolic link \(refused"):
        base_dir()


def test_a_state_folder_that_is_a_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_TMP", str(tmp_path))
    (tmp_path / f"torchdist-harness-{os.geteuid()}").write_text("")
    with pytest.raises(HarnessError, match="it is not a folder"):
        base_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_another_users_state_folder_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_TMP", str(tmp_path))
    d = tmp_path / "torchdist-harness-0"
    d.mkdir(mode=0o700)
    os.chown(d, NOBODY, NOBODY)
    with pytest.raises(HarnessError, match=rf"belongs to uid {NOBODY}, not to you \(uid 0\)"):
        base_dir()


# -- two users -------------------------------------------------------------------------------------

def _setpriv():
    """(argv prefix, extra env) that run this Python's harness and torch as ``nobody``, and let
    it start child interpreters (the ranks): this venv's own Python if nobody can execute it
    (a venv whose base Python is under root's 0700 home cannot be), else the system Python of
    the same version with the venv's packages on PYTHONPATH. Skips where neither works."""
    import sysconfig

    if os.geteuid() != 0:
        pytest.skip("needs root to run a second interpreter as another user")
    exe = shutil.which("setpriv")
    if exe is None:
        pytest.skip("setpriv (util-linux) is not installed")
    prefix = [exe, "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups"]
    check = ("import subprocess, sys, harness, torch; "
             "subprocess.run([sys.executable, '-c', 'import torch'], check=True)")
    pkgs = os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                            sysconfig.get_paths()["purelib"]])
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    tried = []
    for python, extra in ((sys.executable, {}), (system, {"PYTHONPATH": pkgs})):
        if not os.path.exists(python):
            continue
        p = subprocess.run(prefix + ["env", *(f"{k}={v}" for k, v in extra.items()), python,
                                     "-c", check], capture_output=True, text=True, timeout=120)
        if p.returncode == 0:
            return prefix + ["env", *(f"{k}={v}" for k, v in extra.items()), python]
        tried.append(f"{python}: {p.stderr.strip().splitlines()[-1:]}")
    pytest.skip(f"nobody cannot run a Python with this harness and torch: {tried}")


@pytest.fixture
def shared_tmp():
    """A folder every user can reach (pytest's tmp_path is root's, 0700)."""
    d = Path(tempfile.mkdtemp(prefix="harness-two-users-", dir="/tmp"))
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def as_nobody(prefix, code: str, tmp: Path, timeout: int = 240):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HARNESS_"))}
    env.update(HARNESS_TMP=str(tmp), HOME=str(tmp))
    return subprocess.run(prefix + ["-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=str(tmp))


ONE_RANK = '''
from harness.run.supervisor import run_scenario
from harness.scenario.loader import load_text
from harness.judge.classify import classify_run
(scn,) = load_text("""
name: user
about: one rank, as whoever runs it
world_size: 1
timeout: 10
deadline: 60
isolate: never
workload: init
""", "user.yaml")
print([v.outcome for v in classify_run(run_scenario(scn))])
'''


def test_a_non_root_run_after_a_root_run_works_in_its_own_folder(shared_tmp, monkeypatch):
    prefix = _setpriv()
    monkeypatch.setenv("HARNESS_TMP", str(shared_tmp))
    from harness.judge.classify import classify_run
    from harness.run.supervisor import run_scenario
    from harness.scenario.loader import load_text

    (scn,) = load_text(ONE_RANK.split('"""')[1], "root.yaml")
    assert [v.outcome for v in classify_run(run_scenario(scn))] == ["ok"]
    assert (shared_tmp / "torchdist-harness-0").is_dir()
    p = as_nobody(prefix, ONE_RANK, shared_tmp)
    assert p.returncode == 0 and p.stdout.strip() == "['ok']", p.stderr[-2000:]
    mine = shared_tmp / f"torchdist-harness-{NOBODY}"
    assert mine.stat().st_uid == NOBODY and stat.S_IMODE(mine.stat().st_mode) == 0o700
    assert list(mine.glob("run-*")) == []
    assert list((shared_tmp / "torchdist-harness-ports").iterdir()) == []   # no pile-up


HOLD = '''
import sys, time
from harness.machine.ports import PortLease
port = int(sys.argv[1])
lease = PortLease(low=port, high=port)
try:
    print("took", lease.take(), flush=True)
except RuntimeError as e:
    print("refused", e, flush=True)
    sys.exit(0)
sys.stdin.readline()      # hold it until told
lease.release()
print("released", flush=True)
'''


def test_root_and_nobody_never_hold_one_port(shared_tmp, monkeypatch):
    """Real flock contention across two uids in the shared sticky folder, both ways round."""
    from test_ports import free_run

    from harness.machine.ports import PortLease

    prefix = _setpriv()
    monkeypatch.setenv("HARNESS_TMP", str(shared_tmp))
    port = free_run(1)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HARNESS_"))}
    env["HARNESS_TMP"] = str(shared_tmp)

    def nobody(stdin=None):
        return subprocess.Popen(prefix + ["-c", HOLD, str(port)], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                cwd=str(shared_tmp))

    with PortLease(low=port, high=port) as root_lease:     # root first
        assert root_lease.take() == port
        lock = shared_tmp / "torchdist-harness-ports" / f"{port}.lock"
        assert lock.stat().st_uid == 0
        p = nobody()
        out, _ = p.communicate("\n", timeout=120)
        assert out.startswith("refused no free port"), out
    assert not lock.exists()                               # root's release removed it

    p = nobody()                                           # nobody first
    try:
        assert p.stdout.readline().strip() == f"took {port}"
        assert lock.stat().st_uid == NOBODY
        with PortLease(low=port, high=port) as root_lease, pytest.raises(RuntimeError):
            root_lease.take()
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "released"
    finally:
        p.communicate(timeout=60)
    assert not lock.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_an_unusable_state_folder_is_one_harness_error_line_per_case(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "one.yaml").write_text(ONE_RANK.split('"""')[1])
    state = tmp_path / "state"
    (state / "torchdist-harness-0").mkdir(parents=True)
    os.chown(state / "torchdist-harness-0", NOBODY, NOBODY)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HARNESS_"))}
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"],
                       cwd=tmp_path, env=dict(env, HARNESS_TMP=str(state)),
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 1 and "1 error" in p.stdout
    assert f"harness error (neither pass nor fail): state folder {state}/torchdist-harness-0: " \
           f"it belongs to uid {NOBODY}, not to you (uid 0)" in p.stdout
    assert "Traceback" not in p.stdout and "PermissionError" not in p.stdout

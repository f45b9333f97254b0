"""``harness capture -- COMMAND`` (harness.capturelaunch), for real.

A failing torchrun launch and a hanging user script are captured (each run twice by capture:
once observing, once checking the written file), then the written file is run again with
``harness run`` and must pass: the same verdicts. Secrets never land in the file; a command
capture does not understand is one line on stderr and exit 2.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from harness.tools import capture as cl

pytestmark = pytest.mark.timeout(400)

FAILING = textwrap.dedent("""
    import sys
    import torch.distributed as dist
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise ValueError("bad batch on rank 1")
    dist.barrier()
    dist.destroy_process_group()
""")

# rank 1 never comes to init: rank 0 waits in init_process_group (torch's default 30 min)
HANGING = textwrap.dedent("""
    import os, time
    import torch.distributed as dist
    if os.environ["RANK"] == "1":
        time.sleep(3600)
    dist.init_process_group("gloo")
    dist.destroy_process_group()
""")


def harness(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """The harness as a user with its venv active runs it: capture runs the launch as written
    first, so its torchrun is the venv's, found on PATH."""
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, text=True,
                          capture_output=True, env={**os.environ, "PATH": path, **(env or {})},
                          timeout=380)


def test_failing_torchrun_captured_and_reproduced(tmp_path):
    (tmp_path / "fail.py").write_text(FAILING)
    user_tmp = tmp_path / "user-tmp"     # the shell's TMPDIR: torchrun's agent leaves its
    user_tmp.mkdir()                     # torchelastic_* folder in the TMPDIR it is given
    p = harness("capture", "-o", "fail.yaml", "--deadline", "40", "--",
                "OMP_NUM_THREADS=1", "MY_TOKEN=x", "AWS_SECRET_ACCESS_KEY=y", "torchrun",
                "--nproc-per-node", "2", "--standalone", "fail.py", "--lr", "0.1",
                cwd=tmp_path, env={"TMPDIR": str(user_tmp)})
    assert p.returncode == 0, p.stdout + p.stderr
    text = (tmp_path / "fail.yaml").read_text()
    # never the secrets' values, each name listed as left out
    assert "=x" not in text and "=y" not in text and ": x\n" not in text
    assert "MY_TOKEN" in text and "AWS_SECRET_ACCESS_KEY" in text
    scn = yaml.safe_load(text)
    assert scn["env"] == {"OMP_NUM_THREADS": "1"}
    assert scn["launcher"] == {"kind": "torchrun", "standalone": True}
    assert scn["world_size"] == 2
    assert scn["program"] == {"script": "fail.py", "args": ["--lr", "0.1"]}
    ranks = scn["expect"]["ranks"]
    assert scn["expect"]["job"] == "error"
    assert ranks["1"]["outcome"] == "error" and ranks["1"]["exception"] == "ValueError"
    assert ranks["agent:local"]["outcome"] == "error"
    assert "run 2:" in scn["about"] and "every run gave the same verdicts" in p.stdout
    # a user's own re-run of the written file: the same verdicts
    again = harness("run", "fail.yaml", "--no-progress", cwd=tmp_path,
                    env={"TMPDIR": str(user_tmp)})
    assert again.returncode == 0, again.stdout + again.stderr
    # the original launch and the runs left no torchrun folder (the harness's own shared
    # folders, its port leases and run places, stay by design)
    assert list(user_tmp.glob("torchelastic_*")) == []


def test_hanging_script_captured_with_stacks_at_the_deadline(tmp_path):
    (tmp_path / "hang.py").write_text(HANGING)
    p = harness("capture", "-o", "hang.yaml", "--deadline", "12", "--", "WORLD_SIZE=2",
                "MASTER_PORT=29533", sys.executable, "hang.py", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    scn = yaml.safe_load((tmp_path / "hang.yaml").read_text())
    assert scn["world_size"] == 2 and scn["deadline"] == 12
    assert "launcher" not in scn and "python" not in scn   # the harness's own interpreter
    assert scn["program"] == {"script": "hang.py"}
    assert scn["env"] == {"MASTER_PORT": "29533"}
    ranks = scn["expect"]["ranks"]
    assert scn["expect"]["job"] == "hang"
    assert ranks["0"]["outcome"] == "hang" and ranks["0"]["phase"] == "init"
    assert ranks["1"]["outcome"] == "hang"
    # the original launch's deadline counted from its ranks' torch import, as a run's does
    # from its start line: 12 s after it, not the deadline + 30 s allowance
    after = re.search(r"alive at the deadline \((\d+) s after torch was loaded, ([\d.]+) s in "
                      r"all", scn["about"])
    assert after and int(after[1]) == 12 and float(after[2]) < 12 + 30, scn["about"]
    again = harness("run", "hang.yaml", "--no-progress", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr


@pytest.mark.parametrize("command, words", [
    (["srun", "-N", "2", "python", "train.py"], "srun: not supported yet"),
    (["bash", "run.sh"], "bash: not a command capture understands"),
    (["torchrun", "--nproc-per-node", "2", "--no-such-flag", "t.py"], "torchrun's own parser"),
    (["python", "missing.py"], "no such file"),
    (["torchrun", "--nproc-per-node", "gpu", "t.py"], "capture needs a number of workers"),
])
def test_commands_capture_cannot_understand(tmp_path, command, words):
    (tmp_path / "t.py").write_text("pass\n")
    p = harness("capture", "-o", "x.yaml", "--", *command, cwd=tmp_path)
    assert p.returncode == 2
    assert words in p.stderr and "Traceback" not in p.stderr + p.stdout
    assert not (tmp_path / "x.yaml").exists()


def test_environment_allow_list_and_secret_names(tmp_path):
    (tmp_path / "t.py").write_text("pass\n")
    env = {"PATH": "/usr/bin", "HOME": "/root", "NCCL_DEBUG": "INFO", "TORCH_HUB_TOKEN": "s",
           "GLOO_SOCKET_IFNAME": "lo", "RANK": "0", "WORLD_SIZE": "3"}
    scn, left = cl.scenario_of(["MY_TOKEN=x", "python", "t.py"], tmp_path / "o.yaml", env=env,
                               cwd=tmp_path)
    assert scn["env"] == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "INFO"}
    assert scn["world_size"] == 3
    assert {"PATH", "HOME", "MY_TOKEN", "TORCH_HUB_TOKEN"} <= set(left)
    assert cl.shown(["MY_TOKEN=x", "NCCL_DEBUG=INFO", "python", "t.py"]) == \
        "MY_TOKEN=... NCCL_DEBUG=INFO python t.py"
    with pytest.raises(cl.CaptureError, match="looks like a secret"):
        cl.scenario_of(["python", "t.py"], tmp_path / "o.yaml", env=env, cwd=tmp_path,
                       keep_env=("MY_API_KEY",))


@pytest.mark.parametrize("command, launcher, program", [
    (["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
      "t.py", "--x", "1"], {"kind": "torchrun", "max_restarts": 1},
     {"script": "t.py", "args": ["--x", "1"]}),
    (["python", "-m", "torch.distributed.launch", "--nproc-per-node", "2", "--use-env", "t.py"],
     {"kind": "launch", "use_env": True}, {"script": "t.py"}),
    (["python", "-m", "torch.distributed.launch", "--nproc-per-node", "2", "--use_env", "t.py"],
     {"kind": "launch", "use_env": True}, {"script": "t.py"}),
    (["python", "-m", "torch.distributed.launch", "--nproc-per-node", "2", "t.py"],
     {"kind": "launch"}, {"script": "t.py"}),
    (["torchrun", "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
      "--rdzv-endpoint", "localhost:0", "--monitor-interval", "1", "t.py"],
     {"kind": "torchrun", "nnodes": 1, "rdzv_backend": "c10d", "rdzv_endpoint": "localhost",
      "monitor_interval": 1.0}, {"script": "t.py"}),
    (["torchrun", "--standalone", "--nproc-per-node", "2", "--rdzv-conf",
      "join_timeout=5,is_host=true", "--redirects", "3", "t.py"],
     {"kind": "torchrun", "standalone": True, "rdzv_conf": {"join_timeout": 5, "is_host": True},
      "args": ["--redirects", "3"]}, {"script": "t.py"}),
    (["env", "OMP_NUM_THREADS=2", "WORLD_SIZE=2", "python", "-u", "-m", "json.tool"],
     None, {"module": "json.tool"}),
])
def test_every_understood_form_writes_a_scenario_that_loads(tmp_path, command, launcher,
                                                            program):
    """Each command form capture claims (torchrun, python -m torch.distributed.run, the legacy
    launch with and without --use-env, env NAME=VALUE python -m MODULE): the scenario it
    writes, with an expectation, is one the loader takes, with that launcher."""
    from harness.scenario.loader import load_text

    (tmp_path / "t.py").write_text("pass\n")
    env = {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    command = [sys.executable if w == "python" else w for w in command]
    scn, _ = cl.scenario_of(command, tmp_path / "o.yaml", env=env, cwd=tmp_path)
    assert scn.get("launcher") == launcher and scn["program"] == program
    assert scn["world_size"] == 2 and "python" not in scn    # the harness's own interpreter
    scn.update(about="x", expect={"job": "ok"})
    (loaded,) = load_text(yaml.safe_dump(scn), str(tmp_path / "o.yaml"))
    assert loaded.launcher.kind == (launcher or {"kind": "direct"})["kind"]


# -- issue 39: capture records what ran, or says it could not ---------------------------------

# imports a module that lies only on PYTHONPATH (a folder beside the job's, not its own)
NEEDS_PATH = textwrap.dedent("""
    import mylib
    import torch.distributed as dist
    dist.init_process_group("gloo")
    dist.barrier()
    print("trained with", mylib.NAME)
    dist.destroy_process_group()
""")

# resumes from the checkpoint it writes in its working folder: trains the epochs left; every
# start appends "<epochs trained>" to the log named by its first argument (outside the folder)
RESUMES = textwrap.dedent("""
    import os, sys
    import torch.distributed as dist
    dist.init_process_group("gloo")
    start = int(open("ckpt.txt").read()) if os.path.exists("ckpt.txt") else 0
    for epoch in range(start, 10):
        dist.barrier()
        if dist.get_rank() == 0:
            with open("ckpt.txt", "w") as f:
                f.write(str(epoch + 1))
    if dist.get_rank() == 0:
        with open(sys.argv[1], "a") as f:
            f.write(f"{10 - start}\\n")
    dist.destroy_process_group()
""")

# reads a variable of its own, given on the command line only
NEEDS_VAR = textwrap.dedent("""
    import os
    import torch.distributed as dist
    data = os.environ["MY_DATA_DIR"]
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
""")


def test_launch_needing_pythonpath_replays_the_original_verdicts(tmp_path):
    """PYTHONPATH (what the launch needs to start) is written, not masked: every replay imports
    the module as the original launch did, and the file holds the original's verdict (ok)."""
    (tmp_path / "libs").mkdir()
    (tmp_path / "libs" / "mylib.py").write_text("NAME = 'mylib'\n")
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.py").write_text(NEEDS_PATH)
    p = harness("capture", "-o", "t.yaml", "--deadline", "40", "--",
                f"PYTHONPATH={tmp_path / 'libs'}", "OMP_NUM_THREADS=1", "torchrun",
                "--nproc-per-node", "2", "--standalone", "train.py", cwd=job)
    assert p.returncode == 0, p.stdout + p.stderr
    text = (job / "t.yaml").read_text()
    scn = yaml.safe_load(text)
    assert scn["env"]["PYTHONPATH"] == str(tmp_path / "libs")
    assert "PYTHONPATH=..." not in text
    assert scn["expect"]["job"] == "ok"
    assert all(r["outcome"] == "ok" for r in scn["expect"]["ranks"].values())
    assert "original launch: exit 0" in scn["about"]
    again = harness("run", "t.yaml", "--no-progress", cwd=job)
    assert again.returncode == 0, again.stdout + again.stderr


def test_each_run_has_its_own_copy_of_the_working_folder(tmp_path):
    """A program that checkpoints in its working folder and resumes from it: the original
    launch and every replay each start from the folder as it was (each trains all 10 epochs),
    and the folder itself is never written."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.py").write_text(RESUMES)
    log = tmp_path / "epochs.log"
    before = sorted(p.name for p in job.iterdir())
    p = harness("capture", "-o", str(tmp_path / "ckpt.yaml"), "--deadline", "40", "--runs",
                "2", "--", "WORLD_SIZE=2", sys.executable, "train.py", str(log), cwd=job)
    assert p.returncode == 0, p.stdout + p.stderr
    # the original launch and both replays: 10 epochs each, none resumed from another's file
    assert log.read_text().split() == ["10", "10", "10"], log.read_text()
    assert sorted(p.name for p in job.iterdir()) == before    # no ckpt.txt, no .harness
    scn = yaml.safe_load((tmp_path / "ckpt.yaml").read_text())
    assert scn["expect"]["job"] == "ok"
    assert "ckpt.txt" in scn["about"]      # what the launch writes in its folder is said


def test_replay_that_cannot_reproduce_the_launch_exits_non_zero(tmp_path):
    """The original launch trains (exit 0); a variable given on the command line only is not
    written (not on the keep list), so every replayed rank fails with KeyError: capture says
    which replay, which rank and what differed, names --keep-env MY_DATA_DIR, exits 1 and
    leaves no file claiming the failure. With --keep-env the same launch is captured."""
    (tmp_path / "train.py").write_text(NEEDS_VAR)
    cmd = ["MY_DATA_DIR=/data", "torchrun", "--nproc-per-node", "2", "--standalone",
           "train.py"]
    p = harness("capture", "-o", "v.yaml", "--deadline", "40", "--", *cmd, cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    out = p.stdout + p.stderr
    assert "case passed" not in out and "Traceback" not in p.stderr
    assert "original launch: exit 0" in out
    assert "run 1" in out and "rank 0" in out and "KeyError" in out
    assert "--keep-env MY_DATA_DIR" in out
    assert not (tmp_path / "v.yaml").exists()
    ok = harness("capture", "-o", "v.yaml", "--deadline", "40", "--runs", "1", "--keep-env",
                 "MY_DATA_DIR", "--", *cmd, cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert yaml.safe_load((tmp_path / "v.yaml").read_text())["expect"]["job"] == "ok"


def test_what_the_launch_needs_to_start_is_kept_secrets_never(tmp_path):
    (tmp_path / "t.py").write_text("pass\n")
    env = {"PYTHONPATH": "/src", "LD_LIBRARY_PATH": "/opt/lib", "VIRTUAL_ENV": "/venv",
           "CONDA_PREFIX": "/conda", "CUDA_HOME": "/cuda", "PYTORCH_CUDA_ALLOC_CONF": "x",
           "OMP_PROC_BIND": "true", "CUDA_TOKEN": "s", "HOME": "/root", "LD_PRELOAD": "/x.so"}
    scn, left = cl.scenario_of(["python", "t.py"], tmp_path / "o.yaml", env=env, cwd=tmp_path)
    assert set(scn["env"]) == {"PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX",
                               "CUDA_HOME", "PYTORCH_CUDA_ALLOC_CONF", "OMP_PROC_BIND"}
    assert {"CUDA_TOKEN", "HOME", "LD_PRELOAD"} <= set(left)


def _case(job, *ranks):
    return {"job": job, "ranks": [dict(zip(("label", "outcome", "exception", "message"), r))
                                  for r in ranks]}


def test_differs_names_the_rank_what_differed_and_the_hint():
    ok = cl.Original("ok", 0, "", 3.0, "trained\n")
    assert cl.differs(ok, _case("ok", ("0", "ok", None, "")), [], []) == ""
    why = cl.differs(ok, _case("error", ("0", "error", "KeyError", "'MY_DATA_DIR'"),
                               ("agent:local", "error", "ChildFailedError", "====\nt.py FAILED")),
                     ["MY_DATA_DIR"], ["HOME", "MY_DATA_DIR"])
    assert "original launch ended exit 0" in why and "job error" in why
    assert "rank 0 error KeyError: 'MY_DATA_DIR'" in why
    assert "agent:local error ChildFailedError: t.py FAILED" in why
    assert "--keep-env MY_DATA_DIR" in why and "--keep-env HOME" not in why
    # both failed, but with an exception the original's output never names
    bad = cl.Original("error", 1, "", 3.0, "ValueError: bad batch\nChildFailedError\n")
    assert cl.differs(bad, _case("error", ("1", "error", "ValueError", "bad batch")), [],
                      []) == ""
    why = cl.differs(bad, _case("error", ("1", "error", "ModuleNotFoundError",
                                          "No module named 'mylib'")), ["MY_TOKEN"], [])
    assert "never names ModuleNotFoundError" in why and "rank 1" in why
    assert "--keep-env MY_TOKEN" not in why and "secret-looking" in why
    # a hang is reproduced by a hang only
    hang = cl.Original("hang", None, "torchrun still running", 90.0, "")
    assert "longer --deadline" in cl.differs(hang, _case("ok", ("0", "ok", None, "")), [], [])
    assert cl.differs(hang, _case("hang", ("0", "hang", None, "")), [], []) == ""


def test_working_folder_copy_skips_refuses_and_lists_writes(tmp_path, monkeypatch):
    root = tmp_path / "job"
    (root / ".git").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("ref\n")
    (root / "env").mkdir()
    (root / "env" / "pyvenv.cfg").write_text("home = /usr\n")
    (root / "tools").mkdir()
    (root / "tools" / "pyvenv.cfg").write_text("home = /usr\n")
    (root / "tools" / "run.py").write_text("pass\n")
    (root / "train.py").write_text("pass\n")
    os.mkfifo(root / "pipe")
    named = cl.named_paths(["python", "tools/run.py"], {}, root)
    folder = cl.Folder(root, named)
    assert folder.refusal == "" and sorted(folder.skipped) == [".git", "env"]
    copy = folder.copy(tmp_path / "c")
    assert sorted(p.name for p in copy.iterdir()) == ["tools", "train.py"]  # named: copied
    (copy / "ckpt.pt").write_text("1")
    (copy / "train.py").write_text("changed\n")
    assert folder.written_by(copy) == ["ckpt.pt", "train.py"]
    monkeypatch.setattr(cl, "MAX_COPY_BYTES", 4)
    refusal = cl.Folder(root, named).refusal
    assert "will not copy that much" in refusal and str(root) in refusal


def test_folder_too_large_to_copy_is_refused_not_shared(tmp_path):
    """A working folder over the copy limit: one line, exit 2, nothing run or written."""
    (tmp_path / "t.py").write_text("open('ran', 'w').write('1')\n")
    (tmp_path / "data.bin").write_bytes(b"x" * 4096)
    p = harness("capture", "-o", "x.yaml", "--", sys.executable, "t.py", cwd=tmp_path,
                env={"HARNESS_CAPTURE_MAX_COPY": "1000"})
    assert p.returncode == 2, p.stdout + p.stderr
    assert "will not copy that much" in p.stderr and str(tmp_path) in p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "x.yaml").exists() and not (tmp_path / "ran").exists()


def test_launch_that_does_not_start_is_refused(tmp_path):
    """Capture runs the launch as written first: a torchrun not on the command's PATH is one
    line and exit 2, nothing written."""
    (tmp_path / "t.py").write_text("pass\n")
    p = harness("capture", "-o", "x.yaml", "--", "torchrun", "--nproc-per-node", "2", "t.py",
                cwd=tmp_path, env={"PATH": str(tmp_path)})
    assert p.returncode == 2, p.stdout + p.stderr
    assert "torchrun: not found on its PATH" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "x.yaml").exists()


def test_the_interpreter_the_command_finds_is_written(tmp_path):
    """The python (or the torchrun's #! python) found on the command's PATH runs the replays
    when it is another environment's: a link to the base interpreter outside the venv's bin
    folder imports another site-packages, so it is written, not taken for the harness's own."""
    (tmp_path / "t.py").write_text("pass\n")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    base = os.path.realpath(sys.executable)
    (bin_ / "python").symlink_to(base)
    (bin_ / "torchrun").write_text(f"#!{bin_ / 'python'}\nimport sys\n")
    (bin_ / "torchrun").chmod(0o755)
    env = {"PATH": str(bin_), "WORLD_SIZE": "2"}
    scn, _ = cl.scenario_of(["python", "t.py"], tmp_path / "o.yaml", env=env, cwd=tmp_path)
    assert scn["python"] == str(bin_ / "python")
    scn, _ = cl.scenario_of(["torchrun", "--nproc-per-node", "2", "t.py"], tmp_path / "o.yaml",
                            env=env, cwd=tmp_path)
    assert scn["python"] == str(bin_ / "python")
    (bin_ / "torchrun").write_text(f"#!{sys.executable}\nimport sys\n")
    scn, _ = cl.scenario_of(["torchrun", "--nproc-per-node", "2", "t.py"], tmp_path / "o.yaml",
                            env=env, cwd=tmp_path)
    assert "python" not in scn

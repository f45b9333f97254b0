"""Runs inside a job step of the harness's own Slurm test cluster (a Slurm scenario's program):
task 0 is a user standing in that allocation and does what ``STEPS`` (a JSON file) says; the
other tasks wait until it is done. What task 0 saw goes to ``OUT/result.json``. Used by
tests/test_allocation.py.

Steps, each ``{"do": ..., "name": ...}``:

* ``run``: a command (``argv``), bounded by ``timeout``; its status, duration and output tail.
* ``kill``: a command started in a session of its own; once a file matching ``glob`` holds
  ``holds`` (the run's tasks are up), the command's own process (the harness, not its group)
  gets SIGKILL; then, for at most ``settle`` seconds, the processes whose command line or
  environment names ``marker`` are looked for until none is left. Records what was left and
  when it went.
* ``look``: processes naming ``marker`` (command line or environment), the allocation's steps
  (``squeue -s``), and the run directories left under ``state``.
* ``mount`` / ``umount``: a tmpfs over ``path`` in this node's own mount namespace (the other
  nodes do not see it), and its removal.
"""

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(sys.argv[1])
STEPS = json.loads(Path(sys.argv[2]).read_text())
DONE = OUT / "done"


def naming(marker):
    """(pid, command line) of every process whose command line or environment names
    ``marker`` (but this driver and its own children)."""
    out = []
    me = os.getpid()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == me:
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":
            continue
        if marker.encode() in cmd or marker.encode() in env:
            out.append([int(pid), cmd.replace(b"\0", b" ").decode(errors="replace")[:300]])
    return out


def steps_of_job():
    p = subprocess.run(["squeue", "-h", "-s", "-o", "%i %j"], capture_output=True, text=True,
                       timeout=30)
    return [ln.split() for ln in p.stdout.splitlines() if ln.strip()]


def run(step):
    t0 = time.monotonic()
    p = subprocess.run(step["argv"], capture_output=True, text=True, timeout=step["timeout"],
                       cwd=step.get("cwd"), env=dict(os.environ, **step.get("env", {})))
    return {"rc": p.returncode, "s": round(time.monotonic() - t0, 1),
            "stdout": p.stdout[-20000:], "stderr": p.stderr[-6000:]}


def kill(step):
    proc = subprocess.Popen(step["argv"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, cwd=step.get("cwd"),
                            env=dict(os.environ, **step.get("env", {})))
    seen = False
    end = time.monotonic() + step["wait"]
    while time.monotonic() < end and not seen and proc.poll() is None:
        for f in glob.glob(step["glob"]):
            try:
                if step["holds"] in Path(f).read_text():
                    seen = True
            except OSError:
                pass
        time.sleep(0.1)
    before = naming(step["marker"])
    t_kill = time.monotonic()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    left = naming(step["marker"])
    end = time.monotonic() + step["settle"]
    while left and time.monotonic() < end:
        time.sleep(0.2)
        left = naming(step["marker"])
    gone = round(time.monotonic() - t_kill, 1)
    # and the step itself, in Slurm's own view (its record can outlive its processes a while)
    steps = steps_of_job()
    while any(s[-1].startswith("harness-") for s in steps) and time.monotonic() < end:
        time.sleep(0.2)
        steps = steps_of_job()
    return {"seen": seen, "before": before, "left": left, "gone_after_s": gone,
            "step_gone_after_s": round(time.monotonic() - t_kill, 1), "steps": steps}


def look(step):
    state = Path(step["state"])
    runs = sorted(str(p) for p in state.glob("*/run-*")) if state.exists() else []
    return {"left": naming(step["marker"]), "steps": steps_of_job(), "runs": runs}


def mount(step):
    Path(step["path"]).mkdir(parents=True, exist_ok=True)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", step["path"]],
                       capture_output=True, text=True)
    return {"rc": p.returncode, "stderr": p.stderr}


def umount(step):
    p = subprocess.run(["umount", step["path"]], capture_output=True, text=True)
    return {"rc": p.returncode, "stderr": p.stderr}


if os.environ.get("SLURM_PROCID") == "0":
    results = {}
    try:
        for step in STEPS:
            results[step["name"]] = globals()[step["do"]](step)
    except Exception as e:  # noqa: BLE001 - the test reads what happened
        results["error"] = f"{type(e).__name__}: {e}"
    finally:
        (OUT / "result.json").write_text(json.dumps(results, indent=1))
        DONE.write_text("done")
else:
    end = time.monotonic() + float(os.environ.get("DRIVER_WAIT", "600"))
    while time.monotonic() < end and not DONE.exists():
        time.sleep(0.2)

"""The job script of ``launcher: slurm`` (``parent:srun``): what a user's batch script does on
the first node, then Slurm's own view of how it went.

``python -m harness.launchers.slurm_job SPEC``, observed (harness.ranks.observer) and held until the
start line like the first process of every launcher. Then it runs
``srun OPTIONS --output=<run>/slurm/task-%t.out --error=<run>/slurm/task-%t.err sh -c SCRIPT``
(each task's own output in a file of its own, srun's messages on its stderr), waits for it,
and reads the job's state (``squeue --json``: a finished job stays in the controller's list
for ``MinJobAge``; ``scontrol`` has no JSON form in Slurm 22.05). It writes
``<run>/slurm/job.json``
(srun's exit status, its messages, each task that failed and how, the job's state, reason and
exit code) and prints one line of it. When srun exits 0 so does this; otherwise it raises
:class:`SrunFailed` whose message says all of that, so that an expectation can name it
(``parent:srun: {outcome: error, message: "exit code 7"}``).

What srun itself says is text: srun has no machine-readable report of its tasks (no
``--json`` in Slurm 22.05), and ``sacct --json``, which has each step's exit code, needs
accounting storage, which the run's test cluster does not run. So the one thing read from
srun's words is its line per failed task, ``srun: error: NODE: task(s) N: HOW``
(:data:`TASK_LINE`; :func:`task_code` turns HOW into a status), plus ``Node failure on NODE``
(``harness.launchers.slurm``); every other line is kept as it was said, for people.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

MAX_LINES = 60
TRANSIENT = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED")
TASK_LINE = re.compile(r"srun: error: (?P<node>\S+): tasks? (?P<tasks>[0-9,\-\[\]]+): "
                       r"(?P<how>.+)$")


class SrunFailed(RuntimeError):
    """srun exited with a status other than 0 (the message is Slurm's view of the job)."""


def _tasks(spec: str) -> List[int]:
    out: List[int] = []
    for part in spec.strip("[]").split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            if a.isdigit() and b.isdigit():
                out += list(range(int(a), int(b) + 1))
        elif part.isdigit():
            out.append(int(part))
    return out


def parse_srun(lines: List[str]) -> Dict[str, Any]:
    """What srun's own lines say about the tasks (pure): task -> how it ended, and the node."""
    tasks: Dict[str, Dict[str, str]] = {}
    for ln in lines:
        m = TASK_LINE.search(ln)
        if m:
            for t in _tasks(m.group("tasks")):
                tasks[str(t)] = {"node": m.group("node"), "how": m.group("how").strip()}
    return tasks


def task_code(how: str) -> Optional[int]:
    """srun's words for how a task ended -> its exit status (a signal as -N), None if they
    say no status ("Exited with exit code 7": 7, "Terminated": -15, "Killed": -9)."""
    m = re.search(r"exit code (-?[0-9]+)", how)
    if m:
        return int(m.group(1))
    sig = {"terminated": 15, "killed": 9, "aborted": 6, "segmentation fault": 11,
           "hangup": 1, "interrupt": 2, "bus error": 7}.get(how.strip().lower())
    return -sig if sig else None


def exit_code_words(status: int) -> str:
    """A job's raw wait status as scontrol words it: ``EXIT:SIGNAL`` (1792 -> ``7:0``, a
    SIGTERM, 15 -> ``0:15``)."""
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    return f"{os.WEXITSTATUS(status)}:{sig}"


def _exit_code(value: Any) -> Optional[str]:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):                       # Slurm 22.05: the raw wait status
        return exit_code_words(value)
    if isinstance(value, dict):                      # later releases: an object
        code = (value.get("return_code") or {})
        sig = (value.get("signal") or {}).get("id") or {}
        number = code.get("number") if isinstance(code, dict) else code
        signo = sig.get("number") if isinstance(sig, dict) else sig
        if isinstance(number, int):
            return f"{number}:{signo if isinstance(signo, int) else 0}"
    return None


def job_of(listing: Any) -> Dict[str, str]:
    """``squeue --json`` -> the newest job's fields the evidence keeps, named as ``scontrol
    show job`` names them (pure): JobId, JobState, Reason, ExitCode, NodeList."""
    jobs = listing.get("jobs") if isinstance(listing, dict) else None
    jobs = [j for j in jobs if isinstance(j, dict) and isinstance(j.get("job_id"), int)] \
        if isinstance(jobs, list) else []
    if not jobs:
        return {}
    job = max(jobs, key=lambda j: j["job_id"])
    state = job.get("job_state")
    out = {"JobId": str(job["job_id"]),
           "JobState": ",".join(map(str, state)) if isinstance(state, list) else str(state),
           "Reason": str(job.get("state_reason") or "None"),
           "NodeList": str(job.get("nodes") or "")}
    code = _exit_code(job.get("exit_code"))
    if code is not None:
        out["ExitCode"] = code
    return {k: v for k, v in out.items() if v}


def summary(rc: int, job: Dict[str, str], tasks: Dict[str, Dict[str, str]],
            lines: List[str], step: Optional[str] = None) -> str:
    """One message (pure): srun's status, the job's state (``step``, on an allocation: the
    case's step, the job going on), the failed tasks, srun's lines."""
    words = [f"srun exited with status {rc}"]
    if step is not None:
        words.append(f"step {step or '?'} of the allocation (its job goes on)")
    elif job:
        words.append(f"job {job.get('JobId', '?')} {job.get('JobState', '?')} "
                     f"({job.get('Reason', 'None')}) ExitCode={job.get('ExitCode', '?')}")
    for t in sorted(tasks, key=int):
        words.append(f"task {t} on {tasks[t]['node']}: {tasks[t]['how']}")
    text = "; ".join(words)
    said = [ln for ln in lines if ln.startswith("srun:")]
    if said:
        text += "\n" + "\n".join(said[-MAX_LINES:])
    return text


def final_job_state(env: Dict[str, str], limit: float = 10.0) -> Dict[str, str]:
    """The job's fields once it left its transient states (COMPLETING...), looked at every
    0.1 s for at most ``limit`` seconds; the last look otherwise ({} when none answered)."""
    end = time.monotonic() + limit
    job: Dict[str, str] = {}
    while True:
        try:
            listed = subprocess.run(["squeue", "--json"], env=env, capture_output=True,
                                    text=True, timeout=5, check=False)
            if listed.returncode == 0:
                job = job_of(json.loads(listed.stdout)) or job
        except (OSError, subprocess.TimeoutExpired, ValueError):
            pass
        if job.get("JobState") not in TRANSIENT or time.monotonic() >= end:
            return job
        time.sleep(0.1)


def step_of(out_dir: Path) -> str:
    """On an allocation: the step the task helpers reported ("JOB.STEP"), or ""."""
    for path in sorted((out_dir.parent / "alloc").glob("*.status")):
        try:
            first = json.loads(path.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            continue
        if first.get("step"):
            return str(first["step"])
    return ""


def main(argv: List[str]) -> int:
    from ..core import protocol as P
    from ..machine.procs import die_with_parent

    die_with_parent()       # srun dies with this script (below), this script with the harness
    spec = json.loads(argv[0])
    env = dict(os.environ)
    env.pop(P.OBSERVE_NODE_ENV, None)            # they are nobody's children here
    allocation = spec.get("allocation")
    if spec.get("helper"):
        # on an allocation every task is the node's task helper (harness.launchers.
        # alloc_task), which runs the program: the helper itself is not observed, and nothing
        # of this machine's run (its pid record, its supervisor) means anything on a node
        from .alloc_env import NOT_ON_NODES, srun_env

        env = {k: v for k, v in srun_env().items() if k not in NOT_ON_NODES}
        for k in (P.OBSERVE_ROLE_ENV, P.OBSERVE_NODE_ENV):
            env.pop(k, None)
        out_dir = Path(spec["out_dir"])
        cmd = [*spec["srun"], f"--output={out_dir / 'helper-%t.out'}",
               f"--error={out_dir / 'helper-%t.err'}", *spec["helper"]]
    else:
        env[P.OBSERVE_ROLE_ENV] = spec["role"]   # what the tasks are: ranks or agents
        out_dir = Path(spec["slurm_conf"]).parent
        cmd = [*spec["srun"], f"--output={out_dir / 'task-%t.out'}",
               f"--error={out_dir / 'task-%t.err'}", "sh", "-c", spec["script"]]
    # srun dies with this script (util-linux's setpriv asks for the death signal, then execs
    # it; not harness.machine.procs --exec or a preexec_fn: the observer would see an interpreter or
    # a fork of this one and take it for a task), so a killed run leaves no srun behind
    proc = subprocess.Popen(["setpriv", "--pdeathsig", "KILL", "--", *cmd], env=env,
                            stdin=subprocess.DEVNULL, stdout=sys.stdout,
                            stderr=subprocess.PIPE, text=True, errors="replace")
    lines: List[str] = []
    assert proc.stderr is not None
    for line in proc.stderr:
        sys.stderr.write(line)
        sys.stderr.flush()
        if len(lines) < 10 * MAX_LINES:
            lines.append(line.rstrip("\n"))
    rc = proc.wait()
    # the test cluster's job ends with its one step: its final state is Slurm's view; an
    # allocation's job goes on after the case's step (which leaves no record without
    # accounting), so the step is named instead
    job = final_job_state(env) if not allocation else {}
    tasks = parse_srun(lines)
    record = {"srun_exit": rc, "job": job, "tasks": tasks,
              "srun_lines": [ln for ln in lines if ln.startswith("srun:")][-MAX_LINES:],
              "argv": cmd[:-1] + ["<script>"]}
    if allocation:
        record["allocation"] = allocation
        record["step"] = step_of(out_dir)
    try:
        (out_dir / "job.json").write_text(json.dumps(record, indent=1) + "\n")
    except OSError:
        pass
    text = summary(rc, job, tasks, lines, step=str(record.get("step") or "") if allocation
                   else None)
    print(text.splitlines()[0], flush=True)
    if rc != 0:
        raise SrunFailed(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

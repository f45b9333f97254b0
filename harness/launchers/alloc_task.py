"""The task helper on an allocation's node: what the supervisor cannot do from its own machine.

``srun`` runs ``python -m harness.launchers.alloc_task RUN_DIR`` as every task of a case's step
(harness.launchers.allocation). The supervisor is on another machine: it cannot signal a pid on
a node, read its /proc, or hand it a pipe. This helper does that on the node, and the two speak
through files in the run directory, which lies on a file system every node sees:

* ``alloc/spec.json`` (written by the supervisor before srun starts): what each task runs. In
  ``ranks`` mode (a ``launcher: direct`` scenario) the task picks its rank by its node and its
  local id (``$SLURMD_NODENAME``, ``$SLURM_LOCALID``): the rank's whole environment, its argv
  (the harness's worker with the rank's spec, or the user's program), whether it is held until
  the start line, its files; a node's spare task (its host has fewer ranks than the busiest)
  exits at once, and an ``absent`` rank's task says so and exits. In ``tasks`` mode (a
  ``launcher: slurm`` scenario) task N runs the job's task script as rank N, as srun would.
* ``alloc/<tag>.status`` (written here, JSON lines): ``start`` (the node, this helper's pid, the
  step, and both clocks, so that the supervisor can place the rank's monotonic event times on
  its own clock), ``child`` (the program's pid), each command done, ``exit`` (the status,
  a signal as -N, and when). Each line is one write of a file this helper alone appends to.
* ``alloc/<tag>.cmd`` (written by the supervisor, pre-created empty): one command a line,
  each done once: ``go`` (the start line: the held program is released), ``signal NAME`` (to
  the program's process group: kill_rank, stop_rank, the kill at the deadline), ``stacks``
  (the harness's stack-dump signal, then SIGCONT so that a stopped program can write them).
  Both files are re-opened at every look, so that a network file system's close-to-open
  consistency shows each new line (a file that already exists; a new file's name can take
  the directory's attribute cache time to appear on another client).
* ``alloc/heartbeat`` (rewritten by the supervisor every second): when it has not changed for
  ``lost_after`` seconds, the supervisor is gone (killed with SIGKILL, its machine lost): the
  program's group is killed and the helper exits, so that nothing of the run stays on the node
  (Slurm itself also ends a step whose srun was killed).

The program runs in a session of its own, its stdout and stderr drained into the run
directory (bounded, as on the harness's own machine: harness.machine.output_caps). Signals Slurm
sends the step (``scancel``, ``--kill-on-bad-exit``) reach the program directly (Slurm signals every
process of the step); this helper notes them and waits for the program, so that srun reports the
program's own end. When the program ends, the helper kills what is left of its group and ends the
same way: its exit status, or the same signal, so that srun's words for the task ("Exited with exit
code 7", "Terminated", "Killed") are the program's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

POLL = 0.05
# signals Slurm (or a user) sends the whole step: the helper notes them and waits for the
# program, which gets them itself (never SIG_IGN: an ignored signal would be inherited)
NOTED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
         signal.SIGQUIT, signal.SIGALRM, signal.SIGCONT)


def tag_of(label: str) -> str:
    return label.replace(":", "-").replace("@", "_")


class Status:
    """This task's status file (one JSON line per record, one write each)."""

    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, ev: str, **fields: Any) -> None:
        line = json.dumps({"ev": ev, "mono": time.monotonic(), **fields}) + "\n"
        try:
            os.write(self.fd, line.encode())
        except OSError:
            pass


class Commands:
    """The supervisor's commands to this task, each returned once."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.partial = b""

    def new(self) -> List[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        return [ln.decode(errors="replace").strip() for ln in lines if ln.strip()]


class Heartbeat:
    """Whether the supervisor is still there: its heartbeat file changed within ``lost_after``
    seconds (looked at once a second)."""

    def __init__(self, path: Path, lost_after: float):
        self.path, self.lost_after = path, lost_after
        self.last = b""
        self.changed = time.monotonic()
        self.looked = 0.0

    def lost(self) -> bool:
        now = time.monotonic()
        if now - self.looked < 1.0:
            return False
        self.looked = now
        try:
            with open(self.path, "rb") as f:
                data = f.read(200)
        except OSError:
            data = b""
        if data and data != self.last:
            self.last, self.changed = data, now
        return now - self.changed > self.lost_after


def entry_of(spec: Dict[str, Any], node: str, local: int, procid: int
             ) -> Optional[Dict[str, Any]]:
    """What this task runs (None: a spare task with nothing to run)."""
    if spec.get("mode") == "tasks":
        tasks = spec.get("tasks") or []
        return tasks[procid] if 0 <= procid < len(tasks) else None
    on_node = (spec.get("ranks") or {}).get(node)
    if on_node is None:
        return None
    return on_node[local] if 0 <= local < len(on_node) else None


def child_env(entry: Dict[str, Any], own: Dict[str, str]) -> Dict[str, str]:
    """The program's environment. A planned rank (``ranks`` mode): this task's own, as srun
    gave it (exported from the supervisor's machine, with what Slurm sets per task on this
    node: its SLURM_* variables, a GPU binding), with what the plan makes different for the
    rank (``env``, ``unset``). A task of a ``launcher: slurm`` job (``tasks`` mode, no ``env``
    in its entry): this task's own, observed in the role the entry says (its task script sets
    RANK, MASTER_ADDR... as a user's does)."""
    from ..core import protocol as P

    if "env" not in entry:
        env = dict(own)
        env[P.OBSERVE_ROLE_ENV] = str(entry.get("role") or P.ROLE_WORKER)
        if entry.get("observe_dir"):
            env[P.OBSERVE_DIR_ENV] = str(entry["observe_dir"])
        return env
    env = dict(own)
    env.update(entry.get("env") or {})
    for k in entry.get("unset") or []:
        env.pop(k, None)
    return env


def own_address() -> str:
    """The address this node's name resolves to here: what gloo advertises without
    GLOO_SOCKET_IFNAME, and what a peer's message names ("" if it does not resolve)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return ""


def _signum(name: str) -> Optional[int]:
    sig = getattr(signal, "SIG" + name.upper(), None)
    return int(sig) if isinstance(sig, signal.Signals) else None


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def run(run_dir: Path) -> int:
    from ..machine.output_caps import Capture

    spec = json.loads((run_dir / "alloc" / "spec.json").read_text())
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    procid = int(os.environ.get("SLURM_PROCID", "0"))
    local = int(os.environ.get("SLURM_LOCALID", "0"))
    entry = entry_of(spec, node, local, procid)
    if entry is None:
        return 0              # a spare task: its node's host has fewer ranks
    tag = entry.get("tag") or tag_of(str(entry["label"]))
    status = Status(run_dir / "alloc" / f"{tag}.status")
    status.write("start", node=node, host=socket.gethostname(), addr=own_address(),
                 pid=os.getpid(),
                 wall=time.time(), procid=procid, local=local,
                 step=f"{os.environ.get('SLURM_JOB_ID', '')}.{os.environ.get('SLURM_STEP_ID', '')}")
    if entry.get("absent"):
        status.write("absent")
        return 0
    noted: List[int] = []
    for s in NOTED:
        signal.signal(s, lambda n, _f: noted.append(n))
    env = child_env(entry, dict(os.environ))
    capture = Capture()
    out_w = capture.pipe(Path(entry["out"]))
    err_w = capture.pipe(Path(entry["err"]))
    keep, go_w, stdin = _child_fds(entry, env)
    try:
        proc = subprocess.Popen(entry["argv"], env=env, cwd=entry.get("cwd") or "/",
                                stdin=stdin, stdout=out_w, stderr=err_w, pass_fds=tuple(keep),
                                start_new_session=True)
    except OSError as e:
        status.write("error", message=f"cannot start {entry['argv'][0]}: {e}")
        sys.stderr.write(f"harness task helper: cannot start {entry['argv'][0]}: {e}\n")
        return 127
    finally:
        for fd in keep + [out_w, err_w]:
            os.close(fd)
    status.write("child", pid=proc.pid)
    go: Any = proc.stdin if proc.stdin is not None else \
        (os.fdopen(go_w, "wb", buffering=0) if go_w is not None else None)
    cmds = Commands(run_dir / "alloc" / f"{tag}.cmd")
    beat = Heartbeat(Path(spec["heartbeat"]), float(spec.get("lost_after", 30)))
    lost = False
    while proc.poll() is None:
        for cmd in cmds.new():
            go = _obey(cmd, proc, go)
            status.write("done", cmd=cmd)
        if beat.lost():
            lost = True
            status.write("lost", after=beat.lost_after)
            _killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            break
        time.sleep(POLL)
    rc = proc.returncode
    _killpg(proc.pid, signal.SIGKILL)         # whatever the program left in its group
    capture.close()
    status.write("exit", returncode=rc, wall=time.time(),
                 slurm_signals=[signal.Signals(n).name for n in noted])
    if lost:
        return 1
    return _end_as(rc)


def _child_fds(entry: Dict[str, Any], env: Dict[str, str]) -> Tuple[List[int], Optional[int], Any]:
    """(the descriptors the program is handed, the write end of its start line's pipe, its
    stdin), its environment told where they are: the harness's worker gets its event and
    stack descriptors and the start line on stdin; an observed program its events file and,
    when held, the start line's pipe."""
    from ..core import protocol as P

    keep: List[int] = []
    go_w: Optional[int] = None
    stdin: Any = subprocess.DEVNULL
    if entry.get("protocol") == "worker":     # the harness's worker: fds + stdin
        ev = os.open(entry["events"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        st = os.open(entry["stacks"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        keep += [ev, st]
        env[P.EVENT_FD_ENV], env[P.STACK_FD_ENV] = str(ev), str(st)
        stdin = subprocess.PIPE
    else:                                     # an observed program (harness.ranks.observer)
        env[P.OBSERVE_EVENTS_ENV] = entry["events"]
        env[P.OBSERVE_LABEL_ENV] = str(entry["label"])
        if entry.get("held"):
            go_r, go_w = os.pipe()
            keep.append(go_r)
            env[P.GO_FD_ENV] = str(go_r)
    return keep, go_w, stdin


def _obey(cmd: str, proc: Any, go: Any) -> Any:
    """One command of the supervisor's: ``go`` (the start line, written once), ``signal NAME``
    (to the program's group), ``stacks``; returns the start line's file, None once used."""
    from ..core import protocol as P

    word, _, arg = cmd.partition(" ")
    if word == "go" and go is not None:
        try:
            go.write(P.GO_LINE)
            go.close()
        except OSError:
            pass
        go = None
    elif word == "signal":
        sig = _signum(arg)
        if sig is not None:
            _killpg(proc.pid, sig)
    elif word == "stacks":
        try:
            os.kill(proc.pid, P.STACK_SIGNAL)
            os.kill(proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    return go


def _end_as(rc: int) -> int:
    """End as the program ended (its status, or the same signal): srun says the same."""
    if rc < 0:
        try:
            signal.signal(-rc, signal.SIG_DFL)
        except (OSError, ValueError):
            pass                              # SIGKILL: no disposition to reset
        os.kill(os.getpid(), -rc)
        time.sleep(1)
        return 128 - rc
    return rc


def main(argv: List[str]) -> int:
    from ..machine.procs import die_with_parent

    die_with_parent()          # with slurmstepd: a task never outlives its step
    if len(argv) != 1:
        sys.stderr.write("usage: python -m harness.launchers.alloc_task RUN_DIR\n")
        return 2
    return run(Path(argv[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

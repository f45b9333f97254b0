"""The user's own launch, run as written, for ``harness capture`` (harness.tools.capture):
``run_original`` (the whole environment, a direct ``python SCRIPT`` once per rank, until it
ends or the deadline from its torch import, at most the deadline + ``START_ALLOWANCE``; every
process it made killed by its token),
``Original`` (how it ended, its output), and ``differs``: why a replay does not reproduce it."""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

from .capture_command import CaptureError, _assignments, secret

ORIGINAL_TOKEN = "HARNESS_CAPTURE_ORIGINAL"   # marks every process of the original launch
LAST_LINES = 8
# the original launch's limit is the deadline counted from when each process capture started
# has torch loaded (the harness's deadline counts from the start line its ranks pass once
# imported), and at most the deadline plus this: its interpreters start and import torch cold
START_ALLOWANCE = 30.0


def torch_loaded(pid: int) -> bool:
    """Whether process ``pid`` has torch's library mapped (its ``import torch`` is under way or
    done): read from /proc/PID/maps; False where that cannot be read."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            return any(b"libtorch" in line for line in f)
    except OSError:
        return False


class Original:
    """How the user's own launch ended: ``state`` ok (every process exit 0), error (one exit
    non-zero or a signal) or hang (alive at the deadline, then killed); ``exit`` the launch's
    status (torchrun's, or the first rank's that failed), the output kept."""

    def __init__(self, state: str, exit: Optional[int], detail: str, seconds: float,
                 output: str, started: Optional[float] = None):
        self.state, self.exit, self.detail, self.seconds = state, exit, detail, seconds
        self.output = output
        self.started = started    # s to torch loaded in each process (None: never seen)

    def last_lines(self, n: int = LAST_LINES) -> List[str]:
        lines = [ln.rstrip()[:240] for ln in self.output.splitlines() if ln.strip()]
        return lines[-n:]

    def notable(self, n: int = 3) -> List[str]:
        """Its last exception lines (``[rank1]: ValueError: ...``), else its last lines."""
        lines = self.last_lines(10_000)
        exc = [ln for ln in lines if re.search(r"\b[A-Z]\w*(Error|Exception|Exit|Interrupt)\b"
                                               r"(:|$)", ln) and not ln.startswith(" ")]
        seen: List[str] = []
        for ln in reversed(exc):
            if ln not in seen:
                seen.insert(0, ln)
            if len(seen) == n:
                break
        return seen or lines[-n:]

    def summary(self) -> str:
        if self.state == "hang" and self.started is not None:
            what = (f"alive at the deadline ({self.seconds - self.started:.0f} s after torch was "
                    f"loaded, {self.seconds:.1f} s in all), killed")
        elif self.state == "hang":
            what = f"alive at the deadline ({self.seconds:.0f} s, torch never seen loaded), killed"
        else:
            what = f"exit {self.exit}"
        return what + (f" ({self.detail})" if self.detail else "") + \
            ("" if self.state == "hang" else f" in {self.seconds:.1f} s")


def _marked(token: str) -> List[int]:
    """Every process whose environment carries the original launch's token (torchrun's
    workers run in sessions of their own: the group of the launch does not hold them)."""
    needle = f"{ORIGINAL_TOKEN}={token}".encode() + b"\0"
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if needle in f.read():
                    out.append(int(d))
        except OSError:
            continue
    return out


def _kill_marked(token: str) -> None:
    import signal

    for _ in range(50):
        pids = _marked(token)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.1)


def _wait(procs: List[Any], t0: float, deadline: float) -> Optional[float]:
    """Wait until every process ended or the deadline passed, counted from the start line:
    every process capture started (each rank, or torchrun) has torch loaded; at most the
    deadline + ``START_ALLOWANCE`` from ``t0``. Returns the start line (monotonic; None: never
    seen)."""

    started: Optional[float] = None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if started is None and all(p.poll() is not None or torch_loaded(p.pid) for p in procs):
            started = now
        if now - t0 >= deadline + START_ALLOWANCE or \
                (started is not None and now - started >= deadline):
            break
        time.sleep(0.1)
    return started


def run_original(command: List[str], kind: str, world: int, cwd: Path, deadline: float,
                 tmp: Path) -> Original:
    """Run the launch as written (the whole environment of this shell and of the command
    line), in ``cwd``, until it ends or the deadline: a direct ``python SCRIPT`` once per rank
    with RANK/LOCAL_RANK (and WORLD_SIZE, MASTER_ADDR, MASTER_PORT when the command sets
    none), as one command per rank is launched by hand."""
    from ..machine.output_caps import Capture
    from ..machine.ports import PortLease
    from ..machine.procs import ManagedProcess, PidRecord

    assigned, argv = _assignments(list(command))
    token = uuid.uuid4().hex
    base = {**os.environ, **assigned, ORIGINAL_TOKEN: token}
    if "TMPDIR" not in assigned:
        # torchrun's agent makes a torchelastic_* folder in TMPDIR and leaves it: kept inside
        # capture's own folder, it goes with it (a TMPDIR the command sets is its own)
        (tmp / "tmpdir").mkdir(exist_ok=True)
        base["TMPDIR"] = str(tmp / "tmpdir")
    if shutil.which(argv[0], path=base.get("PATH")) is None:
        raise CaptureError(f"the launch does not start: {argv[0]}: not found on its PATH (capture "
                           "runs the command as written first, to see how it ends)")
    envs: List[Dict[str, str]] = []
    lease = PortLease()
    try:
        if kind == "direct":
            common = {"WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world)}
            if not base.get("MASTER_ADDR"):
                common["MASTER_ADDR"] = "127.0.0.1"
            if not base.get("MASTER_PORT"):
                common["MASTER_PORT"] = str(lease.take())
            for r in range(world):
                envs.append({**base, **common, "RANK": str(r), "LOCAL_RANK": str(r)})
        else:
            envs.append(base)
        cap = Capture(head=256 << 10, tail=64 << 10)
        procs: List[Any] = []
        outs: List[Path] = []
        t0 = time.monotonic()
        try:
            for r, env in enumerate(envs):
                outs.append(tmp / f"original-{r}.out")
                w = cap.pipe(outs[-1])
                try:
                    procs.append(ManagedProcess(argv, name=f"original {r}", env=env,
                                                cwd=str(cwd), stdout=w, stderr=w,
                                                record=PidRecord(tmp / "pids.jsonl"),
                                                exec_wrapper=True))
                except OSError as e:
                    raise CaptureError(f"the launch does not start: {argv[0]}: "
                                       f"{e.strerror or e}") from None
                finally:
                    os.close(w)
            started = _wait(procs, t0, deadline)
            seconds = time.monotonic() - t0
            hung = [i for i, p in enumerate(procs) if p.poll() is None]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            _kill_marked(token)
            cap.close()
    finally:
        lease.release()
    output = "\n".join(o.read_text(errors="replace") for o in outs if o.exists())
    who = (lambda i: f"rank {i}") if kind == "direct" else (lambda i: kind)
    if hung:
        return Original("hang", None, ", ".join(who(i) for i in hung) + " still running",
                        seconds, output, None if started is None else started - t0)
    codes = [int(p.returncode) for p in procs]
    bad = [i for i, c in enumerate(codes) if c != 0]
    if not bad:
        return Original("ok", 0, "", seconds, output)
    i = bad[0]
    parts = [who(i)] if kind == "direct" and world > 1 else []
    if codes[i] < 0:
        parts.append(f"killed by signal {-codes[i]}")
    detail = ", ".join(parts)
    return Original("error", codes[i], detail, seconds, output)


# the job outcomes of a replay that agree with how the original launch ended
AGREES = {"ok": ("ok",), "error": ("error", "timeout", "crash"), "hang": ("hang",)}


def differs(orig: Original, case: Dict[str, Any], missing: List[str],
            left_out: List[str]) -> str:
    """Why a replay (a report's case) does not reproduce the original launch, or "": its job
    ended another way, or a rank failed with an exception the original's output never names.
    ``missing``: the variables the original had and the replays have not (set on the
    command line, not written); ``left_out``: every name not written."""
    job = case.get("job")
    ranks = case.get("ranks") or []
    failed = [r for r in ranks if r.get("outcome") not in ("ok", None)]
    why = ""
    if job not in AGREES[orig.state]:
        why = f"the original launch ended {orig.summary()}, this replay's job {job}"
    elif orig.state == "error":
        alien = [r for r in failed if r.get("exception") and not re.search(
            r"\b" + re.escape(str(r["exception"]).rsplit(".", 1)[-1]) + r"\b", orig.output)]
        if alien:
            failed = alien
            why = (f"the original launch ended {orig.summary()} and its output never names "
                   + ", ".join(sorted({str(r['exception']) for r in alien})))
    if not why:
        return ""
    rows = []
    for r in failed[:6]:
        msg = [ln.strip() for ln in str(r.get("message") or "").splitlines()
               if re.search(r"[A-Za-z0-9]{2}", ln)][:1]
        rows.append(f"{'rank ' if r['label'][:1].isdigit() else ''}{r['label']} "
                    f"{r.get('outcome')}" + (f" ({r['phase']})" if r.get("phase") else "")
                    + (f" {r['exception']}" if r.get("exception") else "")
                    + (f": {msg[-1][:200]}" if msg else ""))
    text = " ".join(str(r.get("message") or "") for r in failed)
    named = [n for n in left_out if n.split(" ")[0] and re.search(
        r"\b" + re.escape(n.split(" ")[0]) + r"\b", text)]
    hint = [n.split(" ")[0] for n in named or missing]
    out = why + ("; " + "; ".join(rows) if rows else "")
    if orig.state == "hang":
        out += (". (The original launch had the deadline from when its processes had torch "
                f"loaded, at most the deadline + {START_ALLOWANCE:g} s: if it was still "
                "starting or slow, give a longer --deadline)")
    keep = [n for n in hint if not secret(n)]
    if keep:
        out += (". The replays ran without " + ", ".join(keep[:5]) + " (the original launch "
                "had it; not written): if the program needs it, "
                + " ".join(f"--keep-env {n}" for n in keep[:5]) + " writes it into the file")
    if len(keep) < len(hint):
        out += (". Left out for its secret-looking name, never written: "
                + ", ".join(n for n in hint if secret(n))[:200]
                + " (give it to the program another way)")
    if not hint:
        out += (". If the program needs a variable that was not written, give --keep-env NAME"
                + (f" (left out: {', '.join(left_out[:12])}"
                   + (", ..." if len(left_out) > 12 else "") + ")" if left_out else ""))
    return out

"""Native stacks of a stuck process by py-spy: ``py-spy dump --native --json --pid PID``.

py-spy's JSON (a list of threads, each with its frames) is what the harness reads; the text a
person sees (the failure table, the HTML report, ``rank-N.native``) is rendered from it here,
in the shape py-spy itself prints (``Thread 17395 (idle): "MainThread"`` then one indented
``function (file:line)`` per frame, innermost first). py-spy's human-readable output is never
parsed. The evidence keeps the threads trimmed to what a rule or a person reads: the thread's
id, name and state, and per frame its function, file (py-spy's short name) and line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

TIMEOUT_S = 20.0
NAME_CAP = 200        # pybind11's template frames run to thousands of characters
NAME_HEAD = 150

Thread = Dict[str, Any]


def executable() -> Optional[str]:
    """py-spy on PATH, or beside this Python (a venv that was not activated)."""
    return shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))


def _name(name: Any) -> str:
    text = str(name or "?")
    return text if len(text) <= NAME_CAP else text[:NAME_HEAD] + " ..."


def trim(raw: Any) -> List[Thread]:
    """py-spy's JSON threads -> what the evidence keeps (pure): ``{"thread", "name", "state",
    "frames": [{"function", "file", "line"}]}``; anything that is not a thread is left out."""
    out: List[Thread] = []
    for t in raw if isinstance(raw, list) else []:
        if not isinstance(t, dict):
            continue
        tid = t.get("os_thread_id") or t.get("thread_id")
        state = "active+gil" if t.get("owns_gil") else "active" if t.get("active") else "idle"
        frames = [{"function": _name(f.get("name")),
                   "file": str(f.get("short_filename") or f.get("filename") or "?"),
                   "line": int(f.get("line") or 0)}
                  for f in t.get("frames") or [] if isinstance(f, dict)]
        out.append({"thread": tid, "name": t.get("thread_name"), "state": state,
                    "frames": frames})
    return out


def render(threads: Sequence[Thread]) -> str:
    """The threads as text, in py-spy's own layout (pure)."""
    lines: List[str] = []
    for t in threads:
        head = f"Thread {t.get('thread')} ({t.get('state', 'idle')})"
        lines.append(head + (f': "{t["name"]}"' if t.get("name") else ""))
        for f in t.get("frames") or []:
            where = f"{f['file']}:{f['line']}" if f.get("line") else f["file"]
            lines.append(f"    {f['function']} ({where})")
    return "\n".join(lines) + ("\n" if lines else "")


def dump(pid: int, timeout: float = TIMEOUT_S) -> Tuple[List[Thread], str]:
    """(threads, text) of a process's native stacks (py-spy pauses it while it reads them).
    Without py-spy: ([], ""). When py-spy fails (not permitted: it needs CAP_SYS_PTRACE; the
    process is gone): ([], what py-spy said, for a person)."""
    exe = executable()
    if not exe:
        return [], ""
    argv = [exe, "dump", "--native", "--json", "--pid", str(pid)]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                           start_new_session=True)
    except (subprocess.TimeoutExpired, OSError) as e:
        return [], f"py-spy failed: {e}"
    if p.returncode != 0:
        return [], f"py-spy failed (rc {p.returncode}): {p.stderr[-500:]}"
    try:
        threads = trim(json.loads(p.stdout))
    except ValueError as e:
        return [], f"py-spy gave no JSON ({e}): {p.stdout[:300]}"
    return threads, render(threads)


def functions(thread: Thread) -> List[str]:
    """The function names of a thread's frames, innermost first."""
    return [str(f.get("function", "")) for f in thread.get("frames") or []]

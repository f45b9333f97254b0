"""Other interpreters for ranks (``python:`` per host or rank): where one is, and whether it can
run a rank (a Python that imports torch and torch.distributed). A scenario whose interpreter is
missing or cannot import torch is skipped with this module's reason.

``~`` and ``$VARS`` in a path are expanded (``$HARNESS_PYTHON_OLD`` keeps a machine's path out of
the scenario file); a bare name (``python3.10``) is looked up on PATH.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from typing import Optional, Tuple

PROBE_TIMEOUT = 120.0
# one JSON line, last: whatever the interpreter's own start-up prints before it is not read
_PROBE = ("import json, platform, torch, torch.distributed as d; "
          "print(json.dumps({'torch': torch.__version__, 'distributed': d.is_available(), "
          "'python': platform.python_version()}))")


def resolve(spec: str) -> str:
    """The interpreter's path as the plan gives it to the launcher ('' for none); a virtual
    environment's folder stands for its ``bin/python``."""
    path = os.path.expandvars(os.path.expanduser(spec))
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "bin", "python")):
        return os.path.join(os.path.abspath(path), "bin", "python")
    if os.sep not in path:
        return shutil.which(path) or path
    return path


@functools.cache
def probe(path: str) -> Tuple[Optional[str], str]:
    """(None, 'torch 2.13.0 on Python 3.11.2') when ``path`` can run a rank, else (the reason
    it cannot, ''). Tried once per process and path."""
    if "$" in path:
        return f"python {path}: names an environment variable that is not set", ""
    if not os.path.isabs(path):
        return f"python {path}: not found on PATH", ""
    if not os.path.exists(path):
        return f"python {path}: no such file", ""
    if not os.access(path, os.X_OK):
        return f"python {path}: not executable", ""
    try:
        p = subprocess.run([path, "-c", _PROBE], capture_output=True, text=True,
                           timeout=PROBE_TIMEOUT, start_new_session=True, cwd="/",
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"python {path}: could not run it: {e}", ""
    if p.returncode != 0:
        lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
        return f"python {path}: cannot import torch: {lines[-1] if lines else p.returncode}", ""
    try:
        got = json.loads((p.stdout.strip().splitlines() or ["{}"])[-1])
        version, dist, py = str(got["torch"]), got["distributed"], str(got["python"])
    except (ValueError, KeyError, TypeError):
        return f"python {path}: its answer was not understood: {p.stdout[-200:]!r}", ""
    if dist is not True:
        return f"python {path}: torch {version} was built without torch.distributed", ""
    return None, f"torch {version} on Python {py}"

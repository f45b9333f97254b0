"""What torch this machine has, asked of a fresh interpreter once per process (cached).

The supervisor never imports torch itself: the ranks do, and the harness must work whatever
torch (2.2 and newer) the image carries. The probe is the same interpreter the ranks run.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from typing import Any, Dict, Optional

_CODE = r"""
import json, os, sys
out = {"python": sys.version.split()[0], "torch": None}
try:
    import torch, torch.distributed as dist
    out["torch"] = torch.__version__
    out["torch_path"] = os.path.dirname(os.path.abspath(torch.__file__))
    out["torch_git"] = getattr(torch.version, "git_version", None)
    out["cuda"] = torch.version.cuda
    out["gpus"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out["distributed"] = dist.is_available()
    out["gloo"] = dist.is_available() and dist.is_gloo_available()
    out["nccl"] = dist.is_available() and dist.is_nccl_available()
    out["mpi"] = dist.is_available() and dist.is_mpi_available()
    out["ucc"] = dist.is_available() and getattr(dist, "is_ucc_available", lambda: False)()
    try:
        out["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version())) if out["nccl"] else None
    except Exception:
        out["nccl_version"] = None
    out["libuv_store_default"] = os.environ.get("USE_LIBUV", "") != "0" and \
        tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 4)
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def _cache_key() -> str:
    """What the probe's answer depends on: the interpreter, the torch it finds (its files' size
    and time: a reinstall changes them), and the environment it reads. Finding torch does not
    import it."""
    import hashlib
    import importlib.util

    parts = [os.path.realpath(sys.executable), sys.version]
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    origin = spec.origin if spec is not None and spec.origin else ""
    if not origin:
        return ""   # no torch to key on: ask every time (its absence is cheap to learn)
    torch_dir = os.path.dirname(origin)
    # where torch is found, as found (not resolved), and the environment's prefix: a venv
    # whose torch is a symlink to another's has the same files but answers with its own path
    parts += [f"torch_dir={torch_dir}", f"prefix={sys.prefix}"]
    for name in ("__init__.py", "version.py", "lib/libtorch_cpu.so", "lib/libtorch_cuda.so"):
        try:
            st = os.stat(os.path.join(torch_dir, name))
            parts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}")
        except OSError:
            parts.append(f"{name}:-")
    for var in ("PYTHONPATH", "USE_LIBUV", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"):
        parts.append(f"{var}={os.environ.get(var, '')}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def _cache_path(key: str) -> Any:
    from .rundir import base_dir

    return base_dir() / f"probe2-{key}.json"   # 2: answers carry torch_path


@functools.cache
def probe(python: Optional[str] = None) -> Dict[str, Any]:
    """The probe's answer (of ``python``, another interpreter, when given: asked once per
    process, not cached on disk): from the per-user cache when the interpreter, torch's files
    and the variables it reads are unchanged (asking costs a torch import, ~1-3 s, in every pytest
    worker), else asked and cached. A GPU count can change without those: the cache holds
    only where no GPU was seen."""
    # not realpath: a venv's python is a symlink to the base interpreter, and the venv (its
    # site-packages, its .pth files) is what differs
    if python and os.path.abspath(python) != os.path.abspath(sys.executable):
        info = _ask(python)
        info["python_executable"] = python
        return info
    key = _cache_key()
    if key:
        try:
            cached: Dict[str, Any] = json.loads(_cache_path(key).read_text())
            if isinstance(cached, dict) and cached.get("torch"):
                return cached
        except Exception:  # noqa: BLE001 - unreadable or no state folder: ask
            pass
    info = _ask()
    if key and info.get("torch") not in (None, "none") and not info.get("gpus") \
            and not info.get("error"):
        try:
            path = _cache_path(key)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(info))
            tmp.replace(path)
        except Exception:  # noqa: BLE001 - a cache that cannot be written is no cache
            pass
    return info


def _ask(python: Optional[str] = None) -> Dict[str, Any]:
    try:
        p = subprocess.run([python or sys.executable, "-c", _CODE], capture_output=True,
                           text=True, timeout=300)
    except OSError as e:
        return {"torch": "none", "error": f"{python}: {e}"}
    try:
        info: Dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        info = {"torch": None, "error": (p.stderr or p.stdout)[-500:]}
    if info.get("torch") is None:
        info["torch"] = "none"
    return info

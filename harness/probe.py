"""What torch this machine has, asked of a fresh interpreter once per process (cached).

The supervisor never imports torch itself: the ranks do, and the harness must work whatever
torch (2.2 and newer) the image carries. The probe is the same interpreter the ranks run.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from typing import Any, Dict

_CODE = r"""
import json, os, sys
out = {"python": sys.version.split()[0], "torch": None}
try:
    import torch, torch.distributed as dist
    out["torch"] = torch.__version__
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


@functools.cache
def probe() -> Dict[str, Any]:
    p = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True,
                       timeout=300)
    try:
        info: Dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        info = {"torch": None, "error": (p.stderr or p.stdout)[-500:]}
    if info.get("torch") is None:
        info["torch"] = "none"
    return info

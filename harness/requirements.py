"""What a scenario needs from this machine, and the exact reason to skip when it is missing."""

from __future__ import annotations

import os
import pwd
from typing import Any, Dict, Optional

from .schema import Scenario


def skip_reason(scn: Scenario, env: Dict[str, Any]) -> Optional[str]:
    if env.get("torch") in (None, "none"):
        return f"torch is not importable by {env.get('python', 'this Python')}: " \
               f"{env.get('error', '')} (install torch first)"
    if not env.get("distributed"):
        return f"torch {env['torch']} was built without torch.distributed"
    if scn.backend == "gloo" and not env.get("gloo"):
        return f"torch {env['torch']} has no gloo backend"
    if scn.backend == "nccl":
        if not env.get("nccl"):
            return f"backend nccl: torch {env['torch']} has no NCCL (a CPU build?)"
        if env.get("gpus", 0) < scn.world_size:
            return (f"backend nccl: needs {scn.world_size} CUDA GPUs (one per rank), "
                    f"this machine has {env.get('gpus', 0)}")
    for f in scn.faults:
        if f.kind == "file_init" and getattr(f, "mode", None) == "unwritable_dir" \
                and os.geteuid() == 0:
            try:
                pwd.getpwnam("nobody")
            except KeyError:
                return "file_init unwritable_dir: running as root, the ranks must run as " \
                       "user 'nobody' (root writes anywhere), and there is no such user"
    return None

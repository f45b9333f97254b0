"""What a scenario needs from this machine, and the exact reason to skip when it is missing."""

from __future__ import annotations

import functools
import os
import shutil
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
    from .faults import resolve

    faults = resolve(scn)
    multi = scn.hosts is not None and len(scn.hosts) > 1
    needs = [f.kind for f in faults if f.needs_netns]
    from .topology import missing

    if multi or needs or scn.isolate == "always":
        gaps = missing()
        if gaps:
            what = "several hosts" if multi else (f"the fault {needs[0]}" if needs
                                                 else "isolate: always")
            return f"{what} needs network namespaces, and: " + "; ".join(gaps)
    elif scn.isolate == "never" or missing():
        # the ranks run in the machine's own network namespace: only their private resolver
        # view keeps torch's own lookups (c10d's reverse lookups of peers) off the resolver
        from .resolver import missing as view_missing

        why = view_missing()
        if why:
            return why
    if any(f.kind == "latency" for f in faults):
        why = netem_missing()
        if why:
            return why
    for f in scn.faults:
        if f.kind == "file_init" and getattr(f, "mode", None) == "unwritable_dir" \
                and os.geteuid() == 0 and not shutil.which("chattr"):
            return ("file_init unwritable_dir: as root a 0555 directory is still writable, so the "
                    "harness makes it immutable with chattr +i, and chattr is not installed "
                    "(apt-get install e2fsprogs)")
    return None


@functools.cache
def netem_missing() -> Optional[str]:
    """Whether tc's netem qdisc works here (tried in a scratch namespace); None if it does."""
    import subprocess
    import uuid

    ns = f"thx-netem{uuid.uuid4().hex[:6]}"
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
        p = subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem",
                            "delay", "1ms"], capture_output=True, text=True)
        if p.returncode != 0:
            return ("latency: not supported on this kernel: the netem qdisc is missing "
                    f"(tc said: {p.stderr.strip()[:120]}); the harness has no user-space "
                    "delay proxy yet")
        return None
    except (OSError, subprocess.CalledProcessError) as e:
        return f"latency: could not try netem: {e}"
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)

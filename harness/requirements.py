"""What a scenario needs from this machine, and the exact reason to skip when it is missing.

A :class:`Requirement` is one thing a machine has or lacks (root, a program, a kernel feature).
Faults declare theirs (``Fault.requirements``); the scenario's own needs (torch, the backend,
network namespaces for several hosts) are added here. ``skip_reason`` gives the first missing
one, in words; ``harness doctor`` lists every requirement any registered fault declares.
"""

from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .schema import Scenario


@dataclass(frozen=True)
class Requirement:
    """One thing the machine must have. ``missing()`` is None when it is there, else the
    reason, a sentence that says what to do."""

    name: str                                  # short, for `harness doctor`: "nft", "netem"
    ok: str = ""                               # what having it means, for `harness doctor`

    def missing(self) -> Optional[str]:
        raise NotImplementedError


@dataclass(frozen=True)
class Tool(Requirement):
    """A program on PATH (or in an sbin directory), from a Debian package."""

    package: str = ""
    only_as_root: bool = False                 # needed only when the harness runs as root
    why: str = ""                              # what it is needed for

    def missing(self) -> Optional[str]:
        if self.only_as_root and os.geteuid() != 0:
            return None
        if _which(self.name):
            return None
        why = f" ({self.why})" if self.why else ""
        return f"{self.name} not found{why}: apt-get install {self.package or self.name}"


@dataclass(frozen=True)
class Probe(Requirement):
    """A capability found out by trying it once per process (``check`` returns the reason it
    is missing, or None)."""

    check: Callable[[], Optional[str]] = field(default=lambda: None, compare=False)
    cached: bool = True                        # tried once per process (False: cheap to ask)

    def missing(self) -> Optional[str]:
        return _probe(self.name, self.check) if self.cached else self.check()


@functools.cache
def _which(name: str) -> Optional[str]:
    return shutil.which(name) or shutil.which(
        name, path=os.pathsep.join(("/usr/local/sbin", "/usr/sbin", "/sbin")))


_PROBES: Dict[str, Optional[str]] = {}


def _probe(name: str, check: Callable[[], Optional[str]]) -> Optional[str]:
    if name not in _PROBES:
        _PROBES[name] = check()
    return _PROBES[name]


def _namespaces_missing() -> Optional[str]:
    from .topology import missing

    gaps = missing()
    return "; ".join(gaps) if gaps else None


NAMESPACES = Probe("namespaces", ok="network scenarios can run", check=_namespaces_missing,
                   cached=False)


def _view_missing() -> Optional[str]:
    from .resolver import missing as view_missing

    return view_missing()


# ranks in the machine's own network namespace: only their private resolver view keeps torch's
# own lookups (c10d's reverse lookups of peers) off the machine's resolver
RESOLVER_VIEW = Probe("resolver view", ok="ranks in the machine's network namespace resolve "
                      "with the harness's view (no DNS leaves the machine)", check=_view_missing,
                      cached=False)   # harness.resolver.missing caches its own try


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
    if scn.needs_namespaces():
        why = NAMESPACES.missing()
        if why:
            multi = scn.hosts is not None and len(scn.hosts) > 1
            needs = [f.kind for f in scn.faults if f.needs_netns]
            what = "several hosts" if multi else (f"the fault {needs[0]}" if needs
                                                 else "isolate: always")
            return f"{what} needs network namespaces, and: {why}"
    elif scn.isolate == "never" or NAMESPACES.missing():
        why = RESOLVER_VIEW.missing()
        if why:
            return why
    for f in scn.faults:
        for req in f.requirements(scn):
            why = req.missing()
            if why:
                return f"{f.kind}: {why}"
    return None


def all_requirements() -> List[Requirement]:
    """Every requirement a registered fault may declare, once each (for `harness doctor`),
    after the run's own (namespaces, the resolver view)."""
    from .faults import REGISTRY

    seen: Dict[str, Requirement] = {NAMESPACES.name: NAMESPACES,
                                    RESOLVER_VIEW.name: RESOLVER_VIEW}
    for _, cls in REGISTRY.items():
        for req in cls.REQUIRES:
            seen.setdefault(req.name, req)
    return list(seen.values())


def requirement_lines(reqs: Sequence[Requirement]) -> List[Tuple[bool, str, str]]:
    """(met, name, text) per requirement, for `harness doctor`."""
    out = []
    for r in reqs:
        why = r.missing()
        out.append((why is None, r.name, r.ok if why is None else why))
    return out

"""What a scenario needs from this machine, and the exact reason to skip when it is missing.

Faults declare what they need (``Fault.requirements``, as :mod:`harness.machine.requirement`
requirements); the scenario's own needs (torch, the backend, network namespaces for several
hosts, the resolver view for ranks in the machine's own network) are added here.
``skip_reason`` gives the first missing one, in words; ``harness doctor`` lists every
requirement any registered fault declares.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..machine import interpreters
from ..machine.requirement import (  # noqa: F401 - the requirement types, for fault modules and doctor
    HOST_NAMES,
    NAMESPACES,
    RESOLVER_VIEW,
    Probe,
    Requirement,
    Tool,
)
from ..scenario.schema import Scenario


def skip_reason(scn: Scenario, env: Dict[str, Any], on_allocation: bool = False
                ) -> Optional[str]:
    """The first thing this machine lacks for the case (None: nothing). ``on_allocation``: the
    ranks run on an allocation's nodes (harness.tools.allocation_catalog says what cannot run
    there): no namespace, resolver view, test cluster or service of this machine is needed."""
    if env.get("torch") in (None, "none"):
        return f"torch is not importable by {env.get('python', 'this Python')}: " \
               f"{env.get('error', '')} (install torch first)"
    if not env.get("distributed"):
        return f"torch {env['torch']} was built without torch.distributed"
    why = backend_missing(scn, env)
    if scn.backend_available is False:
        # about a machine that cannot give the backend: torch built without it ("doesn't
        # have NCCL built in"), or a CUDA build on a machine without the GPUs NCCL needs
        # (ValueError "no GPUs found"): which of the two, the expect blocks' build: says
        if why is None:
            return (f"the case is about a machine without backend {scn.backend} "
                    f"(backend_available: false), and torch {env['torch']} here has it"
                    + (f" ({env.get('gpus', 0)} GPU(s))" if "nccl" in scn.backend_names()
                       else ""))
    elif why:
        return why
    if on_allocation:
        for py in scn.interpreters():
            why, _ = interpreters.probe(interpreters.resolve(py))
            if why:
                return why
        return None
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
    if scn.dns is not None:
        from ..services.dns import DNSMASQ

        why = DNSMASQ.missing()
        if why:
            return f"dns: {why}"
    if scn.etcd is not None:
        from ..services.etcd import ETCD, PYTHON_ETCD

        if scn.etcd.binary is None:
            why = ETCD.missing()
        else:
            why = _program_missing(scn.etcd.binary)
        why = why or PYTHON_ETCD.missing()
        if why:
            return f"etcd: {why}"
    if scn.hostnames == "own" or any(h.hostname for h in scn.hosts or []):
        for tool in HOST_NAMES:
            why = tool.missing()
            if why:
                return why
    for py in scn.interpreters():
        why, _ = interpreters.probe(interpreters.resolve(py))
        if why:
            return why
    for req in scn.launcher.requirements(scn):
        why = req.missing()
        if why:
            return f"launcher {scn.launcher.kind}: {why}"
    for f in scn.faults:
        for req in f.requirements(scn):
            why = req.missing()
            if why:
                return f"{f.kind}: {why}"
    return None


def _program_missing(path: str) -> Optional[str]:
    """Why a program given by path (or name) cannot be run, or None."""
    import os
    import shutil

    found = shutil.which(path) if os.sep not in path else (path if os.access(path, os.X_OK)
                                                           else None)
    return None if found else f"the etcd program {path!r} is not there or not executable " \
        "(etcd: binary:)"


def backend_missing(scn: Scenario, env: Dict[str, Any]) -> Optional[str]:
    """Why this machine cannot give the scenario's backend (torch built without it, or fewer
    GPUs than NCCL needs here), or None."""
    names = scn.backend_names()
    label = f"backend {scn.backend}" if scn.backend is not None else "the default backend"
    if scn.backend is None and env.get("nccl") and env.get("gpus", 0) > 0:
        # torch picks cpu:gloo,cuda:nccl where CUDA is there, and barrier runs on the GPU
        names = names + ["nccl"]
        label = "the default backend (torch takes cpu:gloo,cuda:nccl where CUDA is there)"
    if "gloo" in names and not env.get("gloo"):
        return f"{label}: torch {env['torch']} has no gloo backend"
    if "nccl" in names:
        if not env.get("nccl"):
            return f"{label}: torch {env['torch']} has no NCCL (a CPU build?)"
        need = scn.world_size if scn.gpus is None else scn.gpus
        if env.get("gpus", 0) < need:
            return (f"{label}: needs {need} CUDA GPU{'s' * (need != 1)}"
                    + (" (one per rank)" if scn.gpus is None else " (gpus)")
                    + f", this machine has {env.get('gpus', 0)}")
    for name in ("mpi", "ucc"):
        if name in names and not env.get(name):
            return f"{label}: torch {env['torch']} was built without {name.upper()}"
    return None


def all_requirements() -> List[Requirement]:
    """Every requirement a registered fault may declare, once each (for `harness doctor`),
    after the run's own (namespaces, the resolver view)."""
    from ..faults import REGISTRY

    seen: Dict[str, Requirement] = {NAMESPACES.name: NAMESPACES,
                                    RESOLVER_VIEW.name: RESOLVER_VIEW}
    from ..services.dns import DNSMASQ

    seen.setdefault(DNSMASQ.name, DNSMASQ)
    from ..services.etcd import ETCD, PYTHON_ETCD

    seen.setdefault(ETCD.name, ETCD)
    seen.setdefault(PYTHON_ETCD.name, PYTHON_ETCD)
    for tool in HOST_NAMES:
        seen[tool.name] = tool
    from ..services.slurm import ROOT, TOOLS

    for one in (*TOOLS, ROOT):
        seen.setdefault(one.name, one)
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

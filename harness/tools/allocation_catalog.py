"""The catalog across a real allocation's nodes: what runs there, what is skipped and why.

``pytest --harness-launcher slurm`` / ``harness run --launcher slurm``, inside an allocation
(``salloc``, an ``sbatch`` script: ``$SLURM_JOB_ID`` set). Each case's ranks are started with
``srun --overlap`` on the allocation's nodes instead of on the run's own test cluster or on this
machine; the supervisor stays where pytest runs. This module is the pure part:

* :class:`Allocation`: the job and its nodes, in Slurm's order (``scontrol show hostnames
  $SLURM_JOB_NODELIST``); scenario host *i* is node *i*;
* :func:`unsupported`: why a case cannot run there (a skip reason naming what it needs), or
  None. No root and no namespaces on the nodes: every fault and feature that needs them (the
  harness's network namespaces, nftables, tc, its resolver view, a host's own name or hosts
  file, cgroups) is skipped with the reason, never run half-way and never a silent pass;
* :func:`adapt`: the scenario with its launcher replaced by the allocation's
  (``harness.launchers.allocation``): ``launcher: direct`` becomes one srun task per rank
  (tasks as ranks), ``launcher: slurm`` (form tasks) the same job script without the test
  cluster.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

from ..core.errors import HarnessError

# what a real allocation cannot give the harness (the same words for every such feature)
from ..faults import NEEDS_ROOT


class NotInAllocation(HarnessError):
    """``--harness-launcher slurm`` outside an allocation, or without Slurm's clients."""


@dataclass(frozen=True)
class Allocation:
    """The allocation the run is inside: its job id and its nodes in Slurm's order."""

    job_id: str
    nodes: Tuple[str, ...]
    shared_dir: str = ""        # where run directories go ("" = HARNESS_TMP / the temp dir)
    extra: Tuple[str, ...] = field(default=())   # more srun flags for every step

    def to_dict(self) -> dict:
        return {"job": self.job_id, "nodes": list(self.nodes),
                "shared_dir": self.shared_dir}


def current(shared_dir: str = "") -> Allocation:
    """The allocation this process is in (``$SLURM_JOB_ID``, ``$SLURM_JOB_NODELIST``);
    NotInAllocation saying what is missing."""
    import shutil

    from .preflight import expand_nodelist

    job = os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID") or ""
    if not job:
        raise NotInAllocation("--harness-launcher slurm runs the ranks across the nodes of the "
                              "Slurm allocation you are in, and SLURM_JOB_ID is not set: run "
                              "it under salloc (salloc -N2 pytest --harness-launcher slurm "
                              "...) or in an sbatch script")
    for tool in ("srun", "scontrol", "scancel"):
        if shutil.which(tool) is None:
            raise NotInAllocation(f"--harness-launcher slurm: {tool} is not on PATH (Slurm's "
                                  "client programs start and cancel the run's steps)")
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST") or ""
    nodes = tuple(expand_nodelist(nodelist)) if nodelist else ()
    if not nodes:
        raise NotInAllocation(f"allocation {job}: SLURM_JOB_NODELIST is empty or unreadable "
                              f"({nodelist!r}): cannot tell its nodes")
    return Allocation(job, nodes, shared_dir=shared_dir)


def _fault_problem(f: Any, scn: Any) -> Optional[str]:
    why = f.allocation_problem(scn)
    return f"{f.kind}: {why}" if why else None


def unsupported(scn: Any, alloc: Allocation) -> Optional[str]:
    """Why this case cannot run across the allocation's nodes (a skip reason), or None."""
    kind = scn.launcher.kind
    if kind not in ("direct", "slurm"):
        return (f"launcher {kind} is not built for an allocation's nodes (its agents or "
                "parents start workers the harness would have to watch on the nodes); "
                "launcher direct and slurm (form tasks) run there")
    if kind == "slurm" and scn.launcher.form != "tasks":
        return ("launcher slurm form torchrun is not built for an allocation's nodes (its "
                "agents' workers would have to be watched on the nodes); form tasks runs there")
    hosts = scn.host_names()
    if len(hosts) > len(alloc.nodes):
        return (f"the scenario has {len(hosts)} hosts and allocation {alloc.job_id} has "
                f"{len(alloc.nodes)} node{'s' * (len(alloc.nodes) != 1)} "
                f"({', '.join(alloc.nodes)}): one node per host")
    for h in scn.hosts or []:
        what = [name for name, on in (
            ("hostname", h.hostname), ("resolves_self", h.resolves_self),
            ("knows", h.knows != "all"), ("names", h.names), ("sysctl", h.sysctl),
            ("mtu", h.mtu is not None)) if on]
        if what:
            return (f"host {h.name}: {', '.join(what)} makes it a machine of the harness's (a "
                    f"UTS and mount namespace, its own hosts file, kernel settings): "
                    f"{NEEDS_ROOT}")
    if scn.isolate == "always":
        return f"isolate: always {NEEDS_ROOT}"
    if scn.dns is not None:
        return f"dns: the run's own name server on a host of its own {NEEDS_ROOT}"
    if scn.etcd is not None:
        return ("etcd: the run's own etcd is a service on the harness's machine or in its "
                "namespaces: not built for an allocation's nodes")
    if scn.init == "file":
        return ("init: file puts torch's FileStore in the run directory, which on an "
                "allocation lies on the shared file system (its locks are that file system's, "
                "not a local file's): not supported there")
    if scn.ip != "4" and len(hosts) > 1:
        return (f"ip: {scn.ip} gives the hosts the run's own IPv6 addresses; an allocation's "
                "nodes have the cluster's")
    for block in scn.expect:
        if getattr(block, "counters", None):
            return ("expect: counters: are the TCP counters of the harness's network "
                    f"namespaces: {NEEDS_ROOT}")
    for f in scn.faults:
        why = _fault_problem(f, scn)
        if why:
            return why
    return None


def adapt(scn: Any, alloc: Allocation) -> Any:
    """The scenario with the allocation's launcher (call :func:`unsupported` first)."""
    from ..launchers.allocation import on_allocation

    return scn.model_copy(update={"launcher": on_allocation(scn.launcher, alloc)})


def describe(alloc: Allocation) -> str:
    return f"allocation {alloc.job_id} ({len(alloc.nodes)} nodes: {', '.join(alloc.nodes)})"


__all__: List[str] = ["Allocation", "NEEDS_ROOT", "NotInAllocation", "adapt", "current",
                      "describe", "unsupported"]

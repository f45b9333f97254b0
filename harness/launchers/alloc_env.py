"""The environment of an allocation's steps, apart from the allocation launcher so that the job
script (``harness.launchers.slurm_job``), which the launcher also imports, can use it without an
import circle: what srun gets, and what of this machine's run must not reach a node."""

from __future__ import annotations

from typing import Dict, Optional

from ..core import protocol as P
from . import process_env

# srun reads these from its environment as options (-n, --ntasks-per-node, -c...), and a
# step gives its tasks their values: srun started inside a step (an sbatch script's task, a
# task running pytest) would take them for the case's step
STEP_VARS = ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
             "SLURM_CPUS_PER_TASK", "SLURM_DISTRIBUTION", "SLURM_PROCID", "SLURM_LOCALID",
             "SLURM_NODEID", "SLURM_GTIDS", "SLURM_TASK_PID", "SLURM_CPUS_ON_NODE",
             "SLURM_LAUNCH_NODE_IPADDR", "SLURM_PRIO_PROCESS", "SLURM_UMASK", "SLURMD_NODENAME",
             "SLURM_TOPOLOGY_ADDR", "SLURM_TOPOLOGY_ADDR_PATTERN", "SLURM_EXPORT_ENV")
STEP_PREFIXES = ("SLURM_STEP", "SLURM_SRUN_COMM", "SLURM_CPU_BIND", "SLURM_MEM_BIND")
# what the observer or the worker would do wrongly on a node: enter a resolver view the node
# does not have, record itself in a pid record of another machine, watch a supervisor pid
# that is not on its machine
NOT_ON_NODES = (P.PID_RECORD_ENV, P.SUPERVISOR_ENV, "HARNESS_RESOLVER_VIEW",
                "HARNESS_RESOLVER_USERNS", "HARNESS_READ_ONLY")


def srun_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment srun gets: the harness's own minus the step-level Slurm variables (the
    allocation's job id and node list stay: srun finds the allocation through them)."""
    env = process_env(extra=extra)
    for k in list(env):
        if k in STEP_VARS or k.startswith(STEP_PREFIXES):
            env.pop(k)
    return env

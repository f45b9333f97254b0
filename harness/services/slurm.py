"""A Slurm test cluster of the run's own, as services: munge, the controller, one node daemon
per scenario host (Debian's slurm-wlm 22.05 and munge 0.5.15).

What this module owns (the launcher ``harness.launchers.slurm`` plans it, its set-up step
``SlurmUp`` starts it through the service seam):

* :class:`ClusterConfig` (pure): the cluster's ``slurm.conf`` text and every path of it. All
  of it lies in ``<run>/slurm/``: config, the controller's state, each node's spool, pid and
  log files (``%n``: the node's name), munge's key, socket, pid, seed and log. Nothing of
  /etc/slurm or /etc/munge is read or written, and no machine-wide daemon is asked: every
  daemon and every client (``srun``, ``scontrol``, ``sinfo``) is given ``SLURM_CONF`` or ``-f``
  and the run's munge socket (``AuthInfo=socket=``).
* Ports: the controller's and the node daemons' ports are leased by the run (harness.machine.ports),
  so two runs never pick the same numbers, and they live in the run's own namespaces anyway.
* Plugins: the simple ones suffice and need nothing of the machine (``proctrack/linuxproc``,
  ``task/none``, no accounting, ``select/cons_tres`` by CPU); ``SlurmdParameters=
  config_overrides`` lets a node claim more CPUs than this machine has, ``ReturnToService=2``
  brings a node back when it registers.
* Where: the controller and munged run on the master host; each slurmd runs inside its host's
  network and UTS namespaces (its own host name) and a mount namespace of its own where the
  host's hosts file, nsswitch.conf and resolv.conf are bind-mounted over /etc (a task that
  slurmd starts resolves names as that host does). ``ip netns exec`` cannot start slurmd (it
  mounts a fresh /sys: "No filesystem mounted on /sys/fs/cgroup"), so the node's prefix is
  ``nsenter --net --uts`` + ``unshare --mount`` (:func:`node_prefix`).
* Ready: munged when a credential can be made on its socket; the controller when ``scontrol
  ping`` says UP; each node when ``sinfo`` lists it idle. Never a sleep before a look.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ..machine.requirement import Probe, Tool

SLURMCTLD = Tool("slurmctld", package="slurmctld", why="the Slurm launcher's test cluster")
SLURMD = Tool("slurmd", package="slurmd", why="the Slurm launcher's test cluster")
SRUN = Tool("srun", package="slurm-client", why="the Slurm launcher")
MUNGED = Tool("munged", package="munge", why="authentication of the Slurm test cluster")
NSENTER = Tool("nsenter", package="util-linux", why="slurmd inside a host's namespaces")
SETPRIV = Tool("setpriv", package="util-linux", why="srun dies with the harness")
TOOLS = (SLURMCTLD, SLURMD, SRUN, MUNGED, NSENTER, SETPRIV)
ROOT = Probe("slurm-root", ok="the Slurm test cluster can run its daemons (root)",
             check=lambda: None if os.geteuid() == 0 else
             "the Slurm test cluster runs munged, slurmctld and slurmd as root in the run's "
             "namespaces: run as root", cached=False)

MUNGE_SERVICE = "munged"
CTLD_SERVICE = "slurmctld"
NODE_SERVICE = "slurmd@"          # + the scenario host's name
NODE_CPUS = 64                    # what each node claims (config_overrides): tasks never wait
CLIENT_TIMEOUT = 5.0              # one scontrol/sinfo look


@dataclass
class Node:
    host: str          # the scenario host
    name: str          # its Slurm node name = its host name
    addr: str          # its address on the run's link
    netns: str = ""    # filled at run time from the topology
    uts: str = ""


@dataclass
class ClusterConfig:
    """The run's cluster (pure data; the launcher makes it while planning)."""

    directory: str                     # <run>/slurm
    cluster: str                       # ClusterName (lower case, short)
    controller_host: str               # the scenario host the controller runs on
    controller_name: str               # its host name (slurmctld checks it against its own)
    controller_addr: str
    ctld_port: int
    slurmd_port: int
    nodes: List[Node] = field(default_factory=list)
    kill_wait: int = 2                 # KillWait: SIGTERM -> SIGKILL of a cancelled step
    msg_timeout: int = 10              # MessageTimeout

    # -- paths ------------------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return Path(self.directory)

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.dir / "munge" / "munge.sock"

    @property
    def munge_key(self) -> Path:
        return self.dir / "munge" / "munge.key"

    def env(self) -> Dict[str, str]:
        """What every Slurm client of the run is given (srun, scontrol, sinfo)."""
        return {"SLURM_CONF": str(self.conf)}

    def text(self) -> str:
        """slurm.conf."""
        d = self.dir
        lines = [
            "# torchdist-harness: the run's own test cluster; nothing machine-wide",
            f"ClusterName={self.cluster}",
            f"SlurmctldHost={self.controller_name}({self.controller_addr})",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool' / '%n'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'slurmd-%n.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            f"KillWait={self.kill_wait}",
            f"MessageTimeout={self.msg_timeout}",
            "InactiveLimit=0",
            "MinJobAge=300",
            "SlurmdTimeout=30",
            "SlurmctldTimeout=30",
            "MailProg=/bin/true",
        ]
        for n in self.nodes:
            lines.append(f"NodeName={n.name} NodeAddr={n.addr} NodeHostname={n.name} "
                         f"CPUs={NODE_CPUS} State=UNKNOWN")
        names = ",".join(n.name for n in self.nodes)
        lines.append(f"PartitionName=main Nodes={names} Default=YES MaxTime=INFINITE "
                     "State=UP OverSubscribe=YES")
        return "".join(f"{ln}\n" for ln in lines)

    def write(self) -> None:
        """The folders, the key and slurm.conf (the run directory is root's, 0700)."""
        for sub in ("state", "spool", "munge"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        for n in self.nodes:
            (self.dir / "spool" / n.name).mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir / "munge", 0o700)
        if not self.munge_key.exists():
            fd = os.open(self.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(1024))
        self.conf.write_text(self.text())

    # -- argv ---------------------------------------------------------------------------------
    def munged_argv(self) -> List[str]:
        m = self.dir / "munge"
        return ["munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                f"--key-file={self.munge_key}", f"--pid-file={m / 'munged.pid'}",
                f"--seed-file={m / 'munged.seed'}", f"--log-file={m / 'munged.log'}",
                "--num-threads=2"]

    def slurmctld_argv(self) -> List[str]:
        # -D foreground, -i ignore saved state problems, -c clear state (a fresh cluster)
        return ["slurmctld", "-D", "-c", "-i", "-f", str(self.conf)]

    def slurmd_argv(self, node: Node) -> List[str]:
        return ["slurmd", "-D", "-N", node.name, "-f", str(self.conf)]


def node_prefix(netns: str, uts: Optional[str], view: str, python: str = sys.executable
                ) -> List[str]:
    """Argv prefix: into the host's network (and UTS) namespace through nsenter, a mount
    namespace of its own where the host's resolver files (``view``: /etc/netns/<ns>) cover
    /etc's, then the program through ``harness.machine.procs --exec`` (it dies with the harness)."""
    binds = " && ".join(
        f"mount --bind {shlex.quote(str(Path(view) / name))} /etc/{name}"
        for name in ("hosts", "nsswitch.conf", "resolv.conf") if (Path(view) / name).exists())
    script = (binds + " && " if binds else "") + \
        f'exec {shlex.quote(python)} -m harness.machine.procs --exec -- "$@"'
    enter = ["nsenter", f"--net=/run/netns/{netns}"] + ([f"--uts={uts}"] if uts else [])
    return enter + ["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                    "slurmd-node"]


# -- readiness (harness.services.Readiness) ----------------------------------------------------
def _client(cfg: ClusterConfig, argv: Sequence[str], prefix: Sequence[str] = (),
            timeout: float = CLIENT_TIMEOUT) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **cfg.env())
    return subprocess.run([*prefix, *argv], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@dataclass(frozen=True)
class MungeAnswers:
    """munged makes a credential on the run's socket."""

    cfg: ClusterConfig

    def ready(self, svc: Any) -> bool:
        if not self.cfg.munge_socket.exists():
            return False
        try:
            p = subprocess.run(["munge", "-n", f"--socket={self.cfg.munge_socket}"],
                               capture_output=True, timeout=CLIENT_TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return p.returncode == 0      # munge exits 0 only with a credential made

    def describe(self) -> str:
        return f"a credential made on {self.cfg.munge_socket}"


@dataclass(frozen=True)
class ControllerUp:
    """``scontrol ping`` (from the controller's host) exits 0: it does only when a controller
    answered (its "... is UP" line is for people and is not read)."""

    cfg: ClusterConfig
    prefix: tuple = ()

    def ready(self, svc: Any) -> bool:
        try:
            p = _client(self.cfg, ["scontrol", "ping"], self.prefix)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return p.returncode == 0

    def describe(self) -> str:
        return "scontrol ping saying UP"


def node_states(cfg: ClusterConfig, prefix: Sequence[str] = ()) -> Dict[str, str]:
    """Node name -> state as ``sinfo --json`` gives it, lower case, with its flags after a
    ``+`` (``idle``, ``down+not_responding``); {} when it cannot be asked."""
    try:
        p = _client(cfg, ["sinfo", "--json"], prefix)
        listing = json.loads(p.stdout) if p.returncode == 0 else {}
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return {}
    return states_of(listing)


def states_of(listing: Any) -> Dict[str, str]:
    """``sinfo --json`` -> node name -> state (pure). Slurm 22.05 gives ``state`` as a word and
    ``state_flags`` as a list; later releases give ``state`` as a list: both are read."""
    out: Dict[str, str] = {}
    nodes = listing.get("nodes") if isinstance(listing, dict) else None
    for node in nodes if isinstance(nodes, list) else []:
        if not isinstance(node, dict) or not node.get("name"):
            continue
        state = node.get("state")
        words = [str(w) for w in state] if isinstance(state, list) else [str(state or "")]
        words += [str(f) for f in node.get("state_flags") or []]
        out[str(node["name"])] = "+".join(w.lower() for w in words if w)
    return out


def missing() -> List[str]:
    """What the machine lacks for the test cluster ([] when nothing)."""
    return [why for why in (t.missing() for t in (*TOOLS, ROOT)) if why]

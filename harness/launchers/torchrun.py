"""The torchrun launcher: one torchrun agent per host, each starting its own workers.

``launcher: torchrun`` or ``{kind: torchrun, ...options}``. Every agent is
``python -m torch.distributed.run FLAGS PROGRAM`` (what the ``torchrun`` script runs) on its
host, observed (harness.ranks.observer): held until the start line after importing torch, its
rendezvous, restarts and the exit status of each worker it collects come out as events; its
workers are found through their own event files (rank and ``TORCHELASTIC_RESTART_COUNT`` give
their rows: "1", "1@1"). The program is the harness's worker (``-m harness.ranks.worker SPEC``) or
the user's (``train.py ARGS``, ``-m MODULE ARGS``).

Flags, as torchrun spells them (every one a scenario may set; ``agents: {HOST: {...}}`` sets
them for one agent, ``null`` there drops a flag):

* ``nnodes`` (``2`` or ``"1:2"``; default: the number of hosts), ``nproc_per_node`` (default:
  the host's ranks), ``node_rank`` (default: the agent's index, with the static backend);
* ``rdzv_backend`` (static | c10d | etcd | etcd-v2; torchrun's default is static; the etcd
  ones on the run's own etcd, the scenario's ``etcd:`` block, whose address is then the
  endpoint), ``rdzv_endpoint``
  (``HOST[:PORT]``: HOST a host of the scenario, written as its address on the run's link, a
  name the run's hosts files or name server give, or a loopback address or name; PORT omitted:
  the run's leased port), ``rdzv_id``, ``rdzv_conf``
  (``join_timeout``, ``last_call_timeout``, ``close_timeout``, ``read_timeout``, ``timeout``,
  ``is_host``...);
* ``master_addr`` (a host or an address, as above) and ``master_port`` (a number; omitted with a
  master_addr: the leased port); ``standalone``; ``max_restarts``; ``monitor_interval``;
  ``args`` (more flags, verbatim).

Nothing set: a single host gets ``--nnodes 1 --nproc-per-node N`` (torchrun then uses c10d on
``localhost:0`` by itself); several hosts get the static rendezvous on the master host, as the
usual recipe writes it (``--master-addr --master-port --node-rank``). A literal port (29400,
29500) makes the run use namespaces of its own, so that runs beside it never share it.

``share_store: false`` sets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (the workers then host their
own store instead of using the agent's), ``true`` unsets it; left out, the agents get the
harness's own value, as an image's ``ENV`` would set it (``harness compare --env-b``), and the
plan records it. TORCHELASTIC_* and PET_* never leak in from the harness's environment
(harness.launchers.CLEARED_PREFIXES).
"""

from __future__ import annotations

import os
import re
from typing import Any, ClassVar, Dict, List, Literal, Optional, Tuple, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..core import protocol as P
from ..core.limits import MAX_ADDR, MAX_HOSTS, MAX_SHORT, MAX_STEPS, MAX_WORLD, PositiveSeconds
from ..core.rows import RowSet
from . import LauncherSpec, Problem

NO_SHARE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"   # torch: the workers host their own store

RDZV_CONF_KEYS = ("join_timeout", "last_call_timeout", "close_timeout", "heartbeat_timeout",
                  "read_timeout", "timeout", "is_host", "keep_alive_interval",
                  "keep_alive_max_attempt", "store_type")
NNODES_RE = re.compile(r"^[1-9][0-9]{0,3}(:[1-9][0-9]{0,3})?\Z", re.ASCII)
ID_RE = r"^[A-Za-z0-9_.-]{1,64}$"
ENDPOINT_RE = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[^:\[\]]+|[0-9A-Fa-f:]+::?[0-9A-Fa-f:]*)"
                         r"(?::(?P<port>[0-9]{1,5}))?\Z")
FLAGS = ("nnodes", "nproc_per_node", "node_rank", "rdzv_backend", "rdzv_endpoint", "rdzv_id",
         "rdzv_conf", "master_addr", "master_port", "standalone", "max_restarts",
         "monitor_interval", "args")
MODULE = "torch.distributed.run"
ETCD_BACKENDS = ("etcd", "etcd-v2")   # on the run's etcd (harness.faults._etcd)


class AgentFlags(BaseModel):
    """torchrun's flags (see the module doc); unset: the harness's default for it."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    OVERRIDE: ClassVar[bool] = True

    nnodes: Optional[Union[int, str]] = Field(None, description="--nnodes: N or MIN:MAX (2 or "
                                              "'1:2'); unset: the number of hosts (none with "
                                              "standalone)")
    nproc_per_node: Optional[int] = Field(None, ge=1, le=MAX_WORLD,
                                          description="--nproc-per-node; unset: the host's ranks")
    node_rank: Optional[int] = Field(None, ge=0, le=MAX_HOSTS, description="--node-rank; unset: "
                                     "the agent's index, with the static backend on several "
                                     "hosts")
    rdzv_backend: Optional[Literal["static", "c10d", "etcd", "etcd-v2"]] = Field(
        None, description="--rdzv-backend (unset: torchrun's default, static; etcd, etcd-v2: on "
        "the run's etcd, an etcd: block, which is then the endpoint)")
    rdzv_endpoint: Optional[str] = Field(
        None, max_length=MAX_ADDR + 6, description="--rdzv-endpoint HOST[:PORT]: HOST a host of "
        "the scenario (written as its address on the run's link), a name the run's own hosts "
        "files or name server give (a host's names: entry, a dns: record), or loopback in any "
        "spelling; PORT omitted: the run's leased port. Refused with rdzv_backend etcd or "
        "etcd-v2 (the endpoint is the run's etcd)")
    rdzv_id: Optional[str] = Field(None, pattern=ID_RE, description="--rdzv-id")
    rdzv_conf: Optional[Dict[str, Union[bool, int, float, str]]] = Field(
        None, description=f"--rdzv-conf k=v,...: {', '.join(RDZV_CONF_KEYS)}")
    master_addr: Optional[str] = Field(None, max_length=MAX_ADDR, description="--master-addr: a "
                                       "host of the scenario (its address on the run's link), "
                                       "a name the run's own hosts files or name server give, "
                                       "or a loopback address")
    master_port: Optional[int] = Field(None, ge=1, le=65535, description="--master-port; unset "
                                       "with a master_addr: the run's leased port (beside an "
                                       "rdzv_endpoint another leased one, to show which wins)")
    standalone: Optional[bool] = Field(None, description="--standalone")
    max_restarts: Optional[int] = Field(None, ge=0, le=100, description="--max-restarts (unset: "
                                        "torchrun's 0)")
    monitor_interval: Optional[PositiveSeconds] = Field(None, description="--monitor-interval")
    args: Optional[List[str]] = Field(None, max_length=MAX_STEPS,
                                      description="more torchrun flags, verbatim")

    @field_validator("nnodes")
    @classmethod
    def _nnodes(cls, v: Any) -> Any:
        if v is None:
            return v
        if isinstance(v, bool) or (isinstance(v, int) and not 1 <= v <= MAX_HOSTS * 100):
            raise ValueError("nnodes is a number of nodes (1..) or 'MIN:MAX'")
        if isinstance(v, str) and not NNODES_RE.match(v):
            raise ValueError(f"nnodes {v[:20]!r}: write N or MIN:MAX")
        return v

    @field_validator("rdzv_conf")
    @classmethod
    def _conf(cls, v: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
        for k, x in (v or {}).items():
            if k not in RDZV_CONF_KEYS:
                raise ValueError(f"rdzv_conf key {k[:40]!r}: known keys are "
                                 f"{', '.join(RDZV_CONF_KEYS)}")
            if isinstance(x, str) and (len(x) > MAX_SHORT or "," in x or "=" in x):
                raise ValueError(f"rdzv_conf {k}: a value without ',' or '='")
        return v

    @field_validator("rdzv_endpoint")
    @classmethod
    def _endpoint(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not ENDPOINT_RE.match(v):
            raise ValueError(f"rdzv_endpoint {v[:40]!r}: write HOST or HOST:PORT")
        if v is not None:
            port = ENDPOINT_RE.match(v).group("port")   # type: ignore[union-attr]
            if port is not None and not 1 <= int(port) <= 65535:
                raise ValueError(f"rdzv_endpoint port {port}: 1..65535")
        return v

    @field_validator("args")
    @classmethod
    def _args(cls, v: Optional[List[str]]) -> Optional[List[str]]:
        for a in v or []:
            if "\0" in a or len(a) > MAX_SHORT:
                raise ValueError("an argument holds a NUL byte or is too long")
        return v


class Torchrun(LauncherSpec, AgentFlags):
    kind: Literal["torchrun"] = "torchrun"
    summary = "one torchrun agent per host; the agents start the workers (rendezvous, restarts)"
    share_store: Optional[bool] = Field(
        None, description="false: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (the workers host their "
        "own store instead of using the agent's); true: the variable unset (the agent's store "
        "is shared); left out: as the harness's environment says (an image's ENV), shared "
        "where it does not set it")
    agents: Dict[str, AgentFlags] = Field(
        default_factory=dict, max_length=MAX_HOSTS * 2,
        description="flags of one agent, by host name ('job2:HOST' for a second job's); null "
        "drops a flag")

    # -- what runs -------------------------------------------------------------------------------
    def shares_store(self) -> bool:
        """Whether the workers use the agent's store: the scenario's ``share_store``, else the
        harness's environment (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 there: not shared)."""
        if self.share_store is not None:
            return self.share_store
        return os.environ.get(NO_SHARE, "0") != "1"

    def _agents(self, scn: Any) -> List[Tuple[str, int]]:
        """(host, its ranks) in order, the master host first."""
        hosts = [(h.name, h.ranks) for h in scn.hosts] if scn.hosts else \
            [("local", scn.world_size)]
        master = scn.master_host or hosts[0][0]
        return [h for h in hosts if h[0] == master] + [h for h in hosts if h[0] != master]

    def _value(self, name: str, over: Optional[AgentFlags]) -> Tuple[bool, Any]:
        """(given, value) of a flag for one agent: its override, else the launcher's."""
        if over is not None and name in over.model_fields_set:
            return True, getattr(over, name)
        if name in self.model_fields_set:
            return True, getattr(self, name)
        return False, None

    def _override(self, host: str, job: str) -> Optional[AgentFlags]:
        return self.agents.get(f"{job}:{host}" if job else host)

    def _world(self, scn: Any) -> int:
        total = 0
        for host, ranks in self._agents(scn):
            given, n = self._value("nproc_per_node", self._override(host, ""))
            total += n if given and n else ranks
        return total

    def _max_restarts(self, scn: Any) -> int:
        """How many restart attempts can happen: --max-restarts, and with an elastic
        ``nnodes: MIN:MAX`` one per node that may join after the first MIN (a membership change
        restarts the workers without counting against --max-restarts)."""
        agents = self._agents(scn)
        joins = 0
        for h, _ in agents:
            given, nn = self._value("nnodes", self._override(h, ""))
            if given and isinstance(nn, str) and ":" in nn:
                lo = int(nn.split(":")[0])
                joins = max(joins, len(agents) - lo)
        return max((self._value("max_restarts", self._override(h, ""))[1] or 0)
                   for h, _ in agents) + joins

    def rows(self, scn: Any, job: str = "", world: Optional[int] = None) -> RowSet:
        return RowSet(world=world or self._world(scn), attempts=self._max_restarts(scn),
                      agents=[P.agent_label(h, job) for h, _ in self._agents(scn)], job=job)

    def _ports(self) -> List[int]:
        """Literal ports the scenario names."""
        out = []
        for flags in [self, *self.agents.values()]:
            if flags.master_port is not None:
                out.append(flags.master_port)
            m = ENDPOINT_RE.match(flags.rdzv_endpoint or "")
            if m and m.group("port"):
                out.append(int(m.group("port")))
        return out

    def needs_netns(self, scn: Any) -> bool:
        return bool(self._ports())

    def check(self, scn: Any) -> List[Problem]:
        from ..faults import REGISTRY
        from ..net.safety import refuse_address

        out: List[Problem] = []
        names = {h for h, _ in self._agents(scn)}
        # a name the run's own hosts files give (a host's own name, a names: entry, a dns:
        # record) leads to an address of the run, loopback or nowhere: the hosts ask no one else
        own = {n.lower() for n in scn.hosts_file_names()} | \
            ({str(n).lower() for n in scn.dns.records} if scn.dns is not None else set())
        suggest = REGISTRY.kind_for("a name that does not resolve")
        jobs = {lab.split(":", 1)[0] for f in scn.faults for lab in f.extra_labels(scn)
                if lab.startswith("job")}
        for key in self.agents:
            host = key.split(":", 1)[1] if key.startswith("job") and ":" in key else key
            job = key.split(":", 1)[0] if host != key else ""
            if job and job not in jobs:
                out.append((("agents", key), f"no job {job} in this case (its concurrent_job "
                            "faults start " + (", ".join(sorted(jobs)) or "none") + ")"))
            elif host not in names:
                out.append((("agents", key), f"no host {host!r} in this scenario (hosts: "
                            f"{', '.join(sorted(names))})"))
        for where, flags in [((), self)] + [(("agents", k), f) for k, f in self.agents.items()]:
            for name in ("rdzv_endpoint", "master_addr"):
                value = getattr(flags, name)
                if value is None:
                    continue
                host = _host_of(value) if name == "rdzv_endpoint" else value
                if host in names or host.lower() in own:
                    continue
                why = refuse_address(host.strip("[]"), unresolvable=suggest)
                if why:
                    out.append((where + (name,), why))
        for where, flags in [((), self)] + [(("agents", k), f) for k, f in self.agents.items()]:
            if flags.rdzv_backend not in ETCD_BACKENDS:
                continue
            if scn.etcd is None:
                out.append((where + ("rdzv_backend",), f"rdzv_backend {flags.rdzv_backend} "
                            "needs the scenario's etcd: block (the run's own etcd; e.g. "
                            "etcd: {host: etcd})"))
            if flags.rdzv_endpoint is not None:
                out.append((where + ("rdzv_endpoint",), f"with rdzv_backend "
                            f"{flags.rdzv_backend} the endpoint is the run's etcd: leave "
                            "rdzv_endpoint out"))
        agents = self._agents(scn)
        if len(agents) > 1:
            for where, flags in [((), self)] + [(("agents", k), f)
                                                for k, f in self.agents.items()]:
                if flags.standalone:
                    out.append((where + ("standalone",), "standalone makes each agent run "
                                "its own rendezvous on its own host: the "
                                f"{len(agents)} hosts would run {len(agents)} worlds of "
                                "their own, not one job; leave standalone out (several hosts "
                                "use the static rendezvous on the master host) or give one "
                                "host"))
        return out

    def plan(self, plan: Any, scn: Any) -> None:
        self._plan_agents(plan, scn, job="")

    def plan_job(self, plan: Any, scn: Any, job: str, world: int, release: Any = None) -> None:
        self._plan_agents(plan, scn, job=job, release=release)

    def _plan_agents(self, plan: Any, scn: Any, job: str, release: Any = None) -> None:
        agents = self._agents(scn)
        ports: Dict[str, int] = {}
        for i, (host, ranks) in enumerate(agents):
            over = self._override(host, job)
            argv = ["-m", self.MODULE, *self.flags(plan, i, ranks, len(agents), over, ports),
                    *self.launcher_flags(), *_program(plan, scn)]
            env = plan.link_env(dict(scn.env), host)
            unset = []
            if not self.shares_store():
                env.setdefault(NO_SHARE, "1")
            elif os.environ.get(NO_SHARE):
                unset.append(NO_SHARE)
            rp = plan.new_process(label=P.agent_label(host, job), rank=None, env=env, unset=unset,
                                  init=plan.init_for(scn, 0, scn.world_size), host=host,
                                  role=P.ROLE_AGENT, argv=argv, observed=True, job=job,
                                  cwd=scn.program_cwd(), python=plan.host_python(scn, host))
            if release is not None:
                rp.release = release
            plan.add_process(rp)
        plan.notes.append(f"torchrun{' ' + job if job else ''}: " + "; ".join(
            f"{r.label}: torchrun {' '.join(_shown(r.argv[2:]))}" for r in plan.ranks
            if r.role == P.ROLE_AGENT and r.job == job))

    MODULE: ClassVar[str] = MODULE

    def launcher_flags(self) -> List[str]:
        """Flags of this launcher's own, after torchrun's (none for torchrun)."""
        return []

    def flags(self, plan: Any, index: int, ranks: int, n_agents: int,
              over: Optional[AgentFlags] = None, ports: Optional[Dict[str, int]] = None
              ) -> List[str]:
        """torchrun's flags for one agent (pure; the plan gives addresses and leased ports,
        ``ports`` keeps the leases every agent shares)."""
        ports = {} if ports is None else ports
        def get(name: str) -> Tuple[bool, Any]:
            return self._value(name, over)

        out: List[str] = []
        standalone = get("standalone")[1]
        backend = get("rdzv_backend")
        endpoint = get("rdzv_endpoint")
        maddr, mport = get("master_addr"), get("master_port")
        # several hosts and no rendezvous given: the static recipe on the master host
        recipe = n_agents > 1 and not (endpoint[0] or maddr[0] or mport[0] or standalone
                                       or backend[1] in ETCD_BACKENDS)
        given, nnodes = get("nnodes")
        if not given:
            nnodes = None if standalone else n_agents
        if nnodes is not None:
            out += ["--nnodes", str(nnodes)]
        given, nproc = get("nproc_per_node")
        if not given:
            nproc = ranks
        if nproc is not None:
            out += ["--nproc-per-node", str(nproc)]
        static = (backend[1] or "static") == "static" and not standalone
        given, node_rank = get("node_rank")
        if not given and static and (n_agents > 1 or recipe):
            node_rank = index
        if node_rank is not None:
            out += ["--node-rank", str(node_rank)]
        if backend[1] is not None:
            out += ["--rdzv-backend", backend[1]]
        if endpoint[1] is not None:
            out += ["--rdzv-endpoint", self.endpoint(plan, endpoint[1])]
        elif backend[1] in ETCD_BACKENDS and plan.etcd is not None:
            out += ["--rdzv-endpoint", plan.etcd.endpoint]
        given, rid = get("rdzv_id")
        if rid is not None:
            out += ["--rdzv-id", rid]
        given, conf = get("rdzv_conf")
        if conf:
            out += ["--rdzv-conf", ",".join(f"{k}={_conf_value(v)}" for k, v in conf.items())]
        if recipe:
            out += ["--master-addr", plan.master_addr, "--master-port", str(plan.master_port)]
        else:
            if maddr[1] is not None:
                out += ["--master-addr", self.address(plan, maddr[1])]
            elif mport[1] is not None and static and n_agents > 1 and endpoint[1] is None:
                # a port of the scenario's for the static rendezvous: still on the master
                # host (torchrun's own default, 127.0.0.1, is every agent's own loopback)
                out += ["--master-addr", plan.master_addr]
            if mport[1] is not None:
                out += ["--master-port", str(mport[1])]
            elif maddr[1] is not None and not mport[0]:
                # beside an endpoint, a port of its own (to show which one wins)
                if endpoint[1] is None:
                    port = plan.master_port
                else:
                    port = ports.setdefault("master", plan.new_port())
                out += ["--master-port", str(port)]
        if standalone:
            out.append("--standalone")
        for name, flag in (("max_restarts", "--max-restarts"),
                           ("monitor_interval", "--monitor-interval")):
            value = get(name)[1]
            if value is not None:
                out += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        out += list(get("args")[1] or [])
        return out

    # -- addresses and ports ---------------------------------------------------------------------
    def address(self, plan: Any, host: str) -> str:
        """A scenario host -> its address in this run; anything else as written."""
        addr = plan.address_of(host)
        return addr if addr is not None else host

    def endpoint(self, plan: Any, value: str) -> str:
        m = ENDPOINT_RE.match(value)
        assert m is not None   # checked by the model
        host, port = m.group("host"), m.group("port")
        return f"{self.address(plan, host)}:{port if port else plan.master_port}"

    def describe(self) -> str:
        given = {k: getattr(self, k) for k in FLAGS if k in self.model_fields_set}
        return "torchrun " + " ".join(f"{k}={v}" for k, v in given.items())


class Launch(Torchrun):
    """``python -m torch.distributed.launch``, the legacy launcher (deprecated, still in every
    torch 2.x): torchrun's agent, but each worker gets ``--local-rank=N`` on its command line
    unless ``use_env`` (then only LOCAL_RANK in its environment, as torchrun does). Scripts
    written for torch 1.x parse ``--local_rank`` and stop at the hyphen form."""

    kind: Literal["launch"] = "launch"  # type: ignore[assignment]
    summary = "python -m torch.distributed.launch (legacy): --local-rank=N to each worker " \
        "unless use_env"
    use_env: bool = Field(False, description="--use-env: LOCAL_RANK in the environment only, "
                          "no --local-rank argument")
    MODULE: ClassVar[str] = "torch.distributed.launch"

    def launcher_flags(self) -> List[str]:
        return ["--use-env"] if self.use_env else []

    def describe(self) -> str:
        return "launch" + (" --use-env" if self.use_env else "") + \
            super().describe()[len("torchrun"):]


def _host_of(endpoint: str) -> str:
    m = ENDPOINT_RE.match(endpoint)
    return m.group("host") if m else endpoint


def _conf_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _program(plan: Any, scn: Any) -> List[str]:
    """What torchrun runs: the user's program as torchrun takes it (``-m`` is torchrun's own
    flag too), or the harness's worker (its rank from torchrun's environment)."""
    argv = scn.program_argv()
    if argv:
        return argv
    return ["-m", "harness.ranks.worker", plan.shared_worker_spec().to_json()]


def _shown(argv: List[str]) -> List[str]:
    return [a if len(a) <= 60 else a[:40] + "..." for a in argv]

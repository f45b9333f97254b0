"""Planning: one Scenario case -> a concrete RunPlan (pure: no processes, no sockets).

The plan says everything the supervisor will do: which processes the launcher starts on which
host (ranks, torchrun agents or spawning parents: :class:`RankPlan`) with which program,
environment and init arguments, when each is released (a :class:`~harness.core.triggers.Trigger`,
normally the start line), and the fault :class:`~harness.faults.steps.Step` objects with their
triggers. The scenario's launcher (``harness.launchers``) plans its processes, then faults edit
the plan (``Fault.apply``); the supervisor executes it without knowing any launcher or fault by
name.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Dict, List, Optional

from ..core.errors import PlanRefusal  # noqa: F401 - re-exported: harness.run.plan.PlanRefusal
from ..core.jobstore import JobStore, job_store
from ..core.protocol import (
    RANK_VARIATIONS_ENV,
    ROLE_AGENT,
    ROLE_PARENT,
    RUN_TMP,
    InitSpec,
    Variation,
    WorkerSpec,
    url_host,
)
from ..core.triggers import Trigger
from ..faults.steps import RUN, Step
from ..judge import edits
from ..machine import interpreters
from ..net.addresses import IFNAME_VARS
from ..net.hostspec import HostNames, host_names
from ..net.safety import as_meant
from ..scenario.schema import Scenario, fill_init_url, init_url_parts

if TYPE_CHECKING:
    pass


@dataclass
class RankPlan:
    """A process the launcher starts itself: a rank (``direct``), a torchrun agent, a spawning
    parent. Workers an agent or a parent starts are not planned: they are found at run time."""

    label: str                       # "0", "1", "job2:0"; "agent:node0"; "parent:local"
    rank: Optional[int]              # the rank number it is told (None when it is told none)
    env: Dict[str, str]              # set for the process on top of the harness's environment
    init: InitSpec
    unset: List[str] = field(default_factory=list)   # variables removed from its environment
    release: Trigger = field(default_factory=lambda: Trigger.at_time(0.0))
    host: str = "local"
    resolver_view: str = ""          # the folder of the hosts/nsswitch/resolv.conf it resolves
    #                                  with (harness.net.resolver): /etc/netns/<ns> in the run's
    #                                  namespaces, <run_dir>/resolver in the machine's own
    variation: Variation = field(default_factory=Variation)   # how its run differs (faults)
    python: str = ""                 # its interpreter ("": the harness's own, sys.executable)
    absent: bool = False             # part of the world, never started (a fault)
    role: str = "rank"               # rank | agent | parent (harness.core.protocol)
    argv: List[str] = field(default_factory=list)    # after the interpreter; [] = the worker
    observed: bool = False           # runs under harness.ranks.observer (not the worker's protocol)
    job: str = ""                    # "job2" for a second job's processes
    cwd: str = ""                    # where it runs ("" = /)
    start: str = "fresh"             # fresh (its own interpreter) | fork (from a host's
    #                                  warm server, harness.ranks.forkserver); the launcher decides
    start_note: str = ""             # why it runs fresh where the run asked for fork
    fresh_only: str = ""             # a fault's reason why this rank must start fresh
    restart_of: str = ""             # a restart (kill_rank's restart_after): the label of the
    #                                  process it starts again, with the same argv, environment
    #                                  and host; started by a step, never by the launcher

    def to_dict(self) -> Dict[str, Any]:
        d = {"label": self.label, "rank": self.rank, "env": dict(self.env),
             "init": asdict(self.init), "unset": list(self.unset), "host": self.host,
             "release": self.release.to_dict(), "released": self.release.describe(),
             "resolver_view": self.resolver_view, "role": self.role,
             "argv": list(self.argv), "observed": self.observed, "job": self.job,
             "cwd": self.cwd, "start": self.start}
        if self.start_note:
            d["start_note"] = self.start_note
        if not self.variation.is_plain():
            d["variation"] = asdict(self.variation)
        if self.python:
            d["python"] = self.python
        if self.absent:
            d["absent"] = True
        if self.restart_of:
            d["restart_of"] = self.restart_of
        return d


@dataclass
class HostPlan:
    name: str
    addr: str                        # the host's address on the run's private link
    ifname: str                      # its link interface ("lo" for a host without a link)
    netns: str = ""                  # its network namespace ("" when the run has none)
    addr6: str = ""                  # its IPv6 address (ip: 6 or dual), else ""
    machine: HostNames = field(default_factory=HostNames)   # its name, hosts file, sysctl,
    #                                  MTU (harness.net.hostspec); faults may change it in the plan


@dataclass
class MakeDir(Step):
    """The run's own preparation for ``init: file``: the store's directory exists before the
    ranks start (torch does not make it, and retries open() of a path in a missing directory
    far past the group's timeout)."""

    path: str = ""

    def do(self, rt: Any) -> None:
        Path(self.path).mkdir(parents=True, exist_ok=True)

    def describe(self) -> str:
        return f"make the directory {self.path}"


@dataclass
class WriteResolverView(Step):
    """The run's own preparation for ranks in the machine's network namespace: the resolver
    view they enter (harness.net.resolver; the topology writes the namespaces' own)."""

    path: str = ""

    def do(self, rt: Any) -> None:
        from ..net.resolver import write_view

        write_view(Path(self.path))

    def describe(self) -> str:
        return f"write the ranks' resolver view to {self.path}"


@dataclass
class ShapeHosts(Step):
    """The run's own preparation of hosts that are whole machines (harness.net.hostspec): each
    one's host name (a UTS namespace), hosts file, kernel settings and MTU, before any process
    starts on it. It reads the plan's hosts when it fires, so that faults could change them."""

    UNDO_AT_TEARDOWN: ClassVar[bool] = False   # it all goes with the namespaces

    def do(self, rt: Any) -> Optional[Dict[str, Any]]:
        done: Dict[str, Any] = {}
        for h in rt.plan.hosts:
            m = h.machine
            if m.is_plain():
                continue
            if m.hostname:
                rt.net.set_hostname(h.name, m.hostname)
            if m.entries:
                rt.net.set_hosts_file(h.name, m.entries)
            for key, value in m.sysctl.items():
                rt.net.set_sysctl(h.name, key, value)
            if m.mtu is not None:
                rt.net.set_mtu(h.name, m.mtu)
            done[h.name] = m.describe()
        return done

    def describe(self) -> str:
        return "hosts as machines: names, hosts files, kernel settings"


@dataclass
class RunPlan:
    scenario: str
    case: Optional[str]
    backend: Optional[str]
    world_size: int
    timeout: float
    deadline: float
    workload: List[str]              # the workload steps after init (barrier, all_reduce...)
    destroy: bool
    master_addr: str
    master_port: int
    run_dir: str
    ranks: List[RankPlan]
    steps: List[Step] = field(default_factory=list)   # what faults (and set-up) do, timed
    notes: List[str] = field(default_factory=list)   # what each fault did, for humans
    hosts: List[HostPlan] = field(default_factory=list)
    netns: bool = False              # ranks run in network namespaces made for this run
    link: bool = False               # hosts are joined by a bridge (multi-host, or a fault asks)
    run_id: str = ""
    url_port: Optional[int] = None   # init_url's {port2}: a second reserved port
    rank_timeouts: Dict[str, float] = field(default_factory=dict)   # rank_timeouts: per rank
    # what the harness's worker does differently as a rank, where a launcher starts the workers
    # from one shared spec (rank -> Variation; :meth:`variations`)
    shared_variations: Dict[int, Variation] = field(default_factory=dict)
    ip: str = "4"                    # the hosts' address families (4, 6, dual)
    take_port: Optional[Callable[[], int]] = field(default=None, repr=False, compare=False)
    launcher: Any = field(default=None, repr=False, compare=False)   # the scenario's launcher
    program: Dict[str, Any] = field(default_factory=lambda: {"worker": True})
    start: str = "fresh"             # what the run asked for: fresh | fork (ranks say what
    #                                  each got: RankPlan.start, start_note)
    dns: Any = None                  # harness.services.dns.DnsPlan (a dns: block), else None
    etcd: Any = None                 # harness.faults._etcd.EtcdPlan (an etcd: block), else None
    allocation: Optional[Dict[str, Any]] = None   # the Slurm allocation whose nodes run the
    #                                  ranks (harness.tools.allocation_catalog: job, nodes),
    #                                  else None
    stores: Dict[str, JobStore] = field(default_factory=dict)   # each job's store, as
    #                                  launched ("" the scenario's own; harness.core.jobstore)
    # processes started again after they were killed (kill_rank's restart_after): each a copy
    # of the process it restarts, made once every fault has edited the plan; a step starts it
    restarts: List[RankPlan] = field(default_factory=list)
    # (label to restart, the restart's label, the fault's number): asked by faults, copied at
    # the end of make_plan (:func:`_copy_restarts`)
    restart_requests: List[Any] = field(default_factory=list)

    def store(self, job: str = "") -> JobStore:
        """Where ``job``'s store really is (harness.core.jobstore): the port that ``ports: master``
        and the store probe mean, which may not be the lease (``master_port``)."""
        if job in self.stores:
            return self.stores[job]
        return JobStore(job=job, host=self.hosts[0].name if self.hosts else "",
                        addr=self.master_addr, port=self.master_port, source="the run's lease")

    def store_ports(self) -> List[int]:
        """The known store ports of every job planned so far (the scenario's own first)."""
        out: List[int] = []
        for st in [self.store(), *self.stores.values()]:
            if st.port is not None and st.port not in out:
                out.append(st.port)
        return out
    # the case's faults, numbered from 1: kind and whether it may have no effect
    # (harness.judge.effects)
    faults: List[Dict[str, Any]] = field(default_factory=list)
    _fault_no: int = field(default=0, repr=False, compare=False)   # the fault being applied
    # what each fault without steps of its own changed in the planned processes, per process
    # (harness.judge.edits): its effect is read from what the processes said at the end of the run
    edits: List[Any] = field(default_factory=list)

    def service_hosts(self) -> List[str]:
        """Hosts of the run's services (no ranks): the name server's, then etcd's own."""
        out = [self.dns.host] if self.dns is not None else []
        if self.etcd is not None and self.etcd.own_host:
            out.append(self.etcd.host)
        return out

    def rank(self, label: Any) -> RankPlan:
        """A process the launcher starts, by label: a rank ("1"), an agent ("agent:node0")..."""
        for r in self.ranks + self.restarts:
            if r.label == str(label):
                return r
        if self.launcher is not None and not self.launcher.STARTS_RANKS \
                and isinstance(label, int):
            self._refuse_per_rank()
        what = "rank" if str(label).isdigit() else "process"
        raise KeyError(f"no {what} {label} in the plan")

    def _refuse_per_rank(self) -> None:
        kind = getattr(self.launcher, "kind", "?")
        raise PlanRefusal(f"this fault edits how each rank is started (its environment, its "
                          f"init arguments), and the {kind} launcher starts the ranks itself: "
                          "use launcher: direct, or env: for every process")

    def launched_ranks(self) -> List[RankPlan]:
        """The ranks a launcher starts (an absent rank is part of the world, never started)."""
        return [r for r in self.ranks if not r.absent]

    def worker_spec(self, rp: RankPlan) -> WorkerSpec:
        """What the harness's worker runs as rank ``rp`` (its argv's JSON)."""
        return WorkerSpec(label=rp.label, backend=self.backend, timeout=self.timeout,
                          steps=list(rp.variation.steps if rp.variation.steps is not None
                                     else self.workload),
                          destroy=self.destroy, init=rp.init,
                          variation=rp.variation, rank_timeouts=dict(self.rank_timeouts))

    def pin_fresh(self, ranks: List[RankPlan], why: str) -> None:
        """A fault's word that these ranks must be fresh interpreters under ``start: fork``
        (what it does to a rank would act differently on a forked one); ``why`` says so."""
        for r in ranks:
            r.fresh_only = r.fresh_only or why

    def main_ranks(self, selected: Optional[List[int]] = None) -> List[RankPlan]:
        """Ranks of the scenario's own job, optionally only those with the given numbers. Only
        a launcher that starts each rank itself has them (a PlanRefusal otherwise)."""
        if self.launcher is not None and not self.launcher.STARTS_RANKS:
            self._refuse_per_rank()
        main = [r for r in self.ranks if ":" not in r.label]
        if selected is None:
            return main
        return [r for r in main if int(r.label) in selected]

    def variations(self, selected: List[int]) -> List[Variation]:
        """What the harness's worker does differently as these ranks (slow_rank,
        raise_exception, skip_collective, rank_workload, model_mismatch): each planned rank's
        own Variation, or, where a launcher starts the workers from one shared spec (torchrun,
        launch, spawn, srun), a per-rank one its launcher's process carries to the workers
        (protocol.RANK_VARIATIONS_ENV), which each worker takes by the rank it was given, in
        every attempt. A user's program has no such variation: refused."""
        if self.launcher is None or self.launcher.STARTS_RANKS:
            return [r.variation for r in self.main_ranks(selected)]
        if not self.program.get("worker"):
            kind = getattr(self.launcher, "kind", "?")
            raise PlanRefusal(f"this fault changes what the harness's worker does as a rank, "
                              f"and the {kind} launcher runs your program, not the worker")
        return [self.shared_variations.setdefault(int(r), Variation()) for r in selected]

    def carry_variations(self) -> None:
        """Put the per-rank variations (:meth:`variations`) into the environment of every
        process that starts workers from the shared spec, for its workers to inherit."""
        if not self.shared_variations:
            return
        text = json.dumps({str(r): asdict(v) for r, v in sorted(self.shared_variations.items())
                           if not v.is_plain()})
        for rp in self.ranks:   # the scenario's own job's launching processes
            if not rp.job and rp.role in (ROLE_AGENT, ROLE_PARENT):
                rp.env[RANK_VARIATIONS_ENV] = text

    def processes(self, targets: List[Any]) -> List[RankPlan]:
        """The planned processes named by ``targets``: rank numbers (a launcher that starts
        each rank) or labels ("agent:node1", "parent:local")."""
        out: List[RankPlan] = []
        for t in targets:
            if isinstance(t, int):
                out += self.main_ranks([t])
            else:
                out.append(self.rank(t))
        return out

    # -- what launchers plan with ----------------------------------------------------------------
    def rank_env(self, scn: Scenario, rank: Optional[int], world: int, host: str,
                 local: Optional[int] = None, local_world: Optional[int] = None
                 ) -> Dict[str, str]:
        """The environment of a rank the harness starts itself (MASTER_ADDR/PORT, RANK,
        WORLD_SIZE, LOCAL_*; the scenario's env; the host's link interface for gloo/NCCL)."""
        env = base_env(scn, self.master_addr, self.master_port, 0 if rank is None else rank,
                       world, local, local_world)
        if rank is None:
            for k in ("RANK", "LOCAL_RANK"):
                if k not in scn.env:
                    env.pop(k, None)
        self.link_env(env, host)
        return env

    def link_env(self, env: Dict[str, str], host: str) -> Dict[str, str]:
        # as a careful user would: gloo/NCCL use the host's link (an allocation's node: the
        # interface its environment names, if any; the harness knows none)
        if self.link and self.host(host).ifname:
            ifname = self.host(host).ifname
            for var in IFNAME_VARS:
                env.setdefault(var, ifname)
        return env

    def init_for(self, scn: Scenario, rank: int, world: int) -> InitSpec:
        return replace(init_spec(scn, self.master_addr, self.master_port, rank, world,
                                 self.run_dir, self.url_port), port2=self.url_port)

    def python_for(self, scn: Scenario, rank: int, host: str) -> str:
        """The interpreter of a rank the harness starts ("": its own, sys.executable)."""
        py = scn.interpreter(rank, host)
        return interpreters.resolve(py) if py else ""

    def host_python(self, scn: Scenario, host: str) -> str:
        """The interpreter of a process that stands for a whole host (a torchrun agent, a
        spawning parent; its workers run with it): the host's ``python:``, else ``python['*']``
        ("": the harness's own)."""
        by_host = {h.name: h.python for h in scn.hosts or [] if h.python}
        py = by_host.get(host) or scn.python.get("*", "")
        return interpreters.resolve(py) if py else ""

    def new_process(self, **fields: Any) -> RankPlan:
        """A RankPlan (for a launcher, which does not import this module)."""
        return RankPlan(**fields)

    def shared_worker_spec(self, init: Optional[InitSpec] = None, label: str = "") -> WorkerSpec:
        """What the harness's worker runs where an agent or a parent starts the workers (one
        spec for all of them; init from the environment unless ``init`` says otherwise)."""
        return WorkerSpec(label=label, backend=self.backend, timeout=self.timeout,
                          steps=list(self.workload), destroy=self.destroy,
                          init=init or InitSpec("env"), rank_timeouts=dict(self.rank_timeouts))

    def add_process(self, rp: RankPlan) -> RankPlan:
        if not rp.resolver_view and self.allocation is None:
            rp.resolver_view = resolver_view(self.run_dir, self.host(rp.host)) \
                if self.hosts else ""
        self.ranks.append(rp)
        return rp

    def add_job(self, scn: Scenario, job: str, world: int,
                release: Optional[Trigger] = None) -> None:
        """A second job beside the scenario's own, started by the same launcher on the same
        master address and port (``concurrent_job``)."""
        self.launcher.plan_job(self, scn, job, world, release)
        self.stores[job] = job_store(self, scn, job)

    def address_of(self, name: str) -> Optional[str]:
        """A scenario host's address in this run (127.0.0.1 without a link); None if not one."""
        for h in self.hosts:
            if h.name == name:
                return h.addr if self.link else "127.0.0.1"
        return None

    def host(self, name: str) -> HostPlan:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no host {name!r} in the plan")

    def new_port(self) -> int:
        if self.take_port is None:
            raise RuntimeError("this plan has no port source")
        return self.take_port()

    @property
    def file_store(self) -> str:
        """The path of the run's FileStore (``init: file``)."""
        return file_store_path(self.run_dir)

    def add_job_rank(self, scn: Scenario, label: str, rank: int, world: int,
                     release: Optional[Trigger] = None) -> RankPlan:
        """A rank of another job on this run's master address and port (its env and init
        arguments made as the run's own ranks' are); appended to the plan."""
        rp = RankPlan(label=label, rank=rank,
                      env=base_env(scn, self.master_addr, self.master_port, rank, world),
                      init=init_spec(scn, self.master_addr, self.master_port, rank, world,
                                     self.run_dir, self.url_port),
                      release=release or Trigger.at_time(0.0))
        self.ranks.append(rp)
        return rp

    def add_restart(self, label: str, new_label: str) -> None:
        """Ask for the process ``label`` to be started again as ``new_label`` (a step starts
        it): a copy of that process as every fault left it, made at the end of the plan. A
        PlanRefusal where the harness does not start such a process itself."""
        known = {r.label for r in self.ranks} | {n for _, n, _ in self.restart_requests}
        if label not in known:
            what = "rank" if label.isdigit() else "process"
            raise PlanRefusal(f"the harness starts no {what} {label} itself (it is a worker "
                              "an agent or a parent starts, or no process of this run), so it "
                              "cannot start it again", ("restart_after",))
        self.restart_requests.append((label, new_label, self._fault_no))

    def restart(self, label: str) -> RankPlan:
        """The planned restart labelled ``label``."""
        for r in self.restarts:
            if r.label == label:
                return r
        raise KeyError(f"no restart {label} in the plan")

    def add_step(self, fault: Any, step: Step) -> Step:
        """Add a fault's step; it gets its id ("<kind>#2"), its fault's kind and number."""
        step.fault = getattr(fault, "kind", str(fault))
        if fault is not RUN:
            step.fault_no = self._fault_no
        step.id = f"{step.fault}#{len(self.steps) + 1}"
        self.steps.append(step)
        return step

    def to_dict(self) -> Dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k not in ("take_port", "ranks", "steps",
                                                                "hosts", "launcher", "stores",
                                                                "_fault_no", "edits")}
        d["store"] = self.store().to_dict()
        d["stores"] = {job: st.to_dict() for job, st in self.stores.items() if job}
        d["launcher"] = {"kind": self.launcher.kind, **self.launcher.model_dump(
            mode="json", exclude_defaults=True)} if self.launcher is not None \
            else {"kind": "direct"}
        d["ranks"] = [r.to_dict() for r in self.ranks]
        d["restarts"] = [r.to_dict() for r in self.restarts]
        d.pop("restart_requests", None)
        d["hosts"] = [{k: v for k, v in asdict(h).items()
                       if k != "machine" or not h.machine.is_plain()} for h in self.hosts]
        d["steps"] = [s.to_dict() for s in self.steps]
        return d


def needs_port2(scn: Scenario) -> bool:
    """A second reserved port: for init_url's {port2}, a program argument's {port2}, or a
    workload (the scenario's or a rank's own) that re-initialises on a new port."""
    if scn.init_url is not None and "{port2}" in scn.init_url:
        return True
    if scn.program is not None and any("{port2}" in a for a in scn.program.args):
        return True
    steps = list(scn.workload.steps)
    for f in scn.faults:
        steps += list(getattr(f, "steps", None) or [])
    return "reinit new_port" in steps


def file_store_path(run_dir: str) -> str:
    return str(Path(run_dir) / "filestore" / "pg")


def init_spec(scn: Scenario, addr: str, port: int, rank: int, world: int, run_dir: str,
              port2: Optional[int] = None) -> InitSpec:
    if scn.init_url is not None:   # as the user wrote it; the arguments it says
        url = fill_init_url(scn.init_url, addr=url_host(addr), port=port, rank=rank,
                            world_size=world, run_dir=run_dir, port2=port2)
        scheme = init_url_parts(scn.init_url)[0]
        args = scn.init_args if scn.init_args is not None else \
            (["rank", "world_size"] if scheme in ("tcp", "file") else [])
        return InitSpec(scheme, url, rank if "rank" in args else None,
                        world if "world_size" in args else None)
    if scn.init == "env":
        return InitSpec("env")
    if scn.init == "tcp":   # an IPv6 literal in brackets, as in any URL (RFC 3986)
        return InitSpec("tcp", f"tcp://{url_host(addr)}:{port}", rank, world)
    return InitSpec("file", f"file://{file_store_path(run_dir)}", rank, world)


def base_env(scn: Scenario, addr: str, port: int, rank: int, world: int,
             local_rank: Optional[int] = None, local_world: Optional[int] = None
             ) -> Dict[str, str]:
    env = {
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank if local_rank is None else local_rank),
        "LOCAL_WORLD_SIZE": str(world if local_world is None else local_world),
    }
    env.update(scn.env)
    return env


def run_tmp(run_dir: str) -> str:
    """The run's temp folder (harness.core.protocol.RUN_TMP), every process's TMPDIR."""
    return str(Path(run_dir) / RUN_TMP)


def resolver_view(run_dir: str, host: HostPlan) -> str:
    """Where a rank on ``host`` finds its resolver view (see harness.net.resolver): the topology
    writes it to /etc/netns/<ns> for a namespace host, the supervisor to the run directory for
    ranks in the machine's own network namespace."""
    if host.netns:
        from ..net.topology import NETNS_ETC_DIR

        return str(NETNS_ETC_DIR / host.netns)
    return str(Path(run_dir) / "resolver")


def plan_hosts(scn: Scenario, run_id: str, netns: bool, link: bool) -> List[HostPlan]:
    """Hosts with the addresses the topology will give them (its constructor is pure)."""
    names = scn.host_names()
    if not netns:
        lo = "::1" if scn.ip == "6" else "127.0.0.1"
        return [HostPlan(n, lo, "lo", addr6="" if scn.ip == "4" else "::1") for n in names]
    from ..net.topology import Topology

    topo = Topology(run_id, names, link=link or None, ip=scn.ip)
    addresses = {h.name: [a for a in (h.addr4, h.addr6) if a] for h in topo.hosts.values()}
    dead = (lambda: str(topo.network6.network_address + len(names) + 1)) if scn.ip == "6" \
        else (lambda: str(topo.network.network_address + len(names) + 1))
    machines = host_names(scn, addresses, dead) if scn.hosts else {}
    return [HostPlan(h.name, h.addr, h.ifname, h.netns, h.addr6,
                     machine=machines.get(h.name) or HostNames())
            for h in topo.hosts.values()]


def allocation_hosts(scn: Scenario, allocation: Any) -> List[HostPlan]:
    """Hosts on an allocation's nodes: host i (the master host first) is node i; its address
    is the node's name (what the ranks dial), its interface unknown to the harness."""
    names = scn.host_names()
    master = scn.master_host or names[0]
    order = [master] + [n for n in names if n != master]
    nodes = dict(zip(order, allocation.nodes))
    return [HostPlan(n, nodes[n], "", machine=HostNames(hostname=nodes[n])) for n in names]


def make_plan(scn: Scenario, run_dir: str, take_port: Callable[[], int],
              netns: bool = False, run_id: Optional[str] = None,
              allocation: Any = None) -> RunPlan:
    """Build the RunPlan for one scenario case (pure). ``take_port`` hands out ports reserved
    for this run (the supervisor's port lease; tests pass a counter). ``netns``: the harness can
    make network namespaces (a multi-host scenario or a network fault needs them; a single-host
    one uses them when ``isolate`` allows). A PlanRefusal names where the scenario asks for
    something that cannot be planned. ``allocation``
    (harness.tools.allocation_catalog.Allocation): the ranks run on its nodes: no namespaces,
    no resolver view (the nodes resolve as they do)."""
    faults = scn.faults
    run_id = run_id or Path(run_dir).name.replace("run-", "").replace("-", "_")
    multi = scn.hosts is not None and len(scn.hosts) > 1
    use_ns = scn.needs_namespaces() or (netns and scn.isolate == "auto")
    own_etcd = scn.etcd is not None and scn.etcd.own_host(scn.host_names())
    link = multi or scn.dns is not None or own_etcd or any(f.needs_link for f in faults)
    if allocation is not None:
        use_ns, link = False, multi
        hosts = allocation_hosts(scn, allocation)
    else:
        hosts = plan_hosts(scn, run_id, use_ns, link)
    master = next(h for h in hosts if h.name == (scn.master_host or hosts[0].name))
    addr = master.addr if link else scn.master_addr
    if not link and scn.ip == "6" and "master_addr" not in scn.model_fields_set:
        addr = "::1"
    port = take_port()
    # a second reserved port: init_url's or a program argument's {port2}, reinit new_port
    port2 = take_port() if needs_port2(scn) else None
    plan = RunPlan(
        scenario=scn.name, case=scn.case, backend=scn.backend, world_size=scn.world_size,
        timeout=scn.timeout, deadline=scn.deadline, workload=list(scn.workload.steps),
        destroy=scn.workload.destroy, master_addr=addr, master_port=port,
        run_dir=run_dir, ranks=[], take_port=take_port, hosts=hosts, netns=use_ns,
        link=link, run_id=run_id, launcher=scn.launcher, program=scn.program_dict(),
        url_port=port2, ip=scn.ip, start=scn.start,
        rank_timeouts={str(r): t for r, t in scn.rank_timeouts.items()},
        allocation=allocation.to_dict() if allocation is not None else None,
    )
    for told, where in ((addr, "master_addr"), (scn.env.get("MASTER_ADDR"), "env MASTER_ADDR")):
        if told and as_meant(told) != told:   # harness.net.safety judged what it stands for
            plan.notes.append(f"{where} {told!r} reaches torch as written (it stands for "
                              f"{as_meant(told)}): what torch makes of it is the verdict")
    if scn.etcd is not None:   # the run's etcd, before the launcher, which points at it
        from ..faults._etcd import plan_etcd

        plan_etcd(plan, scn)
    scn.launcher.plan(plan, scn)
    plan.stores[""] = job_store(plan, scn, "")   # before the faults, which may misdirect ranks
    if not use_ns and allocation is None:
        plan.add_step(RUN, WriteResolverView(path=resolver_view(run_dir, hosts[0]),
                                                    target="resolver view"))
    if scn.dns is not None:   # the run's name server, before any fault edits it
        from ..faults._dns import plan_dns

        plan_dns(plan, scn)
    if scn.init == "file":
        plan.add_step(RUN, MakeDir(path=str(Path(file_store_path(run_dir)).parent),
                                      target="file store"))
    _apply_faults(plan, scn)
    plan.carry_variations()
    if use_ns and any(not h.machine.is_plain() for h in hosts):
        # first of all: every process of the run (services included) starts on a whole host
        shape = plan.add_step(RUN, ShapeHosts(target="hosts"))
        plan.steps.insert(0, plan.steps.pop())
        assert shape is plan.steps[0]
    for rp in plan.ranks:   # ranks a fault added too: no rank resolves outside a view
        if not rp.resolver_view and allocation is None:
            host = next((h for h in hosts if h.name == rp.host), hosts[0])
            rp.resolver_view = resolver_view(run_dir, host)
        # and none leaves a temp file behind (a scenario's own TMPDIR is kept)
        rp.env.setdefault("TMPDIR", run_tmp(run_dir))
    if port2 is not None:   # a program's argument {port2}: the run's second leased port
        for rp in plan.ranks:
            rp.argv = [a.replace("{port2}", str(port2)) for a in rp.argv]
    scn.launcher.assign_start(plan, scn)   # fresh or forked, each process, with the reason
    _copy_restarts(plan)
    return plan


def _copy_restarts(plan: RunPlan) -> None:
    """Each restart a fault asked for: a copy of the process it starts again as every fault
    left it (argv, environment, host, interpreter, resolver view), released as soon as it is
    started (a restart is not held for a start line) and always a fresh interpreter."""
    for label, new_label, fault_no in plan.restart_requests:
        original = plan.rank(label)
        if original.absent:
            raise PlanRefusal(f"{label} is absent (a fault keeps it from starting): it is "
                              "never killed, so it is never started again",
                              ("faults", fault_no - 1, "restart_after"))
        copy = replace(original, label=new_label, env=dict(original.env),
                       unset=list(original.unset), argv=list(original.argv),
                       release=Trigger.at_time(0.0), restart_of=label, start="fresh",
                       start_note="a restart starts as a fresh interpreter, as a process "
                       "started again by hand does")
        plan.restarts.append(copy)


def _apply_faults(plan: RunPlan, scn: Scenario) -> None:
    """Each fault of the case applied to the plan, in order (a refusal located at its
    ``kind``); a fault that adds no step of its own is proved by what it changed in the plan."""
    for i, fault in enumerate(scn.faults):
        plan._fault_no = i + 1
        plan.faults.append({"n": i + 1, "kind": fault.kind,
                            "optional": getattr(fault, "effect", "required") == "optional"})
        before, steps_before = edits.snapshot(plan), len(plan.steps)
        try:
            fault.apply(plan, scn)
        except PlanRefusal as e:   # located inside the fault where it says where, else at kind
            raise PlanRefusal(f"{fault.kind}: {e}", ("faults", i) + (e.loc or ("kind",))) \
                from None
        if not any(s.fault_no == i + 1 for s in plan.steps[steps_before:]):
            # no step of its own proves it: what it changed in the plan, read back at the end
            plan.edits += edits.diff(before, edits.snapshot(plan), i + 1, fault.kind,
                                     plan.workload)
    plan._fault_no = 0

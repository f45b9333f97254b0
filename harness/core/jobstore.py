"""Where a job's store really is: one answer for the plan, the faults and the report (pure).

"The master port" means the port of the job's store: the TCPStore its ranks (or torchrun's
agents) dial to meet. The harness leases a port for every run (``RunPlan.master_port``), but
the job may be told another one, and then the lease is a port nobody uses:

* ``init_url: tcp://{addr}:{port2}`` or a literal port in the URL (the URL wins over
  MASTER_PORT);
* the case's ``env: {MASTER_PORT: ...}`` (a rank the harness starts reads it, env://);
* torchrun's ``rdzv_endpoint: HOST:PORT`` (static or c10d: the endpoint wins over
  ``--master-port``), its ``master_port``, the same per agent (``agents: {HOST: {...}}``), a
  flag among its verbatim ``args`` (``--rdzv-endpoint=...``), or ``PET_*`` variables in the
  case's env (torchrun's defaults).

:func:`job_store` reads what the launch says, from the planned processes themselves (their
argv, environment and init arguments, after the launcher planned them), and names what set it
(``source``). A port chosen at run time (``torchrun --standalone``, a single-node static
launch without a port, which torch turns into c10d on ``localhost:0``; an etcd rendezvous,
whose workers' store port agent 0 picks) is ``port: None`` with the reason. A user's program
may call ``init_process_group`` with a constant of its own that the harness cannot see before
the run: its store is kept *as launched, unverified* (``verified: False``); the run's fault
evidence says whether a fault planned on it acted.

``ports: master``, ``ports: data``, proxy ``traffic: store``, ``busy_port``, the store probe,
the diagnosis and ``harness show`` all use this answer (``RunPlan.store()``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

UNVERIFIED = "as launched, unverified"
C10D_DEFAULT_PORT = 29400      # torchrun: an endpoint without a port (c10d)
STATIC_DEFAULT_PORT = 29500    # torchrun: --master-port's default (static)
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")
TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")


@dataclass
class JobStore:
    """The store of one job (``job``: "" the scenario's own, "job2"...)."""

    job: str = ""
    kind: str = "tcp"               # tcp (a TCPStore) | file (init: file, no port)
    host: str = ""                  # the scenario host it listens on ("" when not known)
    addr: str = ""                  # the address the job dials, as launched
    port: Optional[int] = None      # None: no TCP store, or a port chosen at run time
    source: str = ""                # what set the port ("the run's lease", "rdzv_endpoint"...)
    verified: bool = True           # False: as launched, unverified (a user's program)
    why: str = ""                   # why the port is None, or why it is unverified

    @property
    def status(self) -> str:
        return "planned" if self.verified else UNVERIFIED

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status
        return d

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> JobStore:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})

    def endpoint(self) -> str:
        if self.kind == "file":
            return "file store (no port)"
        host = f"[{self.addr}]" if ":" in self.addr and not self.addr.startswith("[") \
            else self.addr
        return f"{host}:{self.port if self.port is not None else '?'}"

    def describe(self) -> str:
        """One line, for ``harness show`` and the plan's notes."""
        if self.kind == "file":
            return "store: a file store (init: file), no port"
        where = f" on host {self.host}" if self.host else ""
        if self.port is None:
            return f"store {self.endpoint()}{where}: no port known before the run ({self.why})"
        text = f"store {self.endpoint()}{where} (port from {self.source})"
        if not self.verified:
            text += f", {UNVERIFIED}" + (f": {self.why}" if self.why else "")
        return text


# -- reading a launch ----------------------------------------------------------------------------
def flag_value(argv: List[str], *names: str) -> Tuple[bool, Optional[str]]:
    """(given, value) of an option in an argv (``--x V`` or ``--x=V``; the last one wins, as
    argparse does); a flag without a value (``--standalone``) reads ``(True, None)``."""
    given, value = False, None
    i = 0
    while i < len(argv):
        a = argv[i]
        for n in names:
            if a == n:
                given = True
                nxt = argv[i + 1] if i + 1 < len(argv) else None
                value = nxt if nxt is not None and not nxt.startswith("--") else None
            elif a.startswith(n + "="):
                given, value = True, a[len(n) + 1:]
        i += 1
    return given, value


def split_endpoint(value: str) -> Tuple[str, Optional[int]]:
    """("host", port or None) of ``HOST[:PORT]`` (``[v6]:PORT``; a bare IPv6 literal has no
    port)."""
    v = value.strip()
    if v.startswith("["):
        host, _, rest = v[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
        return host, int(port) if port.isdigit() else None
    if v.count(":") == 1:
        host, _, port = v.partition(":")
        return host, int(port) if port.isdigit() else None
    return v, None


def url_endpoint(url: str) -> Tuple[str, Optional[int]]:
    parts = urlsplit(url)
    try:
        return parts.hostname or "", parts.port
    except ValueError:
        return parts.hostname or "", None


def _is_loopback(addr: str) -> bool:
    a = addr.strip("[]").lower()
    if a in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(a).is_loopback
    except ValueError:
        return False


def host_of(plan: Any, addr: str, fallback: str) -> str:
    """The scenario host that ``addr`` names in this run (a host's name or its address on the
    run's link); a loopback address is ``fallback``'s own; "" when none is."""
    a = addr.strip("[]")
    if _is_loopback(a):
        return fallback
    for h in plan.hosts:
        if a and a in (h.name, h.addr, h.addr6):
            return h.name
    return ""


def _job_processes(plan: Any, job: str) -> List[Any]:
    return [r for r in plan.ranks if (r.job or "") == job]


# -- the answer ------------------------------------------------------------------------------------
def job_store(plan: Any, scn: Any, job: str = "") -> JobStore:
    """The store of ``job`` as its planned processes are launched (see the module doc)."""
    procs = _job_processes(plan, job)
    agents = [r for r in procs if r.role == "agent"]
    if agents or _is_torchrun(plan):
        return _torchrun_store(plan, scn, job, agents)
    return _env_store(plan, scn, job, procs)


def _is_torchrun(plan: Any) -> bool:
    return getattr(plan.launcher, "kind", "") in ("torchrun", "launch")


def _user_program(scn: Any) -> bool:
    return bool(scn.program_argv())


def _unverified(store: JobStore, scn: Any, what: str) -> JobStore:
    if _user_program(scn):
        store.verified = False
        store.why = (f"the program runs its own init_process_group, which may {what}; the "
                     "run's fault evidence says whether a fault on this port acted")
    return store


def _env_store(plan: Any, scn: Any, job: str, procs: List[Any]) -> JobStore:
    """A job whose ranks (or spawning parents, or Slurm tasks) init from MASTER_ADDR/PORT or a
    tcp:// URL: the store is where the process that is rank 0 listens."""
    first = next((r for r in procs if r.rank == 0), procs[0] if procs else None)
    host = first.host if first is not None else (plan.hosts[0].name if plan.hosts else "")
    lease = JobStore(job=job, host=host, addr=plan.master_addr, port=plan.master_port,
                     source="the run's lease")
    if first is None:
        return lease
    init = first.init
    if init.method == "file" or (scn.init == "file" and scn.init_url is None):
        return JobStore(job=job, kind="file", host=host, addr="", port=None,
                        source="init: file", why="a file store has no port")
    if init.method == "tcp" and init.url:
        addr, port = url_endpoint(init.url)
        if scn.init_url is not None:
            if "{port}" in scn.init_url:
                source = "init_url {port}: the run's lease"
            elif "{port2}" in scn.init_url:
                source = "init_url {port2}: the run's second leased port"
            else:
                source = "init_url's own port"
        else:
            source = "the run's lease (init: tcp)"
        st = JobStore(job=job, host=host, addr=addr, port=port, source=source,
                      why="" if port is not None else "the URL names no port")
        return _unverified(st, scn, "use another URL")
    if init.method == "env" or not init.url:
        if scn.init_url is not None and init.method not in ("env", "tcp"):
            return lease   # a scheme torch refuses (foo://): no store starts at all
        port_text = str(first.env.get("MASTER_PORT", ""))
        addr = str(first.env.get("MASTER_ADDR", plan.master_addr))
        if "MASTER_PORT" in scn.env:
            source = "the case's env MASTER_PORT"
        elif port_text:
            source = "the run's lease (MASTER_PORT)"
        else:
            source = "the run's lease"
        port = int(port_text) if port_text.isdigit() and 0 < int(port_text) < 65536 \
            else (None if port_text else plan.master_port)
        st = JobStore(job=job, host=host, addr=addr, port=port, source=source,
                      why="" if port is not None else f"MASTER_PORT {port_text[:20]!r} is "
                      "no port")
        return _unverified(st, scn, "use another address or port than MASTER_ADDR/PORT")
    return lease


def _torchrun_source(plan: Any, scn: Any, job: str, host: str, names: Tuple[str, ...],
                     argv_names: Tuple[str, ...]) -> str:
    """Which field set a torchrun flag of the agent on ``host``: its per-agent option, the
    launcher's option, a verbatim flag in args, or a PET_* variable of the case's env."""
    launcher = plan.launcher
    agents = getattr(launcher, "agents", {}) or {}
    key = f"{job}:{host}" if job else host
    over = agents.get(key)
    for name in names:
        if over is not None and name in over.model_fields_set and getattr(over, name) is not None:
            return f"agents.{key}.{name}"
    for name in names:
        if launcher is not None and name in getattr(launcher, "model_fields_set", ()) and \
                getattr(launcher, name, None) is not None:
            return name
    args = list((getattr(over, "args", None) if over is not None else None)
                or getattr(launcher, "args", None) or [])
    if flag_value(args, *argv_names)[0]:
        return f"args ({argv_names[0]})"
    return ""


def _torchrun_store(plan: Any, scn: Any, job: str, agents: List[Any]) -> JobStore:
    """The rendezvous store of torchrun's agents (with ``share_store`` the workers' store too):
    the agent of the master host's flags, as torch's ``run.py`` reads them."""
    if not agents:
        return JobStore(job=job, host="", port=None, source="",
                        why="no torchrun agent is planned")
    agent = agents[0]
    argv = list(agent.argv)
    if "-m" in argv[2:]:   # torchrun's own flags end where the program starts
        argv = argv[:argv.index("-m", 2)]
    env = dict(agent.env)

    def opt(*names: str) -> Tuple[bool, Optional[str], str]:
        given, value = flag_value(argv, *names)
        if given:
            return True, value, "flag"
        pet = "PET_" + names[0].lstrip("-").replace("-", "_").upper()
        if pet in env:
            return True, env[pet], f"the case's env {pet}"
        return False, None, ""

    def src(how: str, fields: Tuple[str, ...], flags: Tuple[str, ...]) -> str:
        if how != "flag":
            return how
        return _torchrun_source(plan, scn, job, agent.host, fields, flags) or \
            "the run's lease"

    standalone = opt("--standalone")[0]
    _, backend, _ = opt("--rdzv-backend", "--rdzv_backend")
    backend = backend or "static"
    ep_given, endpoint, ep_how = opt("--rdzv-endpoint", "--rdzv_endpoint")
    _, maddr, _ = opt("--master-addr", "--master_addr")
    mp_given, mport, mp_how = opt("--master-port", "--master_port")
    _, nnodes, _ = opt("--nnodes")
    ep_flags = ("--rdzv-endpoint", "--rdzv_endpoint")
    mp_flags = ("--master-port", "--master_port")
    host = agent.host
    if standalone:
        return JobStore(job=job, host=host, addr="localhost", port=None, source="--standalone",
                        why="torchrun --standalone: c10d on localhost:0, a free port the "
                        "agent picks")
    if backend in ("etcd", "etcd-v2"):
        return JobStore(job=job, host=host, addr="", port=None, source=f"rdzv_backend "
                        f"{backend}", why=f"the {backend} rendezvous keeps no TCP store; agent "
                        "0 picks the workers' store port at run time")
    if ep_given and endpoint:
        addr, port = split_endpoint(endpoint)
        source = src(ep_how, ("rdzv_endpoint",), ep_flags)
        why = ""
        if port == 0:
            return JobStore(job=job, host=host_of(plan, addr, agent.host), addr=addr,
                            port=None, source=source, why="port 0: a free port the agent "
                            "picks at run time")
        if port is None:
            if backend == "c10d":
                port, source = C10D_DEFAULT_PORT, f"{source} (no port: c10d's default)"
            else:
                why = "the static rendezvous needs a port in its endpoint"
        st = JobStore(job=job, host=host_of(plan, addr, agent.host), addr=addr, port=port,
                      source=source, why=why)
        return _shared(st, env)
    if backend == "static":
        max_nodes = str(nnodes or "1:1").rsplit(":", 1)[-1]
        if not mp_given and max_nodes == "1":
            return JobStore(job=job, host=host, addr="localhost", port=None,
                            source="torchrun's single-node default",
                            why="a single-node static launch without a port: torch makes it "
                            "c10d on localhost:0, a free port the agent picks")
        addr = maddr or "127.0.0.1"
        if mp_given and mport and mport.isdigit():
            port, source = int(mport), src(mp_how, ("master_port",), mp_flags)
            if source == "the run's lease":
                source = "the run's lease (--master-port)"
        else:
            port, source = STATIC_DEFAULT_PORT, "torchrun's default --master-port"
        st = JobStore(job=job, host=host_of(plan, addr, agent.host), addr=addr, port=port,
                      source=source)
        return _shared(st, env)
    return JobStore(job=job, host=host, addr="", port=None, source=f"rdzv_backend {backend}",
                    why=f"the {backend} rendezvous without an endpoint")


def _shared(st: JobStore, env: Dict[str, str]) -> JobStore:
    if env.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") == "1":
        st.why = ("the agents' rendezvous store; the workers host a store of their own on a "
                  "port chosen at run time (share_store: false)")
    return st


def known_port(plan: Any, what: str, job: str = "") -> int:
    """The store port of ``job`` for a fault that acts on it (``what``: "ports: master"...);
    a PlanRefusal where the store has no port the plan can know."""
    from .errors import PlanRefusal

    st = plan.store(job)
    if st.kind == "file":
        raise PlanRefusal(f"{what} means the job's store port, and init: file has no store "
                          "(a file store): this fault would change nothing")
    if st.port is None:
        raise PlanRefusal(f"{what} means the job's store port, which is chosen at run time "
                          f"here ({st.why}): give the launch a port (rdzv_endpoint: HOST:PORT, "
                          "master_port) or name the ports")
    return st.port

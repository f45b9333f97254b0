"""The scenario format: typed models for one scenario case (pure, no I/O).

A scenario file is YAML; ``harness.scenario.loader`` turns it into ``Scenario`` objects (one per
case) and reports every error as ``file:line: field.path: message``. Faults are typed by their
own plugin models (``harness.faults``, looked up by ``kind`` in the registry), validated once
and kept typed on the scenario. The loader also leaves, on each expectation, the line it came
from (``RankExpect.line``), so that a failed expectation names ``file.yaml:LINE``.

Every value a file can give has a stated bound (docs/reference/scenario-files.md, "Limits"):
what passes here must also start, run and be written down (spawned env, torch's timedelta,
test ids, evidence paths).

The format's parts have modules of their own: :mod:`harness.scenario.parts` (the strict base
model, ``Workload``, the ``init_url`` template, launcher and fault values, ``marks:``),
:mod:`harness.scenario.hosts` (``Host``, ``Dns``, ``Etcd``) and
:mod:`harness.scenario.expectations` (``Expect``, ``RankExpect``, frequency bounds). This
module is the ``Scenario`` itself, and every name of the format is importable from here.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Dict, List, Literal, Optional, Union

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from ..core.limits import (  # noqa: F401 - the limits are part of the format's vocabulary
    ENV_NAME_RE,
    MAX_ADDR,
    MAX_ENV_TOTAL,
    MAX_ENV_VALUE,
    MAX_ENV_VARS,
    MAX_EXPECT_BLOCKS,
    MAX_FAULTS,
    MAX_HOSTS,
    MAX_MARKS,
    MAX_MODEL_MB,
    MAX_NAME,
    MAX_REPEAT,
    MAX_SECONDS,
    MAX_SHORT,
    MAX_STEPS,
    MAX_TEXT,
    MAX_TRAIN_STEPS,
    MAX_WORLD,
    MIN_RACE_REPEAT,
    MIN_TIMEOUT,
    EnvName,
    EnvValue,
    Number,
    Port,
    PositiveSeconds,
    Seconds,
    env_as_text,
    located,
    no_bool,
)
from ..faults import Fault
from ..launchers import LauncherSpec
from .expectations import OUTCOMES as OUTCOMES
from .expectations import Expect
from .expectations import Outcome as Outcome
from .expectations import RankExpect as RankExpect
from .expectations import base_version as base_version
from .expectations import bound_holds as bound_holds
from .expectations import parse_bound as parse_bound
from .hosts import DNS_NAME_RE as DNS_NAME_RE
from .hosts import HOSTNAME_RE as HOSTNAME_RE
from .hosts import Dns, Etcd, Host, check_hosts
from .parts import INIT_URL_FIELDS as INIT_URL_FIELDS
from .parts import MARK_RE as MARK_RE
from .parts import RESERVED_MARKS as RESERVED_MARKS
from .parts import STEP_RE as STEP_RE
from .parts import (
    Strict,
    Workload,
    _marker,
    _workload_shorthand,
    fault_of,
    init_url_parts,
    launcher_spec_of,
)
from .parts import fill_init_url as fill_init_url
from .programs import Program, program_of

NAME_RE = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"   # a scenario's name (a pattern for pydantic)
CASE_ID_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.=-]*", re.ASCII)


class Scenario(Strict):
    _source: Optional[str] = PrivateAttr(None)     # the file it was loaded from (the loader)
    _about_line: Optional[int] = PrivateAttr(None)  # where its about: is written (the loader)

    name: str = Field(pattern=NAME_RE, max_length=MAX_NAME,
                      description="short id, used in test ids: letters, digits, . _ - (not "
                      "starting with . or -)")
    about: str = Field(min_length=1, max_length=MAX_TEXT,
                       description="why this scenario exists, where it comes from, and what was "
                       "watched happening")
    backend: Optional[str] = Field(
        "gloo", pattern=r"^[A-Za-z0-9:,]{0,48}$",
        description="torch's backend argument as users write it: gloo, nccl, "
        "'cpu:gloo,cuda:nccl' (a malformed one, a duplicate device or a trailing comma, is "
        "passed as written, for torch's own error); null: omitted (torch picks by device)")
    backend_available: Optional[bool] = Field(
        None, description="null (default): skipped, with the reason, where this machine "
        "cannot give the backend; false: the case is ABOUT a machine without it (torch's "
        "error is the expectation): it runs where the backend is missing (torch built without "
        "it, or a CUDA build without the GPUs NCCL needs: the two fail differently, so say "
        "which with an expect block's build: cpu or build: cuda) and is skipped where it is "
        "there; true: as null")
    gpus: Optional[int] = Field(
        None, ge=0, le=MAX_WORLD, description="with NCCL (named, or the backend omitted on a "
        "CUDA machine): how many CUDA GPUs the case needs (skipped, with the count, where the "
        "machine has fewer); null: one per rank. Each rank takes the GPU of its LOCAL_RANK: "
        "fewer than the ranks puts several ranks on one GPU (with LOCAL_RANK set in env)")
    world_size: int = Field(2, ge=1, le=MAX_WORLD, description="number of ranks (with hosts: "
                            "may be left out, the sum of the hosts' ranks; given, it must match)")
    init: Literal["env", "tcp", "file"] = Field(
        "env", description="init method: env (env://, MASTER_ADDR/PORT), tcp (tcp://addr:port) or "
        "file (file:///shared/path)")
    init_url: Optional[str] = Field(
        None, max_length=MAX_ADDR, description="init_method exactly as a user writes it, "
        "instead of the one init builds: a template with {addr}, {port} (MASTER_PORT), "
        "{port2} (a second port of the run's, not MASTER_PORT), {rank}, {world_size} and "
        "{run_dir} (e.g. 'tcp://{addr}', 'tcp://{addr}:{port}?rank={rank}', "
        "'env://?use_libuv=0', 'file://', 'foo://x'); a host in it must be one the harness may "
        "send traffic to, a file path must lie in {run_dir}")
    init_args: Optional[List[Literal["rank", "world_size"]]] = Field(
        None, max_length=2, description="with init_url: which of rank and world_size are also "
        "passed as arguments (default: both for tcp:// and file://, none otherwise)")
    timeout: Annotated[float, BeforeValidator(no_bool), Field(
        ge=MIN_TIMEOUT, le=MAX_SECONDS, allow_inf_nan=False)] = Field(
        30.0, description="torch's own timeout for init_process_group, s")
    rank_timeouts: Dict[Annotated[int, Field(ge=0, lt=MAX_WORLD)], Annotated[
        float, BeforeValidator(no_bool), Field(ge=MIN_TIMEOUT, le=MAX_SECONDS,
                                               allow_inf_nan=False)]] = Field(
        default_factory=dict, max_length=MAX_WORLD,
        description="torch's timeout for these ranks instead of timeout: (rank -> s), read by "
        "each worker from its rank before init: orders two ranks' timers that would otherwise "
        "fire together, so that the case has one outcome")
    deadline: PositiveSeconds = Field(
        60.0, description="the harness's wall-clock bound for the run from the start line, s;"
        " ranks alive then are 'hang'")
    master_addr: str = Field("127.0.0.1", max_length=MAX_ADDR,
                             description="MASTER_ADDR given to every rank (single host), as "
                             "written: loopback only, in any spelling users meet ('[::1]', ' "
                             "127.0.0.1', 'localhost.', '::ffff:127.0.0.1': torch gets the text "
                             "and its behaviour is the verdict); with hosts, the master host's "
                             "address is used")
    hosts: Optional[List[Host]] = Field(
        None, min_length=1, max_length=MAX_HOSTS,
        description="several hosts, each a network namespace linked by a bridge; ranks are "
        "numbered from the master host (rank 0 hosts the store), then host by host in order; "
        "default: one host, local")
    nodes: Optional[int] = Field(None, ge=1, le=MAX_HOSTS, description="shorthand for hosts: "
                                 "node0.. with ranks_per_node ranks each (not with hosts)")
    ranks_per_node: Optional[int] = Field(None, ge=1, le=MAX_WORLD, description="with nodes")
    hostnames: Literal["machine", "own"] = Field(
        "machine", description="the hosts' names: machine (every host shares the machine's "
        "name, as network namespaces alone do) or own (each host is named after itself, in "
        "a UTS namespace of its own, and the hosts know each other's names)")
    master_host: Optional[str] = Field(None, max_length=MAX_NAME, description="host of rank 0's "
                                       "store; default: the first host")
    ip: Literal["4", "6", "dual"] = Field(
        "4", description="address families of the hosts: 4, 6 (IPv6 only: unique local "
        "addresses inside the run's namespaces; MASTER_ADDR an IPv6 literal) or dual (both; "
        "MASTER_ADDR the IPv4 one). A single host with 6: MASTER_ADDR ::1")
    isolate: Literal["auto", "always", "never"] = Field(
        "auto", description="run a single-host scenario in a private network namespace (private "
        "ports, a filter rule on lo touches nothing else): auto = when the harness can")
    env: Dict[EnvName, EnvValue] = Field(
        default_factory=dict, max_length=MAX_ENV_VARS,
        description="extra env for every rank (names of letters, digits and _)")
    python: Dict[str, Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]] = Field(
        default_factory=dict, max_length=MAX_WORLD + 1,
        description="the interpreter of ranks (another venv, another torch): a path for every "
        "rank, or a mapping of rank numbers (and '*') to paths; a host's python comes between "
        "(rank > host > '*'); ~ and $VARS are expanded; a scenario whose interpreter is "
        "missing or cannot import torch is skipped with the reason")
    workload: Workload = Field(default_factory=lambda: Workload(),
                               description="what the ranks do after init: init (init only), a "
                               "list of steps, or {steps: [...], destroy: true} (the workload "
                               "steps' reference)")
    launcher: Annotated[LauncherSpec, BeforeValidator(launcher_spec_of)] = Field(
        default_factory=lambda: launcher_spec_of("direct"),
        description="how the ranks start: direct (the harness starts each), torchrun (one "
        "agent per host), launch (the legacy torch.distributed.launch), spawn (one parent per "
        "host) or slurm (srun on the run's own Slurm cluster); a name or a mapping with kind "
        "and its options (docs/launchers.md). A field the launcher does not use is refused at "
        "load, located")
    program: Annotated[Optional[Program], BeforeValidator(program_of)] = Field(
        None, description="what each rank runs: worker (the harness's own, the default), a "
        "Python file (train.py) or a mapping {script | module, args, cwd}")
    start: Literal["fresh", "fork"] = Field(
        "fork", description="how a rank's interpreter comes to be: fork (the default: forked "
        "from a per-host server that imported torch once; ranks whose start would differ "
        "forked run fresh, with the reason in the report) or fresh (its own python, imports "
        "torch); --start / --harness-start overrides")
    faults: List[Annotated[Fault, BeforeValidator(fault_of)]] = Field(
        default_factory=list, max_length=MAX_FAULTS,
        description="faults, each a mapping with its kind and the kind's parameters")
    dns: Optional[Dns] = Field(
        None, description="a real name server in the topology (dnsmasq, no upstream) that "
        "every host resolves with: records, search domain, the master's name "
        "(docs/how-to/network-faults.md)")
    etcd: Optional[Etcd] = Field(
        None, description="a real etcd of the run, for torchrun's etcd / etcd-v2 rendezvous "
        "(docs/how-to/torchrun.md)")
    expect: List[Expect] = Field(
        default_factory=lambda: [Expect()], max_length=MAX_EXPECT_BLOCKS,
        description="one block, or a list of torch-scoped blocks (the first whose 'torch' range "
        "holds is used); default: an empty block, no checks")
    race: Optional[str] = Field(
        None, min_length=1, max_length=MAX_TEXT,
        description="declares a race case: what races (inside torch, not the harness's own "
        "timing) and the frequencies measured; its rows with several outcomes give a "
        f"frequency bound for each, it runs repeat: >= {MIN_RACE_REPEAT} times and gets the "
        "pytest marker 'race'. Without it a case is deterministic: one outcome per row "
        "(harness validate --strict)")
    repeat: int = Field(1, ge=1, le=MAX_REPEAT, description="run the case this many times: "
                        "its ranks' outcome frequencies are reported and checked against "
                        "frequency bounds, and a rank that varies where its expectation "
                        "allows one outcome makes the case flaky (--harness-repeat overrides)")
    marks: List[Annotated[str, AfterValidator(_marker)]] = Field(
        default_factory=list, max_length=MAX_MARKS,
        description="plain labels for pytest's -m (not markers pytest or a plugin gives a "
        "meaning to, such as skip or timeout)")
    case: Optional[str] = Field(None, description="set by the loader: the case id")

    @field_validator("workload", mode="before", json_schema_input_type=Union[
        Workload, List[str], str])
    @classmethod
    def _workload(cls, v: Any) -> Any:
        return _workload_shorthand(v)

    @field_validator("init_url")
    @classmethod
    def _init_url(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            init_url_parts(v)   # raises ValueError naming what is wrong
        return v

    @model_validator(mode="after")
    def _init_args(self) -> Scenario:
        if self.init_args is not None and self.init_url is None:
            raise located("init_args", "init_args goes with init_url (init: tcp and file pass "
                          "both, env none)")
        return self

    @model_validator(mode="after")
    def _race(self) -> Scenario:
        """A race case runs often enough to measure, and each of its racing rows says how
        often each outcome may come (a row whose every bound is 'any' checks nothing)."""
        if self.race is None:
            return self
        if self.repeat < MIN_RACE_REPEAT:
            raise located("repeat", f"a race case runs repeat: >= {MIN_RACE_REPEAT} times "
                          f"(got {self.repeat}): fewer runs measure no frequency")
        for i, block in enumerate(self.expect):
            for label, row in block.ranks.items():
                if len(row.outcome or ()) < 2:
                    continue
                where = ("expect", i, "ranks", label, "outcome")
                bounds = row.frequency or {}
                if set(bounds) != set(row.outcome or ()) or \
                        all(b == "any" for b in bounds.values()):
                    raise located(where, "a racing row of a race case gives each outcome a "
                                  "frequency bound, at least one of them not 'any' "
                                  "({ok: '>= 0.3', timeout: '<= 0.7'})")
        return self

    @field_validator("ip", mode="before",
                     json_schema_input_type=Union[Literal[4, 6], Literal["4", "6", "dual"]])
    @classmethod
    def _ip_word(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @model_validator(mode="after")
    def _hosts(self) -> Scenario:
        if self.nodes is not None or self.ranks_per_node is not None:
            if self.hosts is not None:
                raise located("nodes", "give either hosts or nodes x ranks_per_node, not both")
            n, per = self.nodes or 1, self.ranks_per_node or 1
            if n * per > MAX_WORLD:
                raise located("ranks_per_node" if self.ranks_per_node else "nodes",
                              f"nodes x ranks_per_node = {n} x {per} = {n * per} ranks: at most "
                              f"{MAX_WORLD} in one run")
            self.hosts = [Host(name=f"node{i}", ranks=per) for i in range(n)]
        if self.hosts is not None:
            names = check_hosts(self.hosts, self.hostnames)
            total = sum(h.ranks for h in self.hosts)
            if total > MAX_WORLD:
                raise located("hosts", f"the hosts hold {total} ranks: at most {MAX_WORLD} in "
                              "one run")
            if "world_size" in self.model_fields_set and self.world_size != total:
                raise located("world_size", f"world_size {self.world_size} but the hosts hold "
                              f"{total} ranks")
            self.world_size = total
            if self.master_host is not None and self.master_host not in names:
                raise located("master_host", f"master_host {self.master_host!r} is not one of "
                              f"{names}")
        elif self.master_host is not None:
            raise located("master_host", "master_host needs hosts (or nodes)")
        return self

    @field_validator("python", mode="before", json_schema_input_type=Union[
        str, Dict[str, str]])
    @classmethod
    def _python_shorthand(cls, v: Any) -> Any:
        if isinstance(v, str):
            return {"*": v}
        if isinstance(v, dict):
            return {str(k): x for k, x in v.items()}
        return v

    @model_validator(mode="after")
    def _python_ranks(self) -> Scenario:
        for key in self.python:
            if key != "*" and not (key.isdigit() and int(key) < self.world_size):
                raise located("python", f"{key!r}: a rank number below world_size "
                              f"({self.world_size}) or '*'")
        return self

    @model_validator(mode="after")
    def _rank_timeouts(self) -> Scenario:
        for r in self.rank_timeouts:
            if r >= self.world_size:
                raise located("rank_timeouts", f"rank {r}: a rank number below world_size "
                              f"({self.world_size}): its timeout would be ignored")
        return self

    def interpreter(self, rank: int, host: str) -> str:
        """The python a rank runs with as the scenario writes it ('' for the harness's own):
        the rank's entry, else its host's, else '*'."""
        by_host = {h.name: h.python for h in self.hosts or [] if h.python}
        return self.python.get(str(rank)) or by_host.get(host) or self.python.get("*", "")

    def interpreters(self) -> List[str]:
        """Every interpreter the scenario names (as written)."""
        named = list(self.python.values()) + [h.python for h in self.hosts or [] if h.python]
        return list(dict.fromkeys(named))

    @model_validator(mode="after")
    def _counter_hosts(self) -> Scenario:
        names = self.host_names()
        for i, block in enumerate(self.expect):
            for host in block.counters:
                if host not in names:
                    where = ("expect", i, "counters") if len(self.expect) > 1 else \
                        ("expect", "counters")
                    raise located(where, f"{host!r} is not a host of this scenario "
                                  f"({', '.join(names)})")
        return self

    @model_validator(mode="after")
    def _gloo_only(self) -> Scenario:
        if self.backend != "gloo" and "monitored_barrier" in self.workload.steps:
            raise located("workload", "monitored_barrier: torch implements it for the gloo "
                          "backend only")
        return self

    @field_validator("env")
    @classmethod
    def _env_total(cls, v: Dict[str, str]) -> Dict[str, str]:
        total = sum(len(k) + len(x.encode("utf-8", "surrogatepass")) + 2 for k, x in v.items())
        if total > MAX_ENV_TOTAL:
            raise ValueError(f"env holds {total} bytes of names and values: at most "
                             f"{MAX_ENV_TOTAL} in all")
        return v

    def backend_names(self) -> List[str]:
        """The backends the backend string names (``cpu:gloo,cuda:nccl`` -> gloo, nccl);
        omitted: what torch picks on a CPU machine (gloo)."""
        if self.backend is None:
            return ["gloo"]
        names = [part.rsplit(":", 1)[-1].strip().lower() for part in self.backend.split(",")]
        return [n for n in dict.fromkeys(names) if n]

    @model_validator(mode="after")
    def _dns_records(self) -> Scenario:
        if self.dns is None:
            return self
        self.dns.check_records(self.host_names())
        return self

    @model_validator(mode="after")
    def _etcd_host(self) -> Scenario:
        if self.etcd is None:
            return self
        names = self.host_names()
        if self.etcd.host == "loopback" and len(names) > 1:
            raise located("etcd", "host 'loopback' is for a single-host run: with several "
                          "hosts the agents could not reach it; give a host of the scenario "
                          "or a name of its own")
        if self.dns is not None and self.etcd.host == self.dns.host:
            raise located("etcd", f"host {self.etcd.host!r} is the name server's own host: "
                          "give etcd another host")
        return self

    def host_names(self) -> List[str]:
        return [h.name for h in self.hosts] if self.hosts else ["local"]

    def hosts_file_names(self) -> List[str]:
        """Names the run's own hosts files give on some host (its hosts' own names, their
        names: entries): each resolves only to an address of the run or to loopback."""
        out = [h.hostname or h.name for h in self.hosts or []
               if h.hostname or self.hostnames == "own"]
        return out + [n for h in self.hosts or [] for n in h.names]

    def needs_namespaces(self) -> bool:
        """The run must have network namespaces: several hosts, a fault or the launcher that
        says so (a literal port), or ``isolate: always``."""
        multi = self.hosts is not None and len(self.hosts) > 1
        whole = self.hostnames == "own" or any(h.is_whole_machine() for h in self.hosts or [])
        own_etcd = self.etcd is not None and self.etcd.own_host(self.host_names())
        return multi or whole or self.isolate == "always" or self.dns is not None \
            or own_etcd \
            or any(f.needs_netns for f in self.faults) \
            or self.launcher.needs_netns(self)

    # -- what each rank runs ---------------------------------------------------------------------
    def program_argv(self) -> List[str]:
        """The user's program after the interpreter ([] for the harness's worker)."""
        return [] if self.program is None else self.program.argv(self._source)

    def program_cwd(self) -> str:
        return "" if self.program is None else self.program.workdir(self._source)

    def program_dict(self) -> Dict[str, Any]:
        if self.program is None:
            return {"worker": True}
        return {**self.program.model_dump(exclude_none=True), "argv": self.program_argv(),
                "cwd": self.program_cwd()}

    def row_sets(self) -> List[Any]:
        """Which rows a run of this case can have (harness.core.rows): the scenario's job's and
        those of the jobs and ranks its faults add."""
        from ..core.rows import RowSet

        sets = [self.launcher.rows(self)]
        extra = [lab for f in self.faults for lab in f.extra_labels(self)]
        # a process started again ("agent:node1#2", kill_rank's restart_after) is a row of its
        # own, not one more rank of a job
        again = [lab for lab in extra if "#" in lab]
        extra = [lab for lab in extra if "#" not in lab]
        jobs = sorted({lab.split(":", 1)[0] for lab in extra if lab.startswith("job")})
        for job in jobs:
            n = sum(1 for lab in extra if lab.startswith(job + ":"))
            sets.append(self.launcher.rows(self, job=job, world=n))
        for rows in sets:
            # a restarted agent's or parent's workers number on from the attempts of the one
            # it restarts (harness.launchers.Discovery), and the others restart theirs when
            # it joins: each restart can add as many attempts as the job had
            k = sum(1 for lab in again if lab.split("#", 1)[0] in rows.agents + rows.parents)
            rows.attempts = (rows.attempts + 1) * (k + 1) - 1
        others = [lab for lab in extra if not lab.startswith("job")] + again
        if others:
            sets.append(RowSet(world=0, extra=others))
        return sets

    @field_validator("env", mode="before", json_schema_input_type=Dict[
        str, Union[str, int, float]])
    @classmethod
    def _env_text(cls, v: Any) -> Any:
        if isinstance(v, dict) and len(v) > MAX_ENV_VARS:   # one error, not one per entry
            raise ValueError(f"{len(v)} variables: at most {MAX_ENV_VARS}")
        return env_as_text(v)

    @field_validator("expect", mode="before", json_schema_input_type=Union[Expect, List[Expect]])
    @classmethod
    def _one_block(cls, v: Any) -> Any:
        return [v] if isinstance(v, dict) else v

    @property
    def source(self) -> Optional[str]:
        """The scenario file this case was loaded from (None: built in code)."""
        return self._source

    @property
    def test_id(self) -> str:
        return self.name if self.case is None else f"{self.name}[{self.case}]"

    def expectation_for(self, torch_version: str, cuda: Optional[str] = None
                        ) -> Optional[Expect]:
        for block in self.expect:
            if block.applies_to(torch_version, cuda):
                return block
        return None

"""The scenario format: typed models for one scenario case (pure, no I/O).

A scenario file is YAML; ``harness.loader`` turns it into ``Scenario`` objects (one per case) and
reports every error as ``file:line: field.path: message``. Faults are validated by their own
plugin models (``harness.faults``); here they are carried as ``FaultSpec`` and resolved later.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Dict, List, Literal, Optional, Tuple, Union

import regex
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

OUTCOMES = ("ok", "error", "timeout", "hang", "crash")
Outcome = Literal["ok", "error", "timeout", "hang", "crash"]

STEP_RE = re.compile(r"^(barrier|all_reduce|broadcast|sleep \d+(\.\d+)?)$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _as_outcome_set(v: Any) -> Any:
    if isinstance(v, str):
        return [v]
    return v


class RankExpect(Strict):
    """What one rank must do. Every field is optional; a rank with no field is not checked."""

    outcome: Optional[List[Outcome]] = Field(
        None, description="allowed outcome(s): ok | error | timeout | hang | crash")
    exception: Optional[str] = Field(
        None, description="exception class name; matches any class in the raised exception's MRO "
        "(so RuntimeError accepts DistStoreError); 'module.Class' matches qualified names")
    message: Optional[str] = Field(
        None, description="regular expression searched (case-insensitive) in the exception message")
    within: Optional[Tuple[float, float]] = Field(
        None, description="[min, max] seconds from the start line to the rank's end")
    phase: Optional[str] = Field(
        None, description="phase the rank ended in: start, import, init, workload step N, destroy, "
        "exit")

    # json_schema_input_type: the exported JSON Schema must accept the shorthands too
    _outcome = field_validator("outcome", mode="before", json_schema_input_type=Optional[
        Union[Outcome, List[Outcome]]])(_as_outcome_set)

    @field_validator("message")
    @classmethod
    def _regex(cls, v: Optional[str]) -> Optional[str]:
        # the engine and flags harness.expect matches with (the `regex` library)
        if v is not None:
            from .expect import compile_message_pattern

            try:
                compile_message_pattern(v)
            except regex.error as e:
                raise ValueError(f"not a valid regular expression: {e}") from None
        return v

    def words(self) -> List[str]:
        """This expectation in short words: 'timeout', 'DistStoreError', '/pat/', 'in 3..30 s'."""
        out = ["|".join(self.outcome)] if self.outcome else []
        if self.exception:
            out.append(self.exception)
        if self.message:
            out.append(f"/{self.message}/")
        if self.within:
            out.append(f"in {self.within[0]:g}..{self.within[1]:g} s")
        if self.phase:
            out.append(f"phase {self.phase}")
        return out

    @field_validator("within")
    @classmethod
    def _window(cls, v: Optional[Tuple[float, float]]) -> Optional[Tuple[float, float]]:
        if v is not None and not (0 <= v[0] <= v[1]):
            raise ValueError("must be [min, max] with 0 <= min <= max")
        return v


class Expect(Strict):
    """Expectations for the job and its ranks, optionally scoped to a torch version range."""

    torch: Optional[str] = Field(
        None, description="torch version range this block holds for, e.g. '>=2.4' or '>=2.2,<2.5'")
    job: Optional[List[Outcome]] = Field(
        None, description="allowed job outcome(s); the job's outcome is the most severe of its "
        "ranks' (hang > crash > timeout > error > ok)")
    ranks: Dict[str, RankExpect] = Field(
        default_factory=dict,
        description="per rank (key: rank number, a label such as 'job2:0', or '*' for every rank "
        "not listed); a value may be an outcome or a list of outcomes as shorthand")

    _job = field_validator("job", mode="before", json_schema_input_type=Optional[
        Union[Outcome, List[Outcome]]])(_as_outcome_set)

    @field_validator("torch")
    @classmethod
    def _spec(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            try:
                SpecifierSet(v)
            except InvalidSpecifier:
                raise ValueError(f"not a version range: {v!r} (write e.g. '>=2.4,<2.6')") from None
        return v

    @field_validator("ranks", mode="before", json_schema_input_type=Dict[
        str, Union[RankExpect, Outcome, List[Outcome]]])
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        if isinstance(v, dict):
            out = {}
            for k, r in v.items():
                out[str(k)] = {"outcome": r} if isinstance(r, (str, list)) else r
            return out
        return v

    def summary(self) -> str:
        """One line: '[torch >=2.4] job timeout; 0: timeout DistStoreError; 1: ...'."""
        parts = [f"[torch {self.torch}]"] if self.torch else []
        if self.job:
            parts.append("job " + "|".join(self.job))
        parts += [f"{label}: {' '.join(e.words()) or 'any'}" for label, e in self.ranks.items()]
        return "; ".join(parts) or "(nothing checked)"

    def applies_to(self, torch_version: str) -> bool:
        if self.torch is None:
            return True
        return SpecifierSet(self.torch).contains(base_version(torch_version), prereleases=True)


def base_version(v: str) -> str:
    """'2.13.0+cpu' -> '2.13.0'; '2.6.0a0+git1234' -> '2.6.0a0'."""
    return v.split("+", 1)[0]


def _step(s: str) -> str:
    if not STEP_RE.match(s):
        raise ValueError(f"unknown step {s!r}: use barrier, all_reduce, broadcast or "
                         "'sleep SECONDS'")
    return s


def _workload_shorthand(v: Any) -> Any:
    if isinstance(v, str):
        return {"steps": [] if v == "init" else [v]}
    if isinstance(v, list):
        return {"steps": v}
    return v


def _marker(m: str) -> str:
    if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", m):
        raise ValueError(f"{m!r} is not a valid pytest marker name")
    return m


class Workload(Strict):
    steps: List[Annotated[str, AfterValidator(_step)]] = Field(
        default_factory=lambda: ["all_reduce"],
        description="after init: barrier | all_reduce (sum checked) | broadcast (value checked) | "
        "'sleep S'; [] means init only")
    destroy: bool = Field(True, description="call destroy_process_group at the end")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        return _workload_shorthand(v)


class FaultSpec(BaseModel):
    """A fault before its plugin validated it: a kind and the plugin's parameters."""

    model_config = ConfigDict(extra="allow")
    kind: str


class Host(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,16}$", description="host name (a namespace)")
    ranks: int = Field(1, ge=1, le=64, description="ranks on this host")


class Scenario(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="short id, used in test ids")
    about: str = Field(min_length=1, description="why this scenario exists, where it comes from, "
                       "and what was watched happening")
    backend: Literal["gloo", "nccl"] = "gloo"
    world_size: int = Field(2, ge=1, le=64)
    init: Literal["env", "tcp", "file"] = Field(
        "env", description="init method: env (env://, MASTER_ADDR/PORT), tcp (tcp://addr:port) or "
        "file (file:///shared/path)")
    timeout: float = Field(30.0, gt=0, description="torch's own timeout for init_process_group, s")
    deadline: float = Field(
        60.0, gt=0, description="the harness's wall-clock bound for the run from the start line, s;"
        " ranks alive then are 'hang'")
    master_addr: str = Field("127.0.0.1", description="MASTER_ADDR given to every rank (single "
                             "host); with hosts, the master host's address is used")
    hosts: Optional[List[Host]] = Field(
        None, description="several hosts, each a network namespace linked by a bridge; ranks are "
        "numbered from the master host (rank 0 hosts the store), then host by host in order")
    nodes: Optional[int] = Field(None, ge=1, le=16, description="shorthand for hosts: node0..")
    ranks_per_node: Optional[int] = Field(None, ge=1, le=64, description="with nodes")
    master_host: Optional[str] = Field(None, description="host of rank 0's store; default: the "
                                       "first host")
    isolate: Literal["auto", "always", "never"] = Field(
        "auto", description="run a single-host scenario in a private network namespace (private "
        "ports, a firewall on lo touches nothing else): auto = when the harness can")
    env: Dict[str, str] = Field(default_factory=dict, description="extra env for every rank")
    workload: Workload = Field(default_factory=lambda: Workload())
    faults: List[FaultSpec] = Field(default_factory=list)
    expect: List[Expect] = Field(
        default_factory=lambda: [Expect()],
        description="one block, or a list of torch-scoped blocks (the first whose 'torch' range "
        "holds is used)")
    marks: List[Annotated[str, AfterValidator(_marker)]] = Field(
        default_factory=list, description="pytest markers for -m")
    case: Optional[str] = Field(None, description="set by the loader: the case id")

    @field_validator("workload", mode="before", json_schema_input_type=Union[
        Workload, List[str], str])
    @classmethod
    def _workload(cls, v: Any) -> Any:
        return _workload_shorthand(v)

    @model_validator(mode="after")
    def _hosts(self) -> Scenario:
        if self.nodes is not None or self.ranks_per_node is not None:
            if self.hosts is not None:
                raise ValueError("give either hosts or nodes x ranks_per_node, not both")
            n, per = self.nodes or 1, self.ranks_per_node or 1
            self.hosts = [Host(name=f"node{i}", ranks=per) for i in range(n)]
        if self.hosts is not None:
            names = [h.name for h in self.hosts]
            if len(set(names)) != len(names):
                raise ValueError(f"host names must be unique: {names}")
            total = sum(h.ranks for h in self.hosts)
            if "world_size" in self.model_fields_set and self.world_size != total:
                raise ValueError(f"world_size {self.world_size} but the hosts hold {total} ranks")
            self.world_size = total
            if self.master_host is not None and self.master_host not in names:
                raise ValueError(f"master_host {self.master_host!r} is not one of {names}")
        elif self.master_host is not None:
            raise ValueError("master_host needs hosts (or nodes)")
        return self

    def host_names(self) -> List[str]:
        return [h.name for h in self.hosts] if self.hosts else ["local"]

    @field_validator("env", mode="before", json_schema_input_type=Dict[
        str, Union[str, int, float]])
    @classmethod
    def _env_str(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {k: (str(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x)
                    for k, x in v.items()}
        return v

    @field_validator("expect", mode="before", json_schema_input_type=Union[Expect, List[Expect]])
    @classmethod
    def _one_block(cls, v: Any) -> Any:
        return [v] if isinstance(v, dict) else v

    @property
    def test_id(self) -> str:
        return self.name if self.case is None else f"{self.name}[{self.case}]"

    def expectation_for(self, torch_version: str) -> Optional[Expect]:
        for block in self.expect:
            if block.applies_to(torch_version):
                return block
        return None

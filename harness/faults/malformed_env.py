"""malformed_env: garbage values (made by faker from a recorded seed) in torch's env variables.

Its evidence (harness.judge.edits, read back from what the processes said): the value each target
started with, from its own start record.
"""

from typing import Dict, List, Literal, Optional

from pydantic import Field, field_validator, model_validator

from ..core.limits import MAX_WORLD, EnvValue, env_as_text
from . import REGISTRY, Fault

ALLOWED = ("MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def garbage(var: str, seed: int) -> str:
    """A deterministic garbage value for ``var``: never a valid value for it."""
    from faker import Faker

    fake = Faker()
    fake.seed_instance(f"{seed}:{var}")
    makers = [
        lambda: fake.word(),
        lambda: fake.pystr(min_chars=1, max_chars=6),
        lambda: f"{fake.pyint(1, 99)}.{fake.pyint(0, 9)}",
        lambda: f"{fake.pyint(0, 99)}{fake.random_letter()}",
        lambda: "",
        lambda: fake.pyint(1, 99) and f" {fake.word()} ",
    ]
    if var == "MASTER_PORT":
        makers += [lambda: str(fake.pyint(65536, 999999)), lambda: str(-fake.pyint(1, 9999))]
    return str(fake.random_element(makers)())


class MalformedEnv(Fault):
    kind: Literal["malformed_env"] = "malformed_env"
    ON_ALLOCATION = None   # works on an allocation's nodes
    summary = "garbage values in MASTER_PORT, RANK, WORLD_SIZE... (faker, seeded)"
    ranks: Optional[List[int]] = Field(None, max_length=MAX_WORLD,
                                       description="default: every rank")
    vars: List[str] = Field(default_factory=lambda: ["MASTER_PORT"], min_length=1, max_length=16,
                            description=f"any of {', '.join(ALLOWED)}")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="faker seed; it is part of the test id")
    values: Optional[Dict[str, EnvValue]] = Field(
        None, max_length=16, description="explicit values instead of faker's; without 'vars', the "
        "variables are the keys of 'values' (numbers become text)")

    _values_text = field_validator("values", mode="before")(env_as_text)

    @model_validator(mode="after")
    def _vars_of_values(self):
        # values: {RANK: x} alone means RANK=x (not: MASTER_PORT garbage and RANK ignored)
        if self.values and "vars" not in self.model_fields_set:
            self.vars = [str(k) for k in self.values]
        return self

    def check(self, scn):
        problems = super().check(scn)
        for i, v in enumerate(self.vars):
            if v not in ALLOWED:
                why = (" (a garbage MASTER_ADDR could send a DNS query off the machine: use "
                       f"{REGISTRY.kind_for('another master address')} or "
                       f"{REGISTRY.kind_for('a name that does not resolve')})"
                       if v == "MASTER_ADDR" else "")
                problems.append((("vars", i), f"{v[:40]} is not one of {', '.join(ALLOWED)}{why}"))
        for k in self.values or {}:
            if k not in self.vars:
                problems.append((("values", k), f"{k[:40]} is not in vars "
                                                f"({', '.join(self.vars)}): its value would be "
                                                "ignored"))
        return problems

    def value_of(self, var: str) -> str:
        if self.values and var in self.values:
            return str(self.values[var])
        return garbage(var, self.seed)

    def apply(self, plan, scn):
        chosen = {v: self.value_of(v) for v in self.vars}
        for r in plan.main_ranks(self.ranks):
            r.env.update(chosen)
        shown = ", ".join(f"{k}={v!r}" for k, v in chosen.items())
        plan.notes.append(f"malformed_env: {shown} (faker seed {self.seed})")

    def id_suffix(self):
        made_by_faker = [v for v in self.vars if not (self.values and v in self.values)]
        return f"seed={self.seed}" if made_by_faker else None

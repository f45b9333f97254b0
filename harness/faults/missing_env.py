"""missing_env: variables torch's env:// init needs are not set for chosen ranks.

Its evidence (harness.judge.edits, read back from what the processes said): each target started with
the variables unset, from its own start record.
"""

from typing import List, Literal, Optional

from pydantic import Field

from ..core.limits import MAX_ENV_VARS, MAX_WORLD, EnvName
from . import Fault


class MissingEnv(Fault):
    kind: Literal["missing_env"] = "missing_env"
    ON_ALLOCATION = None   # works on an allocation's nodes
    summary = "variables such as WORLD_SIZE or MASTER_ADDR are unset"
    ranks: Optional[List[int]] = Field(None, max_length=MAX_WORLD,
                                       description="default: every rank")
    vars: List[EnvName] = Field(min_length=1, max_length=MAX_ENV_VARS,
                                description="variables to unset, e.g. [WORLD_SIZE]")

    def apply(self, plan, scn):
        for r in plan.main_ranks(self.ranks):
            for v in self.vars:
                r.env.pop(v, None)
                if v not in r.unset:
                    r.unset.append(v)
        who = "every rank" if self.ranks is None else f"ranks {self.ranks}"
        plan.notes.append(f"missing_env: {', '.join(self.vars)} unset for {who}")

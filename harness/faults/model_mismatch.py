"""model_mismatch: one rank builds a model of another shape (DDP's parameter-shape check).

Its evidence (harness.judge.edits, read back from what the processes said): the parameter count the
rank's ddp phase says, against the changed model's.
"""

from typing import Literal

from pydantic import Field

from . import Fault


class ModelMismatch(Fault):
    kind: Literal["model_mismatch"] = "model_mismatch"
    ON_ALLOCATION = None   # works on an allocation's nodes
    summary = "a rank's model has another shape than the others' (one layer more, or wider)"
    rank: int = Field(1, description="the rank whose model differs")
    change: Literal["extra_layer", "wider"] = Field(
        "extra_layer", description="extra_layer: one Linear layer more (another parameter "
        "count); wider: every layer 8 wider (the same count, other shapes)")

    def check(self, scn):
        problems = super().check(scn)
        if not any(s.startswith("ddp") for s in scn.workload.steps):
            problems.append((("kind",), "the workload has no 'ddp SIZE' entry: no model to "
                                        "change"))
        return problems

    def apply(self, plan, scn):
        for v in plan.variations([self.rank]):
            v.model_change = self.change
        plan.notes.append(f"model_mismatch: rank {self.rank}'s model: {self.change}")

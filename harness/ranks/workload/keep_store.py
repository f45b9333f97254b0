"""keep_store: the rank holds on to the default store past a destroy, as user code that kept
``_get_default_store()`` does."""

from __future__ import annotations

from . import Running, StepKind


class KeepStore(StepKind):
    NAME = "keep_store"
    GRAMMAR = r"keep_store"
    HELP = "keep_store"
    ABOUT = ("holds the default process group's store (as user code that kept it), so it "
             "outlives the next destroy")
    EXAMPLES = ("keep_store",)
    ORDER = 120

    def act(self, w: Running, entry: str) -> None:
        w.state.setdefault(self.NAME, []).append(w.dist.distributed_c10d._get_default_store())

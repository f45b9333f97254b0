"""The catalog's smoke tier (cases marked ``smoke``; ``pytest scenarios/ -m smoke``, ``harness
run --smoke``): every fault kind, launcher, init method, service and workload step at least
once, so that a developer's loop and a CI gate touch every part. Pure: read from the loader
and the registries, nothing runs here (the tier itself is measured in docs/reference/running.md)."""

from __future__ import annotations

import re
from typing import Dict, List, Set

from harness.faults import REGISTRY
from harness.launchers import launcher_kinds
from harness.ranks.workload import STEP_KINDS, WORKLOAD_RE
from harness.scenario.catalog import builtin_dir
from harness.scenario.loader import item_name, load_file


def _parts(scn) -> Set[str]:
    out = {f"fault {f.kind}" for f in scn.faults}
    out.add(f"launcher {scn.launcher.kind if scn.launcher is not None else 'direct'}")
    out.add(f"init {scn.init}")
    out |= {f"step {s.split()[0]}" for s in (scn.workload.steps if scn.workload else [])}
    if scn.dns is not None:
        out.add("service dns")
    if scn.etcd is not None:
        out.add("service etcd")
    if scn.program is not None:
        out.add("a user's program")
    return out


def _catalog() -> Dict[str, List]:
    d = builtin_dir()
    assert d is not None
    return {p.name: load_file(p) for p in sorted(d.glob("*.yaml"))}


def test_step_kinds_are_the_words_the_workload_grammar_admits():
    first = set(re.findall(r"(?:\^\(|\|)([a-z_]+)", WORKLOAD_RE.pattern))
    assert first == set(STEP_KINDS)


def test_the_smoke_tier_covers_every_part():
    everything = ({f"fault {k}" for k in REGISTRY.kinds()}
                  | {f"launcher {k}" for k in launcher_kinds()}
                  | {"init env", "init tcp", "init file", "service dns", "service etcd",
                     "a user's program"}
                  | {f"step {k}" for k in STEP_KINDS})
    smoke = [(f, s) for f, cases in _catalog().items() for s in cases if "smoke" in s.marks]
    covered = set().union(*(_parts(s) for _, s in smoke)) if smoke else set()
    missing = sorted(everything - covered)
    assert not missing, (
        f"not in the smoke tier: {missing}. Add smoke to the marks: of a short catalog case "
        "that has it (scenarios/durations.json has each case's time); a new kind needs one")


def test_smoke_cases_are_deterministic_and_run_once():
    """A race case repeats 10 times: too long for the tier, which checks that each part
    still runs, not a frequency."""
    raced = [f"{f}::{item_name(s)}" for f, cases in _catalog().items() for s in cases
             if "smoke" in s.marks and (s.race is not None or s.repeat > 1)]
    assert not raced

"""Templates for ``harness new``: a commented scenario for reproducing a reported hang.

The fault examples and the list of other fields are generated from the fault registry and the
scenario schema, so the template names every fault kind this installation knows.
"""

from __future__ import annotations

import json
from importlib import resources
from string import Template
from typing import Any, List

TEMPLATED = {"name", "about", "backend", "world_size", "init", "timeout", "deadline",
             "master_addr", "env", "workload", "faults", "expect", "marks", "case"}


def _value(field: Any) -> str:
    if field.is_required():
        return "TODO"
    value = field.get_default(call_default_factory=True)
    if hasattr(value, "model_dump"):   # a typed default (the launcher): as YAML writes it
        value = value.model_dump(mode="json", exclude_defaults=True) or value.kind
    return json.dumps(value)


def fault_examples() -> str:
    from ...faults import REGISTRY

    lines: List[str] = []
    for kind, cls in REGISTRY.items():
        fields = [(n, f) for n, f in cls.model_fields.items() if n != "kind"]
        params = [f"{n}: {_value(f)}" for n, f in fields
                  if f.is_required() or f.get_default(call_default_factory=True) is not None]
        optional = [n for n, f in fields
                    if not f.is_required() and f.get_default(call_default_factory=True) is None]
        summary = (cls.summary or "").strip()
        lines.append(f"#   # {kind}: {summary}" if summary else f"#   # {kind}")
        lines.append("#   - {" + ", ".join([f"kind: {kind}"] + params) + "}"
                     + (f"  # also: {', '.join(optional)}" if optional else ""))
    return "\n".join(lines)


def other_fields() -> str:
    from ..schema import Scenario

    rest = [(n, f) for n, f in Scenario.model_fields.items() if n not in TEMPLATED]
    if not rest:
        return ""
    lines = ["", "# Other fields (see `harness schema`):"]
    for n, f in rest:
        lines.append(f"#   {n}: {_value(f)}  # {(f.description or '').strip()}")
    lines.append("# cases: {CASE_ID: {field: value, ...}, ...}  # several variants of this file, "
                 "each its own test")
    return "\n".join(lines)


def new_scenario(name: str) -> str:
    text = resources.files(__name__).joinpath("repro.yaml").read_text(encoding="utf-8")
    return Template(text).substitute(name=name, fault_examples=fault_examples(),
                                     other_fields=other_fields()) + "\n"

"""A space file: an ordinary scenario file with an ``explore:`` block (the world, scenario
``fields:`` drawn, fault specs, ``max_faults``, invariants) loaded into a ``Space``, every
problem located as the loader locates them and every top-level choice checked once; ``any``
drawn from the field's own pydantic model (``model_any``)."""

from __future__ import annotations

import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import yaml
from pydantic import ValidationError

from ...core.outcomes import ALL_OUTCOMES
from ...faults import REGISTRY
from ...scenario.loader import (
    Lines,
    Problem,
    ScenarioFileError,
    _capped,
    _check_events,
    _field,
    _walk,
    _yaml_error,
    read_limited,
    validate_case,
)
from .invariants import INVARIANT_PARAMS, INVARIANTS, Invariant

ANY_RANK = "any_rank"
ANY = "any"
MAX_WORLD_EXPLORED = 8
# scenario fields a space may not draw (the explorer sets them, or they are the file's own)
NOT_DRAWN = ("name", "about", "faults", "expect", "case", "cases", "repeat", "race", "marks",
             "world_size")


@dataclass
class Space:
    file: str
    base: Dict[str, Any]
    world: Any                      # int | ("range", lo, hi) | ("one_of", [...])
    faults: List[Dict[str, Any]]
    max_faults: int
    invariants: List[Invariant]
    fields: Dict[str, Any] = field(default_factory=dict)   # scenario fields drawn

    @property
    def name(self) -> str:
        return str(self.base.get("name", "explore"))


def _range_problem(spec: Dict[str, Any]) -> Optional[str]:
    lo, hi, step = spec.get("min"), spec.get("max"), spec.get("step")
    extra = set(spec) - {"min", "max", "step"}
    if extra:
        return f"a range takes min, max and step, not {', '.join(sorted(map(str, extra)))}"
    for n, x in (("min", lo), ("max", hi)) + ((("step", step),) if step is not None else ()):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            return f"a range's {n} is a number"
    assert isinstance(lo, (int, float)) and isinstance(hi, (int, float))
    if lo > hi:
        return f"min {lo} is above max {hi}"
    if step is not None and step <= 0:
        return "step must be above 0"
    return None


def _value_problems(v: Any, path: Tuple[Any, ...], out: List[Tuple[Tuple[Any, ...], str]]) -> None:
    if isinstance(v, dict):
        if "one_of" in v:
            if len(v) != 1 or not isinstance(v["one_of"], list) or not v["one_of"]:
                out.append((path, "one_of takes a non-empty list of values, alone"))
                return
            for i, x in enumerate(v["one_of"]):
                _value_problems(x, path + ("one_of", i), out)
        elif "min" in v or "max" in v:
            why = _range_problem(v)
            if why:
                out.append((path, why))
        else:
            for k, x in v.items():
                _value_problems(x, path + (k,), out)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _value_problems(x, path + (i,), out)
    elif v == ANY:
        out.append((path, "'any' draws a field from its model: give it as a field's whole "
                          "value (here it is inside a list, a mapping or a one_of)"))


def _choices(spec: Dict[str, Any]) -> List[Tuple[str, int, Any]]:
    """(field, index, value) of every choice a field's top-level one_of offers (the first is
    the lowest draw, checked with it)."""
    return [(k, i, x) for k, v in spec.items() if isinstance(v, dict) and "one_of" in v
            for i, x in enumerate(v["one_of"]) if i > 0]


def _lowest(v: Any) -> Any:
    """The simplest value a parameter spec gives (for checking a fault spec once)."""
    if isinstance(v, dict):
        if "one_of" in v:
            return _lowest(v["one_of"][0])
        if "min" in v:
            return v["min"]
        return {k: _lowest(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_lowest(x) for x in v]
    return 0 if v == ANY_RANK else v


# -- 'any': a field drawn from its own pydantic model -----------------------------------------

MAX_ANY_INTS = 64          # an int field's bounds drawn whole, at most this many values
MAX_ANY_SPAN = 60.0        # a float field's bounds drawn in 20 steps, at most this wide


def _bounds(meta: Sequence[Any]) -> Tuple[Optional[float], Optional[float]]:
    lo: Optional[float] = None
    hi: Optional[float] = None
    for m in meta:
        inner = getattr(m, "metadata", None)
        if isinstance(inner, list):   # a FieldInfo inside Annotated
            a, b = _bounds(inner)
            lo, hi = (a if a is not None else lo), (b if b is not None else hi)
        for attr, is_lo in (("ge", True), ("gt", True), ("le", False), ("lt", False)):
            x = getattr(m, attr, None)
            if isinstance(x, (int, float)) and not isinstance(x, bool):
                if is_lo:
                    lo = x
                else:
                    hi = x
    return lo, hi


def _type_name(ann: Any) -> str:
    return getattr(ann, "__name__", None) or str(ann).replace("typing.", "")


def model_any(ann: Any, meta: Sequence[Any], name: str) -> Tuple[Any, Optional[str]]:
    """(a parameter spec for 'any' of a field of this type, or why it cannot be drawn)."""
    if name == "rank":
        return ANY_RANK, None
    if name == "ranks":
        return [ANY_RANK], None
    origin = typing.get_origin(ann)
    if origin is typing.Annotated:
        base, *extra = typing.get_args(ann)
        return model_any(base, list(meta) + list(extra), name)
    if origin is typing.Union:
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(ann)) == 2:
            spec, why = model_any(args[0], meta, name)
            # null first: the field's own default, the simplest draw
            return ({"one_of": [None] + (spec["one_of"] if isinstance(spec, dict)
                                         and "one_of" in spec else [spec])}, why)
        return None, f"a union ({_type_name(ann)}) cannot be drawn from the model"
    if origin is typing.Literal:
        return {"one_of": list(typing.get_args(ann))}, None
    if ann is bool:
        return {"one_of": [False, True]}, None
    if ann in (int, float):
        lo, hi = _bounds(meta)
        if lo is None or hi is None:
            return None, (f"{_type_name(ann)} without both bounds in the model: give a value, "
                          "{one_of: [...]} or {min, max}")
        if ann is int and hi - lo < MAX_ANY_INTS:
            return {"min": int(lo), "max": int(hi)}, None
        if ann is float and hi - lo <= MAX_ANY_SPAN:
            return {"min": lo, "max": hi, "step": round((hi - lo) / 20, 6) or 1}, None
        return None, (f"the model's range {lo:g}..{hi:g} is too wide to draw from: give a "
                      "value, {one_of: [...]} or {min, max, step}")
    return None, (f"{_type_name(ann)} cannot be drawn from the model: give a value, "
                  "{one_of: [...]} or a range")


def _resolve_any(model: Any, spec: Dict[str, Any], at: Tuple[Any, ...], owner: str,
                 bad: Callable[[Tuple[Any, ...], str], None]) -> Dict[str, Any]:
    """The spec with every 'any' value replaced by what the model's field allows."""
    out = dict(spec)
    for k, v in spec.items():
        if v != ANY or k == "kind":
            continue
        if k == "launcher" and owner == "the scenario":   # its kinds, not its typed model
            from ...launchers import launcher_kinds
            out[k] = {"one_of": list(launcher_kinds())}
            continue
        info = model.model_fields.get(k)
        if info is None:
            bad(at + (k,), f"unknown field of {owner}")
            continue
        drawn, why = model_any(info.annotation, info.metadata, k)
        if why:
            bad(at + (k,), f"any: {why} ({owner}'s {k})")
        else:
            out[k] = drawn
    return out


def _parse(text: str, file: str) -> Tuple[Dict[str, Any], Dict[Tuple[str, ...], int]]:
    try:
        _check_events(text, file, fast=False)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise _yaml_error(text, file, e) from None
    if node is None or not isinstance(data, dict):
        raise ScenarioFileError([Problem(file, 1, "", "a space file is one YAML mapping: "
                                         "a scenario's fields and an explore: block")])
    lines, problems = _walk(file, node)
    if problems:
        raise ScenarioFileError(_capped(file, problems))
    return data, lines


def hosts_world(d: Dict[str, Any]) -> Optional[int]:
    """The world a scenario's hosts (or nodes x ranks_per_node) hold; None without them."""
    if d.get("nodes") is not None or d.get("ranks_per_node") is not None:
        n, per = d.get("nodes") or 1, d.get("ranks_per_node") or 1
        return int(n) * int(per) if isinstance(n, int) and isinstance(per, int) else None
    hosts = d.get("hosts")
    if isinstance(hosts, list):
        return sum(int(h.get("ranks", 1)) if isinstance(h, dict)
                   and isinstance(h.get("ranks", 1), int) else 1 for h in hosts)
    return None


def _absolute_program(base: Dict[str, Any], file: str) -> None:
    """A program's script and cwd relative to the space file, made absolute: the draws run
    from a folder of their own."""
    here = Path(file).resolve().parent if os.path.isfile(file) else None
    prog = base.get("program")
    if here is None or prog in (None, "worker"):
        return
    if isinstance(prog, str):
        base["program"] = str(here / prog)
    elif isinstance(prog, dict):
        prog = dict(prog)
        if isinstance(prog.get("script"), str):
            prog["script"] = str(here / prog["script"])
        if isinstance(prog.get("cwd"), str):
            prog["cwd"] = str(here / prog["cwd"])
        elif prog.get("script") or prog.get("module"):
            prog["cwd"] = str(here)     # where the file's relative paths pointed
        base["program"] = prog


def load_space_text(text: str, file: str = "<string>") -> Space:
    data, lines = _parse(text, file)
    L = Lines(lines)
    problems: List[Problem] = []

    def bad(path: Tuple[Any, ...], msg: str) -> None:
        problems.append(Problem(file, L.line_of(path), _field(path), msg))

    ex = data.pop("explore", None)
    if not isinstance(ex, dict):
        bad(("explore",), "required: the space to draw from (world_size, fields, faults, "
                          "max_faults, invariants)" if ex is None else "a mapping (world_size, "
                          "fields, faults, max_faults, invariants)")
        raise ScenarioFileError(problems)
    if "cases" in data:
        bad(("cases",), "a space file has no cases: the explorer draws them")
    if data.get("faults"):
        bad(("faults",), "a space file's faults are drawn: declare them under explore.faults")
    known = {"world_size", "fields", "faults", "max_faults", "invariants"}
    for k in ex:
        if k not in known:
            bad(("explore", k), f"unknown field (known: {', '.join(sorted(known))})")
    fields = _drawn_fields(ex, bad)
    world, sizes = _world(data, ex, bad)
    resolved = _fault_specs(ex, bad, problems)
    faults = ex.get("faults", [])
    mf = ex.get("max_faults", min(2, len(faults) if isinstance(faults, list) else 0))
    if isinstance(mf, bool) or not isinstance(mf, int) or mf < 0:
        bad(("explore", "max_faults"), f"a whole number from 0 (got {mf!r})")
        mf = 0
    invs = _invariants(ex, bad)
    if problems:
        raise ScenarioFileError(_capped(file, problems))
    _check_base(data, fields, sizes, file, L)
    _absolute_program(data, file)
    return Space(file, data, world, resolved, mf, invs, fields)


Bad = Callable[[Tuple[Any, ...], str], None]   # records a located problem of the space file


def _drawn_fields(ex: Dict[str, Any], bad: Bad) -> Dict[str, Any]:
    """explore.fields: the scenario fields drawn, with every 'any' resolved by the scenario's
    model."""
    from ...scenario.schema import Scenario

    fields = ex.get("fields") or {}
    if not isinstance(fields, dict):
        bad(("explore", "fields"), "a mapping of scenario fields to values, one_of or ranges")
        fields = {}
    for k in list(fields):
        at: Tuple[Any, ...] = ("explore", "fields", k)
        if not isinstance(k, str) or k not in Scenario.model_fields or k in NOT_DRAWN:
            why = ("the explorer sets it (world_size: under explore:)" if k in NOT_DRAWN
                   else "not a scenario field")
            bad(at, f"{why}; a drawn field is one of: "
                    f"{', '.join(sorted(set(Scenario.model_fields) - set(NOT_DRAWN)))}")
            del fields[k]
            continue
        vp: List[Tuple[Tuple[Any, ...], str]] = []
        if fields[k] != ANY:
            _value_problems(fields[k], at, vp)
        for p, m in vp:
            bad(p, m)
    return _resolve_any(Scenario, fields, ("explore", "fields"), "the scenario", bad)


def _world(data: Dict[str, Any], ex: Dict[str, Any], bad: Bad) -> Tuple[Any, List[Any]]:
    """(the world as Space keeps it, the world sizes to check): explore.world_size, or the
    hosts' ranks where the scenario has hosts."""
    static_hosts = hosts_world(data)
    ws = ex.get("world_size", data.get("world_size", 2))
    if static_hosts is not None:
        if "world_size" in ex:
            bad(("explore", "world_size"), f"the hosts hold the world ({static_hosts} ranks): "
                                           "draw hosts or nodes under explore.fields instead")
        ws = static_hosts
    world: Any = ws
    if isinstance(ws, dict):
        vp: List[Tuple[Tuple[Any, ...], str]] = []
        _value_problems(ws, ("explore", "world_size"), vp)
        choices = ws.get("one_of") if "one_of" in ws else None
        if not vp and choices is None and (isinstance(ws.get("min"), float)
                                           or "step" in ws):
            vp.append((("explore", "world_size"), "whole numbers, no step"))
        for p, m in vp:
            bad(p, m)
        sizes = choices if choices is not None else [ws.get("min"), ws.get("max")]
        world = ("one_of", choices) if choices is not None else ("range", ws.get("min"),
                                                                   ws.get("max"))
    else:
        sizes = [ws]
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= MAX_WORLD_EXPLORED:
            bad(("explore", "world_size"), f"a world size is a whole number from 1 to "
                                           f"{MAX_WORLD_EXPLORED} (got {s!r})")
            break
    return world, sizes


def _fault_specs(ex: Dict[str, Any], bad: Bad, problems: List[Problem]) -> List[Dict[str, Any]]:
    """explore.faults: each spec with its 'any' values resolved by its fault's model, checked
    once at its lowest draw and once per choice of a top-level one_of."""
    faults = ex.get("faults", [])
    if not isinstance(faults, list):
        bad(("explore", "faults"), "a list of fault specs (kind: and its parameters)")
        faults = []
    resolved: List[Dict[str, Any]] = []
    for i, spec in enumerate(faults):
        at: Tuple[Any, ...] = ("explore", "faults", i)
        if not isinstance(spec, dict) or not isinstance(spec.get("kind"), str):
            bad(at, "a fault spec is a mapping with kind: and its parameters")
            continue
        cls = REGISTRY.get(spec["kind"])
        if cls is None:
            bad(at + ("kind",), f"unknown fault kind {spec['kind'][:60]!r} (known: "
                                f"{', '.join(REGISTRY.kinds())})")
            continue
        vp: List[Tuple[Tuple[Any, ...], str]] = []
        for k, v in spec.items():
            if k != "kind" and v != ANY:
                _value_problems(v, at + (k,), vp)
        for p, m in vp:
            bad(p, m)
        if vp:
            continue
        before = len(problems)
        spec = _resolve_any(cls, spec, at, spec["kind"], bad)
        if len(problems) > before:
            continue
        resolved.append(spec)
        _check_fault_spec(cls, spec, at, bad)
    return resolved


def _check_fault_spec(cls: Any, spec: Dict[str, Any], at: Tuple[Any, ...], bad: Bad) -> None:
    try:
        cls.model_validate(_lowest(spec))
    except ValidationError as e:
        for err in e.errors(include_url=False):
            loc = at + tuple(x for x in err["loc"] if isinstance(x, (str, int)))[:1]
            msg = "unknown field" if err["type"] == "extra_forbidden" else str(err["msg"])
            bad(loc, f"{msg} (of {spec['kind']}, its lowest draw)")
        return
    for k, i, choice in _choices(spec):   # each value a one_of offers, the rest lowest
        try:
            cls.model_validate(dict(_lowest(spec), **{k: _lowest(choice)}))
        except ValidationError as e:
            err = e.errors(include_url=False)[0]
            bad(at + (k, "one_of", i), f"{err['msg']} (of {spec['kind']}, this choice with "
                                       "the others' lowest)")


def _invariants(ex: Dict[str, Any], bad: Bad) -> List[Invariant]:
    """explore.invariants: each a known name, alone or with its parameters."""
    invs: List[Invariant] = []
    raw_invs = ex.get("invariants")
    if not isinstance(raw_invs, list) or not raw_invs:
        bad(("explore", "invariants"), "required: a list of invariants every draw must hold "
                                       f"(known: {', '.join(INVARIANTS)})")
        raw_invs = []
    for i, inv in enumerate(raw_invs):
        at = ("explore", "invariants", i)
        params: Any = {}
        if isinstance(inv, dict) and len(inv) == 1:
            name, params = next(iter(inv.items()))
            params = params or {}
        else:
            name = inv
        if not isinstance(name, str) or name not in INVARIANTS:
            bad(at, f"unknown invariant {name!r} (known: {', '.join(INVARIANTS)})")
            continue
        if not isinstance(params, dict):
            bad(at + (name,), "an invariant's parameters are a mapping")
            continue
        takes = INVARIANT_PARAMS.get(name, {})
        extra = set(params) - set(takes)
        if extra:
            bad(at + (name,), f"{name} takes {', '.join(takes) or 'no parameters'}, not "
                              f"{', '.join(sorted(map(str, extra)))}")
            continue
        wrong = [k for k, x in params.items() if isinstance(x, bool) or not isinstance(
            x, (int, float)) or not math.isfinite(x) or x < 0 or (x == 0 and k != "slack")]
        if wrong:
            bad(at + (name, wrong[0]), f"seconds above 0 (got {params[wrong[0]]!r})"
                if wrong[0] in ("within", "slack") else f"a number above 0 (got "
                                                        f"{params[wrong[0]]!r})")
            continue
        within = params.get("within")
        invs.append(Invariant(name, float(within) if within is not None else None,
                              factor=float(params.get("factor", 2.0)),
                              slack=float(params.get("slack", 5.0))))
    return invs


def _check_base(data: Dict[str, Any], fields: Dict[str, Any], sizes: List[Any], file: str,
                L: Lines) -> None:
    """The base with the simplest draw of its fields must be a valid scenario (its located
    problems, as `validate` says them), and so must each field's choices, the others lowest."""
    problems: List[Problem] = []
    base = dict(data)
    base.update({k: _lowest(v) for k, v in fields.items()})
    base.setdefault("expect", {"job": list(ALL_OUTCOMES)})
    if hosts_world(base) is None:
        base["world_size"] = sizes[0]
    else:
        base.pop("world_size", None)
    validate_case(dict(base), file, L)
    for k, i, choice in _choices(fields):      # each field's choices, the others lowest
        try:
            validate_case(dict(base, **{k: _lowest(choice)}), file, Lines({}))
        except ScenarioFileError as e:
            first = e.problems[0]
            problems.append(Problem(file, L.line_of(("explore", "fields", k, "one_of", i)),
                                    _field(("explore", "fields", k, "one_of", i)),
                                    f"{first.field + ': ' if first.field else ''}"
                                    f"{first.message} (this choice, the other fields at their "
                                    "lowest)"))
    if problems:
        raise ScenarioFileError(_capped(file, problems))


def load_space(path: str) -> Space:
    raw = read_limited(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ScenarioFileError([Problem(path, None, "", f"not UTF-8 text ({e.reason})")]) \
            from None
    return load_space_text(text, path)

"""Exploring a fault space: draw scenarios from a declared space, run each for real, check
invariants, shrink a draw that breaks one to the smallest scenario that still breaks it.

A space file is an ordinary scenario file (its fields are the base of every draw; ``expect:``
is optional) with an ``explore:`` block::

    explore:
      world_size: {min: 2, max: 3}          # an int, {min, max} or {one_of: [...]}
      fields:                               # scenario fields drawn too (any launcher, hosts,
        timeout: {one_of: [2, 5, 10]}       # timeout, workload, start...)
        launcher: {one_of: [direct, {kind: torchrun, max_restarts: {min: 0, max: 2}}]}
      max_faults: 2                         # a draw takes 0..max_faults of the faults below
      faults:                               # each at most once per draw; any registered kind
        - kind: busy_port
          mode: any                         # drawn from the fault's own model (its Literal)
        - kind: delayed_rank
          ranks: [any_rank]                 # any_rank: a rank of the drawn world
          delay: {min: 0, max: 8, step: 0.5}
      invariants:
        - no_hang: {within: 20}
        - ok_without_faults

A parameter value is a fixed value (lists and mappings are walked: their values may be drawn
too), ``{one_of: [...]}``, ``{min, max[, step]}`` (integers when both are integers and no step
is given, else min + k*step), the word ``any_rank``, or the word ``any``: drawn from the
field's own pydantic model (a fault's, or the scenario's for ``fields:``): a Literal's values,
a bool, an Optional's null (the default) or value, a narrow bounded number, ``rank``/``ranks``
as any_rank; a field whose type cannot be drawn that way is a located problem. With ``hosts:``
or ``nodes:`` (fixed or drawn), the world is the hosts' ranks.

Drawing and shrinking are Hypothesis's (``hypothesis.given`` driven here, seeded with
``hypothesis.seed``; no example database): the same seed gives the same draws. The draws run
in parallel: Hypothesis first proposes ``--runs`` draws with nothing run (a draw is judged only
on whether it loads and can run here, as the real exploration judges it), every one of them
runs for real, ``--jobs`` at a time, as one pytest session on pytest-xdist's workers (the
harness's own worker pool: ``harness run -n``), and their results fill a cache keyed by the
scenario's canonical form. Hypothesis then explores again with the same seed: until the first
broken invariant its draws are the same ones, answered from the cache; the first that breaks
one is shrunk (each shrink step is a real run, one at a time: a step depends on the last),
confirmed uncached and written out as an ordinary scenario file. A draw the cache does not
hold (a run that was a harness error made Hypothesis go another way) is run then, alone.
"""

from __future__ import annotations

import json
import math
import os
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import yaml
from pydantic import ValidationError

from ..core.outcomes import ALL_OUTCOMES
from ..core.protocol import parse_label
from ..faults import REGISTRY
from ..scenario.loader import (
    Lines,
    Problem,
    ScenarioFileError,
    _capped,
    _check_events,
    _field,
    _walk,
    _yaml_error,
    load_text,
    read_limited,
    validate_case,
)

ANY_RANK = "any_rank"
ANY = "any"
MAX_WORLD_EXPLORED = 8
MAX_JOBS = 32
INVARIANTS: Dict[str, str] = {
    "no_hang": "no rank ends in hang; with within: S, every rank that is not ok ends within S s "
               "of its own start",
    "within_timeout": "every rank or worker that is not ok ends within factor x the draw's "
                      "timeout + slack s of its own start (factor: 2, slack: 5 unless given); "
                      "a hang breaks it",
    "ok_without_faults": "a draw without faults ends ok on every rank",
    "agents_agree_with_workers": "a torchrun agent (or a spawning parent) and its workers agree: "
                                 "it does not end ok while a worker of its last attempt failed, "
                                 "nor fail or hang while every worker of its last attempt "
                                 "ended ok (a row a fault of the draw targets itself is left "
                                 "out)",
    "restarts_recover": "under torchrun or launch with max_restarts R >= 1, a draw whose faults "
                        "are all kill_rank on workers, hitting at most R attempts, ends ok: "
                        "every agent ok, every worker of the last attempt ok",
    "no_error": "no rank ends in error (a deliberately strict invariant, for trying the "
                "explorer: any fault that raises breaks it)",
}
INVARIANT_PARAMS: Dict[str, Dict[str, float]] = {   # parameter -> default (None: optional)
    "no_hang": {"within": math.nan},
    "within_timeout": {"factor": 2.0, "slack": 5.0},
}
# scenario fields a space may not draw (the explorer sets them, or they are the file's own)
NOT_DRAWN = ("name", "about", "faults", "expect", "case", "cases", "repeat", "race", "marks",
             "world_size")
SUPERVISORS = ("agent", "parent")     # rows that start and watch workers (docs/launchers.md)


# -- the space -------------------------------------------------------------------------------

@dataclass
class Invariant:
    name: str
    within: Optional[float] = None
    factor: float = 2.0
    slack: float = 5.0

    def label(self) -> str:
        if self.name == "within_timeout":
            return f"within_timeout({self.factor:g} x timeout + {self.slack:g} s)"
        return self.name + (f"(within {self.within:g} s)" if self.within is not None else "")

    def broken(self, draw: Dict[str, Any], verdicts: List[Dict[str, Any]]) -> Optional[str]:
        """Why this run breaks the invariant, or None."""
        check = getattr(self, "_" + self.name)
        why: Optional[str] = check(draw, verdicts)
        return why

    def _no_hang(self, draw: Dict[str, Any], verdicts: List[Dict[str, Any]]) -> Optional[str]:
        for v in verdicts:
            if v["outcome"] == "hang":
                return f"rank {v['label']} ended in hang ({v['phase']})"
            d = _from_own_start(v)
            if self.within is not None and v["outcome"] not in ("ok", "absent") \
                    and d is not None and d > self.within:
                return (f"rank {v['label']} ended in {v['outcome']} {d:.1f} s after its "
                        f"start, later than {self.within:g} s")
        return None

    def _within_timeout(self, draw: Dict[str, Any], verdicts: List[Dict[str, Any]]
                        ) -> Optional[str]:
        timeout = float(draw.get("timeout", 30.0))
        limit = self.factor * timeout + self.slack
        for v in verdicts:
            if v.get("role", "rank") not in ("rank", "worker") or v["outcome"] in ("ok",
                                                                                   "absent"):
                continue
            if v["outcome"] == "hang":
                return f"rank {v['label']} ended in hang ({v['phase']}), timeout {timeout:g} s"
            d = _from_own_start(v)
            if d is not None and d > limit:
                return (f"rank {v['label']} ended in {v['outcome']} {d:.1f} s after its start "
                        f"({v.get('exception') or v['phase']}): {d / timeout:.1f} x the "
                        f"timeout {timeout:g} s, over {self.factor:g} x {timeout:g} + "
                        f"{self.slack:g} = {limit:g} s")
        return None

    def _ok_without_faults(self, draw: Dict[str, Any], verdicts: List[Dict[str, Any]]
                           ) -> Optional[str]:
        if draw.get("faults"):
            return None
        bad = [v for v in verdicts if v["outcome"] != "ok"]
        return (f"no fault, yet rank {bad[0]['label']} ended in {bad[0]['outcome']}"
                if bad else None)

    def _no_error(self, draw: Dict[str, Any], verdicts: List[Dict[str, Any]]) -> Optional[str]:
        bad = [v for v in verdicts if v["outcome"] == "error"]
        return (f"rank {bad[0]['label']} ended in error ({bad[0].get('exception')})"
                if bad else None)

    def _agents_agree_with_workers(self, draw: Dict[str, Any], verdicts: List[Dict[str, Any]]
                                   ) -> Optional[str]:
        targeted = _fault_targets(draw)
        for sup in verdicts:
            if sup.get("role") not in SUPERVISORS or sup["outcome"] == "absent" \
                    or sup["label"] in targeted:
                continue
            workers = last_attempt([w for w in verdicts if w.get("node") == sup["label"]
                                    and w["outcome"] != "absent"])
            if not workers:
                continue
            failed = [w for w in workers if w["outcome"] != "ok"]
            if sup["outcome"] == "ok" and failed:
                return (f"{sup['label']} ended ok while its worker" + "s" * (len(failed) > 1)
                        + " " + ", ".join(f"{w['label']} ended in {w['outcome']} "
                                          f"({w.get('exception') or w['phase']})"
                                          for w in failed))
            if sup["outcome"] != "ok" and not failed:
                how = f"{sup['outcome']} ({sup.get('exception') or sup['phase']})"
                return (f"{sup['label']} ended in {how} while every worker of its last "
                        f"attempt ended ok ({', '.join(w['label'] for w in workers)})")
        return None

    def _restarts_recover(self, draw: Dict[str, Any], verdicts: List[Dict[str, Any]]
                          ) -> Optional[str]:
        launcher = draw.get("launcher")
        if not isinstance(launcher, dict) or launcher.get("kind") not in ("torchrun", "launch"):
            return None
        restarts = int(launcher.get("max_restarts") or 0)
        faults = draw.get("faults") or []
        if restarts < 1 or not faults:
            return None
        attempts = set()
        for f in faults:
            p = parse_label(str(f.get("rank", 1))) if f.get("kind") == "kill_rank" else None
            if p is None or p.kind != "rank":
                return None       # another fault, or a kill of an agent: not a restart's job
            attempts.add(p.attempt)
        if len(attempts) > restarts:
            return None
        hit = (f"the kills hit {len(attempts)} attempt{'s' * (len(attempts) != 1)}, "
               f"max_restarts {restarts}")
        for v in verdicts:
            if v.get("role") == "agent" and v["outcome"] != "ok":
                return (f"{v['label']} ended in {v['outcome']} "
                        f"({v.get('exception') or v['phase']}): {hit}")
        for v in last_attempt([v for v in verdicts if v.get("role") == "worker"]):
            if v["outcome"] != "ok":
                return f"worker {v['label']} of the last attempt ended in {v['outcome']}: {hit}"
        return None


def _from_own_start(v: Dict[str, Any]) -> Optional[float]:
    d = v.get("duration")
    if d is None:
        return None
    return float(d) - float(v.get("released") or 0.0)   # a late rank's delay does not count


def _fault_targets(draw: Dict[str, Any]) -> set:
    """The row labels a draw's faults name (rank:, ranks:), as strings."""
    out = set()
    for f in draw.get("faults") or []:
        for k in ("rank", "ranks"):
            v = f.get(k)
            for x in (v if isinstance(v, list) else [v] if v is not None else []):
                out.add(str(x))
    return out


def last_attempt(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The rows no later restart attempt of the same rank (same job) replaced."""
    latest: Dict[Tuple[str, Optional[int]], int] = {}
    parsed = []
    for r in rows:
        p = parse_label(r["label"])
        parsed.append(p)
        if p is not None and p.kind == "rank":
            key = (p.job, p.rank)
            latest[key] = max(latest.get(key, 0), p.attempt)
    return [r for r, p in zip(rows, parsed)
            if p is None or p.kind != "rank" or p.attempt == latest[(p.job, p.rank)]]


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
            from ..launchers import launcher_kinds
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
    from ..scenario.schema import Scenario

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
    # scenario fields drawn
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
    fields = _resolve_any(Scenario, fields, ("explore", "fields"), "the scenario", bad)
    # world size (the hosts' ranks where the scenario has hosts)
    static_hosts = hosts_world(data)
    ws = ex.get("world_size", data.get("world_size", 2))
    if static_hosts is not None:
        if "world_size" in ex:
            bad(("explore", "world_size"), f"the hosts hold the world ({static_hosts} ranks): "
                                           "draw hosts or nodes under explore.fields instead")
        ws = static_hosts
    world: Any = ws
    if isinstance(ws, dict):
        vp = []
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
    # faults
    faults = ex.get("faults", [])
    if not isinstance(faults, list):
        bad(("explore", "faults"), "a list of fault specs (kind: and its parameters)")
        faults = []
    resolved: List[Dict[str, Any]] = []
    for i, spec in enumerate(faults):
        at = ("explore", "faults", i)
        if not isinstance(spec, dict) or not isinstance(spec.get("kind"), str):
            bad(at, "a fault spec is a mapping with kind: and its parameters")
            continue
        cls = REGISTRY.get(spec["kind"])
        if cls is None:
            bad(at + ("kind",), f"unknown fault kind {spec['kind'][:60]!r} (known: "
                                f"{', '.join(REGISTRY.kinds())})")
            continue
        vp = []
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
        try:
            cls.model_validate(_lowest(spec))
        except ValidationError as e:
            for err in e.errors(include_url=False):
                loc = at + tuple(x for x in err["loc"] if isinstance(x, (str, int)))[:1]
                msg = "unknown field" if err["type"] == "extra_forbidden" else str(err["msg"])
                bad(loc, f"{msg} (of {spec['kind']}, its lowest draw)")
            continue
        for k, i, choice in _choices(spec):   # each value a one_of offers, the rest lowest
            try:
                cls.model_validate(dict(_lowest(spec), **{k: _lowest(choice)}))
            except ValidationError as e:
                err = e.errors(include_url=False)[0]
                bad(at + (k, "one_of", i), f"{err['msg']} (of {spec['kind']}, this choice with "
                                           "the others' lowest)")
    mf = ex.get("max_faults", min(2, len(faults)))
    if isinstance(mf, bool) or not isinstance(mf, int) or mf < 0:
        bad(("explore", "max_faults"), f"a whole number from 0 (got {mf!r})")
        mf = 0
    # invariants
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
    if problems:
        raise ScenarioFileError(_capped(file, problems))
    # the base with the simplest draw of its fields must be a valid scenario (its located
    # problems, as `validate` says them)
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
    _absolute_program(data, file)
    return Space(file, data, world, resolved, mf, invs, fields)


def load_space(path: str) -> Space:
    raw = read_limited(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ScenarioFileError([Problem(path, None, "", f"not UTF-8 text ({e.reason})")]) \
            from None
    return load_space_text(text, path)


# -- drawing ---------------------------------------------------------------------------------

def _value_strategy(v: Any, world: int) -> Any:
    from hypothesis import strategies as st

    if isinstance(v, dict):
        if "one_of" in v:
            return st.one_of([_value_strategy(x, world) for x in v["one_of"]])
        if "min" in v:
            lo, hi, step = v["min"], v["max"], v.get("step")
            if step is None and isinstance(lo, int) and isinstance(hi, int):
                return st.integers(lo, hi)
            step = float(step if step is not None else 0.5)
            n = int(math.floor((hi - lo) / step + 1e-9))
            return st.integers(0, n).map(lambda k: round(lo + k * step, 3))
        keys = list(v)     # the spec's own order (the strategy's dict order is its own)
        return st.fixed_dictionaries({k: _value_strategy(x, world) for k, x in v.items()}) \
            .map(lambda d: {k: d[k] for k in keys})
    if isinstance(v, list):
        return st.tuples(*[_value_strategy(x, world) for x in v]).map(list)
    if v == ANY_RANK:
        return st.integers(0, world - 1)
    return st.just(v)


def draw_strategy(space: Space) -> Any:
    """A Hypothesis strategy of drawn scenarios (plain dicts the loader validates)."""
    from hypothesis import strategies as st

    w = space.world
    if isinstance(w, int):
        worlds = st.just(w)
    elif w[0] == "range":
        worlds = st.integers(w[1], w[2])
    else:
        worlds = st.sampled_from(sorted(w[1]))

    @st.composite
    def draws(draw: Any) -> Dict[str, Any]:
        out = json.loads(json.dumps(space.base))
        # a fixed layout of choices: every drawn field, the world, then one flag and the
        # parameters of every fault spec, always drawn: the shrinker turns a flag off, and so
        # drops a fault, without shifting the others
        for k, v in space.fields.items():
            x = draw(_value_strategy(v, 1))
            if x is None:
                out.pop(k, None)     # null drawn: the scenario's own default
            else:
                out[k] = x
        world = draw(worlds)
        held = hosts_world(out)
        if held is not None:
            world = held
            out.pop("world_size", None)
        else:
            out["world_size"] = world
        faults: List[Dict[str, Any]] = []
        for spec in space.faults:
            on = draw(st.booleans())
            f = {"kind": spec["kind"]}
            for k, v in spec.items():
                if k != "kind":
                    x = draw(_value_strategy(v, world))
                    if x is not None:       # null drawn: the fault's own default
                        f[k] = x
            if on and len(faults) < space.max_faults:
                faults.append(f)
        out["faults"] = faults
        out.setdefault("expect", {"job": list(ALL_OUTCOMES)})
        return out

    return draws()


def canonical(draw: Dict[str, Any]) -> str:
    return json.dumps(draw, sort_keys=True, separators=(",", ":"))


def short(draw: Dict[str, Any], space: Optional[Space] = None) -> str:
    fs = []
    for f in draw.get("faults", []):
        fs.append(f["kind"] + "(" + ", ".join(f"{k}={v}" for k, v in f.items()
                                              if k != "kind") + ")")
    drawn = ""
    if space is not None and space.fields:
        drawn = "".join(f", {k} {_brief(draw.get(k))}" for k in space.fields)
    world = draw.get("world_size", hosts_world(draw))
    return f"world {world}{drawn}, faults [{'; '.join(fs)}]"


def _brief(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_brief(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_brief(x) for x in v) + "]"
    return "default" if v is None else str(v)


# -- running ---------------------------------------------------------------------------------

def prepare(draw: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Whether a draw can run here, nothing run: None, or {'invalid': why} (the loader refuses
    it) or {'skipped': why} (this machine cannot run it). The pre-draw and the real runs judge
    a draw alike, so both see the same draws."""
    from ..machine.torch_probe import probe
    from ..run.requirements import skip_reason

    text = yaml.safe_dump(draw, sort_keys=False)
    try:
        scn = load_text(text, "<draw>")[0]
    except ScenarioFileError as e:
        return {"invalid": e.short()}
    why = skip_reason(scn, probe(None))
    return {"skipped": why} if why else None


def result_of_case(case: Dict[str, Any]) -> Dict[str, Any]:
    """A report's case (harness.report.case_record) -> the explorer's result of one run."""
    st = case.get("status")
    if st == "skipped":
        return {"skipped": case.get("reason") or "skipped"}
    if st == "error" or not case.get("ranks"):
        return {"error": (case.get("reason") or case.get("failure") or "no result")[:800],
                "evidence": case.get("evidence")}
    released = {r.get("label"): r.get("released_at")
                for r in (case.get("timeline") or {}).get("ranks", [])}
    return {"job": case.get("job"), "wall": case.get("wall"), "evidence": case.get("evidence"),
            "verdicts": [{"label": r["label"], "outcome": r["outcome"], "phase": r.get("phase"),
                          "duration": None if r.get("duration") is None
                          else round(r["duration"], 2),
                          "released": released.get(r["label"]),
                          "exception": r.get("exception"),
                          "message": (r.get("message") or "")[:300], "cause": r.get("cause"),
                          "role": r.get("role", "rank"), "attempt": r.get("attempt", 0),
                          "node": r.get("node")} for r in case["ranks"]]}


class _Collect:
    """pytest plugin (in-process, the controller): each draw's case record as it ends."""

    def __init__(self, files: Dict[str, int], on_result: Callable[[int, Dict[str, Any]], None]):
        self.files, self.on_result = files, on_result
        self.results: Dict[int, Dict[str, Any]] = {}

    def pytest_runtest_logreport(self, report: Any) -> None:
        i = self.files.get(report.nodeid.split("::", 1)[0].rsplit("/", 1)[-1])
        case = getattr(report, "harness_case", None)
        if i is None or i in self.results:
            return
        if case is None and not (report.failed or report.skipped):
            return
        if case is None:      # a skip or an error before the run made its record
            case = {"status": "skipped" if report.skipped else "error",
                    "reason": str(getattr(report, "longreprtext", "") or "")[-800:]}
        if report.skipped:
            case = dict(case, status="skipped",
                        reason=str(report.longrepr[-1] if isinstance(report.longrepr, tuple)
                                   else report.longrepr))
        elif report.failed and report.when != "call":
            case = dict(case, status="error",
                        reason=str(getattr(report, "longreprtext", "") or "")[-800:])
        self.results[i] = res = result_of_case(case)
        self.on_result(i, res)


def run_batch(draws: List[Dict[str, Any]], jobs: int = 1,
              on_result: Optional[Callable[[int, Dict[str, Any]], None]] = None,
              keep: Optional[Path] = None) -> List[Dict[str, Any]]:
    """Run every draw for real, ``jobs`` at a time: one pytest session over the draws written as
    scenario files, on pytest-xdist's workers when ``jobs`` > 1 (the pool ``harness run -n``
    uses), so each run is the ordinary one: the plugin's evidence, sweeps, interrupts and leak
    checks. Returns one result per draw, in order ({'verdicts', 'job', ...}, {'skipped'} or
    {'error'}). ``keep``: every run's evidence goes there (else into a temporary folder)."""

    import pytest

    from ..machine.rundir import own_folder

    results: Dict[int, Dict[str, Any]] = {}

    def got(i: int, res: Dict[str, Any]) -> None:
        results[i] = res
        if on_result is not None:
            on_result(i, res)

    with own_folder() as root:
        (root / "scenarios").mkdir()
        (root / "pytest.ini").write_text("[pytest]\n")   # no user's ini applies
        files: Dict[str, int] = {}
        paths = []
        for i, d in enumerate(draws):
            name = f"draw-{i + 1:04d}"
            p = root / "scenarios" / f"{name}.yaml"
            p.write_text(yaml.safe_dump(dict(d, name=name), sort_keys=False))
            files[p.name] = i
            paths.append(str(p))
        evidence = keep if keep is not None else root / "evidence"
        args = paths + ["-c", str(root / "pytest.ini"), "--rootdir", str(root),
                        "-p", "no:cacheprovider", "-p", "no:terminal", "--assert=plain", "-s",
                        "--harness-report", str(root / "report.json"),
                        "--harness-evidence", str(evidence),
                        "--harness-keep-sessions", "100000"]
        n = max(1, min(jobs, len(draws)))
        if n > 1:
            args += ["-n", str(n)]
        rc = pytest.main(args, plugins=[_Collect(files, got)])
        if rc == pytest.ExitCode.INTERRUPTED:
            raise KeyboardInterrupt
    return [results.get(i) or {"error": f"no result (pytest exit status {int(rc)})"}
            for i in range(len(draws))]


def run_draw(draw: Dict[str, Any]) -> Dict[str, Any]:
    """Run one drawn scenario for real (the batch path, one draw, in this process):
    {'verdicts': [...], 'job': ...}, {'skipped': why}, {'invalid': why} or {'error': why}."""
    pre = prepare(draw)
    if pre is not None:
        return pre
    return run_batch([draw], 1)[0]


# -- what the user sees ----------------------------------------------------------------------

class Progress:
    """Lines (one per draw, shrink step and confirmation) and, on a terminal, a live bar of
    draws, failures and shrink steps (rich's, already a dependency). Lines go above the bar."""

    def __init__(self, say: Callable[[str], None], bar: bool = False):
        self._say = say
        self.bar: Any = None
        self.tasks: Dict[str, Any] = {}
        self.failures = 0
        if bar:
            from rich import progress as rp
            from rich.console import Console

            con = Console(file=sys.stderr)
            self.bar = rp.Progress(rp.TextColumn("[bold]{task.fields[what]:13}"),
                                   rp.BarColumn(), rp.MofNCompleteColumn(),
                                   rp.TimeElapsedColumn(), rp.TextColumn("{task.description}"),
                                   console=con, transient=True, redirect_stdout=False,
                                   redirect_stderr=False)
            self.bar.start()

    def say(self, line: str) -> None:
        if self.bar is not None:
            self.bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            self._say(line)

    def _task(self, what: str, total: int) -> None:
        if self.bar is not None:
            if what in self.tasks:
                self.bar.update(self.tasks[what], total=total)
            else:
                self.tasks[what] = self.bar.add_task(self._desc(), total=total, what=what)

    def _desc(self) -> str:
        return f"failing draws {self.failures}"

    def _advance(self, what: str) -> None:
        if self.bar is not None and what in self.tasks:
            self.bar.update(self.tasks[what], advance=1)
            for t in self.tasks.values():
                self.bar.update(t, description=self._desc())

    def start(self, what: str, total: int) -> None:
        self._task(what, total)

    def step(self, what: str, failed: bool) -> None:
        self.failures += int(failed and what == "draws")
        self._advance(what)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def _stderr_line(s: str) -> None:
    print(s, file=sys.stderr, flush=True)


def default_jobs() -> int:
    """Runs at a time: the CPUs this process may use (at most 8)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(8, n))


Batch = Callable[[List[Dict[str, Any]], int, Callable[[int, Dict[str, Any]], None]],
                 List[Dict[str, Any]]]


@dataclass
class Exploration:
    space: Space
    seed: int
    runs: int
    max_shrinks: int = 20
    confirm: int = 1
    jobs: int = 1
    runner: Callable[[Dict[str, Any]], Dict[str, Any]] = run_draw
    # every draw at once, ``jobs`` at a time (None: one at a time, as Hypothesis asks)
    batch: Optional[Batch] = None
    # whether a draw can run here, nothing run (the pre-draw judges draws as the runs do)
    prepare: Callable[[Dict[str, Any]], Optional[Dict[str, Any]]] = prepare
    say: Callable[[str], None] = _stderr_line
    progress: Optional[Progress] = None
    records: List[Dict[str, Any]] = field(default_factory=list)
    cache: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    target: Optional[str] = None          # the invariant being shrunk
    last_failing: Optional[Dict[str, Any]] = None
    draws_done: int = 0
    shrinks_done: int = 0
    planned: int = 0                      # draws of the pre-draw (the parallel batch)
    _prepared: Dict[str, Optional[Dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.progress is None:
            self.progress = Progress(self.say)

    def _can_run(self, draw: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        key = canonical(draw)
        if key not in self._prepared:
            self._prepared[key] = self.prepare(draw)
        return self._prepared[key]

    def _out(self, line: str) -> None:
        assert self.progress is not None
        self.progress.say(line)

    def _judge(self, draw: Dict[str, Any], res: Dict[str, Any]) -> Dict[str, Any]:
        res["broken"] = {} if "verdicts" not in res else {
            inv.label(): why for inv in self.space.invariants
            if (why := inv.broken(draw, res["verdicts"])) is not None}
        return res

    def _record(self, phase: str, draw: Dict[str, Any], res: Dict[str, Any]) -> None:
        self.records.append({"n": len(self.records) + 1, "phase": phase, "scenario": draw,
                             **res})

    def _fails(self) -> int:
        return sum(1 for r in self.records if r.get("broken"))

    def _check(self, draw: Dict[str, Any]) -> None:
        from hypothesis import reject

        key = canonical(draw)
        phase = "shrink" if self.target else "draw"
        cached = key in self.cache
        if not cached and phase == "shrink" and self.shrinks_done >= self.max_shrinks:
            reject()          # shrink budget spent: not run, so it cannot be the minimum
        if not cached:
            if phase == "draw":
                self.draws_done += 1
                head = f"draw {self.draws_done}/{max(self.runs, self.planned)}"
            else:
                self.shrinks_done += 1
                head = f"shrink step {self.shrinks_done}/{self.max_shrinks} ({self.target})"
            self._out(f"explore: {head}: {short(draw, self.space)} ...")
            res = self._judge(draw, self.runner(draw))
            self.cache[key] = res
            self._record(phase, draw, res)
            assert self.progress is not None
            self.progress.step("shrink steps" if phase == "shrink" else "draws",
                               bool(res["broken"]))
            self._out(f"explore: {head}: {self._said(res)}; failures so far {self._fails()}")
        res = self.cache[key]
        if "verdicts" not in res:
            reject()
        broken = res["broken"]
        if self.target is None and broken:
            self.target = next(iter(broken))
            assert self.progress is not None
            self.progress.start("shrink steps", self.max_shrinks)
        if self.target is not None and self.target in broken:
            self.last_failing = draw
            raise AssertionError(f"{self.target}: {broken[self.target]}")

    @staticmethod
    def _said(res: Dict[str, Any]) -> str:
        if "verdicts" not in res:
            for k in ("skipped", "invalid", "error"):
                if k in res:
                    return f"{'harness error' if k == 'error' else k}: {res[k]}"
            return "no result"
        ranks = ", ".join(f"{v['label']}={v['outcome']}" for v in res["verdicts"])
        b = res.get("broken") or {}
        return f"job {res['job']} ({ranks})" + (f"; BREAKS {', '.join(b)}" if b else "; holds")

    def _hypothesis(self, runner: Callable[[Dict[str, Any]], None]) -> None:
        from hypothesis import HealthCheck, Phase, Verbosity, given, settings
        from hypothesis import seed as hseed

        @hseed(self.seed)
        @settings(max_examples=self.runs, database=None, deadline=None, derandomize=False,
                  phases=[Phase.generate, Phase.shrink], verbosity=Verbosity.quiet,
                  suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                  print_blob=False)
        @given(draw_strategy(self.space))
        def prop(draw: Dict[str, Any]) -> None:
            runner(draw)

        # Hypothesis stops shrinking after 300 s, written for fast tests; a real run takes
        # seconds, and --max-shrinks is the budget here (an internal constant: set if present)
        from hypothesis.internal.conjecture import engine
        limit = getattr(engine, "MAX_SHRINKING_SECONDS", None)
        if limit is not None:
            engine.MAX_SHRINKING_SECONDS = 24 * 3600
        try:
            prop()
        except AssertionError:
            pass
        except Exception as e:   # Hypothesis's own complaints (unsatisfiable: all skipped)
            if type(e).__name__ not in ("Unsatisfiable", "NoSuchExample"):
                raise
        finally:
            if limit is not None:
                engine.MAX_SHRINKING_SECONDS = limit

    def predraw(self) -> List[Dict[str, Any]]:
        """The draws this seed gives while no invariant breaks, nothing run: each is judged
        only by ``prepare`` (loads, can run here), as the real exploration judges it."""
        from hypothesis import reject

        seen: List[Dict[str, Any]] = []
        keys = set()

        def look(draw: Dict[str, Any]) -> None:
            key = canonical(draw)
            if key not in keys:
                keys.add(key)
                seen.append(draw)
            if self._can_run(draw) is not None:
                reject()

        self._hypothesis(look)
        return seen

    def run_all(self) -> None:
        """Every draw of the pre-draw, run for real (``jobs`` at a time); the results fill
        the cache the exploration then reads."""
        assert self.batch is not None and self.progress is not None
        draws = self.predraw()
        pre = [self._can_run(d) for d in draws]
        todo = [i for i, p in enumerate(pre) if p is None]
        self.planned = len(todo)
        results: Dict[int, Dict[str, Any]] = {i: p for i, p in enumerate(pre) if p is not None}
        self._out(f"explore: {len(draws)} draws from seed {self.seed} ({len(todo)} to run, "
                  f"{self.jobs} at a time; {len(draws) - len(todo)} skipped or invalid here)")
        self.progress.start("draws", len(todo))
        done = [0]

        def got(j: int, res: Dict[str, Any]) -> None:
            i = todo[j]
            d = draws[i]
            results[i] = self._judge(d, res)
            done[0] += 1
            assert self.progress is not None
            self.progress.step("draws", bool(res["broken"]))
            fails = sum(1 for r in results.values() if r.get("broken"))
            self._out(f"explore: draw {done[0]}/{len(todo)} (#{i + 1}): {short(d, self.space)}: "
                      f"{self._said(res)}; failures so far {fails}")

        out = self.batch([draws[i] for i in todo], self.jobs, got)
        for j, res in enumerate(out):          # a draw whose result never came
            if todo[j] not in results:
                results[todo[j]] = self._judge(draws[todo[j]], res)
        for i, d in enumerate(draws):
            res = results[i]
            if "broken" not in res:
                res["broken"] = {}
            self.cache[canonical(d)] = res
            self._record("draw", d, res)
        self.draws_done = len(todo)

    def explore(self) -> Optional[Dict[str, Any]]:
        """Draw up to ``runs`` scenarios (all of them first, in parallel, with a batch);
        shrink the first that breaks an invariant. Returns {'invariant', 'scenario', 'why',
        'result'} of the minimal one, or None."""
        if self.batch is not None:
            self.run_all()
        self._hypothesis(self._check)
        if self.target is None or self.last_failing is None:
            return None
        res = self.cache[canonical(self.last_failing)]
        return {"invariant": self.target, "scenario": self.last_failing,
                "why": res["broken"][self.target], "result": res}

    def confirm_found(self, found: Dict[str, Any]) -> List[Dict[str, Any]]:
        """Re-run the minimal scenario ``confirm`` times, uncached."""
        out = []
        assert self.progress is not None
        if self.confirm:
            self.progress.start("confirmations", self.confirm)
        for i in range(self.confirm):
            self._out(f"explore: confirm {i + 1}/{self.confirm}: "
                      f"{short(found['scenario'], self.space)} ...")
            res = self.runner(found["scenario"])
            inv = next(v for v in self.space.invariants if v.label() == found["invariant"])
            why = inv.broken(found["scenario"], res["verdicts"]) if "verdicts" in res else None
            res["broken"] = {} if why is None else {inv.label(): why}
            self._record("confirm", found["scenario"], res)
            self.progress.step("confirmations", False)
            self._out(f"explore: confirm {i + 1}/{self.confirm}: {self._said(res)}")
            out.append(res)
        return out


def pure_draws(space: Space, seed: int, n: int,
               check: Callable[[Dict[str, Any]], Optional[Dict[str, Any]]] = lambda d: None
               ) -> List[Dict[str, Any]]:
    """The first ``n`` draws of ``seed``, nothing run (what a run of the explorer would try
    while no invariant breaks); ``check`` judges whether a draw can run (default: all can)."""
    return Exploration(space, seed, n, prepare=check, say=lambda s: None).predraw()


def thread_batch(runner: Callable[[Dict[str, Any]], Dict[str, Any]]) -> Batch:
    """A batch that runs ``runner`` on a thread pool, ``jobs`` at a time (for runners that
    stand in for torch: tests)."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    def batch(draws: List[Dict[str, Any]], jobs: int,
              on_result: Callable[[int, Dict[str, Any]], None]) -> List[Dict[str, Any]]:
        out: List[Optional[Dict[str, Any]]] = [None] * len(draws)
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futs = {pool.submit(runner, d): i for i, d in enumerate(draws)}
            for f in as_completed(futs):
                i = futs[f]
                out[i] = f.result()
                on_result(i, out[i])    # type: ignore[arg-type]
        return [o or {"error": "no result"} for o in out]
    return batch


# -- writing what was found ------------------------------------------------------------------

def found_scenario(space: Space, seed: int, found: Dict[str, Any],
                   confirms: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The minimal scenario as an ordinary scenario file's data, its expect from the runs
    watched (the shrink's and the confirmations')."""
    runs = [found["result"]] + [c for c in confirms if "verdicts" in c]
    ranks: Dict[str, List[str]] = {}
    jobs: List[str] = []
    durs: Dict[str, List[float]] = {}
    for r in runs:
        if r["job"] not in jobs:
            jobs.append(r["job"])
        for v in r["verdicts"]:
            ranks.setdefault(v["label"], [])
            if v["outcome"] not in ranks[v["label"]]:
                ranks[v["label"]].append(v["outcome"])
            if v["duration"] is not None:
                durs.setdefault(v["label"], []).append(v["duration"])
    held = sum(1 for c in confirms if c.get("broken"))
    watched = "; ".join(
        f"rank {k}: {'/'.join(o)}" + (f" at {min(durs[k]):.1f}-{max(durs[k]):.1f} s"
                                       if k in durs else "")
        for k, o in ranks.items())
    about = (f"Found by `harness explore {space.file} --seed {seed}`: the smallest draw that "
             f"breaks the invariant {found['invariant']} ({found['why']}).\n"
             f"Watched on this machine in {len(runs)} run(s) (the shrink's and {len(confirms)} "
             f"confirmation(s), {held} of which broke it again): job "
             f"{'/'.join(jobs)}; {watched}.\n"
             "Run it at least 3 times and widen the expectation with what you see before adding "
             "it to the catalog.\n")
    import textwrap

    data = dict(found["scenario"])
    data["name"] = f"{space.name}-{found['invariant'].split('(')[0]}-seed{seed}"
    data["about"] = "".join(textwrap.fill(line, 96) + "\n" for line in about.splitlines())
    data["expect"] = {"job": jobs, "ranks": {k: o for k, o in ranks.items()}}
    return data


class _Dumper(yaml.SafeDumper):
    """Multi-line text (about:) as a literal block, as people write it by hand."""


_Dumper.add_representer(str, lambda d, s: d.represent_scalar(
    "tag:yaml.org,2002:str", s, style="|" if "\n" in s else None))


def write_scenario(data: Dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{data['name']}.yaml"
    ordered = {"name": data["name"], "about": data["about"]}
    ordered.update({k: v for k, v in data.items() if k not in ordered})
    path.write_text(yaml.dump(ordered, Dumper=_Dumper, sort_keys=False, width=100))
    load_text(path.read_text(), str(path))   # what we write loads
    return path


# -- the command -----------------------------------------------------------------------------

def add_parser(sub: Any) -> None:
    e = sub.add_parser("explore", help="draw scenarios from a declared fault space, run each, "
                       "shrink one that breaks an invariant to a minimal scenario file")
    e.add_argument("space", metavar="BASE.yaml", help="a scenario file with an explore: block")
    e.add_argument("--seed", type=int, default=0, help="the same seed gives the same draws")
    e.add_argument("--runs", type=int, default=20, metavar="K", help="draws at most (default 20)")
    e.add_argument("--jobs", "-j", type=int, default=None, metavar="N",
                   help="draws run at a time, on pytest-xdist's workers (default: the CPUs "
                        f"this process may use, at most 8; here {default_jobs()})")
    e.add_argument("--max-shrinks", type=int, default=20, metavar="N",
                   help="real runs spent shrinking a failing draw, at most (default 20)")
    e.add_argument("--confirm", type=int, default=1, metavar="N",
                   help="re-runs of the minimal scenario, uncached (default 1)")
    e.add_argument("--out", default="explore-found", metavar="DIR",
                   help="where the minimal scenario file goes (default explore-found/)")
    e.add_argument("--report", metavar="PATH", help="a JSON report of every draw and verdict")
    e.add_argument("--keep", metavar="DIR", help="keep every run's evidence there (events, "
                   "stacks, output; `harness explain` reads it); default: none kept")
    e.add_argument("--no-progress", action="store_true",
                   help="no live bar on a terminal (the lines stay)")
    e.set_defaults(func=cmd_explore)


def cmd_explore(args: Any) -> int:
    """0: every invariant held over every draw; 1: one broke (its minimal scenario written);
    2: a bad space file (located problems on stderr)."""
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        print("harness explore: needs Hypothesis: pip install 'torchdist-harness[explore]'",
              file=sys.stderr)
        return 2
    try:
        space = load_space(args.space)
    except ScenarioFileError as e:
        for p in e.problems:
            print(str(p), file=sys.stderr)
        return 2
    jobs = default_jobs() if args.jobs is None else args.jobs
    if args.runs < 1 or args.max_shrinks < 0 or args.confirm < 0 or not 1 <= jobs <= MAX_JOBS:
        print("harness explore: --runs is at least 1, --max-shrinks and --confirm at least 0, "
              f"--jobs from 1 to {MAX_JOBS}", file=sys.stderr)
        return 2
    keep = Path(args.keep).resolve() if args.keep else None
    if jobs > 1:
        try:
            import xdist  # noqa: F401
        except ImportError:
            print("harness explore: --jobs needs pytest-xdist (pip install "
                  "'torchdist-harness[explore]'): running one draw at a time", file=sys.stderr)
            jobs = 1

    def batch(draws: List[Dict[str, Any]], n: int,
              on_result: Callable[[int, Dict[str, Any]], None]) -> List[Dict[str, Any]]:
        return run_batch(draws, n, on_result, keep=keep)

    def one(draw: Dict[str, Any]) -> Dict[str, Any]:
        pre = prepare(draw)
        return pre if pre is not None else run_batch([draw], 1, keep=keep)[0]

    progress = Progress(_stderr_line, bar=not args.no_progress and sys.stderr.isatty())
    ex = Exploration(space, args.seed, args.runs, max_shrinks=args.max_shrinks,
                     confirm=args.confirm, jobs=jobs, runner=one, batch=batch,
                     progress=progress)
    try:
        found = ex.explore()
        confirms = ex.confirm_found(found) if found is not None else []
    finally:
        progress.stop()
    failures = [{"n": r["n"], "phase": r["phase"], "broken": r["broken"],
                 "scenario": short(r["scenario"], space)}
                for r in ex.records if r.get("broken")]
    report: Dict[str, Any] = {"space": args.space, "seed": args.seed, "runs": args.runs,
                              "jobs": jobs, "invariants": [i.label() for i in space.invariants],
                              "draws": ex.records, "failures": failures, "found": None}
    rc = 0
    said = ex.progress.say if ex.progress is not None else _stderr_line
    n_draws = sum(1 for r in ex.records if r["phase"] == "draw" and "verdicts" in r)
    broke = [f for f in failures if f["phase"] == "draw"]
    if found is None:
        said(f"explore: {n_draws} draws run, every invariant held")
    else:
        data = found_scenario(space, args.seed, found, confirms)
        path = write_scenario(data, Path(args.out))
        held = sum(1 for c in confirms if c.get("broken"))
        report["found"] = {"invariant": found["invariant"], "why": found["why"],
                           "scenario": found["scenario"], "file": str(path),
                           "shrink_steps": ex.shrinks_done,
                           "confirmed": f"{held}/{len(confirms)}"}
        note = (" (NOT confirmed: it broke only in the shrink's run, a race? its about says "
                "what each run did)" if confirms and not held else "")
        others = sorted({k for f in broke for k in f["broken"]} - {found["invariant"]})
        said(f"explore: {n_draws} draws run, {len(broke)} broke an invariant"
             + (f" (also broken, not shrunk: {', '.join(others)})" if others else "")
             + f"; {found['invariant']} broken: {found['why']}; minimal after "
             f"{ex.shrinks_done} shrink steps: {short(found['scenario'], space)}; confirmed "
             f"{held}/{len(confirms)}{note}; written to {path}")
        rc = 1
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=1) + "\n")
    return rc

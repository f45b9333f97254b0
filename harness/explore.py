"""Exploring a fault space: draw scenarios from a declared space, run each for real, check
invariants, shrink a draw that breaks one to the smallest scenario that still breaks it.

A space file is an ordinary scenario file (its fields are the base of every draw; ``expect:``
is optional) with an ``explore:`` block::

    explore:
      world_size: {min: 2, max: 3}          # an int, {min, max} or {one_of: [...]}
      max_faults: 2                         # a draw takes 0..max_faults of the faults below
      faults:                               # each at most once per draw
        - kind: busy_port
          mode: {one_of: [bound, listening, accepting]}
        - kind: delayed_rank
          ranks: [any_rank]                 # any_rank: a rank of the drawn world
          delay: {min: 0, max: 8, step: 0.5}
      invariants:
        - no_hang: {within: 20}
        - ok_without_faults

A parameter value is a fixed value (lists and mappings are walked: their values may be drawn
too), ``{one_of: [...]}``, ``{min, max[, step]}`` (integers when both are integers and no step
is given, else min + k*step) or the word ``any_rank``.

Drawing and shrinking are Hypothesis's (``hypothesis.given`` driven here, seeded with
``hypothesis.seed``; no example database): the same seed gives the same draws. Every run is
cached by the drawn scenario's canonical form (shrinking proposes a draw again); the found
scenario is re-run uncached to confirm and written out as an ordinary scenario file.
Runs go one at a time (no parallel pool).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import yaml
from pydantic import ValidationError

from .faults import REGISTRY
from .loader import (
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
from .outcomes import ALL_OUTCOMES

ANY_RANK = "any_rank"
MAX_WORLD_EXPLORED = 8
INVARIANTS: Dict[str, str] = {
    "no_hang": "no rank ends in hang; with within: S, every rank that is not ok ends within S s "
               "of its own start",
    "ok_without_faults": "a draw without faults ends ok on every rank",
    "no_error": "no rank ends in error (a deliberately strict invariant, for trying the "
                "explorer: any fault that raises breaks it)",
}


# -- the space -------------------------------------------------------------------------------

@dataclass
class Invariant:
    name: str
    within: Optional[float] = None

    def label(self) -> str:
        return self.name + (f"(within {self.within:g} s)" if self.within is not None else "")

    def broken(self, draw: Dict[str, Any], verdicts: List[Dict[str, Any]]) -> Optional[str]:
        """Why this run breaks the invariant, or None."""
        if self.name == "no_hang":
            for v in verdicts:
                if v["outcome"] == "hang":
                    return f"rank {v['label']} ended in hang ({v['phase']})"
                d = v.get("duration")
                if d is not None:   # from its own start: a late rank's delay does not count
                    d -= v.get("released") or 0.0
                if self.within is not None and v["outcome"] not in ("ok", "absent") \
                        and d is not None and d > self.within:
                    return (f"rank {v['label']} ended in {v['outcome']} {d:.1f} s after its "
                            f"start, later than {self.within:g} s")
            return None
        if self.name == "ok_without_faults":
            if draw.get("faults"):
                return None
            bad = [v for v in verdicts if v["outcome"] != "ok"]
            return (f"no fault, yet rank {bad[0]['label']} ended in {bad[0]['outcome']}"
                    if bad else None)
        if self.name == "no_error":
            bad = [v for v in verdicts if v["outcome"] == "error"]
            return (f"rank {bad[0]['label']} ended in error ({bad[0].get('exception')})"
                    if bad else None)
        raise AssertionError(self.name)


@dataclass
class Space:
    file: str
    base: Dict[str, Any]
    world: Any                      # int | ("range", lo, hi) | ("one_of", [...])
    faults: List[Dict[str, Any]]
    max_faults: int
    invariants: List[Invariant]

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


def load_space_text(text: str, file: str = "<string>") -> Space:
    data, lines = _parse(text, file)
    L = Lines(lines)
    problems: List[Problem] = []

    def bad(path: Tuple[Any, ...], msg: str) -> None:
        problems.append(Problem(file, L.line_of(path), _field(path), msg))

    ex = data.pop("explore", None)
    if not isinstance(ex, dict):
        bad(("explore",), "required: the space to draw from (world_size, faults, max_faults, "
                          "invariants)" if ex is None else "a mapping (world_size, faults, "
                          "max_faults, invariants)")
        raise ScenarioFileError(problems)
    if "cases" in data:
        bad(("cases",), "a space file has no cases: the explorer draws them")
    if data.get("faults"):
        bad(("faults",), "a space file's faults are drawn: declare them under explore.faults")
    known = {"world_size", "faults", "max_faults", "invariants"}
    for k in ex:
        if k not in known:
            bad(("explore", k), f"unknown field (known: {', '.join(sorted(known))})")
    # world size
    ws = ex.get("world_size", data.get("world_size", 2))
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
    # faults
    faults = ex.get("faults", [])
    if not isinstance(faults, list):
        bad(("explore", "faults"), "a list of fault specs (kind: and its parameters)")
        faults = []
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
        vp = []
        for k, v in spec.items():
            if k != "kind":
                _value_problems(v, at + (k,), vp)
        for p, m in vp:
            bad(p, m)
        if vp:
            continue
        try:
            cls.model_validate(_lowest(spec))
        except ValidationError as e:
            for err in e.errors(include_url=False):
                loc = at + tuple(x for x in err["loc"] if isinstance(x, (str, int)))[:1]
                msg = "unknown field" if err["type"] == "extra_forbidden" else str(err["msg"])
                bad(loc, f"{msg} (of {spec['kind']}, its lowest draw)")
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
        within = params.get("within")
        extra = set(params) - ({"within"} if name == "no_hang" else set())
        if extra:
            bad(at + (name,), f"{name} takes {'within' if name == 'no_hang' else 'no parameters'}"
                              f", not {', '.join(sorted(map(str, extra)))}")
            continue
        if within is not None and (isinstance(within, bool)
                                   or not isinstance(within, (int, float)) or within <= 0):
            bad(at + (name, "within"), f"seconds above 0 (got {within!r})")
            continue
        invs.append(Invariant(name, float(within) if within is not None else None))
    if problems:
        raise ScenarioFileError(_capped(file, problems))
    # the base itself must be a valid scenario (its located problems, as `validate` says them)
    base = dict(data)
    base.setdefault("expect", {"job": list(ALL_OUTCOMES)})
    base["world_size"] = sizes[0]
    validate_case(dict(base), file, L)
    return Space(file, data, world, faults, mf, invs)


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
        return st.fixed_dictionaries({k: _value_strategy(x, world) for k, x in v.items()})
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
        world = draw(worlds)
        # a fixed layout of choices (one flag and the parameters of every spec, always drawn):
        # the shrinker turns a flag off, and so drops a fault, without shifting the others
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
        out = json.loads(json.dumps(space.base))
        out["world_size"] = world
        out["faults"] = faults
        out.setdefault("expect", {"job": list(ALL_OUTCOMES)})
        return out

    return draws()


def canonical(draw: Dict[str, Any]) -> str:
    return json.dumps(draw, sort_keys=True, separators=(",", ":"))


def short(draw: Dict[str, Any]) -> str:
    fs = []
    for f in draw.get("faults", []):
        fs.append(f["kind"] + "(" + ", ".join(f"{k}={v}" for k, v in f.items()
                                              if k != "kind") + ")")
    return f"world {draw['world_size']}, faults [{'; '.join(fs)}]"


# -- running ---------------------------------------------------------------------------------

def run_draw(draw: Dict[str, Any]) -> Dict[str, Any]:
    """Run one drawn scenario for real: {'verdicts': [...], 'job': ...} or {'skipped': why}
    or {'invalid': why}."""
    from .classify import classify_run, job_outcome
    from .diagnose import explain_run
    from .launch import run_scenario
    from .probe import probe
    from .requirements import skip_reason

    text = yaml.safe_dump(draw, sort_keys=False)
    try:
        scn = load_text(text, "<draw>")[0]
    except ScenarioFileError as e:
        return {"invalid": e.short()}
    why = skip_reason(scn, probe(None))
    if why:
        return {"skipped": why}
    run = run_scenario(scn)
    verdicts = explain_run(run, classify_run(run))
    released = {r.label: r.released_at for r in run.ranks}
    return {"job": job_outcome(verdicts), "wall": round(run.wall, 2),
            "verdicts": [{"label": v.label, "outcome": v.outcome, "phase": v.phase,
                          "duration": None if v.duration is None else round(v.duration, 2),
                          "released": released.get(v.label),
                          "exception": v.exception, "message": v.message[:300],
                          "cause": v.cause} for v in verdicts]}


@dataclass
class Exploration:
    space: Space
    seed: int
    runs: int
    max_shrinks: int = 20
    confirm: int = 1
    runner: Callable[[Dict[str, Any]], Dict[str, Any]] = run_draw
    say: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)
    records: List[Dict[str, Any]] = field(default_factory=list)
    cache: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    target: Optional[str] = None          # the invariant being shrunk
    last_failing: Optional[Dict[str, Any]] = None
    draws_done: int = 0
    shrinks_done: int = 0

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
                head = f"draw {self.draws_done}/{self.runs}"
            else:
                self.shrinks_done += 1
                head = f"shrink step {self.shrinks_done}/{self.max_shrinks} ({self.target})"
            self.say(f"explore: {head}: {short(draw)} ...")
            res = self.runner(draw)
            broken = {} if "verdicts" not in res else {
                inv.label(): why for inv in self.space.invariants
                if (why := inv.broken(draw, res["verdicts"])) is not None}
            res["broken"] = broken
            self.cache[key] = res
            rec = {"n": len(self.records) + 1, "phase": phase, "scenario": draw, **res}
            self.records.append(rec)
            fails = sum(1 for r in self.records if r.get("broken"))
            self.say(f"explore: {head}: {self._said(res)}; failures so far {fails}")
        res = self.cache[key]
        if "verdicts" not in res:
            reject()
        broken = res["broken"]
        if self.target is None and broken:
            self.target = next(iter(broken))
        if self.target is not None and self.target in broken:
            self.last_failing = draw
            raise AssertionError(f"{self.target}: {broken[self.target]}")

    @staticmethod
    def _said(res: Dict[str, Any]) -> str:
        if "verdicts" not in res:
            return "skipped: " + res.get("skipped", res.get("invalid", ""))
        ranks = ", ".join(f"{v['label']}={v['outcome']}" for v in res["verdicts"])
        b = res.get("broken") or {}
        return f"job {res['job']} ({ranks})" + (f"; BREAKS {', '.join(b)}" if b else "; holds")

    def explore(self) -> Optional[Dict[str, Any]]:
        """Draw up to ``runs`` scenarios; shrink the first that breaks an invariant. Returns
        {'invariant', 'scenario', 'why', 'result'} of the minimal one, or None."""
        from hypothesis import HealthCheck, Phase, Verbosity, given, settings
        from hypothesis import seed as hseed

        @hseed(self.seed)
        @settings(max_examples=self.runs, database=None, deadline=None, derandomize=False,
                  phases=[Phase.generate, Phase.shrink], verbosity=Verbosity.quiet,
                  suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                  print_blob=False)
        @given(draw_strategy(self.space))
        def prop(draw: Dict[str, Any]) -> None:
            self._check(draw)

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
        if self.target is None or self.last_failing is None:
            return None
        res = self.cache[canonical(self.last_failing)]
        return {"invariant": self.target, "scenario": self.last_failing,
                "why": res["broken"][self.target], "result": res}

    def confirm_found(self, found: Dict[str, Any]) -> List[Dict[str, Any]]:
        """Re-run the minimal scenario ``confirm`` times, uncached."""
        out = []
        for i in range(self.confirm):
            self.say(f"explore: confirm {i + 1}/{self.confirm}: {short(found['scenario'])} ...")
            res = self.runner(found["scenario"])
            inv = next(v for v in self.space.invariants if v.label() == found["invariant"])
            why = inv.broken(found["scenario"], res["verdicts"]) if "verdicts" in res else None
            res["broken"] = {} if why is None else {inv.label(): why}
            self.records.append({"n": len(self.records) + 1, "phase": "confirm",
                                 "scenario": found["scenario"], **res})
            self.say(f"explore: confirm {i + 1}/{self.confirm}: {self._said(res)}")
            out.append(res)
        return out


def pure_draws(space: Space, seed: int, n: int) -> List[Dict[str, Any]]:
    """The first ``n`` draws of ``seed``, nothing run (what a run of the explorer would try
    while no invariant breaks)."""
    seen: List[Dict[str, Any]] = []
    ex = Exploration(space, seed, n, runner=lambda d: {"verdicts": [], "job": "ok"},
                     say=lambda s: None)

    def runner(d: Dict[str, Any]) -> Dict[str, Any]:
        seen.append(d)
        return {"verdicts": [], "job": "ok"}

    ex.runner = runner
    ex.explore()
    return seen


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
    data = dict(found["scenario"])
    data["name"] = f"{space.name}-{found['invariant'].split('(')[0]}-seed{seed}"
    data["about"] = about
    data["expect"] = {"job": jobs, "ranks": {k: o for k, o in ranks.items()}}
    return data


def write_scenario(data: Dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{data['name']}.yaml"
    ordered = {"name": data["name"], "about": data["about"]}
    ordered.update({k: v for k, v in data.items() if k not in ordered})
    path.write_text(yaml.safe_dump(ordered, sort_keys=False, width=100))
    load_text(path.read_text(), str(path))   # what we write loads
    return path


# -- the command -----------------------------------------------------------------------------

def add_parser(sub: Any) -> None:
    e = sub.add_parser("explore", help="draw scenarios from a declared fault space, run each, "
                       "shrink one that breaks an invariant to a minimal scenario file")
    e.add_argument("space", metavar="BASE.yaml", help="a scenario file with an explore: block")
    e.add_argument("--seed", type=int, default=0, help="the same seed gives the same draws")
    e.add_argument("--runs", type=int, default=20, metavar="K", help="draws at most (default 20)")
    e.add_argument("--max-shrinks", type=int, default=20, metavar="N",
                   help="real runs spent shrinking a failing draw, at most (default 20)")
    e.add_argument("--confirm", type=int, default=1, metavar="N",
                   help="re-runs of the minimal scenario, uncached (default 1)")
    e.add_argument("--out", default="explore-found", metavar="DIR",
                   help="where the minimal scenario file goes (default explore-found/)")
    e.add_argument("--report", metavar="PATH", help="a JSON report of every draw and verdict")
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
    if args.runs < 1 or args.max_shrinks < 0 or args.confirm < 0:
        print("harness explore: --runs is at least 1, --max-shrinks and --confirm at least 0",
              file=sys.stderr)
        return 2
    ex = Exploration(space, args.seed, args.runs, max_shrinks=args.max_shrinks,
                     confirm=args.confirm)
    found = ex.explore()
    report: Dict[str, Any] = {"space": args.space, "seed": args.seed, "runs": args.runs,
                              "invariants": [i.label() for i in space.invariants],
                              "draws": ex.records, "found": None}
    rc = 0
    if found is None:
        print(f"explore: {ex.draws_done} draws, every invariant held", file=sys.stderr)
    else:
        confirms = ex.confirm_found(found)
        data = found_scenario(space, args.seed, found, confirms)
        path = write_scenario(data, Path(args.out))
        held = sum(1 for c in confirms if c.get("broken"))
        report["found"] = {"invariant": found["invariant"], "why": found["why"],
                           "scenario": found["scenario"], "file": str(path),
                           "shrink_steps": ex.shrinks_done,
                           "confirmed": f"{held}/{len(confirms)}"}
        note = (" (NOT confirmed: it broke only in the shrink's run, a race? its about says "
                "what each run did)" if confirms and not held else "")
        print(f"explore: {found['invariant']} broken: {found['why']}; minimal after "
              f"{ex.shrinks_done} shrink steps: {short(found['scenario'])}; confirmed "
              f"{held}/{len(confirms)}{note}; written to {path}", file=sys.stderr)
        rc = 1
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=1) + "\n")
    return rc

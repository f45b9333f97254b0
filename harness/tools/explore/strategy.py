"""Drawing: a ``Space`` as a Hypothesis strategy of scenario dicts (every drawn field, the
world, then one flag and the parameters of every fault spec, always drawn, so the shrinker drops
a fault without shifting the others), and a draw's canonical and short forms."""

from __future__ import annotations

import json
import math
from typing import Any, Dict, List, Optional

from ...core.outcomes import ALL_OUTCOMES
from .space import ANY_RANK, Space, hosts_world


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

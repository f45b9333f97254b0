"""Where a problem is written (:mod:`harness.scenario.loader`): the line of a field path in
one case (``Lines``: the case's own lines first, then the file's top level), a model error's
location turned into the path as written in the YAML (shorthands undone), and pydantic's
errors as located ``Problem`` lines.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

from pydantic import ValidationError

from .problems import MAX_PROBLEMS, Path_, Problem, _field

# -- locating pydantic's errors ----------------------------------------------------------------

class Lines:
    """Field path -> line for one case: the case's own lines first, then the file's top level
    except below what the case replaces (a list or value, not a merged mapping)."""

    def __init__(self, lines: Dict[Path_, int], case: Optional[str] = None,
                 over: Optional[Dict[Any, Any]] = None):
        self.lines = lines
        self.case = case
        self.replaced: Set[Path_] = set()
        if over:
            self._replaced(over, ())

    def _replaced(self, over: Dict[Any, Any], prefix: Path_) -> None:
        for k, v in over.items():
            p = prefix + (str(k),)
            if isinstance(v, dict):
                self._replaced(v, p)
            else:
                self.replaced.add(p)

    def get(self, path: Sequence[Any]) -> Optional[int]:
        p = tuple(str(x) for x in path)
        if self.case is None:
            return self.lines.get(p)
        own = self.lines.get(("cases", self.case) + p)
        if own is not None:
            return own
        if any(p[:i] in self.replaced for i in range(1, len(p))):
            return None
        return self.lines.get(p)

    def merged_note(self, loc: Sequence[Any]) -> str:
        """For a case: where ``loc`` (or the nearest field above it) is written only at the
        file's top level, the words that say it was merged in from there ("" otherwise)."""
        if self.case is None:
            return ""
        p = tuple(str(x) for x in loc)
        while p:
            if self.lines.get(("cases", self.case) + p) is not None:
                return ""
            if self.lines.get(p) is not None:
                return f" ({_field(p)} is set at the file's top level, merged into case " \
                    f"{self.case})"
            p = p[:-1]
        return ""

    def line_of(self, loc: Sequence[Any]) -> int:
        """The line of ``loc``, or of the nearest enclosing field that has one."""
        p = tuple(loc)
        while p:
            line = self.get(p)
            if line is not None:
                return line
            p = p[:-1]
        if self.case is not None:
            line = self.lines.get(("cases", self.case))
            if line is not None:
                return line
        return self.lines.get((), 1)


def _child(value: Any, key: Any, index: Dict[int, Dict[str, Any]]) -> Tuple[bool, Any]:
    """The YAML value under ``key`` (mapping keys compared as text: YAML ``0`` and ``"0"``)."""
    if isinstance(value, dict):
        if key in value:
            return True, value[key]
        keys = index.get(id(value))
        if keys is None:   # built once per mapping: no scan per error
            keys = index[id(value)] = {str(k): k for k in value}
        if str(key) in keys:
            return True, value[keys[str(key)]]
    elif isinstance(value, list) and isinstance(key, int) and 0 <= key < len(value):
        return True, value[key]
    return False, None


def _yaml_loc(data: Any, loc: Sequence[Any],
              index: Optional[Dict[int, Dict[str, Any]]] = None) -> Tuple[Any, ...]:
    """A model error location -> the path as written in the YAML, shorthands undone: ``expect``
    written as one block has no ``[0]``, ``workload: [...]`` and ``workload: init`` have no
    ``steps``, and a rank written as ``1: timeout`` has no ``outcome``. Mapping keys come back
    as text, list positions as numbers."""
    index = {} if index is None else index
    out: List[Any] = []
    node = data
    for key in loc:
        if key == "[key]":   # pydantic's marker for "the key itself", not a level of the YAML
            break
        found, child = _child(node, key, index)
        if found:
            out.append(key if isinstance(node, list) else str(key))
            node = child
        elif (key == 0 and isinstance(node, dict) and out == ["expect"]) or \
                (key == "steps" and isinstance(node, (list, str)) and out == ["workload"]) or \
                (key == "outcome" and isinstance(node, (list, str))):
            continue      # a level of the model that the shorthand leaves out
        elif isinstance(node, str) and isinstance(key, int):
            break         # workload: barrier -> steps[0]
        elif isinstance(key, str) and node is not None and not isinstance(node, dict):
            continue      # a union member's tag (list[int], literal[...]): not a YAML level
        else:
            out.append(key)
            node = None
    return tuple(out)


def _line_of(lines: Union[Lines, Dict[Path_, int]], loc: Sequence[Any]) -> int:
    return (lines if isinstance(lines, Lines) else Lines(lines)).line_of(loc)



def _message(err: Any) -> str:
    msg = str(err["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    if err["type"] in ("extra_forbidden", "invalid_key"):
        msg = "unknown field"
        key = str(err["loc"][-1]) if err["loc"] else ""
        odd = [c for c in key if ord(c) > 127 or not c.isprintable()]
        if odd:
            shown = ", ".join(f"{c!r} U+{ord(c):04X}" for c in dict.fromkeys(odd[:3]))
            msg += f" (its name holds {shown}: a lookalike of an ASCII letter?)"
        elif err["type"] == "invalid_key":
            msg += " (YAML reads this key as a number)"
    elif err["type"] == "missing":
        msg = "required field is missing"
    inp = err.get("input")
    if err["type"] not in ("missing", "extra_forbidden", "invalid_key", "located") \
            and isinstance(inp, (str, int, float)) and not isinstance(inp, bool):
        shown = repr(inp) if not isinstance(inp, int) or abs(inp) < 10 ** 60 else "a huge number"
        msg += f" (got {shown[:60]}{'...' if len(shown) > 60 else ''})"
    return msg


def _pydantic_problems(file: str, lines: Union[Lines, Dict[Path_, int]], e: ValidationError,
                       data: Any, prefix: Tuple[Any, ...] = ()) -> List[Problem]:
    out: List[Problem] = []
    index: Dict[int, Dict[str, Any]] = {}
    for err in e.errors(include_url=False):
        if len(out) > MAX_PROBLEMS:
            break
        loc = tuple(err["loc"])
        if err["type"] == "located":   # a check across fields that names its field
            where = err["ctx"]["field"]
            loc = loc + (tuple(where) if isinstance(where, (list, tuple)) else (where,))
        yloc = _yaml_loc(data, prefix + loc, index)
        out.append(Problem(file, _line_of(lines, yloc), _field(yloc), _message(err)))
    return out


def _known_fields(model: Any) -> str:
    return ", ".join(f for f in model.model_fields if f != "case")   # case: the loader's



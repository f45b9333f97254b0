"""Loading: YAML text -> validated Scenario cases; every problem located as file:line: field.

Lines come from PyYAML's node marks: the document is composed once, every key and list item's
line is recorded under its field path, and pydantic's error locations are looked up there
(falling back to the nearest enclosing field). ``cases:`` expands one file into several
scenarios, each case a deep-merged override of the file's top level.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import yaml
from pydantic import ValidationError

from .faults import FAULTS
from .safety import refuse_address
from .schema import Scenario

Path_ = Tuple[str, ...]
CASE_ID = re.compile(r"^[A-Za-z0-9_.=-]+$")


@dataclass
class Problem:
    file: str
    line: Optional[int]
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.field}: {self.message}" if self.field \
            else f"{where}: {self.message}"


class ScenarioFileError(Exception):
    """A scenario file that cannot be used; ``problems`` are located, first one first."""

    def __init__(self, problems: List[Problem]):
        self.problems = problems
        super().__init__(self.short())

    def short(self) -> str:
        first = str(self.problems[0])
        more = len(self.problems) - 1
        return first + (f"\n  (+{more} more problem{'s' * (more > 1)} in this file; "
                        "`harness validate FILE` lists them all)" if more else "")


def _lines(node: yaml.Node, path: Path_, out: Dict[Path_, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = str(k.value)
            out.setdefault(path + (key,), k.start_mark.line + 1)
            _lines(v, path + (key,), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out.setdefault(path + (str(i),), item.start_mark.line + 1)
            _lines(item, path + (str(i),), out)


def _key_problems(file: str, node: yaml.Node, path: Tuple[Any, ...] = ()) -> List[Problem]:
    """Keys given twice in one mapping (PyYAML silently keeps the last, which would hide the
    first: two ``expect:`` blocks, two case ids), and keys YAML reads as booleans or null
    (``yes:``, ``on:``, ``~:``), which no field of a scenario can be."""
    out: List[Problem] = []
    if isinstance(node, yaml.MappingNode):
        seen: Dict[str, int] = {}
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                key, line = str(k.value), k.start_mark.line + 1
                if k.tag in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:null"):
                    out.append(Problem(file, line, _field(path + (key,)),
                                       f"YAML reads the key {key!r} as "
                                       f"{'a boolean' if k.tag.endswith('bool') else 'null'}, "
                                       f"not as text: quote it ('{key}') if you mean the name"))
                if key in seen:
                    out.append(Problem(file, line, _field(path + (key,)),
                                       f"duplicate key {key!r} (first at line {seen[key]}); "
                                       "YAML would silently keep only the last one"))
                else:
                    seen[key] = line
            out += _key_problems(file, v, path + (str(k.value),))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out += _key_problems(file, item, path + (i,))
    return out


def _child(value: Any, key: Any) -> Tuple[bool, Any]:
    """The YAML value under ``key`` (mapping keys compared as text: YAML ``0`` and ``"0"``)."""
    if isinstance(value, dict):
        for k, v in value.items():
            if str(k) == str(key):
                return True, v
    elif isinstance(value, list) and isinstance(key, int) and 0 <= key < len(value):
        return True, value[key]
    return False, None


def _yaml_loc(data: Any, loc: Sequence[Any]) -> Tuple[Any, ...]:
    """A model error location -> the path as written in the YAML, shorthands undone: ``expect``
    written as one block has no ``[0]``, ``workload: [...]`` and ``workload: init`` have no
    ``steps``, and a rank written as ``1: timeout`` has no ``outcome``."""
    out: List[Any] = []
    node = data
    for key in loc:
        found, child = _child(node, key)
        if found:
            out.append(key)
            node = child
        elif (key == 0 and isinstance(node, dict) and out == ["expect"]) or \
                (key == "steps" and isinstance(node, (list, str)) and out == ["workload"]) or \
                (key == "outcome" and isinstance(node, (list, str))):
            continue      # a level of the model that the shorthand leaves out
        elif isinstance(node, str) and isinstance(key, int):
            break         # workload: barrier -> steps[0]
        else:
            out.append(key)
            node = None
    return tuple(out)


def _line_of(lines: Dict[Path_, int], loc: Sequence[Any]) -> Optional[int]:
    p = tuple(str(x) for x in loc)
    while p:
        if p in lines:
            return lines[p]
        p = p[:-1]
    return lines.get((), 1)


def _field(loc: Sequence[Any]) -> str:
    out = ""
    for x in loc:
        out += f"[{x}]" if isinstance(x, int) else (f".{x}" if out else str(x))
    return out


def _message(err: Any) -> str:
    msg = str(err["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    elif err["type"] == "missing":
        msg = "required field is missing"
    inp = err.get("input")
    if err["type"] not in ("missing", "extra_forbidden") and isinstance(inp, (str, int, float)):
        msg += f" (got {inp!r})"
    return msg


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    return copy.deepcopy(over)


def _drop_replaced(lines: Dict[Path_, int], over: Dict[str, Any], prefix: Path_ = ()) -> None:
    """Forget the base file's lines for everything a case replaces (not merges)."""
    for k, v in over.items():
        p = prefix + (str(k),)
        if isinstance(v, dict):
            _drop_replaced(lines, v, p)
        else:
            for q in [q for q in lines if q[:len(p)] == p and len(q) > len(p)]:
                del lines[q]


def _pydantic_problems(file: str, lines: Dict[Path_, int], e: ValidationError, data: Any,
                       prefix: Tuple[Any, ...] = ()) -> List[Problem]:
    out = []
    for err in e.errors():
        loc = _yaml_loc(data, prefix + tuple(err["loc"]))
        out.append(Problem(file, _line_of(lines, loc), _field(loc), _message(err)))
    return out


def _known_fields(model: Any) -> str:
    return ", ".join(model.model_fields)


def validate_case(data: Dict[str, Any], file: str, lines: Dict[Path_, int]) -> Scenario:
    """One case's merged data -> Scenario, or ScenarioFileError with located problems."""
    problems: List[Problem] = []
    try:
        scn = Scenario.model_validate(data)
    except ValidationError as e:
        problems = _pydantic_problems(file, lines, e, data)
        for p in problems:
            if p.message == "unknown field" and "." not in p.field and "[" not in p.field:
                p.message += f" (known: {_known_fields(Scenario)}, cases)"
        raise ScenarioFileError(problems) from None

    # faults: each validated by its plugin's own model
    for i, spec in enumerate(scn.faults):
        loc: Tuple[Any, ...] = ("faults", i)
        cls = FAULTS.get(spec.kind)
        if cls is None:
            problems.append(Problem(file, _line_of(lines, loc + ("kind",)), _field(loc + ("kind",)),
                                    f"unknown fault kind {spec.kind!r} (known: "
                                    f"{', '.join(sorted(FAULTS))})"))
            continue
        try:
            fault = cls.model_validate(spec.model_dump())
        except ValidationError as e:
            ps = _pydantic_problems(file, lines, e, data, loc)
            for p in ps:
                if p.message == "unknown field":
                    p.message += f" of {spec.kind} (known: {_known_fields(cls)})"
            problems += ps
            continue
        for where, msg in fault.check(scn):
            problems.append(Problem(file, _line_of(lines, loc + where), _field(loc + where), msg))

    # expectations may only name ranks that exist
    labels = {str(r) for r in range(scn.world_size)} | {"*"}
    for spec in scn.faults:
        cls = FAULTS.get(spec.kind)
        if cls is not None:
            try:
                labels |= set(cls.model_validate(spec.model_dump()).extra_labels(scn))
            except ValidationError:
                pass
    for j, block in enumerate(scn.expect):
        for key in block.ranks:
            if key not in labels:
                loc = _yaml_loc(data, ("expect", j, "ranks", key))
                problems.append(Problem(file, _line_of(lines, loc), _field(loc),
                                        f"rank {key} is outside the world (world_size "
                                        f"{scn.world_size}: ranks 0..{scn.world_size - 1})"))
    why = refuse_address(scn.master_addr)
    if why:
        problems.append(Problem(file, _line_of(lines, ("master_addr",)), "master_addr", why))
    if "MASTER_ADDR" in scn.env:
        why = refuse_address(scn.env["MASTER_ADDR"])
        if why:
            problems.append(Problem(file, _line_of(lines, ("env", "MASTER_ADDR")),
                                    "env.MASTER_ADDR", why))
    if problems:
        raise ScenarioFileError(problems)
    return scn


def load_text(text: str, file: str = "<string>") -> List[Scenario]:
    """Parse and validate one scenario file's text into its cases."""
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        context = e.context or ""
        if e.context_mark is not None and e.problem_mark is not None \
                and e.context_mark.line != e.problem_mark.line:
            if not text[e.problem_mark.index:].strip():
                # an unclosed bracket or quote: the line where it was opened, not the file's end
                mark = e.context_mark
                context += " (started here, never closed):"
            else:
                context += f" (from line {e.context_mark.line + 1})"
        line = mark.line + 1 if mark else None
        what = " ".join(x for x in (context, e.problem) if x)
        raise ScenarioFileError([Problem(file, line, "", f"not valid YAML: {what}")]) from None
    except yaml.reader.ReaderError as e:   # a character YAML does not allow (a control char)
        line = text.count("\n", 0, e.position) + 1
        char = chr(e.character) if isinstance(e.character, int) else str(e.character)
        raise ScenarioFileError([Problem(file, line, "", f"not valid YAML: character {char!r} "
                                         f"is not allowed ({e.reason})")]) from None
    except yaml.YAMLError as e:
        raise ScenarioFileError([Problem(file, None, "", f"not valid YAML: {e}")]) from None
    if data is None:
        raise ScenarioFileError([Problem(file, 1, "", "empty file: a scenario needs at least "
                                                      "name, about and expect")])
    assert node is not None   # data is not None
    if not isinstance(data, dict):
        raise ScenarioFileError([Problem(file, node.start_mark.line + 1, "",
                                         "a scenario file is one YAML mapping (name: ..., "
                                         f"about: ...), not a {type(data).__name__}")])
    key_problems = _key_problems(file, node)
    if key_problems:
        raise ScenarioFileError(key_problems)
    lines: Dict[Path_, int] = {(): node.start_mark.line + 1}   # a missing top-level field
    _lines(node, (), lines)

    cases = data.pop("cases", None)
    if cases is None:
        return [validate_case(data, file, lines)]
    if not isinstance(cases, dict) or not cases:
        raise ScenarioFileError([Problem(file, lines.get(("cases",)), "cases",
                                         "must be a mapping of case id -> overrides")])
    out: List[Scenario] = []
    problems: List[Problem] = []
    for cid, over in cases.items():
        cid = str(cid)
        here = ("cases", cid)
        if not CASE_ID.match(cid):
            problems.append(Problem(file, lines.get(here), _field(here),
                                    "case id may use letters, digits, . _ = - only"))
            continue
        if over is None:
            over = {}
        if not isinstance(over, dict):
            problems.append(Problem(file, lines.get(here), _field(here),
                                    "a case is a mapping of fields that override the top level"))
            continue
        merged = _merge(data, over)
        merged["case"] = cid
        case_lines = {p: ln for p, ln in lines.items() if p[:1] != ("cases",)}
        _drop_replaced(case_lines, over)
        for p, ln in lines.items():
            if p[:2] == here and len(p) > 2:
                case_lines[p[2:]] = ln
        try:
            out.append(validate_case(merged, file, case_lines))
        except ScenarioFileError as e:
            for pr in e.problems:
                pr.field = f"cases.{cid}: {pr.field}" if pr.field else f"cases.{cid}"
            problems += e.problems
    if problems:
        raise ScenarioFileError(problems)
    return out


def load_file(path: Union[str, Path]) -> List[Scenario]:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ScenarioFileError([Problem(str(p), None, "", f"cannot read: {e}")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ScenarioFileError([Problem(str(p), line, "", f"not UTF-8 text: byte "
                                         f"{raw[e.start]:#04x} ({e.reason})")]) from None
    return load_text(text, str(p))


def json_schema() -> Dict[str, Any]:
    """JSON Schema of a scenario file (for editors), faults as a union of the registered kinds."""
    from typing import Annotated
    from typing import Union as U

    from pydantic import Field, create_model

    fault_union = U[tuple(FAULTS[k] for k in sorted(FAULTS))]  # type: ignore[valid-type]
    model = create_model(  # type: ignore[call-overload]
        "ScenarioFile", __base__=Scenario,
        faults=(List[Annotated[fault_union, Field(discriminator="kind")]], []),  # type: ignore
        cases=(Optional[Dict[str, Optional[Dict[str, Any]]]],
               Field(None, description="case id -> fields that override the top level; each "
                     "case is its own test")),
    )
    schema = model.model_json_schema()
    schema["title"] = "torchdist-harness scenario"
    schema.get("properties", {}).pop("case", None)
    return schema

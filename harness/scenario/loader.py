"""Loading: YAML text -> validated Scenario cases; every problem located as file:line: field.

Scenario files are user input and may be hostile (a billion laughs, 40,000 keys, a FIFO named
x.yaml): loading is linear in the file's size, with stated caps
(docs/reference/scenario-files.md, "Limits"), and every problem is one located line, never a
traceback or a hang. The passes:

1. read: at most ``MAX_FILE_BYTES`` + 1 bytes of a regular file (a FIFO, device or directory is
   refused without being read);
2. events: PyYAML's event stream is checked before anything is built: nesting depth, the number
   of nodes once every alias is expanded (each anchor's expanded size is recorded when its node
   ends and an alias adds that size, so a billion laughs is refused at the alias that crosses the
   cap without being walked), aliases to an anchor still open (a node inside itself), tags, a
   second document, lone UTF-16 surrogates;
3. only then is the document composed (parsed again: aliases are shared nodes, so this is
   linear too); keys are checked and each field's line recorded in one walk that visits every
   node once (an alias is not walked again); then it is constructed and validated by pydantic
   and the fault plugins, at most ``MAX_PROBLEMS`` problems reported.

libyaml's parser is used where PyYAML has it (ten times faster); PyYAML's own words the YAML
syntax errors.

``cases:`` expands one file into several scenarios, each case a deep-merged override of the
file's top level. Everything a run checks before it starts (fault models and their checks, the
item name, markers, the total number of processes) is checked here, so that ``harness validate``
and a pytest run accept exactly the same files.
"""

from __future__ import annotations

import copy
import itertools
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

import yaml
from pydantic import ValidationError
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import (
    AliasEvent,
    DocumentStartEvent,
    Event,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from ..core.rows import key_ok
from ..faults import REGISTRY
from ..launchers import launcher_kinds, launcher_of
from ..launchers.fields import field_problems
from ..net.safety import refuse_address
from .schema import (
    CASE_ID_RE,
    MAX_ADDR,
    MAX_NAME,
    MAX_WORLD,
    Scenario,
    init_url_parts,
)

Path_ = Tuple[str, ...]

# -- limits (docs/reference/scenario-files.md "Limits") -----------------------------------------
MAX_FILE_BYTES = 1 << 20   # 1 MiB: a scenario is a few KB
MAX_DEPTH = 20             # lists/mappings inside each other, aliases expanded (scenarios use 8)
MAX_NODES = 100_000        # YAML nodes once every alias is expanded
MAX_PROBLEMS = 50          # problems listed per file (then: "stopped after ...")
MAX_CASES = 256            # cases in one file
MAX_NUMBER_CHARS = 100     # characters of one number (int() refuses > 4300 digits)

CASE_ID = CASE_ID_RE       # kept for callers of the old name
_TAG = "tag:yaml.org,2002:"
ALLOWED_TAGS = {"!"} | {_TAG + t for t in ("str", "int", "float", "bool", "null", "map", "seq")}
SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass
class Problem:
    file: str
    line: Optional[int]
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        field = f"{self.field}: " if self.field else ""
        return one_line(f"{where}: {field}{self.message}")


def one_line(s: str) -> str:
    """Control characters (a newline in a key, a NUL in a file name) shown escaped: one line."""
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)


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


def _capped(file: str, problems: List[Problem]) -> List[Problem]:
    if len(problems) <= MAX_PROBLEMS:
        return problems
    return problems[:MAX_PROBLEMS] + [Problem(file, None, "", f"stopped after {MAX_PROBLEMS} "
                                              "problems: fix these first")]


# -- YAML: the parser's events, checked before anything is built -------------------------------

class _Resolver(Resolver):
    """YAML 1.1's implicit types, except dates (``about: 2024-01-01`` stays the text written; no
    field is a date) and ``=`` (a 'value' key PyYAML cannot construct)."""

    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers
                if tag not in (_TAG + "timestamp", _TAG + "value")]
        for first, resolvers in Resolver.yaml_implicit_resolvers.items()}


class _Constructor(SafeConstructor):
    file = "<string>"

    def _short_number(self, node: Any) -> None:   # the walk refuses them first; a backstop
        if len(node.value) > MAX_NUMBER_CHARS:
            raise ScenarioFileError([Problem(self.file, node.start_mark.line + 1, "",
                                             _long_number(node.value))])

    def construct_yaml_int(self, node: Any) -> int:
        self._short_number(node)
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node: Any) -> float:
        self._short_number(node)
        return super().construct_yaml_float(node)


_Constructor.add_constructor(_TAG + "int", _Constructor.construct_yaml_int)  # type: ignore
_Constructor.add_constructor(_TAG + "float", _Constructor.construct_yaml_float)  # type: ignore


class _Loader(Reader, Scanner, Parser, Composer, _Constructor, _Resolver):
    """PyYAML's pure-Python safe loader with this module's resolver and constructor."""

    def __init__(self, stream: str):
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        Composer.__init__(self)
        _Constructor.__init__(self)
        _Resolver.__init__(self)


_CParser = getattr(getattr(yaml, "_yaml", None), "CParser", None)   # libyaml, where built with it
_CLoader: Optional[type] = None
if _CParser is not None:
    class _CLoaderClass(_CParser, _Constructor, _Resolver):  # type: ignore[misc,valid-type]
        """libyaml's parser and composer, this module's resolver and constructor."""

        def __init__(self, stream: str):
            super().__init__(stream)  # type: ignore[call-arg]  # CParser's (calls no other)
            _Constructor.__init__(self)
            _Resolver.__init__(self)

    _CLoader = _CLoaderClass


class _Open:
    """A list or mapping still open in the event stream."""

    __slots__ = ("anchor", "size", "height", "is_map", "key_next", "key", "index")

    def __init__(self, anchor: Optional[str], is_map: bool):
        self.anchor = anchor
        self.size = 1          # nodes inside it so far, aliases expanded, itself included
        self.height = 1        # levels of nesting it holds
        self.is_map = is_map
        self.key_next = True   # in a mapping: the next node is a key
        self.key: Any = ""     # ... the latest key (the field path of what follows it)
        self.index = -1        # in a list: the position of the latest item


def _check_events(text: str, file: str, fast: bool = True) -> None:
    """One pass over the parser's events of ``text``: the first structural problems, located.

    The events come from libyaml's parser where there is one (ten times faster than PyYAML's);
    a YAML syntax error is then parsed again by PyYAML's, whose messages the catalogue of
    broken files was written against (see ``load_text``)."""
    parser: Any = _CLoader(text) if fast and _CLoader is not None else _Loader(text)
    problems: List[Problem] = []
    stack: List[_Open] = []
    top: Optional[_Open] = None                 # stack[-1]
    sizes: Dict[str, Tuple[int, int]] = {}     # closed anchor -> (expanded size, height)
    open_anchors: Set[str] = set()
    total = docs = 0

    def problem(ev: Event, msg: str, frames: Optional[List[_Open]] = None) -> Problem:
        line = ev.start_mark.line + 1 if ev.start_mark is not None else None
        path = [f.key if f.is_map else f.index for f in (stack if frames is None else frames)]
        return Problem(file, line, _field(path), msg)

    def stop(ev: Event, msg: str, frames: Optional[List[_Open]] = None) -> ScenarioFileError:
        return ScenarioFileError(problems + [problem(ev, msg, frames)])

    def deep(ev: Event, why: str = "") -> ScenarioFileError:
        return stop(ev, f"nested deeper than {MAX_DEPTH} levels (lists and mappings inside each "
                        f"other{why}): a scenario needs fewer than 10")

    get = parser.get_event
    try:
        while True:
            ev = get()
            cls = type(ev)
            if cls is MappingEndEvent or cls is SequenceEndEvent:
                done = stack.pop()
                if done.anchor is not None:
                    sizes[done.anchor] = (done.size, done.height)
                    open_anchors.discard(done.anchor)
                top = stack[-1] if stack else None
                if top is not None:
                    top.size += done.size
                    if done.height >= top.height:
                        top.height = done.height + 1
                continue
            if cls is StreamEndEvent:
                break
            if cls is DocumentStartEvent:
                docs += 1
                if docs > 1:
                    raise stop(ev, "a second YAML document ('---'): a scenario file is one YAML "
                                   "document (one scenario, with cases: for variants)")
                continue
            if cls is not ScalarEvent and cls is not AliasEvent and cls is not MappingStartEvent \
                    and cls is not SequenceStartEvent:
                continue   # stream and document ends
            if top is not None:   # where this node is: a mapping's key or value, a list's item
                if not top.is_map:
                    top.index += 1
                elif top.key_next:
                    top.key_next = False
                    if cls is ScalarEvent:
                        top.key = ev.value
                    elif cls is AliasEvent and not sizes.get(str(ev.anchor), (1, 0))[1]:
                        top.key = f"*{ev.anchor}"   # an alias to a plain value: a fine key
                    else:
                        what = (f"list or mapping (the alias *{ev.anchor})"
                                if cls is AliasEvent else
                                "mapping" if cls is MappingStartEvent else "list")
                        raise stop(ev, f"a {what} as a key: a key is a plain name (a field, a "
                                       "rank, a case id, a variable)", stack[:-1])
                else:
                    top.key_next = True
            if cls is AliasEvent:
                name = str(ev.anchor)
                if name in open_anchors:
                    raise stop(ev, f"the alias *{name} refers to itself (it is inside &{name}): "
                                   "the value would be infinitely deep")
                if name not in sizes:
                    raise stop(ev, f"undefined alias *{name}: no anchor &{name} before it")
                size, height = sizes[name]
                if len(stack) + height > MAX_DEPTH:
                    raise deep(ev, f", counting what *{name} holds")
            else:
                if ev.tag is not None and ev.tag not in ALLOWED_TAGS:
                    problems.append(problem(ev, f"YAML tag {_shown_tag(ev.tag)} is not "
                                                "supported: a scenario holds plain text, "
                                                "numbers, lists and mappings"))
                if cls is not ScalarEvent:
                    if len(stack) >= MAX_DEPTH:
                        raise deep(ev)
                    top = _Open(ev.anchor, cls is MappingStartEvent)
                    stack.append(top)
                    if ev.anchor is not None:
                        open_anchors.add(ev.anchor)
                    total += 1
                    if total > MAX_NODES:
                        raise stop(ev, f"more than {MAX_NODES} YAML nodes: a scenario file "
                                       f"holds at most {MAX_NODES}")
                    continue
                bad = SURROGATE.search(ev.value)
                if bad:
                    problems.append(problem(ev, f"\\u{ord(bad.group()):04x} is half of a "
                                                "UTF-16 surrogate pair, not a character (write "
                                                "the character itself)"))
                size, height = 1, 0
                if ev.anchor is not None:
                    sizes[ev.anchor] = (1, 0)
            total += size
            if top is not None:
                top.size += size
                if height >= top.height:
                    top.height = height + 1
            if total > MAX_NODES:
                if cls is AliasEvent:
                    raise stop(ev, f"aliases expand to more than {MAX_NODES} YAML nodes (*"
                                   f"{ev.anchor} is a copy of {size}): a 'billion laughs' file; "
                                   f"at most {MAX_NODES} nodes, each alias counted in full")
                raise stop(ev, f"more than {MAX_NODES} YAML nodes: a scenario file holds at most "
                               f"{MAX_NODES}")
            if len(problems) >= MAX_PROBLEMS:
                break
    finally:
        parser.dispose()
    if problems:
        raise ScenarioFileError(_capped(file, problems))


def _shown_tag(tag: str) -> str:
    return "!!" + tag[len(_TAG):] if tag.startswith(_TAG) else tag


def _yaml_error(text: str, file: str, e: yaml.YAMLError) -> ScenarioFileError:
    if isinstance(e, yaml.MarkedYAMLError):
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
        return ScenarioFileError([Problem(file, line, "", f"not valid YAML: {what}")])
    if isinstance(e, yaml.reader.ReaderError):   # a character YAML does not allow
        line = text.count("\n", 0, e.position) + 1
        char = chr(e.character) if isinstance(e.character, int) else str(e.character)
        return ScenarioFileError([Problem(file, line, "", f"not valid YAML: character {char!r} "
                                          f"is not allowed ({e.reason})")])
    return ScenarioFileError([Problem(file, None, "", f"not valid YAML: {e}")])


# -- keys and lines: one walk over the composed nodes, each node visited once ------------------

_BOOL, _NULL, _INT, _FLOAT, _MERGE = (_TAG + t for t in ("bool", "null", "int", "float", "merge"))
_PY_NAMES = {_TAG + "str": "str", _INT: "int", _FLOAT: "float", _BOOL: "bool"}


def _long_number(text: str) -> str:
    return f"a number of {len(text)} characters: at most {MAX_NUMBER_CHARS}"


def _number_as_written(text: str, tag: str) -> bool:
    """Whether the number YAML reads from ``text`` prints back as ``text`` (``1`` yes, ``0x10``,
    ``1_000``, ``010``, ``1.50``, ``.nan`` no)."""
    if tag == _INT:
        return re.fullmatch(r"-?(0|[1-9][0-9]*)", text) is not None
    try:
        return repr(float(text)) == text
    except ValueError:
        return False


def _walk(file: str, root: Node) -> Tuple[Dict[Path_, int], List[Problem]]:
    """The line of every field path, and the key problems: keys given twice (YAML would keep
    only the last), keys that are lists or mappings, and keys YAML reads as something else than
    the text written (``yes:``, ``~:``, ``0x10:``)."""
    lines: Dict[Path_, int] = {(): root.start_mark.line + 1}   # a missing top-level field
    problems: List[Problem] = []
    seen: Set[int] = set()

    def visit(node: Node, path: Tuple[Any, ...]) -> None:
        if id(node) in seen or len(problems) >= MAX_PROBLEMS:
            return
        seen.add(id(node))
        if isinstance(node, SequenceNode):
            at = tuple(str(x) for x in path)
            for i, item in enumerate(node.value):
                lines.setdefault(at + (str(i),), item.start_mark.line + 1)
                visit(item, path + (i,))
            return
        if isinstance(node, ScalarNode):
            if node.tag in (_INT, _FLOAT) and len(node.value) > MAX_NUMBER_CHARS:
                problems.append(Problem(file, node.start_mark.line + 1, _field(path),
                                        _long_number(node.value)))
            return
        if not isinstance(node, MappingNode):
            return
        first: Dict[str, int] = {}
        merged: List[Node] = []
        at = tuple(str(x) for x in path)
        for k, v in node.value:
            line = k.start_mark.line + 1
            if not isinstance(k, ScalarNode):
                what = "list" if isinstance(k, SequenceNode) else "mapping"
                problems.append(Problem(file, line, _field(path), f"a {what} as a key: a key is "
                                        "a plain name (a field, a rank, a case id, a variable)"))
                continue
            if k.tag == _MERGE:
                merged.append(v)
                continue
            key = str(k.value)
            here = path + (key,)
            if k.tag in (_BOOL, _NULL):
                problems.append(Problem(file, line, _field(here),
                                        f"YAML reads the key {key!r} as "
                                        f"{'a boolean' if k.tag == _BOOL else 'null'}, "
                                        f"not as text: quote it ('{key}') if you mean the name"))
            elif k.tag in (_INT, _FLOAT) and len(key) > MAX_NUMBER_CHARS:
                problems.append(Problem(file, line, _field(path), _long_number(key)))
            elif k.tag in (_INT, _FLOAT) and not _number_as_written(key, k.tag):
                problems.append(Problem(file, line, _field(here),
                                        f"YAML reads the key {key!r} as a number, not as the "
                                        f"text written: quote it ('{key}') if you mean the text"))
            if key in first:
                problems.append(Problem(file, line, _field(here),
                                        f"duplicate key {key!r} (first at line {first[key]}); "
                                        "YAML would silently keep only the last one"))
            else:
                first[key] = line
            lines.setdefault(at + (key,), line)
            visit(v, here)
        for v in merged:   # '<<: *base': its fields count as this mapping's (own keys win)
            for m in (v.value if isinstance(v, SequenceNode) else [v]):
                visit(m, path)

    visit(root, ())
    return lines, problems


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


def _field(loc: Sequence[Any]) -> str:
    out = ""
    for x in loc:
        if isinstance(x, int):
            out += f"[{x}]"
        else:
            s = str(x)
            s = s if s.isprintable() and s.strip() == s or s == "" else repr(s)
            out += f".{s}" if out else s
    return out


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


# -- one case --------------------------------------------------------------------------------

def item_name(scn: Scenario) -> str:
    """The pytest item name of a case: ``name[case,seed=N]``; ``harness list`` shows it too."""
    parts = [scn.case] if scn.case else []
    parts += [s for f in scn.faults if (s := f.id_suffix())]
    return f"{scn.name}[{','.join(parts)}]" if parts else scn.name


ITEM_NAME = re.compile(r"[A-Za-z0-9_.=-]+(\[[A-Za-z0-9_.=,-]+\])?", re.ASCII)


def _plan_problem(scn: Scenario) -> Optional[Tuple[Tuple[Any, ...], str]]:
    from ..run.plan import PlanRefusal, make_plan

    ports = itertools.count(20000)
    try:
        make_plan(scn, "/nonexistent/run-check", lambda: next(ports), netns=True,
                  run_id="check")
    except PlanRefusal as e:   # the plan says where
        return e.loc, str(e)[:300]
    except Exception as e:   # a late refusal the checks above missed: still one located line
        return (), f"a run could not be planned: {type(e).__name__}: {str(e)[:200]}"
    return None


def validate_case(data: Dict[str, Any], file: str,
                  lines: Union[Lines, Dict[Path_, int]]) -> Scenario:
    """One case's merged data -> Scenario, or ScenarioFileError with located problems."""
    lines = lines if isinstance(lines, Lines) else Lines(lines)
    problems: List[Problem] = []
    # faults first, each by its plugin's own model (found by kind): validated once, here, and
    # kept typed on the scenario
    typed: List[Any] = []
    raw_faults = data.get("faults")
    if isinstance(raw_faults, list):
        for i, spec in enumerate(raw_faults):
            loc: Tuple[Any, ...] = ("faults", i)
            if not isinstance(spec, dict):
                typed.append(spec)      # the scenario's own validation says what is wrong
                continue
            kind = spec.get("kind")
            if not isinstance(kind, str):
                where = loc + ("kind",)
                problems.append(Problem(file, lines.line_of(where), _field(where),
                                        "required field is missing" if "kind" not in spec
                                        else "a fault's kind is a name (text)"))
                continue
            cls = REGISTRY.get(kind)
            if cls is None:
                problems.append(Problem(file, lines.line_of(loc + ("kind",)),
                                        _field(loc + ("kind",)),
                                        f"unknown fault kind {kind[:60]!r} (known: "
                                        f"{', '.join(REGISTRY.kinds())})"))
                continue
            try:
                typed.append(cls.model_validate(spec))
            except ValidationError as e:
                ps = _pydantic_problems(file, lines, e, data, loc)
                for p in ps:
                    if p.message.startswith("unknown field"):
                        p.message += f" of {kind} (known: {_known_fields(cls)})"
                problems += ps
    # the launcher, by its kind's own model (located like a fault)
    typed_launcher: Any = None
    raw_launcher = data.get("launcher")
    if raw_launcher is not None:
        spec = launcher_of(raw_launcher)
        kinds = launcher_kinds()
        kind = spec.get("kind", "direct") if isinstance(spec, dict) else None
        where = ("launcher", "kind") if isinstance(raw_launcher, dict) else ("launcher",)
        if not isinstance(spec, dict):
            problems.append(Problem(file, lines.line_of(("launcher",)), "launcher",
                                    f"a launcher is a name ({', '.join(kinds)}) or a mapping "
                                    "with kind and its options"))
        elif not isinstance(kind, str) or kind not in kinds:
            problems.append(Problem(file, lines.line_of(where), _field(where),
                                    f"unknown launcher {str(kind)[:60]!r} (known: "
                                    f"{', '.join(kinds)})"))
        else:
            try:
                typed_launcher = kinds[kind].model_validate(spec)
            except ValidationError as e:
                ps = _pydantic_problems(file, lines, e, data, ("launcher",))
                for p in ps:
                    if p.message.startswith("unknown field"):
                        p.message += f" of launcher {kind} (known: " \
                            f"{_known_fields(kinds[kind])})"
                    # a case's launcher is the file's merged with its own: say which part
                    # came from the top level
                    p.message += lines.merged_note(tuple(p.field.split(".")))
                problems += ps
    merged = dict(data)
    if isinstance(raw_faults, list):
        merged["faults"] = typed
    if typed_launcher is not None:
        merged["launcher"] = typed_launcher
    elif raw_launcher is not None:
        merged.pop("launcher")
    try:
        scn = Scenario.model_validate(merged)
    except ValidationError as e:
        ps = _pydantic_problems(file, lines, e, data)
        for p in ps:
            if p.message.startswith("unknown field") and "." not in p.field \
                    and "[" not in p.field:
                p.message += f" (known: {_known_fields(Scenario)}, cases)"
        raise ScenarioFileError(_capped(file, problems + ps)) from None
    if problems:
        raise ScenarioFileError(_capped(file, problems))

    scn._source = file
    # every field the case sets is one its launcher honours with its program kind (the table
    # harness.launchers.fields), else refused where it is written (null: not set)
    for name, msg in field_problems(scn, [k for k, v in data.items()
                                          if k != "case" and v is not None]):
        problems.append(Problem(file, lines.line_of((name,)), name,
                                msg + lines.merged_note((name,))))
    # the launcher's and the program's own checks (they see the whole scenario)
    for where, msg in scn.launcher.check(scn):
        loc = ("launcher",) + where
        problems.append(Problem(file, lines.line_of(loc), _field(loc),
                                msg + lines.merged_note(loc)))
    if scn.program is not None:
        why = scn.program.problem(file)
        if why:
            loc = ("program", "script") if scn.program.script else ("program",)
            problems.append(Problem(file, lines.line_of(loc), _field(loc), why))

    # each fault's own checks (it sees the whole scenario)
    extra: List[Tuple[Tuple[Any, ...], int, str]] = []   # (where, processes added, kind)
    for i, fault in enumerate(scn.faults):
        loc = ("faults", i)
        for where, msg in fault.check(scn):
            problems.append(Problem(file, lines.line_of(loc + where), _field(loc + where), msg))
        added = fault.extra_labels(scn)
        if added:
            where = ("world_size",) if "world_size" in fault.model_fields_set else ("kind",)
            extra.append((loc + where, len(added), fault.kind))

    # limits on the whole run: every process counts (ranks on all hosts, ranks faults add)
    total = scn.world_size + sum(n for _, n, _ in extra)
    if extra and total > MAX_WORLD:
        where, n, kind = extra[-1]
        problems.append(Problem(file, lines.line_of(where), _field(where),
                                f"the run would start {total} processes ({scn.world_size} ranks "
                                f"+ {total - scn.world_size} of {kind}): at most {MAX_WORLD}"))

    # expectations may only name processes a run can have; each keeps the line it came from,
    # so that a failed one names file.yaml:LINE
    row_sets = scn.row_sets()
    for j, block in enumerate(scn.expect):
        block._line = lines.line_of(_yaml_loc(data, ("expect", j)))
        if block.job is not None:
            block._job_line = lines.line_of(_yaml_loc(data, ("expect", j, "job")))
        if block.counters:
            block._counters_line = lines.line_of(_yaml_loc(data, ("expect", j, "counters")))
        if block.tally:
            block._tally_line = lines.line_of(_yaml_loc(data, ("expect", j, "tally")))
        for key in block.tally:
            yloc = _yaml_loc(data, ("expect", j, "tally", key))
            why = key_ok(key, row_sets)
            if why:
                problems.append(Problem(file, lines.line_of(yloc), _field(yloc), why))
        for key, rank_expect in block.ranks.items():
            yloc = _yaml_loc(data, ("expect", j, "ranks", key))
            rank_expect._line = lines.line_of(yloc)
            why = key_ok(key, row_sets)
            if why and key.isdigit() and scn.launcher.STARTS_RANKS:
                why = (f"rank {key[:40]} is outside the world (world_size "
                       f"{scn.world_size}: ranks 0..{scn.world_size - 1})")
            if why:
                problems.append(Problem(file, lines.line_of(yloc), _field(yloc), why))

    # addresses: bare, and only where the harness may send traffic
    suggest = REGISTRY.kind_for("a name that does not resolve")
    why = refuse_address(scn.master_addr, unresolvable=suggest)
    if why:
        problems.append(Problem(file, lines.line_of(("master_addr",)), "master_addr", why))
    if "MASTER_ADDR" in scn.env:
        addr = scn.env["MASTER_ADDR"]
        # a name the run's own hosts files give (a host's own name, a names: entry) resolves
        # only to the run's addresses or loopback: the hosts ask no one else
        own = {n.lower() for n in scn.hosts_file_names()}
        why = (f"an address of {len(addr)} characters: at most {MAX_ADDR}"
               if len(addr) > MAX_ADDR
               else None if addr.lower() in own else refuse_address(addr, unresolvable=suggest))
        if why:
            problems.append(Problem(file, lines.line_of(("env", "MASTER_ADDR")),
                                    "env.MASTER_ADDR", why))

    if scn.init_url is not None:
        _scheme, host, _path = init_url_parts(scn.init_url)   # {addr} stands as 127.0.0.1
        if host:
            why = refuse_address(host, unresolvable=suggest)
            if why:
                problems.append(Problem(file, lines.line_of(("init_url",)), "init_url", why))

    # what the pytest front door builds from the case: its item name (test id), and the plan
    # the run would make (pure: ports from a counter, nothing started); whatever either
    # refuses is refused here, not after collection
    if not problems and not ITEM_NAME.fullmatch(item_name(scn)):
        problems.append(Problem(file, lines.line_of(("name",)), "name", f"the test id "
                                f"{item_name(scn)[:80]!r} is not plain ASCII"))
    if not problems:
        refused = _plan_problem(scn)
        if refused:
            loc, why = refused
            problems.append(Problem(file, lines.line_of(loc), _field(loc) if loc else "", why))
    if problems:
        raise ScenarioFileError(_capped(file, problems))
    return scn


# -- a file ----------------------------------------------------------------------------------

def load_text(text: str, file: str = "<string>") -> List[Scenario]:
    """Parse and validate one scenario file's text into its cases."""
    if len(text) > MAX_FILE_BYTES // 4 and len(text.encode("utf-8", "surrogatepass")) \
            > MAX_FILE_BYTES:
        raise ScenarioFileError([_too_big(file)])
    # libyaml takes UTF-8: a lone surrogate (from a caller's str) goes to PyYAML, which says
    # where it is
    fast = _CLoader is not None and SURROGATE.search(text) is None
    try:
        try:
            _check_events(text, file, fast)
        except yaml.YAMLError as fast_error:
            if not fast:
                raise
            _check_events(text, file, fast=False)   # PyYAML's own message, where it finds it
            raise fast_error from None
        # checked: now composing (aliases are shared, not copied) is linear and bounded
        composer: Any = (_CLoader if fast and _CLoader is not None else _Loader)(text)
        composer.file = file
        try:
            node = composer.get_single_node()
        finally:
            composer.dispose()
    except yaml.YAMLError as e:
        raise _yaml_error(text, file, e) from None
    if node is None or (isinstance(node, ScalarNode) and node.tag == _NULL):
        raise ScenarioFileError([Problem(file, 1, "", "empty file: a scenario needs at least "
                                                      "name, about and expect")])
    if not isinstance(node, MappingNode):
        what = "list" if isinstance(node, SequenceNode) else \
            _PY_NAMES.get(str(node.tag), "single value")
        raise ScenarioFileError([Problem(file, node.start_mark.line + 1, "",
                                         "a scenario file is one YAML mapping (name: ..., "
                                         f"about: ...), not a {what}")])
    lines, key_problems = _walk(file, node)
    if key_problems:
        raise ScenarioFileError(_capped(file, key_problems))
    try:
        data = composer.construct_document(node)
    except yaml.YAMLError as e:
        raise _yaml_error(text, file, e) from None
    if not isinstance(data, dict):   # cannot happen for a mapping node; kept as a guard
        raise ScenarioFileError([Problem(file, node.start_mark.line + 1, "",
                                         "a scenario file is one YAML mapping")])

    if "case" in data:   # a field of the model, set by the loader: not the file's to give
        raise ScenarioFileError([Problem(file, lines.get(("case",)), "case", "set from cases: "
                                         "(the case id); write cases: {id: {...}} for variants")])
    cases = data.pop("cases", None)
    if cases is None:
        return [validate_case(data, file, Lines(lines))]
    if not isinstance(cases, dict) or not cases:
        raise ScenarioFileError([Problem(file, lines.get(("cases",)), "cases",
                                         "must be a mapping of case id -> overrides")])
    if len(cases) > MAX_CASES:
        raise ScenarioFileError([Problem(file, lines.get(("cases",)), "cases",
                                         f"{len(cases)} cases: at most {MAX_CASES} in one file")])
    out: List[Scenario] = []
    problems: List[Problem] = []
    for cid, over in cases.items():
        if len(problems) >= MAX_PROBLEMS:
            break
        cid = str(cid)
        here = ("cases", cid)
        if len(cid) > MAX_NAME:
            problems.append(Problem(file, lines.get(here), _field(here),
                                    f"a case id of {len(cid)} characters: at most {MAX_NAME} (it "
                                    "is part of the test id and of a folder name)"))
            continue
        if not CASE_ID_RE.fullmatch(cid):
            problems.append(Problem(file, lines.get(here), _field(here),
                                    "case id may use letters, digits, . _ = - only, starting "
                                    "with a letter, digit or _"))
            continue
        if over is None:
            over = {}
        if not isinstance(over, dict):
            problems.append(Problem(file, lines.get(here), _field(here),
                                    "a case is a mapping of fields that override the top level"))
            continue
        if "case" in over:
            problems.append(Problem(file, lines.get(here + ("case",)), _field(here + ("case",)),
                                    "set from the case id: not a field a case gives"))
            continue
        merged = _merge(data, over)
        merged["case"] = cid
        try:
            out.append(validate_case(merged, file, Lines(lines, cid, over)))
        except ScenarioFileError as e:
            for pr in e.problems:
                if pr.line is None and pr.message.startswith("stopped after"):
                    continue
                pr.field = f"cases.{cid}: {pr.field}" if pr.field else f"cases.{cid}"
                problems.append(pr)
    if problems:
        raise ScenarioFileError(_capped(file, problems))
    return out


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    return copy.deepcopy(over)


def _too_big(file: str) -> Problem:
    return Problem(file, None, "", f"larger than {MAX_FILE_BYTES} bytes: a scenario file holds "
                                   f"at most {MAX_FILE_BYTES} (1 MiB)")


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def read_limited(path: Union[str, Path]) -> bytes:
    """The bytes of a regular file of at most MAX_FILE_BYTES; anything else is a located
    problem, found without reading more than MAX_FILE_BYTES + 1 bytes (and a FIFO not at all)."""
    shown = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ScenarioFileError([Problem(shown, None, "", f"cannot read: {e}")]) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a plain file")
            raise ScenarioFileError([Problem(shown, None, "", f"not a regular file ({kind}): "
                                                              "a scenario is a YAML file")])
        if st.st_size > MAX_FILE_BYTES:
            raise ScenarioFileError([_too_big(shown)])
        chunks: List[bytes] = []
        n = 0
        while n <= MAX_FILE_BYTES:
            b = os.read(fd, min(1 << 16, MAX_FILE_BYTES + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
        if n > MAX_FILE_BYTES:   # it grew while read
            raise ScenarioFileError([_too_big(shown)])
        return b"".join(chunks)
    except OSError as e:
        raise ScenarioFileError([Problem(shown, None, "", f"cannot read: {e}")]) from None
    finally:
        os.close(fd)


def load_file(path: Union[str, Path]) -> List[Scenario]:
    p = Path(path)
    raw = read_limited(p)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        hint = ""
        if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
            hint = " (a UTF-16 file: save it as UTF-8)"
        raise ScenarioFileError([Problem(str(p), line, "", f"not UTF-8 text: byte "
                                         f"{raw[e.start]:#04x} ({e.reason}){hint}")]) from None
    return load_text(text, str(p))


def json_schema() -> Dict[str, Any]:
    """JSON Schema of a scenario file (for editors), faults as a union of the registered kinds."""
    from typing import Annotated
    from typing import Union as U

    from pydantic import Field, create_model

    fault_union = U[tuple(cls for _, cls in REGISTRY.items())]  # type: ignore[valid-type]
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

"""The YAML side of loading a scenario file (:mod:`harness.scenario.loader`), bounded whatever
the file holds: PyYAML's (or libyaml's) event stream checked before anything is built, the
loaders that then compose and construct the document, the located words of a YAML syntax
error, and one walk over the composed nodes that records the line of every field and finds the
keys YAML would read otherwise than written.

The events pass (:func:`_check_events`) checks nesting depth, the number of nodes once every
alias is expanded (each anchor's expanded size is recorded when its node ends and an alias adds
that size, so a billion laughs is refused at the alias that crosses the cap without being
walked), aliases to an anchor still open (a node inside itself), tags, a second document and
lone UTF-16 surrogates.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Set, Tuple

import yaml
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

from .problems import MAX_PROBLEMS, Path_, Problem, ScenarioFileError, _capped, _field

MAX_DEPTH = 20             # lists/mappings inside each other, aliases expanded (scenarios use 8)
MAX_NODES = 100_000        # YAML nodes once every alias is expanded
MAX_NUMBER_CHARS = 100     # characters of one number (int() refuses > 4300 digits)

_TAG = "tag:yaml.org,2002:"
ALLOWED_TAGS = {"!"} | {_TAG + t for t in ("str", "int", "float", "bool", "null", "map", "seq")}
SURROGATE = re.compile("[\ud800-\udfff]")


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


class _EventCheck:
    """The state of one pass over a file's events (:func:`_check_events`): the open lists and
    mappings, the closed anchors' expanded sizes, the nodes so far, the problems found."""

    __slots__ = ("file", "problems", "stack", "sizes", "open_anchors", "total")

    def __init__(self, file: str):
        self.file = file
        self.problems: List[Problem] = []
        self.stack: List[_Open] = []
        self.sizes: Dict[str, Tuple[int, int]] = {}   # closed anchor -> (expanded size, height)
        self.open_anchors: Set[str] = set()
        self.total = 0

    def problem(self, ev: Event, msg: str, frames: Optional[List[_Open]] = None) -> Problem:
        line = ev.start_mark.line + 1 if ev.start_mark is not None else None
        path = [f.key if f.is_map else f.index for f in (self.stack if frames is None else frames)]
        return Problem(self.file, line, _field(path), msg)

    def stop(self, ev: Event, msg: str, frames: Optional[List[_Open]] = None
             ) -> ScenarioFileError:
        return ScenarioFileError(self.problems + [self.problem(ev, msg, frames)])

    def deep(self, ev: Event, why: str = "") -> ScenarioFileError:
        return self.stop(ev, f"nested deeper than {MAX_DEPTH} levels (lists and mappings inside "
                             f"each other{why}): a scenario needs fewer than 10")

    def close(self) -> Optional[_Open]:
        """A list or mapping ends: its size and height go to the one around it (the new
        top, returned)."""
        done = self.stack.pop()
        if done.anchor is not None:
            self.sizes[done.anchor] = (done.size, done.height)
            self.open_anchors.discard(done.anchor)
        top = self.stack[-1] if self.stack else None
        if top is not None:
            top.size += done.size
            if done.height >= top.height:
                top.height = done.height + 1
        return top

    def place(self, top: _Open, ev: Any, cls: type) -> None:
        """Where this node is in ``top``: a mapping's key or value, a list's item."""
        if not top.is_map:
            top.index += 1
        elif top.key_next:
            top.key_next = False
            if cls is ScalarEvent:
                top.key = ev.value
            elif cls is AliasEvent and not self.sizes.get(str(ev.anchor), (1, 0))[1]:
                top.key = f"*{ev.anchor}"   # an alias to a plain value: a fine key
            else:
                what = (f"list or mapping (the alias *{ev.anchor})"
                        if cls is AliasEvent else
                        "mapping" if cls is MappingStartEvent else "list")
                raise self.stop(ev, f"a {what} as a key: a key is a plain name (a field, a "
                                    "rank, a case id, a variable)", self.stack[:-1])
        else:
            top.key_next = True

    def alias(self, ev: Any) -> Tuple[int, int]:
        """(size, height) of what an alias stands for, once it is known and not too deep."""
        name = str(ev.anchor)
        if name in self.open_anchors:
            raise self.stop(ev, f"the alias *{name} refers to itself (it is inside &{name}): "
                                "the value would be infinitely deep")
        if name not in self.sizes:
            raise self.stop(ev, f"undefined alias *{name}: no anchor &{name} before it")
        size, height = self.sizes[name]
        if len(self.stack) + height > MAX_DEPTH:
            raise self.deep(ev, f", counting what *{name} holds")
        return size, height

    def open(self, ev: Any, cls: type) -> _Open:
        """A list or mapping starts: the new top."""
        if len(self.stack) >= MAX_DEPTH:
            raise self.deep(ev)
        top = _Open(ev.anchor, cls is MappingStartEvent)
        self.stack.append(top)
        if ev.anchor is not None:
            self.open_anchors.add(ev.anchor)
        self.total += 1
        if self.total > MAX_NODES:
            raise self.stop(ev, f"more than {MAX_NODES} YAML nodes: a scenario file "
                                f"holds at most {MAX_NODES}")
        return top

    def scalar(self, ev: Any) -> Tuple[int, int]:
        bad = SURROGATE.search(ev.value)
        if bad:
            self.problems.append(self.problem(ev, f"\\u{ord(bad.group()):04x} is half of a "
                                                  "UTF-16 surrogate pair, not a character "
                                                  "(write the character itself)"))
        if ev.anchor is not None:
            self.sizes[ev.anchor] = (1, 0)
        return 1, 0

    def count(self, top: Optional[_Open], ev: Any, cls: type, size: int, height: int) -> None:
        """A scalar or an alias of ``size`` nodes: counted in ``top`` and in the file."""
        self.total += size
        if top is not None:
            top.size += size
            if height >= top.height:
                top.height = height + 1
        if self.total > MAX_NODES:
            if cls is AliasEvent:
                raise self.stop(ev, f"aliases expand to more than {MAX_NODES} YAML nodes (*"
                                    f"{ev.anchor} is a copy of {size}): a 'billion laughs' "
                                    f"file; at most {MAX_NODES} nodes, each alias counted in "
                                    "full")
            raise self.stop(ev, f"more than {MAX_NODES} YAML nodes: a scenario file holds at "
                                f"most {MAX_NODES}")


def _check_events(text: str, file: str, fast: bool = True) -> None:
    """One pass over the parser's events of ``text``: the first structural problems, located.

    The events come from libyaml's parser where there is one (ten times faster than PyYAML's);
    a YAML syntax error is then parsed again by PyYAML's, whose messages the catalogue of
    broken files was written against (see ``load_text``)."""
    parser: Any = _CLoader(text) if fast and _CLoader is not None else _Loader(text)
    check = _EventCheck(file)
    top: Optional[_Open] = None                 # check.stack[-1]
    docs = 0
    get = parser.get_event
    try:
        while True:
            ev = get()
            cls = type(ev)
            if cls is MappingEndEvent or cls is SequenceEndEvent:
                top = check.close()
                continue
            if cls is StreamEndEvent:
                break
            if cls is DocumentStartEvent:
                docs += 1
                if docs > 1:
                    raise check.stop(ev, "a second YAML document ('---'): a scenario file is "
                                         "one YAML document (one scenario, with cases: for "
                                         "variants)")
                continue
            if cls is not ScalarEvent and cls is not AliasEvent and cls is not MappingStartEvent \
                    and cls is not SequenceStartEvent:
                continue   # stream and document ends
            if top is not None:   # where this node is: a mapping's key or value, a list's item
                check.place(top, ev, cls)
            if cls is AliasEvent:
                size, height = check.alias(ev)
            else:
                if ev.tag is not None and ev.tag not in ALLOWED_TAGS:
                    check.problems.append(check.problem(
                        ev, f"YAML tag {_shown_tag(ev.tag)} is not supported: a scenario holds "
                            "plain text, numbers, lists and mappings"))
                if cls is not ScalarEvent:
                    top = check.open(ev, cls)
                    continue
                size, height = check.scalar(ev)
            check.count(top, ev, cls, size, height)
            if len(check.problems) >= MAX_PROBLEMS:
                break
    finally:
        parser.dispose()
    if check.problems:
        raise ScenarioFileError(_capped(file, check.problems))


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



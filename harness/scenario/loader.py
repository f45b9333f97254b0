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

The passes have modules of their own: :mod:`harness.scenario.yamlcheck` (the events, the
loaders, the walk over the nodes), :mod:`harness.scenario.locate` (lines of field paths,
pydantic's errors located), :mod:`harness.scenario.cases` (one case validated) and
:mod:`harness.scenario.problems` (``Problem``, ``ScenarioFileError``). This module reads a file
and its cases, and every name callers imported from it before the split is still here.
"""

from __future__ import annotations

import copy
import os
import stat
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import yaml
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from ..faults import REGISTRY
from .cases import ITEM_NAME as ITEM_NAME
from .cases import item_name as item_name
from .cases import validate_case
from .locate import Lines
from .problems import MAX_PROBLEMS, Path_, Problem, ScenarioFileError, _capped, _field
from .problems import one_line as one_line
from .schema import CASE_ID_RE, MAX_NAME, Scenario
from .yamlcheck import (
    _NULL,
    _PY_NAMES,
    SURROGATE,
    _check_events,
    _CLoader,
    _Loader,
    _walk,
    _yaml_error,
)
from .yamlcheck import MAX_DEPTH as MAX_DEPTH
from .yamlcheck import MAX_NODES as MAX_NODES
from .yamlcheck import MAX_NUMBER_CHARS as MAX_NUMBER_CHARS

# -- limits (docs/reference/scenario-files.md "Limits"; the YAML's: scenario/yamlcheck.py) -------
MAX_FILE_BYTES = 1 << 20   # 1 MiB: a scenario is a few KB
MAX_CASES = 256            # cases in one file

CASE_ID = CASE_ID_RE       # kept for callers of the old name


# -- a file ----------------------------------------------------------------------------------

def load_text(text: str, file: str = "<string>") -> List[Scenario]:
    """Parse and validate one scenario file's text into its cases."""
    data, lines = _mapping_of(text, file)
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
    return _cases(data, cases, file, lines)


def _mapping_of(text: str, file: str) -> Tuple[Dict[Any, Any], Dict[Path_, int]]:
    """The file's one YAML mapping, checked before it is built, and the line of every field
    path in it."""
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
    return data, lines


def _cases(data: Dict[Any, Any], cases: Dict[Any, Any], file: str,
           lines: Dict[Path_, int]) -> List[Scenario]:
    """Each case: the file's top level deep-merged with the case's overrides, validated; its
    problems named after it."""
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
    from typing import Annotated, Literal
    from typing import Union as U

    from pydantic import Field, create_model

    from ..launchers import launcher_kinds

    fault_union = U[tuple(cls for _, cls in REGISTRY.items())]  # type: ignore[valid-type]
    # a launcher is a kind's name or a mapping of one kind's fields (kind: direct when left
    # out), as harness.launchers.launcher_of reads it: not the base model's {kind} alone
    kinds = launcher_kinds()
    launcher_union = U[(Literal[tuple(kinds)], *kinds.values())]  # type: ignore[valid-type]
    launcher_field = Scenario.model_fields["launcher"]
    model = create_model(  # type: ignore[call-overload]
        "ScenarioFile", __base__=Scenario,
        faults=(List[Annotated[fault_union, Field(discriminator="kind")]], []),  # type: ignore
        launcher=(launcher_union,  # type: ignore[arg-type]
                  Field("direct", description=launcher_field.description)),
        cases=(Optional[Dict[str, Optional[Dict[str, Any]]]],
               Field(None, description="case id -> fields that override the top level; each "
                     "case is its own test")),
    )
    schema = model.model_json_schema()
    schema["title"] = "torchdist-harness scenario"
    schema.get("properties", {}).pop("case", None)
    return schema

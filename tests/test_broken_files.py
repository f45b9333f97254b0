"""Malformed scenario files: each is one located, short error (file:line: field: message).

The catalogue is tests/data/broken/: every file says in its first three comment lines the line,
the field path and a pattern of the message its first problem must have. Hypothesis and faker
then break a valid scenario one field at a time and check that the error points at the line
that was broken. Last, pytest itself: a scenarios/ folder with broken files gives one located
collection error per file, and the valid scenario still runs (with and without xdist).
"""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import yaml
from faker import Faker
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.scenario.loader import ScenarioFileError, load_file, load_text
from harness.scenario.schema import STEP_RE

BROKEN = Path(__file__).parent / "data" / "broken"
HEADER = re.compile(r"^# (line|field|message): ?(.*)$", re.M)


def expectation(path: Path) -> Tuple[int, str, str]:
    hdr = dict(HEADER.findall(path.read_text(encoding="utf-8", errors="replace")))
    return int(hdr["line"]), hdr["field"].strip(), hdr["message"]


def error_of(path: Path) -> ScenarioFileError:
    with pytest.raises(ScenarioFileError) as e:
        load_file(path)
    return e.value


BROKEN_FILES = sorted(BROKEN.glob("*.yaml"))


def test_the_catalogue_is_not_empty():
    assert len(BROKEN_FILES) >= 40


@pytest.mark.parametrize("path", BROKEN_FILES, ids=lambda p: p.stem)
def test_first_problem_names_the_line(path):
    line, _, _ = expectation(path)
    assert error_of(path).problems[0].line == line


@pytest.mark.parametrize("path", BROKEN_FILES, ids=lambda p: p.stem)
def test_first_problem_names_the_field_path(path):
    _, field, _ = expectation(path)
    assert error_of(path).problems[0].field == field


@pytest.mark.parametrize("path", BROKEN_FILES, ids=lambda p: p.stem)
def test_first_problem_says_what_is_wrong(path):
    _, _, message = expectation(path)
    assert re.search(message, error_of(path).problems[0].message)


@pytest.mark.parametrize("path", BROKEN_FILES, ids=lambda p: p.stem)
def test_error_text_is_one_or_two_lines_starting_with_file_and_line(path):
    line, _, _ = expectation(path)
    text = str(error_of(path))
    assert 1 <= len(text.splitlines()) <= 2
    assert text.startswith(f"{path}:{line}: ")
    assert "Traceback" not in text


def test_zero_byte_file_is_empty_at_line_1(tmp_path):
    p = tmp_path / "empty.yaml"
    p.write_text("")
    first = error_of(p).problems[0]
    assert (first.line, first.field) == (1, "") and "empty file" in first.message


def test_whitespace_only_file_is_empty(tmp_path):
    p = tmp_path / "blank.yaml"
    p.write_text("\n\n   \n")
    assert "empty file" in error_of(p).problems[0].message


def test_file_that_is_not_utf8_is_located_at_the_bad_byte(tmp_path):
    p = tmp_path / "latin1.yaml"
    p.write_bytes(b"name: a\nabout: caf\xe9 au lait\n")
    first = error_of(p).problems[0]
    assert first.line == 2 and "not UTF-8" in first.message


def test_several_problems_in_one_file_are_all_listed_in_order():
    text = ("name: two\nabout: x\nworld_size: 2\nfaults:\n  - kind: delayed_rank\n"
            "    delay: 1\n    ranks: [3]\nexpect:\n  ranks:\n    4: ok\n")
    with pytest.raises(ScenarioFileError) as e:
        load_text(text, "two.yaml")
    assert [(p.line, p.field) for p in e.value.problems] == \
        [(7, "faults[0].ranks[0]"), (10, "expect.ranks.4")]


# -- generated: one valid scenario, one field broken -------------------------------------------

BASE: Dict[str, Any] = {
    "name": "mutant",
    "about": "a valid scenario that one mutation breaks",
    "backend": "gloo",
    "world_size": 2,
    "init": "env",
    "timeout": 5.0,
    "deadline": 30.0,
    "master_addr": "127.0.0.1",
    "env": {"GLOO_SOCKET_IFNAME": "lo"},
    "workload": {"steps": ["barrier", "all_reduce"], "destroy": True},
    "faults": [{"kind": "delayed_rank", "ranks": [1], "delay": 2.0}],
    "expect": {"job": ["ok"],
               "ranks": {"0": {"outcome": ["ok"], "exception": "RuntimeError",
                               "message": "clients joined", "within": [0.0, 20.0],
                               "phase": "exit"}}},
    "marks": ["slow"],
}

# every leaf of BASE and what kind of value it holds
LEAVES: List[Tuple[Tuple[Any, ...], str]] = [
    (("name",), "str"), (("about",), "str"), (("backend",), "literal"),
    (("world_size",), "int"), (("init",), "literal"), (("timeout",), "float"),
    (("deadline",), "float"), (("master_addr",), "str"),
    (("env", "GLOO_SOCKET_IFNAME"), "env"),
    (("workload", "steps", 0), "step"), (("workload", "steps", 1), "step"),
    (("workload", "destroy"), "bool"),
    (("faults", 0, "ranks", 0), "int"), (("faults", 0, "delay"), "float"),
    (("expect", "job", 0), "literal"), (("expect", "ranks", "0", "outcome", 0), "literal"),
    (("expect", "ranks", "0", "exception"), "str"), (("expect", "ranks", "0", "message"), "str"),
    (("expect", "ranks", "0", "within", 0), "float"),
    (("expect", "ranks", "0", "within", 1), "float"),
    (("expect", "ranks", "0", "phase"), "phase"), (("marks", 0), "marker"),
]

# mappings of BASE that are models (an unknown key there is an unknown field), and their fields
MAPPINGS: List[Tuple[Tuple[Any, ...], set]] = [
    ((), set(BASE) | {"cases", "case", "hosts", "nodes", "ranks_per_node", "master_host",
                      "isolate"}),
    (("workload",), {"steps", "destroy"}),
    (("faults", 0), {"kind", "ranks", "delay"}),
    (("expect",), {"torch", "job", "ranks"}),
    (("expect", "ranks", "0"), {"outcome", "exception", "message", "within", "phase"}),
]

YAML_SPECIAL = {"yes", "no", "on", "off", "true", "false", "null", "y", "n", "~"}
PYDANTIC_BOOL_WORDS = {"0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"}


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def wrong_for(kind: str, text: str, number: int, nested: Any) -> Any:
    """A value that ``kind`` does not accept, made of hypothesis's (or faker's) ingredients."""
    if kind == "str":
        return nested if nested is not None else number
    if kind == "env":   # numbers are fine in env (they become text); lists and booleans are not
        return nested if nested is not None else bool(number % 2)
    if kind in ("int", "float"):
        if text and not _is_number(text):
            return text
        return nested if nested is not None else [number]
    if kind == "literal":
        return text + "_x" if text else number
    if kind == "bool":
        if text and text.lower() not in PYDANTIC_BOOL_WORDS:
            return text
        return abs(number) + 2   # 0 and 1 are booleans to pydantic
    if kind == "step":
        return text if text and not STEP_RE.match(text) else number
    if kind == "marker":
        return f"{text} x"
    if kind == "phase":   # a phase name or a list of them: never a number or a mapping
        return {"x": number}
    raise AssertionError(kind)


def set_at(data: Dict[str, Any], path: Tuple[Any, ...], value: Any) -> Dict[str, Any]:
    out = copy.deepcopy(data)
    node: Any = out
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return out


def dump(data: Dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=10 ** 6,
                          allow_unicode=True)


def yaml_line(text: str, path: Tuple[Any, ...]) -> int:
    """The line of ``path`` in ``text`` as a reader sees it: a key's line, or a list item's."""
    node = yaml.compose(text)
    line = node.start_mark.line + 1
    for k in path:
        if isinstance(node, yaml.MappingNode):
            key, node = next((kn, vn) for kn, vn in node.value if kn.value == str(k))
            line = key.start_mark.line + 1
        else:
            node = node.value[k]
            line = node.start_mark.line + 1
    return line


def field_path(path: Tuple[Any, ...]) -> str:
    out = ""
    for k in path:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out


def first_problem(text: str):
    with pytest.raises(ScenarioFileError) as e:
        load_text(text, "mutant.yaml")
    return e.value.problems[0]


def test_the_base_of_the_mutations_is_valid():
    (scn,) = load_text(dump(BASE), "base.yaml")
    assert scn.name == "mutant"


nested_values = st.one_of(
    st.none(),
    st.lists(st.integers(-5, 5), min_size=1, max_size=3),
    st.dictionaries(st.from_regex(r"\A[a-z]{1,6}\Z"), st.integers(0, 9), min_size=1, max_size=2),
)
GEN = settings(max_examples=120, deadline=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@GEN
@given(leaf=st.sampled_from(LEAVES),
       text=st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF,
                                  blacklist_categories=("Cs",)), max_size=12),
       number=st.integers(-10 ** 6, 10 ** 6), nested=nested_values)
def test_wrong_typed_value_is_located_at_its_line(leaf, text, number, nested):
    path, kind = leaf
    text_ = dump(set_at(BASE, path, wrong_for(kind, text, number, nested)))
    p = first_problem(text_)
    assert (p.line, p.field) == (yaml_line(text_, path), field_path(path))


@GEN
@given(where=st.sampled_from(MAPPINGS), key=st.from_regex(r"\A[a-z][a-z0-9_]{0,14}\Z"),
       value=st.one_of(st.integers(), st.text(max_size=8), st.lists(st.integers(), max_size=2)),
       at=st.integers(0, 10))
def test_unknown_key_at_any_depth_is_located_at_its_line(where, key, value, at):
    path, known = where
    if key in known or key in YAML_SPECIAL:
        return
    data = copy.deepcopy(BASE)
    node: Any = data
    for k in path:
        node = node[k]
    items = list(node.items())
    items.insert(min(at, len(items)), (key, value))
    node.clear()
    node.update(items)
    text = dump(data)
    p = first_problem(text)
    assert (p.line, p.field) == (yaml_line(text, path + (key,)), field_path(path + (key,)))
    assert p.message.startswith("unknown field")


@GEN
@given(leaf=st.sampled_from(LEAVES), seed=st.integers(0, 2 ** 32 - 1))
def test_faker_garbage_in_a_field_is_located_at_its_line(leaf, seed):
    path, kind = leaf
    fake = Faker()
    fake.seed_instance(seed)
    nested = fake.random_element([
        None, fake.pylist(nb_elements=2, variable_nb_elements=False, value_types=[int]),
        fake.pydict(nb_elements=1, variable_nb_elements=False, value_types=[int])])
    text_ = dump(set_at(BASE, path, wrong_for(kind, fake.sentence(nb_words=3), fake.pyint(),
                                              nested)))
    p = first_problem(text_)
    assert (p.line, p.field) == (yaml_line(text_, path), field_path(path))


@GEN
@given(port=st.integers(1, 65535), octets=st.tuples(*[st.integers(0, 255)] * 4))
def test_any_non_loopback_wrong_addr_is_refused_naming_the_address(port, octets):
    if octets[0] == 127:
        return
    addr = ".".join(map(str, octets))
    data = set_at(BASE, ("faults",), [{"kind": "wrong_addr", "ranks": [1], "addr": addr}])
    text = dump(data)
    p = first_problem(text)
    assert (p.line, p.field) == (yaml_line(text, ("faults", 0, "addr")), "faults[0].addr")
    assert addr in p.message


@GEN
@given(octets=st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(1, 254)))
def test_any_loopback_wrong_addr_is_allowed(octets):
    addr = "127." + ".".join(map(str, octets))
    data = set_at(BASE, ("faults",), [{"kind": "wrong_addr", "ranks": [1], "addr": addr}])
    (scn,) = load_text(dump(data), "loopback.yaml")
    assert scn.faults[0].model_dump()["addr"] == addr


# -- pytest: broken files next to a valid one --------------------------------------------------

VALID_SCENARIO = """\
name: tiny_ok
about: one rank, init only; the fastest real run there is
world_size: 1
timeout: 10
deadline: 60
workload: init
expect:
  job: ok
"""

IN_FOLDER = ["unknown_fault_kind", "world_size_zero", "unclosed_bracket",
             "wrong_addr_not_loopback", "duplicate_key", "expect_rank_outside_world"]


@pytest.fixture
def folder(pytester):
    d = pytester.mkdir("scenarios")
    (d / "tiny_ok.yaml").write_text(VALID_SCENARIO)
    for name in IN_FOLDER:
        shutil.copy(BROKEN / f"{name}.yaml", d / f"{name}.yaml")
    return pytester


def _located(name: str) -> str:
    line, field, _ = expectation(BROKEN / f"{name}.yaml")
    return f"scenarios/{name}.yaml:{line}: " + (f"{field}: " if field else "")


@pytest.mark.parametrize("xdist", [[], ["-p", "xdist", "-n", "2"]], ids=["serial", "xdist"])
def test_scenario_folder_with_broken_files(folder, xdist):
    result = folder.runpytest_subprocess("-p", "no:cacheprovider", *xdist)
    out = result.stdout.str()
    assert "Traceback" not in out
    missing = [n for n in IN_FOLDER if out.count(_located(n)) < 1]
    assert not missing, f"no located error for {missing}:\n{out}"
    for name in IN_FOLDER:
        assert re.search(rf"ERROR.*scenarios/{name}\.yaml", out)
    result.assert_outcomes(passed=1, errors=len(IN_FOLDER))

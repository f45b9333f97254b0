"""The rules of the seams that no list keeps: each registry entry brings what it needs, and a
missing piece fails here with a message that says which file to add or edit.

* a fault kind (``harness/faults/``, registry ``harness.faults.REGISTRY``): used by a catalog
  scenario; says whether it works across a real allocation's nodes (``ON_ALLOCATION``);
* a proxy toxic (``harness/services/proxy/toxics/``, registry ``TOXICS``): a fault that switches
  it on (a ``ProxyFault`` with ``TOXIC``), whose toxic exists; a catalog scenario that runs it
  through the proxy; a planning row in ``tests/test_proxy_faults.py`` and a test of its own in
  the real proxy (``tests/test_proxy.py``);
* a workload step kind (``harness/ranks/workload/``, registry ``KINDS``): a module named after
  it, how it is written and what it does (the reference table), examples its grammar takes and
  no other kind's does, and a catalog scenario that uses it.

Each check is a function of the registries and the catalog, so that the tests below also
give each one a registry with an entry missing and read the message. Pure: nothing runs.
(Diagnosis rules have their own: tests/test_diagnosis_registry.py.)
"""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Set, Tuple, Type

import pytest
import yaml

from harness.faults import REGISTRY, UNSAID, Fault
from harness.faults._proxy import ProxyFault
from harness.ranks import workload
from harness.ranks.workload import StepKind
from harness.services.proxy import toxics
from harness.services.proxy.toxics import Toxic

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
PROXY_TESTS = ROOT / "tests" / "test_proxy.py"
PROXY_PLAN_TESTS = ROOT / "tests" / "test_proxy_faults.py"
Case = Tuple[str, str, Dict[str, Any]]     # (file name, case name, the case's merged data)


def source_file(obj: Any) -> str:
    """The repository path of the module that defines a class or is a module."""
    name = obj.__module__ if isinstance(obj, type) else obj.__name__
    return name.replace(".", "/") + ".py"


def catalog_cases(folder: Path = SCENARIOS) -> List[Case]:
    """Every case of the catalog's files: its file's top level with the case's own fields."""
    out: List[Case] = []
    for f in sorted(folder.glob("*.yaml")):
        d = yaml.safe_load(f.read_text()) or {}
        top = {k: v for k, v in d.items() if k != "cases"}
        for case, over in (d.get("cases") or {"": {}}).items():
            out.append((f.name, str(case), dict(top, **(over or {}))))
    return out


def case_faults(cases: Iterable[Case]) -> List[Tuple[str, str, Dict[str, Any]]]:
    return [(f, c, fl) for f, c, d in cases for fl in d.get("faults") or []
            if isinstance(fl, dict)]


def case_steps(cases: Iterable[Case]) -> Set[str]:
    """Every workload entry the catalog writes: a case's ``workload:`` (a step, a list or a
    mapping with ``steps``) and the steps faults give a rank or a job (rank_workload's
    ``steps``, concurrent_job's ``workload``)."""
    out: Set[str] = set()

    def add(v: Any) -> None:
        if isinstance(v, str) and v != "init":
            out.add(v)
        elif isinstance(v, list):
            out.update(s for s in v if isinstance(s, str))
        elif isinstance(v, dict):
            add(v.get("steps"))

    for _, _, d in cases:
        add(d.get("workload"))
    for _, _, fl in case_faults(cases):
        add(fl.get("steps"))
        add(fl.get("workload"))
    return out


# -- the checks ------------------------------------------------------------------------------

def fault_problems(kinds: Mapping[str, Type[Fault]], cases: List[Case]) -> List[str]:
    used = {fl.get("kind") for _, _, fl in case_faults(cases)}
    out = []
    for kind, cls in sorted(kinds.items()):
        where = source_file(cls)
        if kind not in used:
            out.append(f"the fault kind {kind} ({where}) is in no catalog scenario: add a case "
                       f"with `faults: [{{kind: {kind}, ...}}]` to a file of scenarios/ (its "
                       f"family's, or a new scenarios/{kind}.yaml), with what was watched in "
                       "its about:")
        if cls.ON_ALLOCATION is UNSAID and cls.needs_netns is not True \
                and not isinstance(cls.needs_netns, property):
            out.append(f"{where}: {cls.__name__} does not say whether the fault works across a "
                       "real allocation's nodes: set its ON_ALLOCATION = None (it works there) "
                       "or to a text that says why it is skipped there")
    return out


def _proxied_kinds(kinds: Mapping[str, Type[Fault]]) -> Dict[str, Type[ProxyFault]]:
    return {k: c for k, c in kinds.items() if isinstance(c, type) and issubclass(c, ProxyFault)}


def _test_names(path: Path) -> List[str]:
    tree = ast.parse(path.read_text())
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef)
            and n.name.startswith("test_")]


def toxic_problems(toxic_kinds: Mapping[str, Type[Toxic]], kinds: Mapping[str, Type[Fault]],
                   cases: List[Case], proxy_tests: Path = PROXY_TESTS,
                   plan_tests: Path = PROXY_PLAN_TESTS) -> List[str]:
    faults = _proxied_kinds(kinds)
    out = [f"{source_file(cls)}: {cls.__name__}.TOXIC is {cls.TOXIC!r}, which the proxy does "
           f"not have: add harness/services/proxy/toxics/{cls.TOXIC}.py (a Toxic subclass with "
           f"NAME = {cls.TOXIC!r}; see that package's doc)"
           for kind, cls in sorted(faults.items()) if cls.TOXIC not in toxic_kinds]
    proxied = set()
    for _, _, fl in case_faults(cases):
        cls = faults.get(fl.get("kind", ""))
        if cls is None:
            continue
        try:
            if cls.model_validate(fl).proxied():
                proxied.add(cls.TOXIC)
        except ValueError:
            continue    # the loader's tests say what is wrong with it
    tests = _test_names(proxy_tests)
    plans = plan_tests.read_text()
    for name, toxic in sorted(toxic_kinds.items()):
        if not toxic.SUMMARY:
            out.append(f"{source_file(toxic)}: give {toxic.__name__} a SUMMARY (what it does to "
                       "a connection: the reference table of toxics reads it; then python -m "
                       "harness.docs_reference --write)")
        mine = sorted(k for k, c in faults.items() if c.TOXIC == name)
        if not mine:
            out.append(
                f"the toxic {name} ({source_file(toxic)}) has no fault that switches it on: add "
                f"harness/faults/{name}.py with a harness.faults._proxy.ProxyFault subclass "
                f"(kind: Literal[{name!r}], TOXIC = {name!r}, a field for each of its "
                f"parameters: {', '.join(toxic.parameters()) or 'none'})")
            continue
        if name not in proxied:
            out.append(f"the toxic {name} is in no catalog scenario through the fault proxy: add "
                       f"a case with `faults: [{{kind: {mine[0]}, ...}}]` (run by the proxy) to "
                       f"scenarios/net-proxy-faults.yaml or a scenarios/ file of its own")
        if not any(t.startswith(f"test_{name}_") for t in tests):
            out.append(f"the toxic {name} has no test in the real proxy: add `def test_{name}_"
                       f"...(proxy)` to {proxy_tests.relative_to(ROOT)} (switch it on with "
                       "toxic(svc, ...) and show what it does to a connection)")
        if not any(f"{{kind: {k}" in plans for k in mine):
            out.append(f"the proxy fault {mine[0]} has no planning row: add one to "
                       f"test_a_proxy_fault_is_a_proxy_on_the_master_host_and_one_toxic in "
                       f"{plan_tests.relative_to(ROOT)} (the fault, its toxic, its params)")
    return out


def _modules(package: Any) -> List[str]:
    return sorted(m.name for m in pkgutil.iter_modules(package.__path__)
                  if not m.name.startswith("_"))


def module_problems(package: Any, names: Mapping[str, Any], what: str, base: str) -> List[str]:
    """One module per entry, named after it: a module that registers nothing, or an entry
    whose module bears another name."""
    where = package.__name__.replace(".", "/")
    by_module = {source_file(type(v) if not isinstance(v, type) else v).rsplit("/", 1)[1][:-3]:
                 n for n, v in names.items()}
    out = [f"{where}/{m}.py defines no {what}: give it a {base} subclass with a NAME, or name it "
           "with a leading _ if it only holds shared parts"
           for m in _modules(package) if m not in by_module]
    out += [f"the {what} {n} is defined in {where}/{m}.py: move it to {where}/{n}.py (one module "
            "per entry, named after it)" for m, n in sorted(by_module.items()) if m != n]
    return out


def step_problems(kinds: Mapping[str, StepKind], cases: List[Case]) -> List[str]:
    out = module_problems(workload, kinds, "workload step kind", "StepKind")
    used = {k.NAME for k in (workload.kind_of(s) for s in case_steps(cases)) if k is not None}
    for name, kind in kinds.items():
        where = source_file(type(kind))
        if not (kind.HELP and kind.ABOUT):
            out.append(f"{where}: give {type(kind).__name__} a HELP (how the step is written) "
                       "and an ABOUT (what a rank does): messages and the reference table read "
                       "them (then python -m harness.docs_reference --write)")
        bad = [e for e in kind.EXAMPLES if workload.kind_of(e) is not kind]
        if not kind.EXAMPLES or bad:
            out.append(f"{where}: EXAMPLES must be entries {name}'s GRAMMAR takes and no other "
                       f"kind's ({'none given' if not bad and not kind.EXAMPLES else bad})")
        if name not in used:
            out.append(f"the workload step {name} ({where}) is in no catalog scenario: add a "
                       f"case whose `workload:` has it to a file of scenarios/ (as "
                       "scenarios/subgroups.yaml and reinit.yaml do for theirs), with what was "
                       "watched in its about:")
    return out


# -- the registries as they are ------------------------------------------------------------

@pytest.fixture(scope="module")
def cases() -> List[Case]:
    return catalog_cases()


def built_in_faults() -> Dict[str, Type[Fault]]:
    return {k: c for k, c in REGISTRY.items() if c.__module__.startswith("harness.faults")}


def test_every_fault_kind_is_in_the_catalog_and_says_where_it_works(cases):
    assert not fault_problems(built_in_faults(), cases), "\n".join(
        fault_problems(built_in_faults(), cases))


def test_every_proxy_toxic_has_its_fault_scenario_and_tests(cases):
    problems = toxic_problems(toxics.TOXICS, built_in_faults(), cases)
    problems += module_problems(toxics, toxics.TOXICS, "proxy toxic", "Toxic")
    assert not problems, "\n".join(problems)


def test_every_workload_step_kind_is_written_documented_and_in_the_catalog(cases):
    problems = step_problems(workload.KINDS, cases)
    assert not problems, "\n".join(problems)


# -- each check, given a registry with an entry missing ---------------------------------------

def _fault(kind: str, base: Type[Fault] = Fault, **attrs: Any) -> Type[Fault]:
    from typing import Literal

    ns = {"__annotations__": {"kind": Literal[kind]}, "kind": kind, "__module__":
          f"harness.faults.{kind}", **attrs}
    return type(f"Fake_{kind}", (base,), ns)


def test_a_fault_kind_without_a_scenario_or_allocation_word_is_named_with_its_file(cases):
    fake = _fault("pause_rank")
    problems = fault_problems({"pause_rank": fake}, cases)
    assert problems == [
        "the fault kind pause_rank (harness/faults/pause_rank.py) is in no catalog scenario: "
        "add a case with `faults: [{kind: pause_rank, ...}]` to a file of scenarios/ (its "
        "family's, or a new scenarios/pause_rank.yaml), with what was watched in its about:",
        "harness/faults/pause_rank.py: Fake_pause_rank does not say whether the fault works "
        "across a real allocation's nodes: set its ON_ALLOCATION = None (it works there) or to "
        "a text that says why it is skipped there"]
    said = _fault("pause_rank", ON_ALLOCATION=None)
    used = cases + [("x.yaml", "c", {"faults": [{"kind": "pause_rank"}]})]
    assert fault_problems({"pause_rank": said}, used) == []


def test_a_proxy_fault_whose_toxic_is_missing_names_the_toxics_file(cases):
    fake = _fault("jitter_burst", ProxyFault, TOXIC="jitter_burst")
    problems = toxic_problems(toxics.TOXICS, {**built_in_faults(), "jitter_burst": fake}, cases)
    assert problems == [
        "harness/faults/jitter_burst.py: Fake_jitter_burst.TOXIC is 'jitter_burst', which the "
        "proxy does not have: add harness/services/proxy/toxics/jitter_burst.py (a Toxic "
        "subclass with NAME = 'jitter_burst'; see that package's doc)"]


def test_a_toxic_without_its_fault_scenario_or_tests_names_each_file(cases):
    class Duplicate(Toxic):
        NAME = "duplicate"
        SUMMARY = "each chunk is sent twice"
        REQUIRED = ("copies",)
    Duplicate.__module__ = "harness.services.proxy.toxics.duplicate"
    no_fault = toxic_problems({**toxics.TOXICS, "duplicate": Duplicate}, built_in_faults(),
                              cases)
    assert no_fault == [
        "the toxic duplicate (harness/services/proxy/toxics/duplicate.py) has no fault that "
        "switches it on: add harness/faults/duplicate.py with a harness.faults._proxy.ProxyFault "
        "subclass (kind: Literal['duplicate'], TOXIC = 'duplicate', a field for each of its "
        "parameters: copies)"]
    fault = _fault("duplicate", ProxyFault, TOXIC="duplicate")
    problems = toxic_problems({"duplicate": Duplicate}, {"duplicate": fault}, cases)
    assert problems == [
        "the toxic duplicate is in no catalog scenario through the fault proxy: add a case "
        "with `faults: [{kind: duplicate, ...}]` (run by the proxy) to "
        "scenarios/net-proxy-faults.yaml or a scenarios/ file of its own",
        "the toxic duplicate has no test in the real proxy: add `def test_duplicate_...(proxy)` "
        "to tests/test_proxy.py (switch it on with toxic(svc, ...) and show what it does to "
        "a connection)",
        "the proxy fault duplicate has no planning row: add one to "
        "test_a_proxy_fault_is_a_proxy_on_the_master_host_and_one_toxic in "
        "tests/test_proxy_faults.py (the fault, its toxic, its params)"]


def test_a_toxic_run_only_by_netem_or_tc_is_not_in_the_catalog_through_the_proxy():
    """latency and bandwidth have other engines: a case counts for their toxic only where the
    fault, as written, runs through the proxy on any machine."""
    lat, bw = REGISTRY.get("latency"), REGISTRY.get("bandwidth")
    assert lat is not None and bw is not None
    assert not lat.model_validate({"kind": "latency", "delay_ms": 5}).proxied()
    assert lat.model_validate({"kind": "latency", "delay_ms": 5, "traffic": "store"}).proxied()
    assert not bw.model_validate({"kind": "bandwidth"}).proxied()
    assert bw.model_validate({"kind": "bandwidth", "engine": "proxy"}).proxied()


def test_a_step_kind_without_a_scenario_or_its_words_names_its_file(cases):
    class Gather(StepKind):
        NAME = "all_gather"
        GRAMMAR = r"all_gather"
    Gather.__module__ = "harness.ranks.workload.all_gather"
    kinds = {**workload.KINDS, "all_gather": Gather()}
    problems = [p for p in step_problems(kinds, cases) if "all_gather" in p]
    assert problems == [
        "harness/ranks/workload/all_gather.py: give Gather a HELP (how the step is written) and "
        "an ABOUT (what a rank does): messages and the reference table read them (then python "
        "-m harness.docs_reference --write)",
        "harness/ranks/workload/all_gather.py: EXAMPLES must be entries all_gather's GRAMMAR "
        "takes and no other kind's (none given)",
        "the workload step all_gather (harness/ranks/workload/all_gather.py) is in no catalog "
        "scenario: add a case whose `workload:` has it to a file of scenarios/ (as "
        "scenarios/subgroups.yaml and reinit.yaml do for theirs), with what was watched in its "
        "about:"]


def test_a_module_that_registers_nothing_or_another_name_is_named():
    class Misplaced(StepKind):
        NAME = "gather"
    Misplaced.__module__ = "harness.ranks.workload.barrier"
    problems = module_problems(workload, {"gather": Misplaced()}, "workload step kind",
                               "StepKind")
    assert "harness/ranks/workload/all_reduce.py defines no workload step kind: give it a " \
           "StepKind subclass with a NAME, or name it with a leading _ if it only holds shared " \
           "parts" in problems
    assert "the workload step kind gather is defined in harness/ranks/workload/barrier.py: " \
           "move it to harness/ranks/workload/gather.py (one module per entry, named after it)" \
           in problems


def test_the_catalog_reader_sees_workloads_in_every_spelling():
    cases: List[Case] = [
        ("a.yaml", "", {"workload": "barrier"}),
        ("b.yaml", "x", {"workload": {"steps": ["ddp 1MB", "train 2"], "destroy": False}}),
        ("c.yaml", "y", {"workload": "init", "faults": [
            {"kind": "rank_workload", "rank": 1, "steps": ["reinit"]},
            {"kind": "concurrent_job", "workload": ["keep_store"]}]})]
    assert case_steps(cases) == {"barrier", "ddp 1MB", "train 2", "reinit", "keep_store"}

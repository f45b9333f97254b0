"""The diagnosis's registry is whole: every rule of a rule module is registered, every registered
rule has a kept real observation, and the package stays in readable parts.

A rule module is a module of harness/judge/diagnose/ whose name does not start with ``_``; its
public functions are rules, registered with ``@rule(order=..., evidence=...)`` (its helpers'
names start with ``_``). Each failure names the file to add or change.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil
import sys
from pathlib import Path

import pytest

import harness.judge.diagnose as diagnosis
from harness.judge.diagnose import EVIDENCE, REGISTRY, RULES, rule

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path(diagnosis.__file__).parent
CORPUS = "tests/data/diagnosis"
KEEP = "python tests/diagnosis_keep.py EVIDENCE_DIR NAME --about TEXT"

_spec = importlib.util.spec_from_file_location(
    "diagnosis_keep", Path(__file__).parent / "diagnosis_keep.py")
assert _spec is not None and _spec.loader is not None
keep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(keep)

# The rules no real kept observation covers yet: a known gap, not a pass (tests/diagnosis_keep.py's
# UNCOVERED ratchet, which only shrinks). Never fake an entry: keep a real run's evidence.
KNOWN_GAP = keep.UNCOVERED


def rule_modules():
    """The rule modules of the package, imported: (module, its file relative to the repo)."""
    out = []
    for info in sorted(pkgutil.iter_modules([str(PACKAGE)]), key=lambda m: m.name):
        if not info.name.startswith("_"):
            mod = importlib.import_module(f"{diagnosis.__name__}.{info.name}")
            out.append((mod, Path(mod.__file__).resolve().relative_to(ROOT).as_posix()))
    return out


def file_of(name: str) -> str:
    mod = sys.modules[REGISTRY[name].module]
    return Path(mod.__file__).resolve().relative_to(ROOT).as_posix()


def test_every_public_function_of_a_rule_module_is_a_registered_rule():
    unregistered = []
    for mod, path in rule_modules():
        for name, fn in inspect.getmembers(mod, inspect.isfunction):
            if fn.__module__ != mod.__name__ or name.startswith("_"):
                continue
            spec = REGISTRY.get(name)
            if spec is None or spec.func is not fn:
                unregistered.append(f"{path}: {name} is a public function of a rule module but "
                                    "no registered rule: put @rule(order=KEY, evidence=(...)) "
                                    f"above it (a free KEY places it in RULES), or name it "
                                    f"_{name} if it is a helper")
    assert not unregistered, "\n".join(unregistered)


def test_every_registered_rule_lives_in_a_rule_module():
    modules = {mod.__name__ for mod, _ in rule_modules()}
    stray = [f"{file_of(n)}: rule {n} is registered outside a rule module: move it into the "
             f"module of its area under {PACKAGE.relative_to(ROOT).as_posix()}/ (a name "
             "without a leading _)" for n, s in REGISTRY.items() if s.module not in modules]
    assert not stray, "\n".join(stray)


def test_rules_are_the_registry_in_the_order_of_its_keys():
    assert len(RULES) == len(REGISTRY) >= 78
    orders = [REGISTRY[r.__name__].order for r in RULES]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)
    assert all(REGISTRY[r.__name__].func is r for r in RULES)
    assert diagnosis.load_rules() is RULES and len(RULES) == len(REGISTRY)


def test_every_rule_declares_the_evidence_it_reads_from_the_vocabulary():
    for name, spec in REGISTRY.items():
        assert spec.evidence and set(spec.evidence) <= set(EVIDENCE), (file_of(name), name)


def test_every_registered_rule_has_a_kept_real_observation():
    covered = set(keep.covered())
    missing = [f"rule {n} ({file_of(n)}) has no kept real observation in {CORPUS}/: run a "
               f"scenario that shows it, read its causes, and keep its case's evidence folder "
               f"with `{KEEP}` (it writes {CORPUS}/NAME.json)"
               for n in sorted(set(REGISTRY) - covered - KNOWN_GAP)]
    assert not missing, "\n".join(missing)


def test_the_known_gap_only_shrinks():
    not_rules = sorted(KNOWN_GAP - set(REGISTRY))
    assert not not_rules, ("not registered rules: take them off UNCOVERED in "
                           f"tests/diagnosis_keep.py: {not_rules}")
    now_covered = sorted(KNOWN_GAP & set(keep.covered()))
    assert not now_covered, (f"{CORPUS}/ covers these now: take them off UNCOVERED in "
                             f"tests/diagnosis_keep.py: "
                             f"{now_covered}")


@pytest.mark.parametrize("kwargs,said", [
    ({"order": 10_001, "evidence": ()}, "evidence must name what it reads"),
    ({"order": 10_001, "evidence": ("the weather",)}, "unknown: \\['the weather'\\]"),
    ({"order": 10, "evidence": ("exception",)}, "order 10 is teardown_gil_deadlock's"),
])
def test_the_decorator_refuses_a_rule_it_cannot_place(kwargs, said):
    def made_up(c):
        return None

    with pytest.raises(ValueError, match=said):
        rule(**kwargs)(made_up)
    assert "made_up" not in REGISTRY and made_up not in RULES


def test_a_name_another_module_registered_is_refused():
    def store_port_in_use(c):   # the name of store.py's rule, defined in this module
        return None

    with pytest.raises(ValueError, match="already registered a rule of that name"):
        rule(order=10_002, evidence=("exception",))(store_port_in_use)
    assert REGISTRY["store_port_in_use"].module.endswith(".store")


MAX_MODULE, MAX_CLASS, MAX_FUNCTION = 800, 400, 80


def test_the_package_stays_in_readable_parts():
    """No module over 800 lines, no class over 400, no function over 80 (decorators counted):
    a rule that grows past that reads in helpers; a module that does, splits by area."""
    too_big = []
    for path in sorted(PACKAGE.glob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE:
            too_big.append(f"{rel}: {len(text.splitlines())} lines (at most {MAX_MODULE})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                n = (node.end_lineno or node.lineno) - first + 1
                cap = MAX_CLASS if isinstance(node, ast.ClassDef) else MAX_FUNCTION
                if n > cap:
                    too_big.append(f"{rel}:{first}: {node.name} is {n} lines (at most {cap})")
    assert not too_big, "\n".join(too_big)

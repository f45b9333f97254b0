"""The package's modules import one another without a circle (issue 42): read from the source
(module-level imports; those under ``if TYPE_CHECKING:`` and inside functions are not run at
import and are left out). Pure: nothing is imported here."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

PACKAGE = Path(__file__).resolve().parent.parent / "harness"


def _modules() -> Dict[str, Path]:
    out = {}
    for p in PACKAGE.rglob("*.py"):
        parts = p.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports(name: str, path: Path, mods: Dict[str, Path]) -> Set[str]:
    """The package's modules ``name`` imports when it is imported."""
    is_pkg = path.name == "__init__.py"
    out: Set[str] = set()
    todo: List[ast.AST] = list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if _type_checking(node):
            continue
        if isinstance(node, (ast.If, ast.Try)):
            todo += [n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt)]
            for h in getattr(node, "handlers", []):
                todo += h.body
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for c in [target] + [f"{target}.{a.name}" for a in node.names]:
                if c in mods and c != name:
                    out.add(c)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in mods and a.name != name}
    return out


def _circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    out: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_of_the_package_imports_itself_through_others():
    mods = _modules()
    graph = {m: _imports(m, p, mods) for m, p in mods.items()}
    assert sum(map(len, graph.values())) > 100      # the reading found the imports
    circles = _circles(graph)
    assert not circles, ("import circles (move the shared part into a module both import, or "
                         f"import inside the function that needs it): {circles}")


def test_a_circle_is_found():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]

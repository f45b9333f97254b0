"""The documentation: the generated reference is current, every YAML example loads, and the
site builds with ``mkdocs build --strict``. Fast (seconds): nothing here runs a scenario."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import docs_reference

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_the_generated_reference_is_up_to_date():
    stale = docs_reference.stale()
    assert not stale, ("stale reference pages (run: python -m harness.docs_reference --write): "
                       + ", ".join(stale))


def test_the_reference_check_exits_1_naming_a_stale_page(tmp_path, capsys, monkeypatch):
    for name, text in docs_reference.generate().items():
        (tmp_path / name).write_text(text)
    (tmp_path / "faults.md").write_text("old\n")
    monkeypatch.setattr(docs_reference, "OUT_DIR", tmp_path)
    monkeypatch.setattr(docs_reference, "stale",
                        lambda out_dir=tmp_path: [n for n, t in docs_reference.generate().items()
                                                  if (out_dir / n).read_text() != t])
    assert docs_reference.main(["--check"]) == 1
    assert "faults.md" in capsys.readouterr().out


EXAMPLES = [(p, line, text, mark) for p in DOCS
            for line, text, mark in docs_reference.yaml_examples(p)]


@pytest.mark.parametrize("path,line,text,mark", EXAMPLES,
                         ids=[f"{p.relative_to(ROOT)}:{line}" for p, line, _, _ in EXAMPLES])
def test_every_yaml_example_loads(path, line, text, mark):
    """A whole scenario (or space file) loads as it is; a `<!-- fragment -->` loads once given
    a name and an about:; only a `<!-- not-a-scenario -->` block is not loaded."""
    if mark == "not loaded":
        pytest.skip("marked <!-- not-a-scenario --> before its fence")
    # as a file in the catalog's folder: a program: path in an example is the catalog's
    where = str(ROOT / "scenarios" / f"{path.stem}-line{line}.yaml")
    problem = docs_reference.example_problem(text, where, fragment=mark == "fragment")
    assert problem is None, f"{path.relative_to(ROOT)}:{line}: {problem}"


def test_few_yaml_examples_are_left_unloaded():
    unloaded = [e for e in EXAMPLES if e[3] == "not loaded"]
    assert len(EXAMPLES) >= 20 and len(unloaded) * 3 <= len(EXAMPLES)


def test_mkdocs_builds_strictly(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]'; .ci/setup installs it)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                        "--site-dir", str(tmp_path / "site")], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=env)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]


def test_the_readme_keeps_to_issue_44s_acceptance():
    """At most 250 lines, `harness new` in the first 120, and the quick start's two commands
    (read there by a tool) first under its heading, as they were."""
    lines = (ROOT / "README.md").read_text().split("\n")
    assert len(lines) <= 251    # the text's last line ends with a newline
    assert any("harness new" in ln for ln in lines[:120])
    text = "\n".join(lines)
    quick = text[text.index("\n## Quick start\n"):]
    quick = quick[:quick.index("\n## ", 5)]
    blocks = [b for b in quick.split("```")[1::2]]
    assert blocks[:2] == ["bash\n./.ci/setup && .venv/bin/pytest scenarios/ -n 4\n",
                          "bash\n./.ci/setup && .venv/bin/pytest tests/ -n 3\n"]

"""Only one thing beyond pyproject.toml: the built-in scenario catalog (the repository's
top-level ``scenarios/``, where ``pytest scenarios/`` runs it) is copied into the wheel as the
package data folder ``harness/scenarios``, so that an installed harness runs it with
``harness run --builtin``. A source checkout (also an editable install) finds ``scenarios/``
beside the package instead (``harness.catalog.builtin_dir``)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

CATALOG = Path(__file__).resolve().parent / "scenarios"


class build_py_with_catalog(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode or not CATALOG.is_dir():
            return
        target = Path(self.build_lib) / "harness" / "scenarios"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(CATALOG, target,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))


setup(cmdclass={"build_py": build_py_with_catalog})

"""A fresh virtual environment that has only torch, and the harness's wheel installed into it,
as a new user on a cluster image would have them (tests/test_package.py).

The venv sees this venv's torch (and only what torch itself requires) through a folder of
symlinks named by a .pth file: nothing is downloaded for torch, and nothing else of this venv
(its editable harness, pytest, pydantic...) is visible. ``pip install`` of the wheel then
installs the harness's own dependencies from the configured package index, as it would for a
user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import List, Sequence, Set, Tuple

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


SOURCES = ("harness", "scenarios", "pyproject.toml", "setup.py", "MANIFEST.in", "README.md")


def build_wheel(out: Path) -> Path:
    """The project's wheel, built from a copy of this checkout's sources into ``out`` (a build
    in the checkout itself writes its build/ folder there, which two xdist workers would
    share)."""
    src = out / "src"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    (whl,) = out.glob("torchdist_harness-*.whl")
    return whl


def torch_closure() -> List[Tuple[str, str]]:
    """(name, path) of every top-level entry (package, module, dist-info) of torch and the
    distributions it requires, as this venv has them."""
    seen: Set[str] = set()
    todo, tops = ["torch"], []
    while todo:
        try:
            d = distribution(todo.pop())
        except PackageNotFoundError:
            continue
        key = (d.metadata["Name"] or "").lower()
        if key in seen:
            continue
        seen.add(key)
        for f in d.files or []:
            top = f.parts[0]
            if top != "..":
                tops.append((top, str(d.locate_file(top))))
        for r in d.requires or []:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return sorted(set(tops))


def purelib(python: Path) -> Path:
    return Path(subprocess.run([str(python), "-c", "import sysconfig; "
                                "print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())


def torch_only_venv(where: Path, pth_lines: Sequence[str] = ()) -> Path:
    """A venv at ``where/venv`` that imports this venv's torch and nothing else of it; its
    python. ``pth_lines`` go into one more .pth file (an image's own site customisation)."""
    site = where / "torchsite"
    site.mkdir(parents=True, exist_ok=True)
    for name, path in torch_closure():
        if not (site / name).exists():
            os.symlink(path, site / name)
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    lib = purelib(py)
    (lib / "torch-only.pth").write_text(f"{site}\n")
    if pth_lines:
        (lib / "image.pth").write_text("".join(f"{ln}\n" for ln in pth_lines))
    return py


def pip_install(python: Path, *what: str) -> subprocess.CompletedProcess:
    """``pip install`` into the venv of ``python`` (with this venv's pip: the new one has
    none)."""
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                           "-q", "--disable-pip-version-check", *what],
                          capture_output=True, text=True, timeout=900)


def wheel_venv(where: Path, *what: str, pth_lines: Sequence[str] = ()) -> Path:
    """A venv with only torch (:func:`torch_only_venv`), then ``pip install`` of ``what`` (the
    wheel, with extras): its python; fails the test with pip's last lines when pip fails."""
    py = torch_only_venv(where, pth_lines)
    p = pip_install(py, *what)
    assert p.returncode == 0, p.stderr[-3000:]
    return py


def this_purelib() -> str:
    return sysconfig.get_paths()["purelib"]

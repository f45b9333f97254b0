"""Registries by discovery: a package's modules scanned for what they define, so that no list of
them is kept by hand (the workload's step kinds, the fault proxy's toxics, the fault kinds, the
diagnosis's rule modules). A module whose name starts with ``_`` holds shared parts and is
never scanned.

Standard library only, and no I/O of its own beyond importing the modules: a rank imports the
workload's registry before torch, the fault proxy its toxics in its own process.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType
from typing import Dict, Iterable, List, Type, TypeVar

T = TypeVar("T")


def package_modules(package: str, path: Iterable[str]) -> List[ModuleType]:
    """Every module of the package named ``package`` (found on ``path``, its ``__path__``)
    whose name does not start with ``_``, imported, in name order."""
    return [importlib.import_module(f"{package}.{info.name}")
            for info in sorted(pkgutil.iter_modules(path), key=lambda m: m.name)
            if not info.name.startswith("_")]


def classes_defined(module: ModuleType, base: Type[T]) -> List[Type[T]]:
    """The subclasses of ``base`` that ``module`` defines itself (not those it imports)."""
    return [cls for _, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, base) and cls.__module__ == module.__name__]


def discover(package: str, path: Iterable[str], base: Type[T], what: str) -> Dict[str, Type[T]]:
    """Every subclass of ``base`` with a ``NAME`` defined in the package's modules, by NAME
    in the order found; two that share a NAME are a TypeError naming both modules (``what``:
    what a NAME names, for that message)."""
    found: Dict[str, Type[T]] = {}
    for mod in package_modules(package, path):
        for cls in classes_defined(mod, base):
            name = getattr(cls, "NAME", "")
            if not name:
                continue
            if name in found:
                raise TypeError(f"{what} {name!r}: {cls.__module__} and "
                                f"{found[name].__module__} both define it")
            found[name] = cls
    return found

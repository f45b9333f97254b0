"""What this machine has or lacks for scenarios: requirements and the probes behind them.

A :class:`Requirement` is one thing a machine has or lacks (root, a program, a kernel feature).
Fault modules declare theirs with these classes; ``harness.run.requirements`` turns them into a
scenario's skip reason and ``harness doctor``'s lines. This module knows no scenario and no
fault.
"""

from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional


@dataclass(frozen=True)
class Requirement:
    """One thing the machine must have. ``missing()`` is None when it is there, else the
    reason, a sentence that says what to do."""

    name: str                                  # short, for `harness doctor`: "nft", "netem"
    ok: str = ""                               # what having it means, for `harness doctor`

    def missing(self) -> Optional[str]:
        raise NotImplementedError


@dataclass(frozen=True)
class Tool(Requirement):
    """A program on PATH (or in an sbin directory), from a Debian package."""

    package: str = ""
    only_as_root: bool = False                 # needed only when the harness runs as root
    why: str = ""                              # what it is needed for

    def missing(self) -> Optional[str]:
        if self.only_as_root and os.geteuid() != 0:
            return None
        if _which(self.name):
            return None
        why = f" ({self.why})" if self.why else ""
        return f"{self.name} not found{why}: apt-get install {self.package or self.name}"


@dataclass(frozen=True)
class Probe(Requirement):
    """A capability found out by trying it once per process (``check`` returns the reason it
    is missing, or None)."""

    check: Callable[[], Optional[str]] = field(default=lambda: None, compare=False)
    cached: bool = True                        # tried once per process (False: cheap to ask)

    def missing(self) -> Optional[str]:
        return _probe(self.name, self.check) if self.cached else self.check()


@functools.cache
def _which(name: str) -> Optional[str]:
    return shutil.which(name) or shutil.which(
        name, path=os.pathsep.join(("/usr/local/sbin", "/usr/sbin", "/sbin")))


_PROBES: Dict[str, Optional[str]] = {}


def _probe(name: str, check: Callable[[], Optional[str]]) -> Optional[str]:
    if name not in _PROBES:
        _PROBES[name] = check()
    return _PROBES[name]


def _namespaces_missing() -> Optional[str]:
    from ..net.topology import missing

    gaps = missing()
    return "; ".join(gaps) if gaps else None


NAMESPACES = Probe("namespaces", ok="network scenarios can run", check=_namespaces_missing,
                   cached=False)


def _view_missing() -> Optional[str]:
    from ..net.resolver import missing as view_missing

    return view_missing()


# ranks in the machine's own network namespace: only their private resolver view keeps torch's
# own lookups (c10d's reverse lookups of peers) off the machine's resolver
RESOLVER_VIEW = Probe("resolver view", ok="ranks in the machine's network namespace resolve "
                      "with the harness's view (no DNS leaves the machine)", check=_view_missing,
                      cached=False)   # harness.net.resolver.missing caches its own try


# hosts with names of their own (UTS namespaces pinned and entered by the topology)
HOST_NAMES = (Tool("unshare", package="util-linux", why="hosts with names of their own"),
              Tool("nsenter", package="util-linux", why="hosts with names of their own"))

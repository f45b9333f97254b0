"""Shared parts of the name faults: each host's own hosts file (its resolver view in
``/etc/netns/<ns>/hosts``, which ranks read through their bind mount) says what a name
resolves to. No DNS is involved: the view has ``hosts: files`` only (harness.resolver)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional

from ..steps import Step


@dataclass
class WriteHosts(Step):
    """Set names in every listed host's hosts file. ``in_place``: into the same file (inode),
    so that ranks already running see it at their next lookup (glibc rereads the file)."""

    UNDO_AT_TEARDOWN: ClassVar[bool] = False   # the files go with the namespaces
    hosts: List[str] = field(default_factory=list)
    entries: Dict[str, List[str]] = field(default_factory=dict)
    in_place: bool = False
    shown: str = ""

    def do(self, rt: Any) -> Optional[Dict[str, Any]]:
        for host in self.hosts:
            rt.net.set_hosts_file(host, self.entries, in_place=self.in_place)
        return {"entries": self.entries}

    def describe(self) -> str:
        return self.shown or "hosts file: " + "; ".join(
            f"{n} -> {', '.join(a) or 'nothing'}" for n, a in self.entries.items())

"""Shared parts of the name faults: each host's own hosts file (its resolver view in
``/etc/netns/<ns>/hosts``, which ranks read through their bind mount) says what a name
resolves to. No DNS is involved: the view has ``hosts: files`` only (harness.net.resolver).

Evidence (:meth:`WriteHosts.effect`): each host's hosts file read back right after the step
wrote it (the addresses it lists for each name, or none), and, for what the file still says
at the end of the run, the answer of glibc itself in one host's view (``getaddrinfo`` in a
process run inside the host's namespace, through the same bind mount as a rank): the step
acted when every host's file said what it set and the resolver answers it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional

from .steps import Effect, Step


def hosts_file_names(text: str) -> Dict[str, List[str]]:
    """A hosts file's text: name (lower case) -> its addresses, in the file's order."""
    out: Dict[str, List[str]] = {}
    for ln in text.splitlines():
        f = ln.split("#", 1)[0].split()
        for name in f[1:]:
            out.setdefault(name.lower(), []).append(f[0])
    return out


# glibc's getaddrinfo in a host's view, without AI_ADDRCONFIG (``getent ahosts`` sets it, and
# would hide an AAAA-only name on a host with no IPv6 address): the addresses, one a line, in
# glibc's order; status 2 when the name is unknown
RESOLVE = ("import socket, sys\n"
           "try:\n"
           "    infos = socket.getaddrinfo(sys.argv[1], None, 0, socket.SOCK_STREAM)\n"
           "except socket.gaierror as e:\n"
           "    print(e); sys.exit(2)\n"
           "print('\\n'.join(dict.fromkeys(i[4][0] for i in infos)))\n")


def resolve_argv(name: str) -> List[str]:
    """A look-up of ``name`` by glibc, as a rank's process makes it (run in the host's view)."""
    import sys

    return [sys.executable, "-I", "-c", RESOLVE, name]


@dataclass
class WriteHosts(Step):
    """Set names in every listed host's hosts file. ``in_place``: into the same file (inode),
    so that ranks already running see it at their next lookup (glibc rereads the file)."""

    UNDO_AT_TEARDOWN: ClassVar[bool] = False   # the files go with the namespaces
    hosts: List[str] = field(default_factory=list)
    entries: Dict[str, List[str]] = field(default_factory=dict)
    in_place: bool = False
    shown: str = ""
    _seen: Optional[Dict[str, Any]] = field(default=None, init=False, repr=False, compare=False)

    def do(self, rt: Any) -> Optional[Dict[str, Any]]:
        for host in self.hosts:
            rt.net.set_hosts_file(host, self.entries, in_place=self.in_place)
        self._seen = {"t": round(rt.now(), 3), "files": self._read(rt)}
        return {"entries": self.entries}

    def _read(self, rt: Any) -> Dict[str, Dict[str, List[str]]]:
        """Each host's hosts file as it is now: for each of the step's names, its addresses."""
        out: Dict[str, Dict[str, List[str]]] = {}
        for host in self.hosts:
            path = Path(rt.net.host_entry(host)["etc"]) / "hosts"
            try:
                names = hosts_file_names(path.read_text())
            except OSError:
                names = {}
            out[host] = {n: names.get(n.lower(), []) for n in self.entries}
        return out

    def effect(self, rt: Any) -> Effect:
        """The hosts files read back when written, and glibc's answer in one host's view at the
        end for each name the files still give as this step set it (a later step, such as a
        name that resolves late, may have changed it since)."""
        assert self._seen is not None
        t, files = self._seen["t"], self._seen["files"]
        events: List[Dict[str, Any]] = []
        wrong = [f"{h}: {n} -> {', '.join(got) or 'nothing'}"
                 for h, names in files.items() for n, got in names.items()
                 if got != list(self.entries[n])]
        for n, want in self.entries.items():
            events.append({"t": t, "what": f"hosts files of {', '.join(self.hosts)} read back: "
                           f"{n} -> {', '.join(want) or 'nothing'}"
                           + (" (not on every host)" if wrong else "")})
        now = self._read(rt)
        resolved: Dict[str, List[str]] = {}
        host = self.hosts[-1] if self.hosts else None
        for n, want in self.entries.items():
            if host is None or now[host].get(n) != list(want):
                continue    # changed since by a later step: glibc's answer is not this step's
            done = rt.run_helper("resolve", resolve_argv(n), host=host, timeout=15)
            got = done.stdout.split() if done.returncode == 0 else []
            resolved[n] = got
            said = ", ".join(got) or f"not found (status {done.returncode})"
            events.append({"t": round(rt.now(), 3),
                           "what": f"getaddrinfo({n}) in {host}'s view: {said}"})
        unresolved = [n for n, got in resolved.items()
                      if sorted(got) != sorted(self.entries[n])]
        acted = not wrong and not unresolved
        parts = [f"{n} -> {', '.join(a) or 'nothing'}" for n, a in self.entries.items()]
        if wrong:
            summary = "hosts files read back otherwise: " + "; ".join(wrong)
        elif unresolved:
            summary = "; ".join(f"{n}: the resolver in {host}'s view answers "
                                f"{', '.join(resolved[n]) or 'not found'}" for n in unresolved)
        else:
            summary = (f"hosts files of {len(self.hosts)} host{'s' * (len(self.hosts) != 1)} "
                       f"said {'; '.join(parts)} at {t:.2f} s"
                       + (f"; glibc in {host}'s view answered the same at the end"
                          if resolved else "; changed since by a later step"))
        return Effect(acted=acted, summary=summary,
                      numbers={"hosts": len(self.hosts), "resolved_at_end": len(resolved)},
                      events=events)

    def describe(self) -> str:
        return self.shown or "hosts file: " + "; ".join(
            f"{n} -> {', '.join(a) or 'nothing'}" for n, a in self.entries.items())

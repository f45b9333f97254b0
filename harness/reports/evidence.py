"""Evidence folders: one per test session, marked as the harness's, pruned only when dead.

Layout under the evidence folder ``DIR`` (``--harness-evidence DIR`` / ``harness run --keep
DIR``; default ``<rootdir>/.harness/evidence``)::

    DIR/session-<UTC time>-<short id>/     one test session (all its xdist workers share it)
        .harness-session.json              the marker: tool, version, owner pid + start time
        <case folder>/                     one per test id (a long id: cut, plus a hash)
    DIR/latest -> session-...              the newest session (a symlink, replaced atomically)

The harness deletes only what it made: pruning (at the start of a session) keeps the newest
``KEEP`` sessions and removes older ``session-*`` folders only when they carry a valid marker
and their owner process is gone (a session still running is never touched, whatever its age).
Anything without the marker, a user's file, a ``latest`` that is not a symlink, is never
touched. Sessions do not touch each other's folders, so two sessions in one rootdir at once keep
both their evidence.

A folder that cannot be used (not a folder, not writable, a path component too long) is found
at the session's start by ``check_root`` and said in one line.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from ..machine.procs import alive, identity

MARKER = ".harness-session.json"
LATEST = "latest"
PREFIX = "session-"
KEEP = 5
NAME_MAX = 255
CASE_NAME_MAX = 120   # bytes of a case folder's name, hash included


@dataclass
class EvidenceSession:
    """The evidence folder of one test session (made on first use)."""

    root: str
    name: str
    pid: int
    start_time: Optional[int]        # the owner's identity (machine.procs): pid, start, boot
    boot_id: str
    started: str

    @property
    def path(self) -> Path:
        return Path(self.root) / self.name

    def to_input(self) -> Dict[str, Any]:
        """For xdist's ``workerinput`` (plain JSON-able values)."""
        return asdict(self)

    @classmethod
    def from_input(cls, data: Dict[str, Any]) -> EvidenceSession:
        return cls(**data)

    def marker(self) -> Dict[str, Any]:
        from .. import __version__
        return {"tool": "torchdist-harness", "version": __version__, "pid": self.pid,
                "start_time": self.start_time, "boot_id": self.boot_id,
                "started": self.started, "uid": os.geteuid()}

    def ensure(self) -> Path:
        """Make the session folder with its marker (idempotent, safe across processes) and
        point ``latest`` at it. OSError if it cannot be made."""
        path = self.path
        path.mkdir(parents=True, exist_ok=True)
        marker = path / MARKER
        if not marker.exists():
            tmp = path / f".{MARKER}.{os.getpid()}.{uuid.uuid4().hex[:6]}"
            tmp.write_text(json.dumps(self.marker(), indent=1) + "\n")
            try:
                os.link(tmp, marker)   # appears whole or not at all; the first writer wins
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        self._point_latest()
        return path

    def _point_latest(self) -> None:
        link = Path(self.root) / LATEST
        if os.path.lexists(link):
            if not link.is_symlink():
                return            # the user's own "latest": never touched
            current = read_marker(Path(self.root) / os.readlink(link))
            if current and str(current.get("started", "")) > self.started:
                return            # a newer session already took it
        tmp = Path(self.root) / f".{LATEST}.{os.getpid()}.{uuid.uuid4().hex[:6]}"
        try:
            os.symlink(self.name, tmp)
            os.replace(tmp, link)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()

    def case_dir(self, nodeid: str) -> Path:
        return self.ensure() / case_folder_name(nodeid)


def new_session(root: Path) -> EvidenceSession:
    now = _dt.datetime.now(_dt.timezone.utc)
    me = identity(os.getpid())
    return EvidenceSession(root=str(root.absolute()),
                           name=f"{PREFIX}{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}",
                           pid=me["pid"], start_time=me["start_time"], boot_id=me["boot_id"],
                           started=now.isoformat(timespec="microseconds"))


def case_folder_name(nodeid: str) -> str:
    """A file name for a test id: unsafe characters become ``_``; a name longer than
    CASE_NAME_MAX bytes is cut and gets a hash of the whole id, so it stays unique."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "._=-") else "_" for c in nodeid)
    safe = safe.lstrip(".") or "_"
    if len(safe) <= CASE_NAME_MAX:
        return safe
    digest = hashlib.sha256(nodeid.encode()).hexdigest()[:12]
    return f"{safe[:CASE_NAME_MAX - 13]}-{digest}"


def check_root(root: Path) -> Optional[str]:
    """Why ``root`` cannot hold evidence (None: it can), without making anything."""
    for part in root.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            return (f"a path component is longer than {NAME_MAX} bytes "
                    f"({part[:40]}...)")
    if len(os.fsencode(str(root.absolute()))) > 4096 - 2 * NAME_MAX:
        return "the path is too long"
    probe = root
    while not os.path.lexists(probe) and probe.parent != probe:
        probe = probe.parent
    if os.path.lexists(probe) and not probe.is_dir():
        what = "a broken symlink" if probe.is_symlink() and not probe.exists() else \
            "not a folder"
        return f"{probe} is {what}"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable" + (" (it does not exist and cannot be made there)"
                                             if probe != root else "")
    return None


def read_marker(folder: Path) -> Optional[Dict[str, Any]]:
    """The marker of a session folder, or None if it is not one of the harness's."""
    try:
        if folder.is_symlink() or not folder.is_dir():
            return None
        data = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("tool") != "torchdist-harness" or \
            not isinstance(data.get("pid"), int):
        return None
    return data


def _owner_alive(marker: Dict[str, Any]) -> bool:
    return alive(marker)


def sessions(root: Path) -> List[Path]:
    """The harness's session folders under ``root``, oldest first."""
    found: List[Tuple[str, Path]] = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    for p in entries:
        if p.name.startswith(PREFIX):
            m = read_marker(p)
            if m is not None:
                found.append((str(m.get("started", "")), p))
    return [p for _, p in sorted(found)]


def prune(root: Path, keep: int = KEEP) -> List[str]:
    """Remove marked session folders beyond the newest ``keep`` whose owner is gone."""
    removed = []
    found = sessions(root)
    for p in found[:max(0, len(found) - keep)]:
        m = read_marker(p)
        if m is None or _owner_alive(m):
            continue
        shutil.rmtree(p, ignore_errors=True)
        if not p.exists():
            removed.append(p.name)
    return removed


SESSION_KEY = pytest.StashKey[EvidenceSession]()

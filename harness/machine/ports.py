"""Ports reserved for one run, free of the race the harness exists to demonstrate.

"Find a free port, close it, hand it to the job" races with every other job doing the same. Here a
port is taken only while its lock file (``<lock folder>/<port>.lock``) is held with ``flock`` by
this run, so two harness runs (``pytest -n 4``, two CI jobs) never get the same port; the lock
dies with the process, so a killed run frees its ports. Ports come from below the kernel's
ephemeral range, so no client socket (the store's, gloo's) is ever handed one of them either.

The lock folder is shared by every user of the machine (``<tmp>/torchdist-harness-ports``,
sticky and world-writable like /tmp itself: mode 1777), so a root run and a non-root run never
get the same port either. Inside it:

* an existing lock file is opened read-only and without ``O_CREAT`` (``fs.protected_regular``
  forbids ``O_CREAT`` on another user's file in a sticky folder; ``flock`` works on a read-only
  descriptor); a missing one is created with ``O_CREAT | O_EXCL``; symlinks are never followed;
* after ``flock`` succeeds the descriptor's inode must still be the path's (a releasing run may
  have unlinked it in between), else the lock is worthless and the take is retried;
* a released lock file is unlinked while still locked, so lock files do not pile up (one that
  belongs to another user cannot be unlinked in a sticky folder: it stays, and is reused).
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import socket
import stat
from pathlib import Path
from typing import List, Optional, Tuple

from ..core.errors import HarnessError

LOW, HIGH = 20000, 28999
LOCK_DIR_NAME = "torchdist-harness-ports"


def ephemeral_range() -> Tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def port_is_free(port: int) -> bool:
    """Nothing is bound to ``port`` on any address (the store binds the wildcard address)."""
    for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            s.bind((addr, port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
        finally:
            s.close()
    return True


def shared_lock_dir() -> Path:
    """``<tmp>/torchdist-harness-ports``: made 1777 if missing; refused (one line) if it is a
    symlink, not a folder, or a folder this user cannot write."""
    from .rundir import tmp_root

    d = tmp_root() / LOCK_DIR_NAME
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(d, 0o700)
        os.chmod(d, 0o1777)        # not through mkdir's mode: the umask would take bits off
    except FileExistsError:
        pass
    except OSError as e:
        raise HarnessError(f"port lock folder {d}: cannot create it ({e.strerror or e})"
                           ) from None
    try:
        st = os.lstat(d)
    except OSError as e:
        raise HarnessError(f"port lock folder {d}: {e.strerror or e}") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise HarnessError(f"port lock folder {d} is not a folder (a symlink or a file): "
                           "refused; remove it")
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != 0o1777:
        try:
            os.chmod(d, 0o1777)
        except OSError:
            pass
    elif not os.access(d, os.W_OK | os.X_OK):
        raise HarnessError(
            f"port lock folder {d} (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}) is not "
            f"writable by uid {os.geteuid()}: its owner can `chmod 1777 {d}` to share it")
    return d


def _open_lock(path: Path) -> Optional[int]:
    """An fd of the lock file (existing: read-only, no O_CREAT; missing: created exclusively);
    None if it cannot be had (a symlink planted there, no permission)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(10):
        try:
            return os.open(path, flags)
        except FileNotFoundError:
            pass
        except OSError:
            return None
        try:
            return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o444)
        except FileExistsError:
            continue   # made by another run just now: open it as an existing one
        except OSError:
            return None
    return None


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class PortLease:
    """Ports held for one run; ``release()`` (or process death) gives them back.

    ``lock_dir``: where the lock files are (default: the shared folder, ``shared_lock_dir()``).
    """

    def __init__(self, lock_dir: Optional[Path] = None, low: int = LOW, high: int = HIGH):
        self.dir = lock_dir if lock_dir is not None else shared_lock_dir()
        self.dir.mkdir(parents=True, exist_ok=True)
        eph_lo, _ = ephemeral_range()
        self.low, self.high = low, min(high, eph_lo - 1)
        self._held: List[Tuple[int, int]] = []   # (port, fd)

    @property
    def ports(self) -> List[int]:
        return [p for p, _ in self._held]

    def _lock(self, port: int) -> Optional[int]:
        """The fd holding ``port``'s lock, or None when another run holds it."""
        path = self.dir / f"{port}.lock"
        for _ in range(10):
            fd = _open_lock(path)
            if fd is None:
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                return None
            if _same_file(fd, path):
                return fd
            os.close(fd)    # unlinked (released) between our open and our lock: try again
        return None

    def _unlock(self, port: int, fd: int) -> None:
        try:
            os.unlink(self.dir / f"{port}.lock")   # still locked: no one holds this inode
        except OSError:
            pass    # another user's file in the sticky folder: it stays and is reused
        os.close(fd)

    def take(self) -> int:
        rng = random.Random()
        for _ in range(2000):
            port = rng.randint(self.low, self.high)
            if port in self.ports:
                continue
            fd = self._lock(port)
            if fd is None:
                continue
            if not port_is_free(port):
                self._unlock(port, fd)
                continue
            self._held.append((port, fd))
            return port
        raise RuntimeError(f"no free port in {self.low}..{self.high} after 2000 tries")

    def release(self) -> None:
        for port, fd in self._held:
            self._unlock(port, fd)
        self._held.clear()

    def __enter__(self) -> PortLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

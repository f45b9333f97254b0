"""Ports reserved for one run, free of the race the harness exists to demonstrate.

"Find a free port, close it, hand it to the job" races with every other job doing the same. Here a
port is taken only while its lock file (``<base>/ports/<port>.lock``) is held with ``flock`` by
this run, so two harness runs (``pytest -n 4``, two CI jobs) never get the same port; the lock
dies with the process, so a killed run frees its ports. Ports come from below the kernel's
ephemeral range, so no client socket (the store's, gloo's) is ever handed one of them either.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import socket
from pathlib import Path
from typing import List, Tuple

LOW, HIGH = 20000, 28999


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


class PortLease:
    """Ports held for one run; ``release()`` (or process death) gives them back."""

    def __init__(self, base: Path, low: int = LOW, high: int = HIGH):
        self.dir = base / "ports"
        self.dir.mkdir(parents=True, exist_ok=True)
        eph_lo, _ = ephemeral_range()
        self.low, self.high = low, min(high, eph_lo - 1)
        self._held: List[Tuple[int, int]] = []   # (port, fd)

    @property
    def ports(self) -> List[int]:
        return [p for p, _ in self._held]

    def take(self) -> int:
        rng = random.Random()
        for _ in range(2000):
            port = rng.randint(self.low, self.high)
            if port in self.ports:
                continue
            fd = os.open(self.dir / f"{port}.lock", os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            if not port_is_free(port):
                os.close(fd)
                continue
            self._held.append((port, fd))
            return port
        raise RuntimeError(f"no free port in {self.low}..{self.high} after 2000 tries")

    def release(self) -> None:
        for _, fd in self._held:
            os.close(fd)
        self._held.clear()

    def __enter__(self) -> PortLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

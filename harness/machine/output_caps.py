"""Capped capture of rank output: every rank's stdout and stderr, bounded, never blocking it.

Each stream is a pipe; one thread per run drains all of them with one selector, so a rank that
prints a lot is never held up by a full pipe (the thread reads 64 KiB at a time as soon as data
is there). What is kept per stream is bounded: the first ``head`` bytes go straight to the
stream's file (visible while the run goes on), the last ``tail`` bytes are kept in memory, and
at the end the file gets a marker line saying how many bytes were cut, then the tail. So the
run directory, and the evidence copied from it, stays bounded (head + tail + one line per
stream) whatever a rank prints.

Defaults: 1 MiB head, 256 KiB tail; ``HARNESS_STREAM_HEAD`` / ``HARNESS_STREAM_TAIL`` (bytes)
change them.
"""

from __future__ import annotations

import os
import selectors
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

HEAD = int(os.environ.get("HARNESS_STREAM_HEAD", str(1 << 20)))
TAIL = int(os.environ.get("HARNESS_STREAM_TAIL", str(256 << 10)))
CHUNK = 1 << 16


def marker(cut: int, total: int, head: int, tail: int) -> bytes:
    return (f"\n[harness: {cut} bytes cut here: this stream wrote {total} bytes; kept the first "
            f"{head} and the last {tail}]\n").encode()


class Stream:
    """One captured stream: head to the file at once, tail in memory, marker at the end."""

    def __init__(self, path: Path, head: int, tail: int):
        self.path = path
        self.file = open(path, "wb", buffering=0)
        self.head_left, self.head, self.tail_max = head, head, tail
        self.tail = bytearray()
        self.total = 0
        self.cut = 0
        self.eof = threading.Event()
        self.finished = False

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        if self.head_left > 0:
            n = min(len(data), self.head_left)
            self.file.write(data[:n])
            self.head_left -= n
            data = data[n:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.tail_max:   # trimmed in batches: amortized O(1)
                drop = len(self.tail) - self.tail_max
                del self.tail[:drop]
                self.cut += drop

    def finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        if len(self.tail) > self.tail_max:
            drop = len(self.tail) - self.tail_max
            del self.tail[:drop]
            self.cut += drop
        if self.cut:
            self.file.write(marker(self.cut, self.total, self.head - self.head_left,
                                   len(self.tail)))
        self.file.write(bytes(self.tail))
        self.tail = bytearray()
        self.file.close()


class Capture:
    """The drain thread of one run. ``pipe(path)`` gives the write end for a child's stdout or
    stderr (close it in the parent after spawning); ``close()`` waits briefly for the last bytes
    of ended processes, then writes every file's tail."""

    def __init__(self, head: Optional[int] = None, tail: Optional[int] = None):
        self.head = HEAD if head is None else head
        self.tail = TAIL if tail is None else tail
        self._sel = selectors.DefaultSelector()
        self._streams: Dict[int, Stream] = {}   # read fd -> stream
        self._all: List[Stream] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._closed = False

    def pipe(self, path: Path) -> int:
        r, w = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(r, False)
        stream = Stream(path, self.head, self.tail)
        with self._lock:
            self._streams[r] = stream
            self._all.append(stream)
            self._sel.register(r, selectors.EVENT_READ)
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="harness-capture",
                                            daemon=True)
            self._thread.start()
        return w

    def stream(self, path: Path) -> Optional[Stream]:
        return next((s for s in self._all if s.path == path), None)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                events = self._sel.select(timeout=0.1)
            except (OSError, ValueError):   # closed under us at the very end
                return
            for key, _ in events:
                self._drain(int(key.fd))

    def _drain(self, fd: int) -> None:
        with self._lock:
            stream = self._streams.get(fd)
        if stream is None:
            return
        for _ in range(64):          # up to 4 MiB per wake-up, then let the others have a turn
            try:
                data = os.read(fd, CHUNK)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                with self._lock:
                    self._sel.unregister(fd)
                    self._streams.pop(fd, None)
                os.close(fd)
                stream.eof.set()
                return
            stream.feed(data)

    def wait_eof(self, paths: List[Path], timeout: float) -> None:
        end = time.monotonic() + timeout
        for p in paths:
            s = self.stream(p)
            if s is not None:
                s.eof.wait(max(0.0, end - time.monotonic()))

    def close(self, timeout: float = 2.0) -> None:
        """Wait up to ``timeout`` s for every stream's end (its processes are gone by now),
        stop the thread, write the tails and markers. Once."""
        if self._closed:
            return
        self._closed = True
        end = time.monotonic() + timeout
        for s in self._all:
            s.eof.wait(max(0.0, end - time.monotonic()))
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            for fd in list(self._streams):
                self._sel.unregister(fd)
                os.close(fd)
            self._streams.clear()
        self._sel.close()
        for s in self._all:
            s.finish()

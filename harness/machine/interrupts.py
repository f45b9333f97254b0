"""SIGINT and SIGTERM: a killed or interrupted session cleans up exactly like one Ctrl-C.

This module owns what the harness does when it is told to stop:

* ``shield()``: a context manager for cleanup sections (killing ranks, tearing down
  namespaces, removing the run directory). While a shield is open in the main thread, SIGINT
  and SIGTERM are recorded, not raised; when the outermost shield closes, a deferred signal is
  raised there as ``KeyboardInterrupt`` (``Terminated`` for SIGTERM). So a second Ctrl-C, or a
  SIGTERM that lands during teardown, can no longer cut a cleanup in half.
* ``install()`` / ``uninstall()``: the front doors (the pytest plugin, the ``harness`` CLI) turn
  SIGTERM into ``Terminated`` (a ``KeyboardInterrupt``), so pytest and the harness unwind and
  clean up as they do after Ctrl-C. After the first signal every further SIGINT/SIGTERM only
  prints that cleanup is under way: repeating the signal cannot leave anything behind.
* ``mend_traceback()``: the interrupt's traceback with a line number in every entry. Python
  3.11 and newer give an entry no line number (``tb_lineno`` None) when the signal's exception
  lands on an instruction the compiler made (a loop's jump, a ``with`` block's exit), and
  pytest's report of the interrupt then fails (``TypeError`` in its traceback code) and turns
  Ctrl-C's exit status 2 into 1. Seen once in CI, in the two-quick-Ctrl-C test.
* the tally of runs cleaned up after an interrupt, the last line that says so (``summary()``),
  and ``reraise()``, which ends the process by the signal that stopped it (the conventional
  exit status 128 + N: 143 after SIGTERM, 130 after SIGINT).

Without ``install()`` (a script calling ``run_scenario`` itself), ``shield()`` installs its
handler for the length of the section and afterwards delivers a deferred signal to whatever
handler was there before (Python's KeyboardInterrupt, or SIGTERM's default: exit).

Signal handlers exist only in the main thread; in other threads ``shield()`` does nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from types import CodeType, FrameType, TracebackType
from typing import Any, Callable, Dict, Iterator, List, Optional

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM, unwound like Ctrl-C (pytest reports it as an interrupted session)."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(f"{signal.Signals(signum).name} received: stopping after cleanup")


_depth = 0                      # open shields (main thread)
_pending: Optional[int] = None  # a signal deferred by a shield
_first: Optional[int] = None    # the signal that interrupted this process (latched)
_installed = 0                  # install() nesting (the outermost front door owns the end)
_saved: Dict[int, Any] = {}     # handlers before ours
_temporary = False              # ours only for one shield (no front door installed)
_on_first: List[Callable[[int], None]] = []
_quiet = False                  # no "still cleaning up" line (xdist workers: the controller says)
_cleaned: List[str] = []        # runs cleaned up after an interrupt
_left: List[str] = []           # what such a cleanup could not remove
_final: List[str] = []          # the last line, as the session's front door worded it


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _say(text: str) -> None:
    try:   # os.write: safe inside a signal handler, whatever the main thread was printing
        os.write(2, (text + "\n").encode())
    except OSError:
        pass


def _interrupt(signum: int) -> KeyboardInterrupt:
    return Terminated(signum) if signum == signal.SIGTERM else KeyboardInterrupt()


def _handler(signum: int, frame: Optional[FrameType]) -> None:
    global _first, _pending
    name = signal.Signals(signum).name
    if _first is not None:
        if not _quiet:
                _say(f"harness: {name} again: still cleaning up ({_describe_first()}); nothing "
                 "is left behind once it ends")
        return
    if _depth > 0:
        if _pending is None:
            _pending = signum
        return
    _first = signum
    for cb in list(_on_first):
        try:
            cb(signum)
        except Exception:  # noqa: BLE001 - a forwarding helper must never mask the signal
            pass
    raise _interrupt(signum)


def _describe_first() -> str:
    return f"after {signal.Signals(_first).name}" if _first is not None else ""


def install(on_first: Optional[Callable[[int], None]] = None, quiet: bool = False) -> bool:
    """Convert SIGTERM (and SIGINT) for this process; nested calls only count.

    ``on_first(signum)`` runs once, on the first signal (e.g. forward it to xdist workers).
    Returns True for the outermost install, which owns ``reraise()``.
    """
    global _installed, _temporary, _quiet
    if not _main_thread():
        return False
    if on_first is not None:
        _on_first.append(on_first)
    _installed += 1
    if _installed > 1:
        return False
    _quiet = quiet
    if _temporary:      # a shield had put ours in temporarily: keep its saved handlers
        _temporary = False
    else:
        for s in SIGNALS:
            _saved[s] = signal.getsignal(s)
            signal.signal(s, _handler)
    return True


def uninstall() -> None:
    """Undo ``install()``; the outermost one restores the handlers and forgets the tally."""
    global _installed, _first, _pending, _temporary
    if not _main_thread() or _installed == 0:
        return
    _installed -= 1
    if _installed:
        return
    if _depth == 0:
        _restore()
    else:               # inside a shield: it restores them when it closes
        _temporary = True
    _on_first.clear()
    _first = _pending = None
    _cleaned.clear()
    _left.clear()
    _final.clear()


def _restore() -> None:
    for s, h in _saved.items():
        signal.signal(s, h if h is not None else signal.SIG_DFL)
    _saved.clear()


def interrupted() -> Optional[int]:
    """The signal that interrupted this process (SIGINT or SIGTERM), if any."""
    return _first


@contextlib.contextmanager
def shield() -> Iterator[None]:
    """Defer SIGINT/SIGTERM until the block has finished (see the module's doc)."""
    global _depth, _pending, _first, _temporary
    if not _main_thread():
        yield
        return
    if _depth == 0 and _installed == 0:
        for s in SIGNALS:
            _saved[s] = signal.getsignal(s)
            signal.signal(s, _handler)
        _temporary = True
    _depth += 1
    failed: Optional[BaseException] = None
    try:
        yield
    except BaseException as e:  # noqa: B036 - only noted: re-raised below
        failed = e
        raise
    finally:
        _depth -= 1
        if _depth == 0:
            pending, _pending = _pending, None
            if _temporary:
                _temporary = False
                _restore()
                if pending is not None and not isinstance(failed, KeyboardInterrupt):
                    signal.raise_signal(pending)   # to the handler that was there before
            elif pending is not None and _first is None:
                _first = pending
                for cb in list(_on_first):
                    with contextlib.suppress(Exception):
                        cb(pending)
                if not isinstance(failed, KeyboardInterrupt):
                    raise _interrupt(pending)


def _line_at(code: CodeType, lasti: int) -> int:
    """The line of the last instruction at or before byte offset ``lasti`` that has one."""
    line = code.co_firstlineno
    for start, _end, number in code.co_lines():
        if start > lasti:
            break
        if number is not None:
            line = number
    return line


def _mended(tb: Optional[TracebackType]) -> Optional[TracebackType]:
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    if all(e.tb_lineno is not None for e in entries):
        return entries[0] if entries else None
    out: Optional[TracebackType] = None
    for e in reversed(entries):
        line = e.tb_lineno
        if line is None:
            line = _line_at(e.tb_frame.f_code, e.tb_lasti)
        out = TracebackType(out, e.tb_frame, e.tb_lasti, line)
    return out


def mend_traceback(exc: BaseException) -> bool:
    """Give every entry of ``exc``'s traceback, and of the exceptions it was raised from or
    during, a line number (see the module's doc); an entry without one gets the line of the
    instruction before it. Returns whether anything changed."""
    changed = False
    seen = set()
    todo: List[Optional[BaseException]] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        tb = e.__traceback__
        mended = _mended(tb)
        if mended is not tb:
            e.__traceback__ = mended
            changed = True
        todo.extend([e.__cause__, e.__context__])
    return changed


def note_cleaned(run: str, left: Optional[List[str]] = None) -> None:
    """A run was interrupted and its cleanup has finished (``left``: what it could not remove)."""
    _cleaned.append(run)
    _left.extend(left or [])


def cleaned() -> List[str]:
    return list(_cleaned)


def left() -> List[str]:
    return list(_left)


def summary(cleaned_runs: Optional[int] = None, left: Optional[List[str]] = None,
            extra: str = "") -> str:
    """The last line after an interrupt: which signal, how many runs were cleaned up, and
    whether anything is left."""
    if _first is None:
        return ""
    n = len(_cleaned) if cleaned_runs is None else cleaned_runs
    lost = list(_left if left is None else left)
    what = f"cleaned up {n} run{'s' * (n != 1)}" if n else "no run was in progress"
    tail = ("; left behind: " + "; ".join(lost)) if lost else \
        " (ranks, port holders, namespaces, run directories)" if n else ""
    return f"harness: interrupted by {signal.Signals(_first).name}: {what}{tail}{extra}"


def set_final_line(line: str) -> None:
    """The pytest plugin words the last line (it knows the xdist workers' tallies); an outer
    front door (the CLI) prints it."""
    _final[:] = [line]


def final_line() -> str:
    return _final[0] if _final else ""


def exit_status() -> Optional[int]:
    """128 + N after signal N (the shell's convention), None when not interrupted."""
    return None if _first is None else 128 + int(_first)


def reraise(sig: Optional[int] = None) -> None:
    """End this process by the signal that interrupted it (or ``sig``), with its default action
    (so that a parent sees 'killed by SIGTERM': exit status 143, or 130 for SIGINT). Returns
    only when there was no signal."""
    sig = _first if sig is None else sig
    if sig is None:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    signal.signal(sig, signal.SIG_DFL)
    if sig == signal.SIGINT:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    os._exit(128 + int(sig))   # only if the signal is blocked

"""The harness's sitecustomize: every interpreter the harness observes starts here.

The launchers put this folder first on ``PYTHONPATH`` for the processes of a run whose code the
harness did not write (torchrun agents and their workers, a spawning parent and its children,
a user's script). With ``HARNESS_OBSERVE_ROLE`` set, :func:`harness.ranks.observer.install` runs;
then the ``sitecustomize`` this one hides (the interpreter's own, a virtualenv's) runs as it
would have; then a held process waits for the start line. Without the variable it only chains.
"""

import os
import sys
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain() -> None:
    import importlib.machinery
    import importlib.util

    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = mod
    spec.loader.exec_module(mod)


_observer: Any = None
if os.environ.get("HARNESS_OBSERVE_ROLE"):
    try:
        import harness.ranks.observer

        _observer = harness.ranks.observer
        _observer.install()
    except ImportError as e:   # the harness is not importable here: say so, run unobserved
        sys.stderr.write(f"harness: cannot observe this process: {e}\n")
        _observer = None
try:
    _chain()
except Exception as e:  # noqa: BLE001 - the hidden sitecustomize's failure, as Python says it
    sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                     f"{type(e).__name__}: {e}\n")
if _observer is not None:
    _observer.hold_if_asked()

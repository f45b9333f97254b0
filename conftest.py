"""Project-wide pytest set-up: after the session, check that no run leaked anything.

The plugin itself comes from the installed package (entry point ``pytest11``), for this project
exactly as for a user's own scenario folder.
"""

import os

import psutil
import pytest


def _harness_children():
    me = psutil.Process(os.getpid())
    out = []
    for p in me.children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if any(m in cmd for m in ("harness.ranks.worker", "harness.portholder", "harness.ranks.forkserver")):
            out.append(f"{p.pid} {cmd[:120]}")
    return out


@pytest.fixture(autouse=True, scope="session")
def _no_leaked_processes():
    yield
    # start: fork's zygotes live as long as the session (the plugin ends them at
    # pytest_sessionfinish, which comes after this teardown): ended here the same way, so that
    # whatever is still alive below is a leak, a zygote that would not go included
    from harness.ranks.forkclient import close_zygotes

    close_zygotes()
    left = _harness_children()
    assert not left, f"harness processes outlived their runs: {left}"

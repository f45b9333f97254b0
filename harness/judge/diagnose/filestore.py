"""Rules of init_method file://: a file that cannot be made or opened, a folder nobody made,
paths that differ per rank, a stale file a killed job left."""

from __future__ import annotations

import re
from typing import Optional

from ._core import Cause, RankContext, _exc_line, _first_line, rule

FILE_STORE_FAIL = re.compile(r"Operation not permitted|Read-only file system|Permission denied|"
                             r"No such file or directory|Is a directory", re.I)


@rule(order=80, evidence=("exception", "plan"))
def file_store_unusable(c: RankContext) -> Optional[Cause]:
    """init_method file://: the file store's file could not be made or opened there."""
    v = c.verdict
    init = c.plan_rank(v.label).get("init") or {}
    if v.outcome != "error" or init.get("method") != "file" or \
            not FILE_STORE_FAIL.search(v.message or ""):
        return None
    return Cause(f"the file store's file {init.get('url') or ''} could not be made or opened: "
                 f"{_first_line(v.message)}", [_exc_line(v)])


@rule(order=90, evidence=("stacks", "plan", "steps"))
def file_store_never_opened(c: RankContext) -> Optional[Cause]:
    """init_method file://, hung or timed out inside FileStore's constructor: torch retries
    open() of the file until it can be made, and its loop does not honour the group's timeout
    (a folder that does not exist, a share not mounted on this node)."""
    v = c.verdict
    init = c.plan_rank(v.label).get("init") or {}
    stacks = (c.obs.stacks or "") if c.obs is not None else ""
    if v.outcome not in ("hang", "timeout") or init.get("method") != "file" or \
            "_file_rendezvous_handler" not in stacks:
        return None
    url = str(init.get("url") or "")
    folder = url.removeprefix("file://").rsplit("/", 1)[0]
    made = [st for st in c.run.step_log if (st.what or "").startswith("make the directory")]
    said = "" if any(folder == (st.what or "").removeprefix("make the directory ").strip()
                     for st in made) else f": nobody made its folder {folder}"
    return Cause(f"stuck opening the file store {url}{said}; torch's FileStore retries open() "
                 "and never honours the group's timeout", [v.reason])


@rule(order=610, evidence=("plan",))
def file_store_paths_differ(c: RankContext) -> Optional[Cause]:
    """init_method file:// with a different path per rank: each waits alone in its own file."""
    v = c.verdict
    init = c.plan_rank(v.label).get("init") or {}
    if v.outcome not in ("timeout", "hang") or init.get("method") != "file":
        return None
    urls = {str(r.get("label")): (r.get("init") or {}).get("url")
            for r in c.run.plan.get("ranks", []) if r.get("role", "rank") == "rank"}
    if len(set(urls.values())) < 2:
        return None
    told = ", ".join(f"rank {k} {u}" for k, u in urls.items())
    return Cause(f"the ranks were given different file:// paths ({told}): each waited for the "
                 f"others in a file nobody else opened", [_exc_line(v) if v.exception
                                                           else v.reason])


@rule(order=100, evidence=("exception", "plan", "steps"))
def stale_file_store(c: RankContext) -> Optional[Cause]:
    """init_method file:// on a file a killed job left (the scenario's ``file_init:
    stale_file``): it still holds that job's rank-0 gloo address, and a rank that reads it
    before the new rank 0 writes its own dials the dead job and is refused."""
    v = c.verdict
    init = c.plan_rank(v.label).get("init") or {}
    stale = next((st for st in c.run.step_log
                  if (st.what or "").startswith("leave a stale FileStore")), None)
    m = re.search(r"Connection refused, remote=(\[[^\]]+\]:\d+)", v.message or "")
    if v.outcome not in ("error", "timeout") or v.phase != "init" \
            or init.get("method") != "file" or stale is None:
        return None
    if m is None:
        if "connectFullMesh" not in (v.message or "") or \
                not re.search(r"Connect timeout|timed out connecting", v.message or ""):
            return None
        return Cause("gloo's full mesh never connected (gloo's connect timeout): the file store "
                     f"{init.get('url') or ''} was left by a killed earlier job (the scenario's "
                     "file_init stale_file fault) and still held that job's gloo addresses: "
                     "the new ranks' mesh dialled the dead job's instead of each other's until "
                     "gloo gave up",
                     [_exc_line(v), stale.what])
    return Cause(f"gloo's full mesh dialled {m.group(1)} and was refused: the file store "
                 f"{init.get('url') or ''} was left by a killed earlier job (the scenario's "
                 "file_init stale_file fault) and still held that job's rank-0 address; this "
                 "rank read it before the new rank 0 wrote its own", [_exc_line(v), stale.what])

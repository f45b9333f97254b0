"""Rows: which processes a run can have, and which expectation key speaks of which (pure).

A row of the verdict table is one process (the label grammar is :mod:`harness.core.protocol`'s):
a rank ``R`` (its first attempt) or ``R@A`` (the A-th restart of a torchrun agent's workers), an
agent ``agent:HOST``, a spawning parent ``parent:HOST``, each with a job prefix for a second job
(``job2:0``). A launcher says which rows a scenario's run can have (:class:`RowSet`); the loader
refuses an expectation key or a fault target that names none of them; ``expect`` finds the key
that speaks of a row (:func:`key_for`).

Expectation keys: a label; ``*`` every rank (any attempt) that no other key names;
``R@*`` rank R in every attempt; ``*@A`` every rank in attempt A; ``agent:*`` every agent;
``parent:*`` every spawning parent. The most specific key wins: the label itself, then
``R@*``, then ``*@A``, then ``*`` (agents: the label, then ``agent:*``; a host's second agent,
``agent:node0#2``, is an agent too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional

from .protocol import agent_label, parse_label, worker_label

AGENT_WILDCARD = "agent:*"
PARENT_WILDCARD = "parent:*"
_RANK_ANY = re.compile(r"^(?:(job[0-9]{1,3}):)?([0-9]{1,4})@\*\Z", re.ASCII)
_ATTEMPT_ANY = re.compile(r"^(?:(job[0-9]{1,3}):)?\*@([0-9]{1,3})\Z", re.ASCII)
_TWIN = re.compile(r"^(?:job[0-9]{1,3}:)?agent:[^#]+#[0-9]{1,4}\Z", re.ASCII)


@dataclass
class RowSet:
    """The rows a run can have: ranks 0..world-1 in attempts 0..attempts, agents, parents."""

    world: int
    attempts: int = 0
    agents: List[str] = field(default_factory=list)      # labels
    parents: List[str] = field(default_factory=list)     # labels
    job: str = ""
    extra: List[str] = field(default_factory=list)       # other labels (a fault's own ranks)

    def labels(self, limit: int = 4096) -> List[str]:
        out = list(self.agents) + list(self.parents)
        for a in range(self.attempts + 1):
            for r in range(self.world):
                out.append(worker_label(r, a, self.job))
                if len(out) >= limit:
                    return out
        return out + list(self.extra)

    def has(self, label: str) -> bool:
        if label in self.agents or label in self.parents or label in self.extra:
            return True
        p = parse_label(label)
        return (p is not None and p.kind == "rank" and p.job == self.job and p.rank is not None
                and p.rank < self.world and p.attempt <= self.attempts)

    def describe(self) -> str:
        pre = f"{self.job}:" if self.job else ""
        parts = [f"ranks {pre}0..{pre}{self.world - 1}" if self.world > 1 else f"rank {pre}0"] \
            if self.world else []
        if self.attempts:
            parts.append(f"restart attempts R@1..R@{self.attempts}")
        parts += self.agents + self.parents + self.extra
        return ", ".join(parts)


def agents_of(hosts: Iterable[str], job: str = "") -> List[str]:
    return [agent_label(h, job) for h in hosts]


def key_ok(key: str, sets: Iterable[RowSet]) -> Optional[str]:
    """None when the expectation key ``key`` may stand in a scenario whose runs have the rows
    ``sets`` (the main job's and a second job's), else why not."""
    sets = list(sets)
    if key == "*":
        return None
    if key == AGENT_WILDCARD:
        return None if any(s.agents for s in sets) else "no agent runs here (launcher: torchrun " \
            "starts one per host)"
    if key == PARENT_WILDCARD:
        return None if any(s.parents for s in sets) else "no spawning parent runs here " \
            "(launcher: spawn starts one per host)"
    m = _RANK_ANY.match(key)
    if m:
        job, r = m.group(1) or "", int(m.group(2))
        return None if any(s.job == job and r < s.world for s in sets) else \
            f"rank {r} is outside the world ({'; '.join(s.describe() for s in sets)})"
    m = _ATTEMPT_ANY.match(key)
    if m:
        job, a = m.group(1) or "", int(m.group(2))
        return None if any(s.job == job and a <= s.attempts for s in sets) else \
            f"attempt {a}: no restart attempt {a} can happen here (max_restarts of the torchrun " \
            "launcher)"
    if any(s.has(key) for s in sets):
        return None
    return f"{key[:40]} is not a process of this run ({'; '.join(s.describe() for s in sets)})"


def key_for(keys: Iterable[str], label: str) -> Optional[str]:
    """The expectation key that speaks of the row ``label``: the label itself, else the most
    specific wildcard that covers it, else None."""
    keys = list(keys)
    if label in keys:
        return label
    p = parse_label(label)
    if p is None and _TWIN.match(label):     # a host's second agent (agent:node0#2)
        return AGENT_WILDCARD if AGENT_WILDCARD in keys else None
    if p is None:
        return "*" if "*" in keys else None
    if p.kind == "agent":
        return AGENT_WILDCARD if AGENT_WILDCARD in keys else None
    if p.kind == "parent":
        return PARENT_WILDCARD if PARENT_WILDCARD in keys else None
    prefix = f"{p.job}:" if p.job else ""
    for k in (f"{prefix}{p.rank}@*", f"{prefix}*@{p.attempt}"):
        if k in keys:
            return k
    return "*" if "*" in keys else None


def covers(key: str, label: str) -> bool:
    """Whether the expectation key ``key`` speaks of the row ``label`` when it stands alone
    (a ``tally:`` key counts the rows it covers)."""
    return key_for([key], label) == key


def sort_key(label: str) -> tuple:
    """Rows in a readable order: agents and parents first, then ranks by job, attempt, rank."""
    p = parse_label(label)
    if p is None:
        return (3, "", 0, 0, label)
    if p.kind in ("agent", "parent"):
        return (0 if p.kind == "agent" else 1, p.job, 0, 0, p.host)
    return (2, p.job, p.attempt, p.rank or 0, "")


def by_job(sets: Iterable[RowSet]) -> Dict[str, RowSet]:
    return {s.job: s for s in sets}

"""Exploring a fault space: draw scenarios from a declared space, run each for real, check
invariants, shrink a draw that breaks one to the smallest scenario that still breaks it.

A space file is an ordinary scenario file (its fields are the base of every draw; ``expect:``
is optional) with an ``explore:`` block::

    explore:
      world_size: {min: 2, max: 3}          # an int, {min, max} or {one_of: [...]}
      fields:                               # scenario fields drawn too (any launcher, hosts,
        timeout: {one_of: [2, 5, 10]}       # timeout, workload, start...)
        launcher: {one_of: [direct, {kind: torchrun, max_restarts: {min: 0, max: 2}}]}
      max_faults: 2                         # a draw takes 0..max_faults of the faults below
      faults:                               # each at most once per draw; any registered kind
        - kind: busy_port
          mode: any                         # drawn from the fault's own model (its Literal)
        - kind: delayed_rank
          ranks: [any_rank]                 # any_rank: a rank of the drawn world
          delay: {min: 0, max: 8, step: 0.5}
      invariants:
        - no_hang: {within: 20}
        - ok_without_faults

A parameter value is a fixed value (lists and mappings are walked: their values may be drawn
too), ``{one_of: [...]}``, ``{min, max[, step]}`` (integers when both are integers and no step
is given, else min + k*step), the word ``any_rank``, or the word ``any``: drawn from the
field's own pydantic model (a fault's, or the scenario's for ``fields:``): a Literal's values,
a bool, an Optional's null (the default) or value, a narrow bounded number, ``rank``/``ranks``
as any_rank; a field whose type cannot be drawn that way is a located problem. With ``hosts:``
or ``nodes:`` (fixed or drawn), the world is the hosts' ranks.

Drawing and shrinking are Hypothesis's (``hypothesis.given`` driven here, seeded with
``hypothesis.seed``; no example database): the same seed gives the same draws. The draws run
in parallel: Hypothesis first proposes ``--runs`` draws with nothing run (a draw is judged only
on whether it loads and can run here, as the real exploration judges it), every one of them
runs for real, ``--jobs`` at a time, as one pytest session on pytest-xdist's workers (the
harness's own worker pool: ``harness run -n``), and their results fill a cache keyed by the
scenario's canonical form. Hypothesis then explores again with the same seed: until the first
broken invariant its draws are the same ones, answered from the cache; the first that breaks
one is shrunk (each shrink step is a real run, one at a time: a step depends on the last),
confirmed uncached and written out as an ordinary scenario file. A draw the cache does not
hold (a run that was a harness error made Hypothesis go another way) is run then, alone.

The parts: ``space`` (the space file), ``invariants``, ``strategy`` (drawing), ``runs``
(running draws for real), ``engine`` (the exploration), ``command`` (``harness explore``).
"""

from __future__ import annotations

from .command import MAX_JOBS, add_parser, cmd_explore, found_scenario, write_scenario
from .engine import Batch, Exploration, Progress, default_jobs, pure_draws, thread_batch
from .invariants import INVARIANT_PARAMS, INVARIANTS, SUPERVISORS, Invariant, last_attempt
from .runs import prepare, result_of_case, run_batch, run_draw
from .space import (
    ANY,
    ANY_RANK,
    MAX_ANY_INTS,
    MAX_ANY_SPAN,
    MAX_WORLD_EXPLORED,
    NOT_DRAWN,
    Space,
    hosts_world,
    load_space,
    load_space_text,
    model_any,
)
from .strategy import canonical, draw_strategy, short

__all__ = ["ANY", "ANY_RANK", "Batch", "Exploration", "INVARIANTS", "INVARIANT_PARAMS",
           "Invariant", "MAX_ANY_INTS", "MAX_ANY_SPAN", "MAX_JOBS", "MAX_WORLD_EXPLORED",
           "NOT_DRAWN", "Progress", "SUPERVISORS", "Space", "add_parser", "canonical",
           "cmd_explore", "default_jobs", "draw_strategy", "found_scenario", "hosts_world",
           "last_attempt", "load_space", "load_space_text", "model_any", "prepare", "pure_draws",
           "result_of_case", "run_batch", "run_draw", "short", "thread_batch", "write_scenario"]

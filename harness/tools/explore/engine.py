"""The exploration: Hypothesis driven over a space with a seed. ``Exploration.predraw`` asks
for the seed's draws with nothing run, ``run_all`` runs them as one batch into a cache by
canonical form, then Hypothesis explores again with the same seed, replays the draws from the
cache and shrinks the first that broke an invariant (each shrink step a real run). ``Progress``:
the lines and, on a terminal, a live bar."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from .runs import prepare, run_draw
from .space import Space
from .strategy import canonical, draw_strategy, short


class Progress:
    """Lines (one per draw, shrink step and confirmation) and, on a terminal, a live bar of
    draws, failures and shrink steps (rich's, already a dependency). Lines go above the bar."""

    def __init__(self, say: Callable[[str], None], bar: bool = False):
        self._say = say
        self.bar: Any = None
        self.tasks: Dict[str, Any] = {}
        self.failures = 0
        if bar:
            from rich import progress as rp
            from rich.console import Console

            con = Console(file=sys.stderr)
            self.bar = rp.Progress(rp.TextColumn("[bold]{task.fields[what]:13}"),
                                   rp.BarColumn(), rp.MofNCompleteColumn(),
                                   rp.TimeElapsedColumn(), rp.TextColumn("{task.description}"),
                                   console=con, transient=True, redirect_stdout=False,
                                   redirect_stderr=False)
            self.bar.start()

    def say(self, line: str) -> None:
        if self.bar is not None:
            self.bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            self._say(line)

    def _task(self, what: str, total: int) -> None:
        if self.bar is not None:
            if what in self.tasks:
                self.bar.update(self.tasks[what], total=total)
            else:
                self.tasks[what] = self.bar.add_task(self._desc(), total=total, what=what)

    def _desc(self) -> str:
        return f"failing draws {self.failures}"

    def _advance(self, what: str) -> None:
        if self.bar is not None and what in self.tasks:
            self.bar.update(self.tasks[what], advance=1)
            for t in self.tasks.values():
                self.bar.update(t, description=self._desc())

    def start(self, what: str, total: int) -> None:
        self._task(what, total)

    def step(self, what: str, failed: bool) -> None:
        self.failures += int(failed and what == "draws")
        self._advance(what)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def _stderr_line(s: str) -> None:
    print(s, file=sys.stderr, flush=True)


def default_jobs() -> int:
    """Runs at a time: the CPUs this process may use (at most 8)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(8, n))


Batch = Callable[[List[Dict[str, Any]], int, Callable[[int, Dict[str, Any]], None]],
                 List[Dict[str, Any]]]


@dataclass
class Exploration:
    space: Space
    seed: int
    runs: int
    max_shrinks: int = 20
    confirm: int = 1
    jobs: int = 1
    runner: Callable[[Dict[str, Any]], Dict[str, Any]] = run_draw
    # every draw at once, ``jobs`` at a time (None: one at a time, as Hypothesis asks)
    batch: Optional[Batch] = None
    # whether a draw can run here, nothing run (the pre-draw judges draws as the runs do)
    prepare: Callable[[Dict[str, Any]], Optional[Dict[str, Any]]] = prepare
    say: Callable[[str], None] = _stderr_line
    progress: Optional[Progress] = None
    records: List[Dict[str, Any]] = field(default_factory=list)
    cache: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    target: Optional[str] = None          # the invariant being shrunk
    last_failing: Optional[Dict[str, Any]] = None
    draws_done: int = 0
    shrinks_done: int = 0
    planned: int = 0                      # draws of the pre-draw (the parallel batch)
    _prepared: Dict[str, Optional[Dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.progress is None:
            self.progress = Progress(self.say)

    def _can_run(self, draw: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        key = canonical(draw)
        if key not in self._prepared:
            self._prepared[key] = self.prepare(draw)
        return self._prepared[key]

    def _out(self, line: str) -> None:
        assert self.progress is not None
        self.progress.say(line)

    def _judge(self, draw: Dict[str, Any], res: Dict[str, Any]) -> Dict[str, Any]:
        res["broken"] = {} if "verdicts" not in res else {
            inv.label(): why for inv in self.space.invariants
            if (why := inv.broken(draw, res["verdicts"])) is not None}
        return res

    def _record(self, phase: str, draw: Dict[str, Any], res: Dict[str, Any]) -> None:
        self.records.append({"n": len(self.records) + 1, "phase": phase, "scenario": draw,
                             **res})

    def _fails(self) -> int:
        return sum(1 for r in self.records if r.get("broken"))

    def _check(self, draw: Dict[str, Any]) -> None:
        from hypothesis import reject

        key = canonical(draw)
        phase = "shrink" if self.target else "draw"
        cached = key in self.cache
        if not cached and phase == "shrink" and self.shrinks_done >= self.max_shrinks:
            reject()          # shrink budget spent: not run, so it cannot be the minimum
        if not cached:
            if phase == "draw":
                self.draws_done += 1
                head = f"draw {self.draws_done}/{max(self.runs, self.planned)}"
            else:
                self.shrinks_done += 1
                head = f"shrink step {self.shrinks_done}/{self.max_shrinks} ({self.target})"
            self._out(f"explore: {head}: {short(draw, self.space)} ...")
            res = self._judge(draw, self.runner(draw))
            self.cache[key] = res
            self._record(phase, draw, res)
            assert self.progress is not None
            self.progress.step("shrink steps" if phase == "shrink" else "draws",
                               bool(res["broken"]))
            self._out(f"explore: {head}: {self._said(res)}; failures so far {self._fails()}")
        res = self.cache[key]
        if "verdicts" not in res:
            reject()
        broken = res["broken"]
        if self.target is None and broken:
            self.target = next(iter(broken))
            assert self.progress is not None
            self.progress.start("shrink steps", self.max_shrinks)
        if self.target is not None and self.target in broken:
            self.last_failing = draw
            raise AssertionError(f"{self.target}: {broken[self.target]}")

    @staticmethod
    def _said(res: Dict[str, Any]) -> str:
        if "verdicts" not in res:
            for k in ("skipped", "invalid", "error"):
                if k in res:
                    return f"{'harness error' if k == 'error' else k}: {res[k]}"
            return "no result"
        ranks = ", ".join(f"{v['label']}={v['outcome']}" for v in res["verdicts"])
        b = res.get("broken") or {}
        return f"job {res['job']} ({ranks})" + (f"; BREAKS {', '.join(b)}" if b else "; holds")

    def _hypothesis(self, runner: Callable[[Dict[str, Any]], None]) -> None:
        from hypothesis import HealthCheck, Phase, Verbosity, given, settings
        from hypothesis import seed as hseed

        @hseed(self.seed)
        @settings(max_examples=self.runs, database=None, deadline=None, derandomize=False,
                  phases=[Phase.generate, Phase.shrink], verbosity=Verbosity.quiet,
                  suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                  print_blob=False)
        @given(draw_strategy(self.space))
        def prop(draw: Dict[str, Any]) -> None:
            runner(draw)

        # Hypothesis stops shrinking after 300 s, written for fast tests; a real run takes
        # seconds, and --max-shrinks is the budget here (an internal constant: set if present)
        from hypothesis.internal.conjecture import engine
        limit = getattr(engine, "MAX_SHRINKING_SECONDS", None)
        if limit is not None:
            engine.MAX_SHRINKING_SECONDS = 24 * 3600
        try:
            prop()
        except AssertionError:
            pass
        except Exception as e:   # Hypothesis's own complaints (unsatisfiable: all skipped)
            if type(e).__name__ not in ("Unsatisfiable", "NoSuchExample"):
                raise
        finally:
            if limit is not None:
                engine.MAX_SHRINKING_SECONDS = limit

    def predraw(self) -> List[Dict[str, Any]]:
        """The draws this seed gives while no invariant breaks, nothing run: each is judged
        only by ``prepare`` (loads, can run here), as the real exploration judges it."""
        from hypothesis import reject

        seen: List[Dict[str, Any]] = []
        keys = set()

        def look(draw: Dict[str, Any]) -> None:
            key = canonical(draw)
            if key not in keys:
                keys.add(key)
                seen.append(draw)
            if self._can_run(draw) is not None:
                reject()

        self._hypothesis(look)
        return seen

    def run_all(self) -> None:
        """Every draw of the pre-draw, run for real (``jobs`` at a time); the results fill
        the cache the exploration then reads."""
        assert self.batch is not None and self.progress is not None
        draws = self.predraw()
        pre = [self._can_run(d) for d in draws]
        todo = [i for i, p in enumerate(pre) if p is None]
        self.planned = len(todo)
        results: Dict[int, Dict[str, Any]] = {i: p for i, p in enumerate(pre) if p is not None}
        self._out(f"explore: {len(draws)} draws from seed {self.seed} ({len(todo)} to run, "
                  f"{self.jobs} at a time; {len(draws) - len(todo)} skipped or invalid here)")
        self.progress.start("draws", len(todo))
        done = [0]

        def got(j: int, res: Dict[str, Any]) -> None:
            i = todo[j]
            d = draws[i]
            results[i] = self._judge(d, res)
            done[0] += 1
            assert self.progress is not None
            self.progress.step("draws", bool(res["broken"]))
            fails = sum(1 for r in results.values() if r.get("broken"))
            self._out(f"explore: draw {done[0]}/{len(todo)} (#{i + 1}): {short(d, self.space)}: "
                      f"{self._said(res)}; failures so far {fails}")

        out = self.batch([draws[i] for i in todo], self.jobs, got)
        for j, res in enumerate(out):          # a draw whose result never came
            if todo[j] not in results:
                results[todo[j]] = self._judge(draws[todo[j]], res)
        for i, d in enumerate(draws):
            res = results[i]
            if "broken" not in res:
                res["broken"] = {}
            self.cache[canonical(d)] = res
            self._record("draw", d, res)
        self.draws_done = len(todo)

    def explore(self) -> Optional[Dict[str, Any]]:
        """Draw up to ``runs`` scenarios (all of them first, in parallel, with a batch);
        shrink the first that breaks an invariant. Returns {'invariant', 'scenario', 'why',
        'result'} of the minimal one, or None."""
        if self.batch is not None:
            self.run_all()
        self._hypothesis(self._check)
        if self.target is None or self.last_failing is None:
            return None
        res = self.cache[canonical(self.last_failing)]
        return {"invariant": self.target, "scenario": self.last_failing,
                "why": res["broken"][self.target], "result": res}

    def confirm_found(self, found: Dict[str, Any]) -> List[Dict[str, Any]]:
        """Re-run the minimal scenario ``confirm`` times, uncached."""
        out = []
        assert self.progress is not None
        if self.confirm:
            self.progress.start("confirmations", self.confirm)
        for i in range(self.confirm):
            self._out(f"explore: confirm {i + 1}/{self.confirm}: "
                      f"{short(found['scenario'], self.space)} ...")
            res = self.runner(found["scenario"])
            inv = next(v for v in self.space.invariants if v.label() == found["invariant"])
            why = inv.broken(found["scenario"], res["verdicts"]) if "verdicts" in res else None
            res["broken"] = {} if why is None else {inv.label(): why}
            self._record("confirm", found["scenario"], res)
            self.progress.step("confirmations", False)
            self._out(f"explore: confirm {i + 1}/{self.confirm}: {self._said(res)}")
            out.append(res)
        return out


def pure_draws(space: Space, seed: int, n: int,
               check: Callable[[Dict[str, Any]], Optional[Dict[str, Any]]] = lambda d: None
               ) -> List[Dict[str, Any]]:
    """The first ``n`` draws of ``seed``, nothing run (what a run of the explorer would try
    while no invariant breaks); ``check`` judges whether a draw can run (default: all can)."""
    return Exploration(space, seed, n, prepare=check, say=lambda s: None).predraw()


def thread_batch(runner: Callable[[Dict[str, Any]], Dict[str, Any]]) -> Batch:
    """A batch that runs ``runner`` on a thread pool, ``jobs`` at a time (for runners that
    stand in for torch: tests)."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    def batch(draws: List[Dict[str, Any]], jobs: int,
              on_result: Callable[[int, Dict[str, Any]], None]) -> List[Dict[str, Any]]:
        out: List[Optional[Dict[str, Any]]] = [None] * len(draws)
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futs = {pool.submit(runner, d): i for i, d in enumerate(draws)}
            for f in as_completed(futs):
                i = futs[f]
                out[i] = f.result()
                on_result(i, out[i])    # type: ignore[arg-type]
        return [o or {"error": "no result"} for o in out]
    return batch

"""harness explore: space files (located problems), seeded draws (pure), shrinking (with a
runner that stands in for torch: pure), and one real exploration whose written scenario breaks
the invariant again when run for real."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Dict, List

import pytest

from harness.scenario.loader import ScenarioFileError, load_file
from harness.tools.explore import (
    Exploration,
    Invariant,
    canonical,
    load_space_text,
    pure_draws,
    run_draw,
    short,
    thread_batch,
)

SPACE = """\
name: squat_late
about: a port squatter and a late rank
timeout: 3
deadline: 12
workload: [barrier]
explore:
  world_size: {min: 2, max: 4}
  max_faults: 2
  faults:
    - kind: busy_port
      mode: {one_of: [bound, listening, accepting]}
    - kind: delayed_rank
      ranks: [any_rank]
      delay: {min: 0, max: 6, step: 0.5}
    - kind: raise_exception
      rank: any_rank
      phase: {one_of: [init, "workload step 1"]}
  invariants:
    - no_hang: {within: 20}
    - ok_without_faults
"""


def space(text: str = SPACE):
    return load_space_text(textwrap.dedent(text), "space.yaml")


def test_same_seed_same_draws():
    a = pure_draws(space(), 7, 12)
    b = pure_draws(space(), 7, 12)
    assert 8 <= len(a) <= 12   # distinct draws: a draw proposed again is not counted twice
    assert [canonical(d) for d in a] == [canonical(d) for d in b]
    c = pure_draws(space(), 8, 12)
    assert [canonical(d) for d in a] != [canonical(d) for d in c]
    for d in a:   # every draw is inside the space
        assert 2 <= d["world_size"] <= 4
        assert len(d["faults"]) <= 2
        for f in d["faults"]:
            if f["kind"] == "delayed_rank":
                assert 0 <= f["ranks"][0] < d["world_size"] and 0 <= f["delay"] <= 6
                assert (f["delay"] * 2) == int(f["delay"] * 2)
            if f["kind"] == "raise_exception":
                assert 0 <= f["rank"] < d["world_size"]


def test_draws_are_scenarios_the_loader_takes():
    import yaml

    from harness.scenario.loader import load_text

    for d in pure_draws(space(), 3, 10):
        (scn,) = load_text(yaml.safe_dump(d), "draw.yaml")
        assert scn.world_size == d["world_size"]


def _fake(draw: Dict[str, Any]) -> Dict[str, Any]:
    """Stands in for torch: a raise_exception makes its rank an error, others time out; a
    delayed rank (any delay) is ok."""
    out = []
    raised = [f["rank"] for f in draw["faults"] if f["kind"] == "raise_exception"]
    for r in range(draw["world_size"]):
        o = "ok" if not raised else ("error" if r in raised else "timeout")
        out.append({"label": str(r), "outcome": o, "phase": "init", "duration": 1.0,
                    "exception": None, "cause": ""})
    job = "timeout" if raised and len(out) > 1 else ("error" if raised else "ok")
    return {"job": job, "verdicts": out}


def test_shrinks_to_the_smallest_draw_that_breaks():
    sp = space(SPACE.replace("- no_hang: {within: 20}\n    - ok_without_faults",
                             "- no_error"))
    said: List[str] = []
    ex = Exploration(sp, 5, 30, max_shrinks=200, runner=_fake, say=said.append)
    found = ex.explore()
    assert found is not None and found["invariant"] == "no_error"
    # the minimum: the smallest world, the one fault that raises, at rank 0, its first phase
    assert found["scenario"]["world_size"] == 2
    assert found["scenario"]["faults"] == [{"kind": "raise_exception", "rank": 0,
                                            "phase": "init"}]
    assert any(r["phase"] == "shrink" for r in ex.records)
    assert any("shrink step" in s for s in said) and any("draw 1/30" in s for s in said)
    # nothing run twice: the cache answers a draw proposed again
    keys = [canonical(r["scenario"]) for r in ex.records]
    assert len(keys) == len(set(keys))


def test_no_failure_when_every_invariant_holds():
    ex = Exploration(space(), 1, 8, runner=lambda d: {"job": "ok", "verdicts": []},
                     say=lambda s: None)
    assert ex.explore() is None
    assert 4 <= ex.draws_done <= 8 and ex.target is None


@pytest.mark.parametrize("text, where", [
    ("name: x\nabout: y\n", "space.yaml:1: explore: required"),
    ("name: x\nabout: y\nexplore:\n  faults:\n    - kind: no_such\n  invariants: [no_hang]\n",
     "space.yaml:5: explore.faults[0].kind: unknown fault kind 'no_such'"),
    ("name: x\nabout: y\nexplore:\n  faults:\n    - kind: delayed_rank\n"
     "      delay: {min: 5, max: 1}\n  invariants: [no_hang]\n",
     "space.yaml:6: explore.faults[0].delay: min 5 is above max 1"),
    ("name: x\nabout: y\nexplore:\n  faults: []\n  invariants:\n    - no_hang\n"
     "    - always_green\n", "space.yaml:7: explore.invariants[1]: unknown invariant"),
    ("name: x\nabout: y\nexplore:\n  world_size: {min: 2, max: 99}\n  invariants: [no_hang]\n",
     "space.yaml:4: explore.world_size: a world size is a whole number from 1 to 8"),
    ("name: x\nabout: y\nexplore:\n  invariants: [no_hang]\n  max_fault: 2\n",
     "space.yaml:5: explore.max_fault: unknown field"),
    ("name: x\nabout: y\ntimeout: -1\nexplore:\n  invariants: [no_hang]\n",
     "space.yaml:3: timeout:"),
    ("name: x\nabout: y\nexplore:\n  faults:\n    - kind: delayed_rank\n      dellay: 3\n"
     "  invariants: [no_hang]\n", "space.yaml:6: explore.faults[0].dellay: unknown field"),
    ("name: x\nabout: y\nexplore:\n  invariants:\n    - no_hang: {within: -3}\n",
     "space.yaml:5: explore.invariants[0].no_hang.within: seconds above 0"),
])
def test_bad_space_files_get_located_problems(text, where):
    with pytest.raises(ScenarioFileError) as e:
        load_space_text(text, "space.yaml")
    assert any(str(p).startswith(where) for p in e.value.problems), e.value.problems


def test_cli_bad_space_file(tmp_path, capsys):
    from harness.cli import main

    p = tmp_path / "s.yaml"
    p.write_text("name: x\nabout: y\nexplore:\n  invariants: [nope]\n")
    assert main(["explore", str(p)]) == 2
    assert f"{p}:4: explore.invariants[0]: unknown invariant 'nope'" in capsys.readouterr().err


REAL = """\
name: raise_or_late
about: a deliberately broken invariant (no_error, with a fault that always raises)
timeout: 3
deadline: 10
workload: [barrier]
explore:
  world_size: 2
  max_faults: 2
  faults:
    - kind: delayed_rank
      ranks: [1]
      delay: 0.5
    - kind: raise_exception
      rank: any_rank
      phase: "workload step 1"
  invariants:
    - no_error
"""


@pytest.mark.timeout(600)
def test_real_exploration_shrinks_and_the_written_file_breaks_it_again(tmp_path, capsys):
    """Real torch runs (each ~5-15 s here): draws until a raise_exception is drawn, shrinks,
    confirms once, writes the file; the file is loaded and run once more for real."""
    import json

    from harness.cli import main

    base = tmp_path / "space.yaml"
    base.write_text(REAL)
    rep = tmp_path / "report.json"
    rc = main(["explore", str(base), "--seed", "2", "--runs", "6", "--max-shrinks", "6",
               "--jobs", "2", "--confirm", "1", "--out", str(tmp_path / "found"),
               "--report", str(rep)])
    err = capsys.readouterr().err
    assert rc == 1, err
    report = json.loads(rep.read_text())
    found = report["found"]
    assert found["invariant"] == "no_error" and found["confirmed"] == "1/1"
    # the minimum keeps only the fault that raises (a delay does not make an error)
    assert [f["kind"] for f in found["scenario"]["faults"]] == ["raise_exception"], err
    assert "draw 1/" in err and "confirm 1/1" in err
    phases = [d["phase"] for d in report["draws"]]
    assert phases.count("confirm") == 1 and "draw" in phases
    (scn,) = load_file(found["file"])
    assert "no_error" in scn.about and "--seed 2" in scn.about
    again = run_draw(json.loads(json.dumps(found["scenario"])))
    raised = found["scenario"]["faults"][0]["rank"]
    verdict = {v["label"]: v["outcome"] for v in again["verdicts"]}
    assert verdict[str(raised)] == "error", (short(found["scenario"]), again)
    assert scn.expect[0].ranks[str(raised)].outcome == ["error"] or \
        "error" in str(scn.expect[0].ranks[str(raised)].outcome)
    assert Path(found["file"]).parent == tmp_path / "found"
    # nothing of the ~10 runs is left: no process of ours (each run's own cleanup raises a
    # HarnessError when it leaves a namespace, a table or its run directory behind)
    import psutil

    assert psutil.Process().children(recursive=True) == []


def test_no_hang_within_counts_from_the_rank_own_start():
    inv = Invariant("no_hang", 12.0)
    late = {"label": "1", "outcome": "timeout", "phase": "init", "duration": 13.5,
            "released": 6.0}
    assert inv.broken({"faults": []}, [late]) is None          # 7.5 s after its own start
    assert "later than 12" in inv.broken({"faults": []}, [dict(late, released=0.0)])
    assert "hang" in inv.broken({"faults": []}, [dict(late, outcome="hang")])
    assert Invariant("no_hang").broken({"faults": []}, [dict(late, released=0.0)]) is None
    ok = Invariant("ok_without_faults")
    assert ok.broken({"faults": [{"kind": "x"}]}, [late]) is None
    assert "no fault" in ok.broken({"faults": []}, [late])


# -- the parallel path: every draw first, jobs at a time, then the same exploration ----------

def test_parallel_draws_are_the_sequential_draws_and_shrink_alike():
    """With a batch (a thread pool, 3 at a time, results arriving out of order), the draws
    run are exactly the seed's pure draws; the exploration then replays them from the cache
    (no draw is run twice, none after the batch but shrink steps) and finds the same minimum
    as the one-at-a-time exploration."""
    import random
    import threading
    import time

    sp = space(SPACE.replace("- no_hang: {within: 20}\n    - ok_without_faults",
                             "- no_error"))
    lock = threading.Lock()
    active, most = [0], [0]

    def slow_fake(d):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(random.uniform(0, 0.02))   # out of order
        with lock:
            active[0] -= 1
        return _fake(d)

    seq = Exploration(sp, 5, 30, max_shrinks=200, runner=_fake, say=lambda s: None)
    par = Exploration(sp, 5, 30, max_shrinks=200, runner=_fake, batch=thread_batch(slow_fake),
                      jobs=3, prepare=lambda d: None, say=lambda s: None)
    a, b = seq.explore(), par.explore()
    assert a is not None and b is not None
    assert a["scenario"] == b["scenario"] and a["invariant"] == b["invariant"]
    assert most[0] > 1                                   # ran in parallel
    draws = [r["scenario"] for r in par.records if r["phase"] == "draw"]
    assert [canonical(d) for d in draws] == [canonical(d) for d in pure_draws(sp, 5, 30)]
    keys = [canonical(r["scenario"]) for r in par.records]
    assert len(keys) == len(set(keys))
    first_bad = next(i for i, r in enumerate(par.records) if r["broken"])
    # the sequential exploration stopped drawing at its first failure; the same draw is the
    # first failure of the batch, and the batch also ran (and recorded) the draws after it
    assert canonical(par.records[first_bad]["scenario"]) == \
        canonical(next(r["scenario"] for r in seq.records if r["broken"]))
    assert len(draws) >= len([r for r in seq.records if r["phase"] == "draw"])


def test_parallel_exploration_without_a_failure_runs_each_draw_once():
    calls = []

    def count(d):
        calls.append(canonical(d))
        return {"job": "ok", "verdicts": []}

    ex = Exploration(space(), 1, 8, runner=count, batch=thread_batch(count), jobs=2,
                     prepare=lambda d: None, say=lambda s: None)
    assert ex.explore() is None
    assert len(calls) == len(set(calls)) == ex.planned
    assert [r["phase"] for r in ex.records] == ["draw"] * len(calls)


def test_a_draw_that_cannot_run_is_rejected_alike_in_the_predraw_and_the_runs():
    """A draw prepare refuses (skipped here) is never run; the replay sees it refused too, so
    the draws stay the same as the pure draws with the same judge."""
    def refuse(d):
        return {"skipped": "no"} if d["world_size"] == 3 else None

    ran = []

    def run(d):
        ran.append(d)
        return {"job": "ok", "verdicts": []}

    ex = Exploration(space(), 4, 10, runner=run, batch=thread_batch(run), jobs=2,
                     prepare=refuse, say=lambda s: None)
    ex.explore()
    assert ran and all(d["world_size"] != 3 for d in ran)
    want = pure_draws(space(), 4, 10, check=refuse)
    assert [canonical(r["scenario"]) for r in ex.records] == [canonical(d) for d in want]
    assert any(r.get("skipped") for r in ex.records)


def test_progress_lines_count_draws_failures_and_shrink_steps():
    said: List[str] = []
    sp = space(SPACE.replace("- no_hang: {within: 20}\n    - ok_without_faults",
                             "- no_error"))
    ex = Exploration(sp, 5, 12, max_shrinks=5, runner=_fake, batch=thread_batch(_fake), jobs=2,
                     prepare=lambda d: None, say=said.append)
    ex.explore()
    assert any(s.startswith("explore: ") and "draws from seed 5" in s for s in said)
    assert any("draw 1/" in s and "failures so far" in s for s in said)
    assert any("shrink step 1/5" in s for s in said)
    assert ex.progress is not None and ex.progress.failures >= 1


# -- invariants --------------------------------------------------------------------------------

def _row(label, outcome, role="rank", node=None, phase="init", exc=None, duration=1.0,
         released=0.0):
    return {"label": label, "outcome": outcome, "role": role, "node": node, "phase": phase,
            "exception": exc, "duration": duration, "released": released}


def test_agents_agree_with_workers():
    inv = Invariant("agents_agree_with_workers")
    torchrun = {"faults": [], "launcher": {"kind": "torchrun"}}
    agent = lambda o, e=None: _row("agent:local", o, role="agent", exc=e)  # noqa: E731
    w = lambda lab, o: _row(lab, o, role="worker", node="agent:local")    # noqa: E731
    # agree: all ok; a worker failed and the agent failed; a restart recovered
    assert inv.broken(torchrun, [agent("ok"), w("0", "ok"), w("1", "ok")]) is None
    assert inv.broken(torchrun, [agent("error", "ChildFailedError"), w("0", "crash"),
                                 w("1", "crash")]) is None
    assert inv.broken(torchrun, [agent("ok"), w("0", "crash"), w("1", "crash"),
                                 w("0@1", "ok"), w("1@1", "ok")]) is None
    # disagree: the agent says ok while a worker of its last attempt failed
    why = inv.broken(torchrun, [agent("ok"), w("0", "ok"), w("1", "error")])
    assert why is not None and "agent:local ended ok while its worker 1 ended in error" in why
    why = inv.broken(torchrun, [agent("ok"), w("0", "crash"), w("0@1", "timeout"),
                                w("1@1", "ok")])
    assert why is not None and "worker 0@1" in why
    # disagree: the agent hung (or failed) while every worker ended ok
    why = inv.broken(torchrun, [agent("hang"), w("0", "ok"), w("1", "ok")])
    assert why is not None and "agent:local ended in hang" in why and "0, 1" in why
    # an agent the draw's own fault targets is left out; a parent is judged like an agent
    killed = {"faults": [{"kind": "kill_rank", "rank": "agent:local"}]}
    assert inv.broken(killed, [agent("crash"), w("0", "ok")]) is None
    parent = _row("parent:local", "ok", role="parent")
    child = _row("1", "error", role="worker", node="parent:local")
    assert "parent:local ended ok" in inv.broken({"faults": []}, [parent, child])
    # direct ranks have no supervisor: nothing to agree on
    assert inv.broken({"faults": []}, [_row("0", "error"), _row("1", "ok")]) is None


def test_restarts_recover():
    inv = Invariant("restarts_recover")
    kill = lambda r: {"kind": "kill_rank", "rank": r, "phase": "init"}  # noqa: E731
    agent = lambda o: _row("agent:local", o, role="agent")             # noqa: E731
    w = lambda lab, o: _row(lab, o, role="worker", node="agent:local")  # noqa: E731
    draw = {"launcher": {"kind": "torchrun", "max_restarts": 1}, "faults": [kill(1)]}
    assert inv.broken(draw, [agent("ok"), w("0", "crash"), w("1", "crash"), w("0@1", "ok"),
                             w("1@1", "ok")]) is None
    why = inv.broken(draw, [agent("error"), w("0", "crash"), w("1", "crash"),
                            w("0@1", "error"), w("1@1", "error")])
    assert why is not None and "agent:local ended in error" in why and "max_restarts 1" in why
    # two attempts hit with one restart: not expected to recover
    two = dict(draw, faults=[kill(1), kill("0@1")])
    assert inv.broken(two, [agent("error"), w("1", "crash")]) is None
    # no restarts, another fault, or a direct launcher: not this invariant's question
    assert inv.broken(dict(draw, launcher={"kind": "torchrun"}), [agent("error")]) is None
    assert inv.broken(dict(draw, faults=[{"kind": "delayed_rank", "ranks": [1]}]),
                      [agent("error")]) is None
    assert inv.broken({"faults": [kill(1)]}, [_row("1", "crash")]) is None


def test_within_timeout_scales_with_the_draw_timeout():
    inv = Invariant("within_timeout", factor=2, slack=5)
    assert inv.label() == "within_timeout(2 x timeout + 5 s)"
    late = _row("1", "timeout", duration=26.0, exc="RuntimeError")
    why = inv.broken({"timeout": 5, "faults": []}, [late])
    assert why is not None and "5.2 x the timeout 5 s" in why and "= 15 s" in why
    assert inv.broken({"timeout": 12, "faults": []}, [late]) is None          # 29 s allowed
    assert inv.broken({"timeout": 5, "faults": []}, [dict(late, released=12.0)]) is None
    assert "hang" in inv.broken({"timeout": 5, "faults": []}, [dict(late, outcome="hang")])
    agent = _row("agent:local", "timeout", role="agent", duration=90.0)
    assert inv.broken({"timeout": 5, "faults": []}, [agent]) is None       # workers only


# -- fields, hosts, launchers and every fault kind ---------------------------------------------

FIELDS = """\
name: drawn_fields
about: fields drawn
deadline: 30
workload: [barrier]
explore:
  world_size: {min: 1, max: 3}
  fields:
    timeout: {one_of: [2, 5, 10]}
    launcher: {one_of: [direct, {kind: torchrun, max_restarts: {min: 0, max: 2}}, spawn]}
    start: any
  faults:
    - kind: busy_port
      mode: any
  invariants: [no_hang]
"""


def test_fields_are_drawn_and_any_comes_from_the_model():
    sp = space(FIELDS)
    assert sp.fields["start"] == {"one_of": ["fresh", "fork"]}
    assert sp.faults[0]["mode"] == {"one_of": ["bound", "listening", "accepting"]}
    draws = pure_draws(sp, 3, 25)
    seen = {(str(d["launcher"]), d["timeout"], d["start"]) for d in draws}
    assert len(seen) > 3
    assert {d["timeout"] for d in draws} <= {2, 5, 10}
    kinds = {d["launcher"] if isinstance(d["launcher"], str) else d["launcher"]["kind"]
             for d in draws}
    assert kinds == {"direct", "torchrun", "spawn"}
    for d in draws:
        if isinstance(d["launcher"], dict):
            assert 0 <= d["launcher"]["max_restarts"] <= 2
    assert "timeout" in short(draws[0], sp) and "launcher" in short(draws[0], sp)


def test_hosts_give_the_world_and_any_rank_follows_them():
    sp = space("""\
name: hosts_drawn
about: hosts drawn
timeout: 3
workload: [barrier]
explore:
  fields:
    hosts: {one_of: [[{name: a}, {name: b}], [{name: a, ranks: 2}, {name: b}, {name: c}]]}
  faults:
    - kind: firewall
      host: {one_of: [a, b]}
      ports: data
      action: any
    - kind: delayed_rank
      ranks: [any_rank]
      delay: 1
  invariants: [no_hang]
""")
    import yaml

    from harness.scenario.loader import load_text

    draws = pure_draws(sp, 2, 20)
    assert {hosts_total(d) for d in draws} == {2, 4}
    for d in draws:
        assert "world_size" not in d
        for f in d["faults"]:
            if f["kind"] == "delayed_rank":
                assert 0 <= f["ranks"][0] < hosts_total(d)
        (scn,) = load_text(yaml.safe_dump(d), "d.yaml")
        assert scn.world_size == hosts_total(d)


def hosts_total(d):
    return sum(h.get("ranks", 1) for h in d["hosts"])


@pytest.mark.parametrize("text, where", [
    ("name: x\nabout: y\nexplore:\n  fields:\n    name: {one_of: [a, b]}\n"
     "  invariants: [no_hang]\n", "space.yaml:5: explore.fields.name: the explorer sets it"),
    ("name: x\nabout: y\nexplore:\n  fields:\n    timout: 3\n  invariants: [no_hang]\n",
     "space.yaml:5: explore.fields.timout: not a scenario field"),
    ("name: x\nabout: y\nexplore:\n  fields:\n    timeout: any\n  invariants: [no_hang]\n",
     "space.yaml:5: explore.fields.timeout: any: the model's range 0.001..86400 is too wide"),
    ("name: x\nabout: y\nexplore:\n  faults:\n    - kind: raise_exception\n"
     "      phase: init\n      exception: any\n  invariants: [no_hang]\n",
     "space.yaml:7: explore.faults[0].exception: any: str cannot be drawn from the model"),
    ("name: x\nabout: y\nhosts: [{name: a}, {name: b}]\nexplore:\n  world_size: 3\n"
     "  invariants: [no_hang]\n", "space.yaml:5: explore.world_size: the hosts hold the world"),
    ("name: x\nabout: y\nexplore:\n  invariants:\n    - within_timeout: {factor: 0}\n",
     "space.yaml:5: explore.invariants[0].within_timeout.factor: a number above 0"),
    ("name: x\nabout: y\nexplore:\n  fields:\n    launcher: {one_of: [direct, warp]}\n"
     "  invariants: [no_hang]\n",
     "space.yaml:5: explore.fields.launcher.one_of[1]: launcher: unknown launcher 'warp'"),
])
def test_bad_fields_get_located_problems(text, where):
    with pytest.raises(ScenarioFileError) as e:
        load_space_text(text, "space.yaml")
    assert any(str(p).startswith(where) for p in e.value.problems), e.value.problems


def _catalog_uses():
    """Every fault kind's first use in the catalog: (file, case, the case's data, the fault)."""
    import yaml

    seen = {}
    for f in sorted(Path(__file__).resolve().parent.parent.glob("scenarios/*.yaml")):
        d = yaml.safe_load(f.read_text())
        top = {k: v for k, v in d.items() if k != "cases"}
        for case, over in (d.get("cases") or {"": {}}).items():
            merged = dict(top, **(over or {}))
            for fl in merged.get("faults") or []:
                seen.setdefault(fl["kind"], (f, case, merged, fl))
    return seen


def test_every_registered_fault_kind_can_be_explored():
    """For every kind the registry has (that the catalog uses each is
    tests/test_registries.py's rule): a space whose base is the catalog case that uses it (its
    launcher, hosts, program...) and whose fault draws every parameter the fault's own model
    can give ('any'): it loads, and its draws are scenarios the loader takes, the fault in
    some of them."""
    import yaml

    from harness.faults import REGISTRY
    from harness.scenario.loader import load_text
    from harness.tools.explore import model_any

    uses = _catalog_uses()
    launchers = set()
    for kind in sorted(set(REGISTRY.kinds()) & set(uses)):
        f, case, merged, fl = uses[kind]
        cls = REGISTRY.get(kind)
        spec = dict(fl)
        for k in fl:
            info = cls.model_fields.get(k)
            if k != "kind" and info is not None and \
                    model_any(info.annotation, info.metadata, k)[1] is None:
                spec[k] = "any"
        base = {k: v for k, v in merged.items() if k not in ("faults", "expect", "repeat", "race")}
        ex = {"faults": [spec], "max_faults": 1, "invariants": ["no_hang"]}
        if "world_size" in base and not any(k in base for k in ("hosts", "nodes")):
            ex["world_size"] = base.pop("world_size")
        base.pop("world_size", None)
        base["explore"] = ex
        where = f"{kind} (from {f.name} {case})"
        sp = load_space_text(yaml.safe_dump(base), str(f))   # relative paths: the catalog's

        def loads(d, f=f):
            try:
                load_text(yaml.safe_dump(d), str(f))
                return None
            except ScenarioFileError as e:
                return {"invalid": e.short()}

        ok = [d for d in pure_draws(sp, 0, 10, check=loads) if d["faults"] and loads(d) is None]
        assert ok, where
        launcher = ok[0].get("launcher", "direct")
        launchers.add(launcher if isinstance(launcher, str) else launcher.get("kind"))
    assert {"direct", "torchrun", "slurm"} <= launchers


def test_every_launcher_can_be_drawn():
    sp = space("""\
name: launchers
about: every launcher kind, drawn from the scenario's own list
hosts: [{name: a}, {name: b}]
hostnames: own
timeout: 3
explore:
  fields:
    launcher: any
  invariants: [no_hang]
""")
    import yaml

    from harness.launchers import launcher_kinds
    from harness.scenario.loader import load_text

    assert sp.fields["launcher"] == {"one_of": list(launcher_kinds())}
    kinds = set()
    for d in pure_draws(sp, 0, 20):
        (scn,) = load_text(yaml.safe_dump(d), "d.yaml")
        kinds.add(scn.launcher.kind)
    assert kinds == {"direct", "torchrun", "launch", "spawn", "slurm"}

"""harness explore: space files (located problems), seeded draws (pure), shrinking (with a
runner that stands in for torch: pure), and one real exploration whose written scenario breaks
the invariant again when run for real."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Dict, List

import pytest

from harness.explore import Exploration, canonical, load_space_text, pure_draws, run_draw, short
from harness.loader import ScenarioFileError, load_file

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

    from harness.loader import load_text

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
               "--confirm", "1", "--out", str(tmp_path / "found"), "--report", str(rep)])
    err = capsys.readouterr().err
    assert rc == 1, err
    report = json.loads(rep.read_text())
    found = report["found"]
    assert found["invariant"] == "no_error" and found["confirmed"] == "1/1"
    # the minimum keeps only the fault that raises (a delay does not make an error)
    assert [f["kind"] for f in found["scenario"]["faults"]] == ["raise_exception"], err
    assert "draw 1/6" in err and "confirm 1/1" in err
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
    from harness.explore import Invariant

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

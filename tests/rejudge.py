"""Re-judge a whole-catalog run's kept evidence with the harness as it is now.

    python tests/rejudge.py REPORT.json [SCENARIO_DIR]

For every case of a JSON session report (pytest --harness-report / harness run --report), its
kept observation(s) (observation.json, run-<i>/observation.json for a repeated case) are
classified and diagnosed again and checked against the case's expectation as the scenario files
of SCENARIO_DIR (default: scenarios/ beside this folder) give it now; prints every case that
would fail and the count. What it tells apart: a change to the judge (classification,
diagnosis, expectation matching) replayed over real runs, without running them again; a run's
own behaviour (what torch did) is what was kept. Exit 1 when a case fails.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

from harness.judge.classify import classify_run
from harness.judge.diagnose import explain_run
from harness.judge.observation import RunObservation
from harness.scenario.expect import check, check_repeated
from harness.scenario.loader import load_file

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def runs_of(evidence: Path) -> List[Tuple[Any, Any]]:
    obs = sorted(evidence.glob("run-*/observation.json"), key=lambda p: int(p.parent.name[4:]))
    out = []
    for o in obs or [evidence / "observation.json"]:
        run = RunObservation.from_dict(json.loads(o.read_text()))
        out.append((run, explain_run(run, classify_run(run))))
    return out


def rejudge(report: Path, scenarios: Path) -> Tuple[int, List[str]]:
    """(cases that pass, lines of the ones that fail)."""
    rep = json.loads(report.read_text())
    files: Dict[Path, Dict[str, Any]] = {}
    passed, failed = 0, []
    for c in rep["cases"]:
        if c["status"] == "skipped":
            continue
        f = scenarios / Path(c["file"]).name
        if f not in files:
            files[f] = {s.test_id: s for s in load_file(f)}
        scn = files[f].get(c["test_id"])
        if scn is None:
            failed.append(f"{c['id']}: no such case in {f}")
            continue
        exp = scn.expectation_for(c["torch_version"], None)
        runs = runs_of(Path(c["evidence"]))
        if len(runs) > 1:
            res = check_repeated(exp, [v for _, v in runs], [r.counters for r, _ in runs],
                                 [r.effects for r, _ in runs])
            why: List[Any] = list(res.mismatches) if res.failed else []
            if res.failed and not why:
                why = ["frequency bounds or a flaky rank"]
        else:
            run, verdicts = runs[0]
            why = list(check(exp, verdicts, run.counters, run.effects))
        if why:
            failed.append(f"{c['id']}: {why[:3]}")
        else:
            passed += 1
    return passed, failed


def main(argv: List[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 2
    scenarios = Path(argv[1]) if len(argv) > 1 else SCENARIOS
    passed, failed = rejudge(Path(argv[0]), scenarios)
    for line in failed:
        print(f"FAIL {line}")
    print(f"{argv[0]}: {passed} pass, {len(failed)} fail (re-judged offline)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

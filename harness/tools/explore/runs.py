"""Running draws for real: whether a draw can run here, nothing run (``prepare``), and a
batch of draws as one in-process pytest session over the draws written as scenario files, on
pytest-xdist's workers (``run_batch``); the plugin's report record of each case is its result
(``result_of_case``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import yaml

from ...scenario.loader import (
    ScenarioFileError,
    load_text,
)


def prepare(draw: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Whether a draw can run here, nothing run: None, or {'invalid': why} (the loader refuses
    it) or {'skipped': why} (this machine cannot run it). The pre-draw and the real runs judge
    a draw alike, so both see the same draws."""
    from ...machine.torch_probe import probe
    from ...run.requirements import skip_reason

    text = yaml.safe_dump(draw, sort_keys=False)
    try:
        scn = load_text(text, "<draw>")[0]
    except ScenarioFileError as e:
        return {"invalid": e.short()}
    why = skip_reason(scn, probe(None))
    return {"skipped": why} if why else None


def result_of_case(case: Dict[str, Any]) -> Dict[str, Any]:
    """A report's case (harness.reports.report.case_record) -> the explorer's result of one run."""
    st = case.get("status")
    if st == "skipped":
        return {"skipped": case.get("reason") or "skipped"}
    if st == "error" or not case.get("ranks"):
        return {"error": (case.get("reason") or case.get("failure") or "no result")[:800],
                "evidence": case.get("evidence")}
    released = {r.get("label"): r.get("released_at")
                for r in (case.get("timeline") or {}).get("ranks", [])}
    return {"job": case.get("job"), "wall": case.get("wall"), "evidence": case.get("evidence"),
            "verdicts": [{"label": r["label"], "outcome": r["outcome"], "phase": r.get("phase"),
                          "duration": None if r.get("duration") is None
                          else round(r["duration"], 2),
                          "released": released.get(r["label"]),
                          "exception": r.get("exception"),
                          "message": (r.get("message") or "")[:300], "cause": r.get("cause"),
                          "role": r.get("role", "rank"), "attempt": r.get("attempt", 0),
                          "node": r.get("node")} for r in case["ranks"]]}


class _Collect:
    """pytest plugin (in-process, the controller): each draw's case record as it ends."""

    def __init__(self, files: Dict[str, int], on_result: Callable[[int, Dict[str, Any]], None]):
        self.files, self.on_result = files, on_result
        self.results: Dict[int, Dict[str, Any]] = {}

    def pytest_runtest_logreport(self, report: Any) -> None:
        i = self.files.get(report.nodeid.split("::", 1)[0].rsplit("/", 1)[-1])
        case = getattr(report, "harness_case", None)
        if i is None or i in self.results:
            return
        if case is None and not (report.failed or report.skipped):
            return
        if case is None:      # a skip or an error before the run made its record
            case = {"status": "skipped" if report.skipped else "error",
                    "reason": str(getattr(report, "longreprtext", "") or "")[-800:]}
        if report.skipped:
            case = dict(case, status="skipped",
                        reason=str(report.longrepr[-1] if isinstance(report.longrepr, tuple)
                                   else report.longrepr))
        elif report.failed and report.when != "call":
            case = dict(case, status="error",
                        reason=str(getattr(report, "longreprtext", "") or "")[-800:])
        self.results[i] = res = result_of_case(case)
        self.on_result(i, res)


def run_batch(draws: List[Dict[str, Any]], jobs: int = 1,
              on_result: Optional[Callable[[int, Dict[str, Any]], None]] = None,
              keep: Optional[Path] = None) -> List[Dict[str, Any]]:
    """Run every draw for real, ``jobs`` at a time: one pytest session over the draws written as
    scenario files, on pytest-xdist's workers when ``jobs`` > 1 (the pool ``harness run -n``
    uses), so each run is the ordinary one: the plugin's evidence, sweeps, interrupts and leak
    checks. Returns one result per draw, in order ({'verdicts', 'job', ...}, {'skipped'} or
    {'error'}). ``keep``: every run's evidence goes there (else into a temporary folder)."""

    import pytest

    from ...machine.rundir import own_folder

    results: Dict[int, Dict[str, Any]] = {}

    def got(i: int, res: Dict[str, Any]) -> None:
        results[i] = res
        if on_result is not None:
            on_result(i, res)

    with own_folder() as root:
        (root / "scenarios").mkdir()
        (root / "pytest.ini").write_text("[pytest]\n")   # no user's ini applies
        files: Dict[str, int] = {}
        paths = []
        for i, d in enumerate(draws):
            name = f"draw-{i + 1:04d}"
            p = root / "scenarios" / f"{name}.yaml"
            p.write_text(yaml.safe_dump(dict(d, name=name), sort_keys=False))
            files[p.name] = i
            paths.append(str(p))
        evidence = keep if keep is not None else root / "evidence"
        args = paths + ["-c", str(root / "pytest.ini"), "--rootdir", str(root),
                        "-p", "no:cacheprovider", "-p", "no:terminal", "--assert=plain", "-s",
                        "--harness-report", str(root / "report.json"),
                        "--harness-evidence", str(evidence),
                        "--harness-keep-sessions", "100000"]
        n = max(1, min(jobs, len(draws)))
        if n > 1:
            args += ["-n", str(n)]
        rc = pytest.main(args, plugins=[_Collect(files, got)])
        if rc == pytest.ExitCode.INTERRUPTED:
            raise KeyboardInterrupt
    return [results.get(i) or {"error": f"no result (pytest exit status {int(rc)})"}
            for i in range(len(draws))]


def run_draw(draw: Dict[str, Any]) -> Dict[str, Any]:
    """Run one drawn scenario for real (the batch path, one draw, in this process):
    {'verdicts': [...], 'job': ...}, {'skipped': why}, {'invalid': why} or {'error': why}."""
    pre = prepare(draw)
    if pre is not None:
        return pre
    return run_batch([draw], 1)[0]

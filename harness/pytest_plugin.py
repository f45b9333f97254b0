"""The pytest front door: scenario YAML files become test items (thin: the rooms do the work).

Registered through the ``pytest11`` entry point, so any project with the package installed gets
it. Collected: ``*.yaml`` / ``*.yml`` files inside a folder named ``scenarios`` (below the
rootdir or a given path), or named on the command line, or matching a glob of the
``harness_scenarios`` ini option. Each case
of a file is one item ``file.yaml::name[case]``; ``marks:`` become pytest markers; fault kinds
are keywords (``-k busy_port``). A broken file is one located collection error (no traceback)
and, unless other collection errors exist, the remaining scenarios still run.

The run happens in the item's setup (a failure of the harness there is a test *error*); the
verdicts are compared in the call (a mismatch is a test *failure*, shown as a table).
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from .classify import Verdict, classify_run, job_outcome
from .expect import check, failure_table
from .loader import ScenarioFileError, item_name, load_file
from .probe import probe
from .schema import Scenario

SUFFIXES = (".yaml", ".yml")
_BROKEN_KEY = pytest.StashKey[int]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("torchdist-harness")
    group.addoption("--harness-evidence", metavar="DIR", default=None,
                    help="where every run's evidence goes (events, stacks, stdout/stderr, "
                    "observation.json); default: <rootdir>/.harness/evidence, emptied at the "
                    "start of each session")
    group.addoption("--harness-report", metavar="PATH", default=None,
                    help="write the session's JSON report (environment, every scenario case and "
                    "rank) to PATH; works under pytest-xdist")
    group.addoption("--harness-html", metavar="PATH", default=None,
                    help="write a self-contained HTML report (timelines, stacks) to PATH")
    parser.addini("harness_scenarios", type="args", default=[],
                  help="extra globs of YAML files to collect as scenarios (relative to rootdir)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "scenario: a torchdist-harness scenario case")
    config.stash[_BROKEN_KEY] = 0
    report, html = config.getoption("harness_report"), config.getoption("harness_html")
    if report or html:
        from .report import SessionRecorder
        config.pluginmanager.register(SessionRecorder(config, report, html), "harness-report")
    root = evidence_root(config)
    if not hasattr(config, "workerinput") and root.name == "evidence" and root.exists():
        import shutil
        shutil.rmtree(root, ignore_errors=True)   # only the latest session's evidence is kept


def evidence_root(config: pytest.Config) -> Path:
    opt = config.getoption("harness_evidence", None)
    return Path(opt) if opt else config.rootpath / ".harness" / "evidence"


def _is_scenario(file_path: Path, config: pytest.Config) -> bool:
    if file_path.suffix not in SUFFIXES:
        return False
    path = file_path.resolve()
    args = {Path(a.split("::")[0]).resolve() for a in config.args}
    if path in args:
        return True
    # a folder named "scenarios" counts below the rootdir or below a path given on the command
    # line, never above them (a checkout that happens to live in ~/scenarios/ is not a catalog)
    for base in {config.rootpath.resolve(), *args}:
        if base in path.parents:
            parts = (base.name,) + path.relative_to(base).parts[:-1] if base in args \
                else path.relative_to(base).parts[:-1]
            if "scenarios" in parts:
                return True
    rel = str(file_path.relative_to(config.rootpath)) if file_path.is_relative_to(
        config.rootpath) else str(file_path)
    return any(fnmatch.fnmatch(rel, g) for g in config.getini("harness_scenarios"))


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> Optional[ScenarioFile]:
    if _is_scenario(file_path, parent.config):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """A broken scenario file must not stop the others: if every collection error came from a
    scenario file, run the rest anyway (the errors still fail the session)."""
    broken = session.config.stash.get(_BROKEN_KEY, 0)
    if broken and session.testsfailed == broken:
        session.config.option.continue_on_collection_errors = True


class ScenarioFile(pytest.File):
    def collect(self) -> Iterator[ScenarioItem]:
        import os

        shown = os.path.relpath(self.path, self.config.invocation_params.dir)
        if shown.startswith(".."):
            shown = str(self.path)
        try:
            cases = load_file(self.path)
        except ScenarioFileError as e:
            for p in e.problems:   # name the file as the user typed it, relative to the cwd
                if p.file == str(self.path):
                    p.file = shown
            raise self.CollectError(e.short()) from None
        for scn in cases:
            yield ScenarioItem.from_parent(self, name=item_name(scn), scenario=scn)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    if isinstance(collector, ScenarioFile):
        rep = outcome.get_result()  # type: ignore[attr-defined]
        if rep.failed:
            collector.config.stash[_BROKEN_KEY] += 1


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A failure of the harness itself (in the item's setup) is one line, said as such."""
    outcome = yield
    from .launch import HarnessError

    if isinstance(item, ScenarioItem) and call.excinfo is not None \
            and isinstance(call.excinfo.value, HarnessError):
        rep = outcome.get_result()  # type: ignore[attr-defined]
        rep.longrepr = f"harness error (neither pass nor fail): {call.excinfo.value}"


def write_evidence(d: Path, run: Dict[str, Any], verdicts: List[Verdict]) -> None:
    import json

    d.mkdir(parents=True, exist_ok=True)
    (d / "observation.json").write_text(json.dumps(run, indent=1, default=str))
    (d / "verdicts.json").write_text(json.dumps([v.to_dict() for v in verdicts], indent=1))
    for r in run["ranks"]:
        if r.get("native_stacks"):
            (d / f"rank-{r['label'].replace(':', '-')}.native").write_text(r["native_stacks"])


class ScenarioMismatch(Exception):
    pass


class ScenarioItem(pytest.Item):
    def __init__(self, *, scenario: Scenario, **kw: Any) -> None:
        super().__init__(**kw)
        self.scenario = scenario
        self.verdicts: List[Verdict] = []
        self.run: Dict[str, Any] = {}
        self.add_marker("scenario")
        for m in scenario.marks:
            self.config.addinivalue_line("markers", f"{m}: from scenario files")
            self.add_marker(m)
        self.add_marker(pytest.mark.timeout(scenario.deadline + 300))
        self.extra_keyword_matches.update(f.kind for f in scenario.faults)
        self.extra_keyword_matches.update({scenario.backend, scenario.init})
        self.user_properties.append(("scenario", scenario.test_id))

    def reportinfo(self):  # type: ignore[no-untyped-def]
        return self.path, 0, f"scenario {self.name}"

    def setup(self) -> None:
        from .launch import run_scenario
        from .requirements import skip_reason

        env = probe()
        why = skip_reason(self.scenario, env)
        if why:
            pytest.skip(why)
        self.expectation = self.scenario.expectation_for(env["torch"])
        if self.expectation is None:
            ranges = ", ".join(str(b.torch) for b in self.scenario.expect)
            pytest.skip(f"no expectation for torch {env['torch']} (blocks cover: {ranges})")
        safe = "".join(c if c.isalnum() or c in "._=-" else "_" for c in self.nodeid)
        self.evidence = evidence_root(self.config) / safe
        obs = run_scenario(self.scenario, keep=self.evidence)
        self.run = obs.to_dict()
        self.verdicts = classify_run(self.run)
        write_evidence(self.evidence, self.run, self.verdicts)
        self.user_properties.append(("job", job_outcome(self.verdicts)))

    def runtest(self) -> None:
        assert self.expectation is not None
        mismatches = check(self.expectation, self.verdicts)
        if mismatches:
            raise ScenarioMismatch(failure_table(self.verdicts, self.expectation, mismatches))

    def repr_failure(self, excinfo, style=None):  # type: ignore[no-untyped-def]
        from .launch import HarnessError

        if isinstance(excinfo.value, ScenarioMismatch):
            notes = self.run.get("plan", {}).get("notes", [])
            head = (f"scenario {self.scenario.test_id} ({self.path.name}) on torch "
                    f"{self.run.get('torch_version')}: ranks did not end as expected")
            faults = "\n".join(f"  fault: {n}" for n in notes)
            where = f"\n  evidence: {self.evidence}" if getattr(self, "evidence", None) else ""
            return f"{head}\n{faults}\n{excinfo.value}{where}".rstrip()
        if isinstance(excinfo.value, HarnessError):
            return f"harness error (neither pass nor fail): {excinfo.value}"
        return super().repr_failure(excinfo, style=style)

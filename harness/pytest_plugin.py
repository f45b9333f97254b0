"""The pytest front door: scenario YAML files become test items (thin: the rooms do the work).

Registered through the ``pytest11`` entry point, so any project with the package installed gets
it. Collected: ``*.yaml`` / ``*.yml`` files inside a folder named ``scenarios`` (below the
rootdir or a given path), or named on the command line, or matching a glob of the
``harness_scenarios`` ini option. Each case
of a file is one item ``file.yaml::name[case]``; ``marks:`` become pytest markers; fault kinds
are keywords (``-k KIND``). A broken file is one located collection error (no traceback)
and, unless other collection errors exist, the remaining scenarios still run.

The run happens in the item's setup (a failure of the harness there is a test *error*); the
verdicts are compared in the call (a mismatch is a test *failure*, shown as a table).

Evidence goes to one folder per session (``harness.reports.evidence``), chosen by the controller and
handed to xdist workers through ``workerinput``. SIGTERM is turned into an interrupt and
repeated signals wait for cleanup (``harness.machine.interrupts``); after an interrupt the session's
last line says so, and after SIGTERM the process ends by SIGTERM (exit status 143). Ctrl-C keeps
pytest's own exit code 2.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from .judge.classify import Verdict, classify_run, job_outcome
from .judge.diagnose import explain_run
from .judge.observation import RunObservation
from .machine import interrupts
from .machine.admission import Gate
from .machine.torch_probe import probe
from .reports import evidence as evidence_mod
from .scenario.discovery import is_scenario_file
from .scenario.expect import RepeatedCheck, check, check_repeated, failure_table, repeated_table
from .scenario.loader import ScenarioFileError, item_name, load_file
from .scenario.schema import Scenario

_BROKEN_KEY = pytest.StashKey[int]()
_ALLOC_KEY = pytest.StashKey[Any]()
_STATE_KEY = pytest.StashKey["_SessionState"]()


class _SessionState:
    """What the plugin keeps for one session: signal ownership, the evidence folder's problem,
    the xdist workers (pids for forwarding SIGTERM, their reports after an interrupt)."""

    def __init__(self) -> None:
        self.owner = False            # this session installed the signal handlers first
        self.evidence_problem = ""    # the default evidence folder cannot be used: why
        self.workers: List[Any] = []  # xdist WorkerControllers (controller only)
        self.worker_pids: List[tuple] = []   # (pid, create_time)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("torchdist-harness")
    group.addoption("--harness-evidence", metavar="DIR", default=None,
                    help="where every run's evidence goes (events, stacks, stdout/stderr, "
                    "observation.json), in a folder of its own per session: "
                    "DIR/session-<time>-<id>/, DIR/latest points at the newest; default: "
                    "<rootdir>/.harness/evidence. Only the harness's own session folders of "
                    "finished sessions are ever removed (the newest 5 are kept). A DIR that "
                    "cannot hold evidence is a usage error: one ERROR: line, exit code 4")
    group.addoption("--harness-keep-sessions", metavar="N", type=int,
                    default=evidence_mod.KEEP,
                    help=f"how many sessions' evidence to keep (default {evidence_mod.KEEP})")
    group.addoption("--harness-report", metavar="PATH", default=None,
                    help="write the session's JSON report (environment, every scenario case and "
                    "rank) to PATH; works under pytest-xdist")
    group.addoption("--harness-html", metavar="PATH", default=None,
                    help="write a self-contained HTML report (timelines, stacks) to PATH")
    group.addoption("--harness-start", choices=("fresh", "fork"), default=None,
                    help="how ranks start, overriding the scenarios' start: fresh (one "
                    "interpreter per rank) or fork (forked from a per-host server that "
                    "imported torch once; ranks that must be fresh say why in the report)")
    group.addoption("--harness-repeat", metavar="N", type=int, default=None,
                    help="run every scenario case N times (overrides the scenarios' repeat:): "
                    "each rank's outcome frequencies are reported and checked against the "
                    "expectations' frequency bounds; a rank that varies where its expectation "
                    "allows one outcome makes the case flaky")
    group.addoption("--harness-python", metavar="PATH", default=None,
                    help="run every rank, torchrun agent and spawning parent with this "
                    "interpreter (another image's python, or a venv folder; the scenario's own "
                    "python: entries still win); the report's environment (torch, Python, "
                    "libuv_store_default, python_executable) is this interpreter's. Its ranks "
                    "start fresh")
    group.addoption("--harness-launcher", choices=("slurm",), default=None,
                    help="slurm: inside a Slurm allocation (salloc, sbatch), start every case's "
                    "ranks with srun across the allocation's nodes (scenario host i = node i; "
                    "launcher: direct scenarios become one task per rank, launcher: slurm ones "
                    "run their srun there); what needs root on the nodes is skipped with the "
                    "reason")
    group.addoption("--harness-shared-dir", metavar="DIR", default=None,
                    help="with --harness-launcher slurm: where run directories go, a folder "
                    "every node of the allocation sees (the home or a project file system); "
                    "default: HARNESS_TMP, else the temp dir (checked: a node that cannot "
                    "read it fails the case, named)")
    group.addoption("--harness-order", choices=("longest", "collected"), default="longest",
                    help="the order scenario cases start in: longest (default: the longest "
                    "expected first, by the durations the catalog's durations.json and "
                    "pytest's cache recorded; harness.run.schedule) or collected (the files' "
                    "order)")
    parser.addini("harness_scenarios", type="args", default=[],
                  help="extra globs of YAML files to collect as scenarios (relative to rootdir)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "scenario: a torchdist-harness scenario case")
    config.addinivalue_line("markers", "race: a race case (race: in its file), run repeat: "
                            "times with its frequency bounds checked")
    if getattr(config.option, "markers", False):   # `pytest --markers`: collection does not run
        for mark, files in scenario_marks(config).items():
            config.addinivalue_line("markers", f"{mark}: scenario mark (marks: in "
                                    f"{', '.join(files[:3])}{' ...' * (len(files) > 3)})")
    config.stash[_BROKEN_KEY] = 0
    if config.getoption("harness_launcher", None) == "slurm":
        from .tools import allocation_catalog as allocation

        try:
            config.stash[_ALLOC_KEY] = allocation.current(
                config.getoption("harness_shared_dir", None) or "")
        except allocation.NotInAllocation as e:
            raise pytest.UsageError(str(e)) from None
    elif config.getoption("harness_shared_dir", None):
        raise pytest.UsageError("--harness-shared-dir is for --harness-launcher slurm (the "
                                "run directories every node of an allocation must see)")
    state = _SessionState()
    config.stash[_STATE_KEY] = state
    worker = hasattr(config, "workerinput")
    if worker and "harness_evidence" in config.workerinput:  # type: ignore[attr-defined]
        session = evidence_mod.EvidenceSession.from_input(
            config.workerinput["harness_evidence"])  # type: ignore[attr-defined]
        state.evidence_problem = config.workerinput.get(  # type: ignore[attr-defined]
            "harness_evidence_problem", "")
    else:
        root = evidence_root(config)
        problem = evidence_mod.check_root(root)
        if problem and config.getoption("harness_evidence", None):
            raise pytest.UsageError(f"--harness-evidence {root}: cannot hold evidence: "
                                    f"{problem}")
        if problem:   # the default folder: an error only if a scenario runs (said per case)
            state.evidence_problem = (f"the evidence folder {root} cannot be used: {problem} "
                                      "(give --harness-evidence DIR)")
        session = evidence_mod.new_session(root)
        if not problem and not worker:
            try:
                evidence_mod.prune(root, max(1, config.getoption("harness_keep_sessions")) - 1)
            except OSError:
                pass
    config.stash[evidence_mod.SESSION_KEY] = session
    report, html = config.getoption("harness_report"), config.getoption("harness_html")
    if report or html:
        from .reports.report import SessionRecorder
        config.pluginmanager.register(SessionRecorder(config, report, html), "harness-report")
    state.owner = interrupts.install(on_first=None if worker else
                                     lambda sig: _forward_to_workers(state, sig),
                                     quiet=worker)
    if config.getoption("harness_order", "longest") == "longest":
        config.pluginmanager.register(_LongestFirst(config), "harness-order")


class _LongestFirst:
    """Scenario cases start longest first (``harness.run.schedule``), and every session records
    what its cases took in pytest's cache for the next one. Under pytest-xdist each worker
    collects and sorts alike (the same files, the same cache), and the controller hands out one
    case at a time (``--maxschedchunk 1`` unless given): xdist's default first hands each worker
    a quarter of its share in one block, which would give the longest cases all to one worker."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.measured: Dict[str, float] = {}
        if getattr(config.option, "maxschedchunk", 0) is None:
            config.option.maxschedchunk = 1

    def _cache(self) -> Any:
        return getattr(self.config, "cache", None)   # None under -p no:cacheprovider

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: List[pytest.Item]) -> None:
        from .run import schedule

        opt = self.config.option
        if getattr(opt, "failedfirst", False) or getattr(opt, "newfirst", False) or \
                getattr(opt, "stepwise", False) or getattr(opt, "stepwise_skip", False):
            return   # --ff / --nf asked for their own order, --sw resumes in the files' order
        at = [i for i, it in enumerate(items) if isinstance(it, ScenarioItem)]
        if len(at) < 2:
            return
        default: Dict[str, float] = {}
        for folder in sorted({items[i].path.parent for i in at}):
            default.update(schedule.read_file(folder / schedule.FILE_NAME))
        cache = self._cache()
        known = schedule.merged(default, cache.get(schedule.CACHE_KEY, {}) if cache else {})
        keys = [schedule.key_of(items[i].nodeid) for i in at]
        repeats = [items[i].repeat() for i in at]   # type: ignore[attr-defined]
        alone = [any(type(f).ALONE for f in items[i].scenario.faults)  # type: ignore
                 for i in at]
        schedule.reorder_in_place(items, at, keys, repeats, known, alone)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if hasattr(self.config, "workerinput") or "scenario" not in report.keywords:
            return   # (a worker: the controller records what its workers report)
        from .run import schedule

        key = schedule.key_of(report.nodeid)
        if report.skipped:
            self.measured.pop(key, None)
        elif report.when in ("setup", "call"):   # a scenario runs in its item's setup
            waited: Any = dict(report.user_properties).get("admission_waited", 0.0)
            took = report.duration - (float(waited) if report.when == "setup" else 0.0)
            self.measured[key] = round(self.measured.get(key, 0.0) + max(0.0, took), 1)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        cache = self._cache()
        if hasattr(self.config, "workerinput") or cache is None or not self.measured:
            return
        from .run import schedule

        cache.set(schedule.CACHE_KEY,
                  schedule.updated(cache.get(schedule.CACHE_KEY, {}), self.measured))


def scenario_marks(config: pytest.Config) -> Dict[str, List[str]]:
    """Every ``marks:`` name of the scenario files this session would collect (the paths
    given, and the rootdir's scenario folders and ``harness_scenarios`` globs), with the files
    that use it: what ``pytest --markers`` lists, although it collects nothing."""
    from .scenario.discovery import find_scenarios

    paths = [a.split("::")[0] for a in config.args if Path(a.split("::")[0]).exists()]
    root = config.rootpath
    try:
        files = find_scenarios(list(dict.fromkeys([*paths, str(root)])), root=root,
                               globs=config.getini("harness_scenarios"))
    except OSError:
        return {}
    out: Dict[str, List[str]] = {}
    for f in files:
        try:
            cases = load_file(f)
        except (ScenarioFileError, OSError):
            continue   # said where it is collected, not here
        for scn in cases:
            for m in scn.marks:
                names = out.setdefault(m, [])
                if f.name not in names:
                    names.append(f.name)
    return dict(sorted(out.items()))


def evidence_root(config: pytest.Config) -> Path:
    opt = config.getoption("harness_evidence", None)
    return Path(opt) if opt else config.rootpath / ".harness" / "evidence"


def evidence_session(config: pytest.Config) -> Optional[evidence_mod.EvidenceSession]:
    return config.stash.get(evidence_mod.SESSION_KEY, None)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """(xdist, controller) every worker writes into the controller's session folder; its pid is
    kept so that a SIGTERM to the controller reaches it too."""
    config = node.config
    session = evidence_session(config)
    state = config.stash.get(_STATE_KEY, None)
    if session is not None:
        node.workerinput["harness_evidence"] = session.to_input()
    if state is not None:
        node.workerinput["harness_evidence_problem"] = state.evidence_problem
        state.workers.append(node)
        popen = getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)
        pid = getattr(popen, "pid", None)
        if pid:
            try:
                import psutil
                state.worker_pids.append((pid, psutil.Process(pid).create_time()))
            except Exception:  # noqa: BLE001 - gone already: nothing to forward to
                pass


def _forward_to_workers(state: _SessionState, sig: int) -> None:
    """A signal to the controller alone (``kill PID``) goes on to its xdist workers, which
    clean up their runs. (Ctrl-C in a terminal reaches them already through the process group;
    the second signal is then only counted there.)"""
    import psutil

    for pid, ctime in state.worker_pids:
        try:
            if abs(psutil.Process(pid).create_time() - ctime) < 0.05:
                os.kill(pid, sig)
        except (psutil.Error, OSError):
            pass


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The session's zygotes (``start: fork``'s warm parents, harness.ranks.forkclient) end with it;
    (xdist worker) tell the controller what an interrupt made this worker clean up."""
    from .ranks.forkclient import close_zygotes

    with interrupts.shield():
        close_zygotes()
    config = session.config
    if hasattr(config, "workeroutput") and interrupts.interrupted() is not None:
        config.workeroutput["harness_interrupt"] = {  # type: ignore[attr-defined]
            "signal": interrupts.interrupted(), "cleaned": len(interrupts.cleaned()),
            "left": interrupts.left()}


@pytest.hookimpl(tryfirst=True)
def pytest_keyboard_interrupt(excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    """Before pytest formats the interrupt: every traceback entry gets a line number
    (``interrupts.mend_traceback``), or pytest's report fails and Ctrl-C ends with status 1."""
    if interrupts.mend_traceback(excinfo.value):
        mended = excinfo.value.__traceback__
        if mended is not None:
            excinfo.traceback = type(excinfo.traceback)(mended)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    session = evidence_session(config)
    if session is not None and session.path.is_dir():
        terminalreporter.write_line(f"harness: evidence of this session: {session.path}")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """After an interrupt: the last line, a sweep of what killed workers left, and (after
    SIGTERM, for the process that owns the signals) the end by SIGTERM itself."""
    state = config.stash.get(_STATE_KEY, None)
    if state is None:
        return
    sig = interrupts.interrupted()
    worker = hasattr(config, "workerinput")
    if sig is not None and not worker:
        line = _interrupt_line(state)
        interrupts.set_final_line(line)
        tr = config.pluginmanager.get_plugin("terminalreporter")
        if not state.owner:
            pass              # the front door that owns the signals (the CLI) prints it
        elif tr is not None:
            tr.write_line(line, bold=True)
        else:
            print(line, flush=True)
    if state.owner:
        interrupts.uninstall()
        if sig == signal.SIGTERM and not worker:
            interrupts.reraise(sig)


def _interrupt_line(state: _SessionState) -> str:
    cleaned, left = len(interrupts.cleaned()), interrupts.left()
    silent = []
    for node in state.workers:
        out = getattr(node, "workeroutput", None) or {}
        rec = out.get("harness_interrupt")
        if rec is None:
            silent.append(str(getattr(getattr(node, "gateway", None), "id", "?")))
            continue
        cleaned += int(rec.get("cleaned", 0))
        left += list(rec.get("left", []))
    extra = ""
    if state.workers:
        swept = _sweep_leftovers()
        if silent:
            extra += f"; worker{'s' * (len(silent) > 1)} {', '.join(sorted(silent))} ended " \
                "without reporting"
        if swept:
            extra += f"; swept what they left: {', '.join(swept)}"
    return interrupts.summary(cleaned_runs=cleaned, left=left, extra=extra)


def _sweep_leftovers() -> List[str]:
    """Remove run directories, processes and namespaces of dead owners (killed workers)."""
    out: List[str] = []
    with interrupts.shield():
        try:
            from .machine.rundir import sweep
            out += sweep()
        except Exception:  # noqa: BLE001 - a best effort at the very end
            pass
        try:
            from .net import topology
            if not topology.missing():
                out += topology.sweep()
        except Exception:  # noqa: BLE001
            pass
    return out


def _is_scenario(file_path: Path, config: pytest.Config) -> bool:
    return is_scenario_file(file_path, given=[Path(a.split("::")[0]) for a in config.args],
                            root=config.rootpath, globs=config.getini("harness_scenarios"))


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
            name = item_name(scn)
            # the id given as a string: pytest >= 9.2 parses "name[case]" into its structured
            # id as it parses the ids in its cache, so that --lf and --sw find the case again
            yield ScenarioItem.from_parent(self, name=name, scenario=scn,
                                           nodeid=f"{self.nodeid}::{name}")


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
    from .core.errors import HarnessError

    if isinstance(item, ScenarioItem) and call.excinfo is not None \
            and isinstance(call.excinfo.value, HarnessError):
        rep = outcome.get_result()  # type: ignore[attr-defined]
        rep.longrepr = _harness_error_text(item, call.excinfo.value)


def _harness_error_text(item: Any, err: BaseException) -> str:
    where = getattr(item, "evidence", None)
    kept = f" (evidence: {where})" if where is not None and Path(where).is_dir() else ""
    return f"harness error (neither pass nor fail): {err}{kept}"


def write_evidence(d: Path, run: RunObservation, verdicts: List[Verdict]) -> None:
    import json

    d.mkdir(parents=True, exist_ok=True)
    (d / "observation.json").write_text(json.dumps(run.to_dict(), indent=1, default=str))
    (d / "verdicts.json").write_text(json.dumps([v.to_dict() for v in verdicts], indent=1))
    for r in run.ranks:
        if r.native_stacks:
            (d / f"rank-{r.label.replace(':', '-')}.native").write_text(r.native_stacks)


def with_interpreter(scn: Scenario, python: str) -> Scenario:
    """The scenario with ``python`` (--harness-python) as the interpreter of every process it
    does not give one itself (its own ``python:`` entries win)."""
    if not python:
        return scn
    return scn.model_copy(update={"python": {"*": python, **scn.python}})


class ScenarioMismatch(Exception):
    pass


class ScenarioItem(pytest.Item):
    def __init__(self, *, scenario: Scenario, **kw: Any) -> None:
        super().__init__(**kw)
        self.scenario = scenario
        self.verdicts: List[Verdict] = []
        self.run: Optional[RunObservation] = None
        self.runs: List[Tuple[RunObservation, List[Verdict]]] = []   # every run, repeated
        self.repeated: Optional[RepeatedCheck] = None
        self.admission_waited = 0.0   # s its runs waited at the gate (not in their own times)
        self.add_marker("scenario")
        for m in scenario.marks:
            self.config.addinivalue_line("markers", f"{m}: from scenario files")
            self.add_marker(m)
        if scenario.race is not None:
            self.add_marker("race")
        # pytest-timeout's guard: past every run's deadline plus start-up and clean-up
        # (and the admission gate's wait before each run: harness.machine.admission)
        self.add_marker(pytest.mark.timeout(self.repeat() * (scenario.deadline + 60) + 840))
        self.extra_keyword_matches.update(f.kind for f in scenario.faults)
        self.extra_keyword_matches.update({*scenario.backend_names(), scenario.init})
        self.user_properties.append(("scenario", scenario.test_id))

    def reportinfo(self):  # type: ignore[no-untyped-def]
        return self.path, 0, f"scenario {self.name}"

    def setup(self) -> None:
        from .run.requirements import skip_reason
        from .run.supervisor import run_scenario

        python = self.python()
        env = probe(python or None)
        alloc = self.config.stash.get(_ALLOC_KEY, None)
        if alloc is not None:
            from .tools import allocation_catalog as allocation

            why = allocation.unsupported(self.started(), alloc)
            if why:
                pytest.skip(f"on {allocation.describe(alloc)}: {why}")
        why = skip_reason(self.started(), env, on_allocation=alloc is not None)
        if why:
            pytest.skip(why)
        self.expectation = self.scenario.expectation_for(env["torch"], env.get("cuda"))
        if self.expectation is None:
            ranges = ", ".join(f"{b.torch or 'any'}{f' {b.build} build' if b.build else ''}"
                               for b in self.scenario.expect)
            build = "a CPU build" if env.get("cuda") is None else f"CUDA {env['cuda']}"
            pytest.skip(f"no expectation for torch {env['torch']} ({build}; blocks cover: "
                        f"{ranges})")
        self.evidence = self._evidence_dir()
        n = self.repeat()
        gate = Gate()
        alone = any(type(f).ALONE for f in self.scenario.faults)
        for i in range(1, n + 1):   # a repeated case keeps each run's evidence in run-<i>/
            where = self.evidence if n == 1 else self.evidence / f"run-{i}"
            say = self._progress(f"run {i} of {n}: " if n > 1 else "")
            with gate.admitted(alone=alone) as admitted:   # times count from the start line
                run = run_scenario(self.on_where(), keep=where, progress=say,
                                   allocation=self.config.stash.get(_ALLOC_KEY, None))
            run.plan["admission"] = admitted.to_dict()
            self.admission_waited += admitted.waited
            verdicts = explain_run(run, classify_run(run))
            write_evidence(where, run, verdicts)
            self.runs.append((run, verdicts))
        self.run, self.verdicts = self.runs[0]
        self.user_properties.append(("job", job_outcome(self.verdicts)))
        self.user_properties.append(("admission_waited", round(self.admission_waited, 2)))

    def started(self) -> Scenario:
        """The scenario with --harness-start's and --harness-python's choices, if given."""
        update: Dict[str, Any] = {}
        opt = self.config.getoption("harness_start", None)
        if opt:
            update["start"] = opt
        scn = self.scenario.model_copy(update=update) if update else self.scenario
        return with_interpreter(scn, self.python())

    def on_where(self) -> Scenario:
        """The scenario as it runs: on an allocation (--harness-launcher slurm), with the
        allocation's launcher in place of its own."""
        scn = self.started()
        alloc = self.config.stash.get(_ALLOC_KEY, None)
        if alloc is None:
            return scn
        from .tools import allocation_catalog as allocation

        return allocation.adapt(scn, alloc)

    def python(self) -> str:
        """--harness-python, resolved ('' when not given)."""
        from .machine import interpreters

        opt = self.config.getoption("harness_python", None)
        return interpreters.resolve(opt) if opt else ""

    def _progress(self, prefix: str = "") -> Optional[Any]:
        """Under -v (not in an xdist worker, whose output nobody sees live): a printer of the
        run's progress lines (start line released, each row's end, the deadline), written
        past pytest's output capture, so that a long case is not minutes of silence."""
        config = self.config
        if config.getoption("verbose", 0) <= 0 or hasattr(config, "workerinput"):
            return None
        tr = config.pluginmanager.get_plugin("terminalreporter")
        capman = config.pluginmanager.get_plugin("capturemanager")
        if tr is None:
            return None

        def say(line: str) -> None:
            import contextlib

            ctx = capman.global_and_fixture_disabled() if capman is not None \
                else contextlib.nullcontext()
            with ctx:
                tr.ensure_newline()
                tr.write_line(f"    {self.name}: {prefix}{line}")
        return say

    def repeat(self) -> int:
        """How many times this case runs: --harness-repeat, else the scenario's repeat:."""
        opt = self.config.getoption("harness_repeat", None)
        return max(1, int(opt)) if opt else self.scenario.repeat

    def _evidence_dir(self) -> Path:
        from .core.errors import HarnessError

        state = self.config.stash.get(_STATE_KEY, None)
        session = evidence_session(self.config)
        if state is not None and state.evidence_problem:
            raise HarnessError(state.evidence_problem)
        assert session is not None
        try:
            return session.case_dir(self.nodeid)
        except OSError as e:
            raise HarnessError(f"the evidence folder {session.path} cannot be made: "
                               f"{e.strerror or e} (give --harness-evidence DIR)") from None

    def runtest(self) -> None:
        assert self.expectation is not None
        if len(self.runs) > 1:
            self.repeated = check_repeated(self.expectation, [v for _, v in self.runs],
                                           [r.counters for r, _ in self.runs],
                                           [r.effects for r, _ in self.runs])
            if self.repeated.failed:
                raise ScenarioMismatch(repeated_table([v for _, v in self.runs],
                                                      self.expectation, self.repeated,
                                                      source=self.shown_path()))
            return
        mismatches = check(self.expectation, self.verdicts,
                           self.run.counters if self.run is not None else None,
                           self.run.effects if self.run is not None else None)
        if mismatches:
            raise ScenarioMismatch(failure_table(self.verdicts, self.expectation, mismatches,
                                                 source=self.shown_path()))

    def shown_path(self) -> str:
        """The scenario file as the user would type it (relative to where pytest was run)."""
        import os

        shown = os.path.relpath(self.path, self.config.invocation_params.dir)
        return str(self.path) if shown.startswith("..") else shown

    def repr_failure(self, excinfo, style=None):  # type: ignore[no-untyped-def]
        from .core.errors import HarnessError

        if isinstance(excinfo.value, ScenarioMismatch):
            notes = self.run.plan.get("notes", []) if self.run is not None else []
            version = self.run.torch_version if self.run is not None else "?"
            how = "ranks did not end as expected"
            if self.repeated is not None:
                how = (f"flaky over {self.repeated.runs} runs" if self.repeated.flaky else
                       f"ranks did not end as expected over {self.repeated.runs} runs")
            head = f"scenario {self.scenario.test_id} ({self.path.name}) on torch {version}: {how}"
            from .judge.effects import line as effect_line

            faults = "\n".join([f"  fault: {n}" for n in notes] + [
                f"  effect: {effect_line(e)}" for e in (self.run.effects if self.run else [])])
            where = f"\n  evidence: {self.evidence}" if getattr(self, "evidence", None) else ""
            return f"{head}\n{faults}\n{excinfo.value}{where}".rstrip()
        if isinstance(excinfo.value, HarnessError):
            return _harness_error_text(self, excinfo.value)
        return super().repr_failure(excinfo, style=style)

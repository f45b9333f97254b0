"""One case of a scenario file (:mod:`harness.scenario.loader`): its merged data validated into a
``Scenario``, with every problem located. Faults are validated first, each by its plugin's own
model (found by kind), and the launcher by its kind's model; then the scenario; then what looks
at the whole case: the fields its launcher honours, the launcher's, the program's and each
fault's own checks, the number of processes, the names expectations may use (each keeping the
line it is written on), the addresses the run may send traffic to, the item name and the plan
the run would make. A pytest run and ``harness validate`` accept exactly the same cases.
"""

from __future__ import annotations

import itertools
import re
from typing import Any, Dict, List, Optional, Tuple, Union

from pydantic import ValidationError

from ..core.rows import key_ok
from ..faults import REGISTRY
from ..launchers import launcher_kinds, launcher_of
from ..launchers.fields import field_problems
from ..net.safety import refuse_address
from .locate import Lines, _known_fields, _pydantic_problems, _yaml_loc
from .problems import Path_, Problem, ScenarioFileError, _capped, _field
from .schema import MAX_ADDR, MAX_WORLD, Scenario, init_url_parts


def item_name(scn: Scenario) -> str:
    """The pytest item name of a case: ``name[case,seed=N]``; ``harness list`` shows it too."""
    parts = [scn.case] if scn.case else []
    parts += [s for f in scn.faults if (s := f.id_suffix())]
    return f"{scn.name}[{','.join(parts)}]" if parts else scn.name


ITEM_NAME = re.compile(r"[A-Za-z0-9_.=-]+(\[[A-Za-z0-9_.=,-]+\])?", re.ASCII)


def _plan_problem(scn: Scenario) -> Optional[Tuple[Tuple[Any, ...], str]]:
    from ..run.plan import PlanRefusal, make_plan

    ports = itertools.count(20000)
    try:
        make_plan(scn, "/nonexistent/run-check", lambda: next(ports), netns=True,
                  run_id="check")
    except PlanRefusal as e:   # the plan says where
        return e.loc, str(e)[:300]
    except Exception as e:   # a late refusal the checks above missed: still one located line
        return (), f"a run could not be planned: {type(e).__name__}: {str(e)[:200]}"
    return None


def validate_case(data: Dict[str, Any], file: str,
                  lines: Union[Lines, Dict[Path_, int]]) -> Scenario:
    """One case's merged data -> Scenario, or ScenarioFileError with located problems."""
    lines = lines if isinstance(lines, Lines) else Lines(lines)
    problems: List[Problem] = []
    # faults first, each by its plugin's own model (found by kind): validated once, here, and
    # kept typed on the scenario
    typed = _typed_faults(data, file, lines, problems)
    # the launcher, by its kind's own model (located like a fault)
    typed_launcher = _typed_launcher(data, file, lines, problems)
    scn = _scenario(data, file, lines, problems, typed, typed_launcher)
    scn._source = file
    _whole_case_problems(scn, data, file, lines, problems)
    _expectation_problems(scn, data, file, lines, problems)
    _address_problems(scn, file, lines, problems)
    # what the pytest front door builds from the case: its item name (test id), and the plan
    # the run would make (pure: ports from a counter, nothing started); whatever either
    # refuses is refused here, not after collection
    if not problems and not ITEM_NAME.fullmatch(item_name(scn)):
        problems.append(Problem(file, lines.line_of(("name",)), "name", f"the test id "
                                f"{item_name(scn)[:80]!r} is not plain ASCII"))
    if not problems:
        refused = _plan_problem(scn)
        if refused:
            loc, why = refused
            problems.append(Problem(file, lines.line_of(loc), _field(loc) if loc else "", why))
    if problems:
        raise ScenarioFileError(_capped(file, problems))
    return scn


def _typed_faults(data: Dict[str, Any], file: str, lines: Lines,
                  problems: List[Problem]) -> List[Any]:
    """The case's faults, each validated by its kind's model (what is not a mapping is left for
    the scenario's own validation to say)."""
    typed: List[Any] = []
    raw_faults = data.get("faults")
    if isinstance(raw_faults, list):
        for i, spec in enumerate(raw_faults):
            loc: Tuple[Any, ...] = ("faults", i)
            if not isinstance(spec, dict):
                typed.append(spec)      # the scenario's own validation says what is wrong
                continue
            kind = spec.get("kind")
            if not isinstance(kind, str):
                where = loc + ("kind",)
                problems.append(Problem(file, lines.line_of(where), _field(where),
                                        "required field is missing" if "kind" not in spec
                                        else "a fault's kind is a name (text)"))
                continue
            cls = REGISTRY.get(kind)
            if cls is None:
                problems.append(Problem(file, lines.line_of(loc + ("kind",)),
                                        _field(loc + ("kind",)),
                                        f"unknown fault kind {kind[:60]!r} (known: "
                                        f"{', '.join(REGISTRY.kinds())})"))
                continue
            try:
                typed.append(cls.model_validate(spec))
            except ValidationError as e:
                ps = _pydantic_problems(file, lines, e, data, loc)
                for p in ps:
                    if p.message.startswith("unknown field"):
                        p.message += f" of {kind} (known: {_known_fields(cls)})"
                problems += ps
    return typed


def _typed_launcher(data: Dict[str, Any], file: str, lines: Lines,
                    problems: List[Problem]) -> Any:
    """The case's launcher, validated by its kind's model (None: not given, or refused)."""
    typed_launcher: Any = None
    raw_launcher = data.get("launcher")
    if raw_launcher is not None:
        spec = launcher_of(raw_launcher)
        kinds = launcher_kinds()
        kind = spec.get("kind", "direct") if isinstance(spec, dict) else None
        where = ("launcher", "kind") if isinstance(raw_launcher, dict) else ("launcher",)
        if not isinstance(spec, dict):
            problems.append(Problem(file, lines.line_of(("launcher",)), "launcher",
                                    f"a launcher is a name ({', '.join(kinds)}) or a mapping "
                                    "with kind and its options"))
        elif not isinstance(kind, str) or kind not in kinds:
            problems.append(Problem(file, lines.line_of(where), _field(where),
                                    f"unknown launcher {str(kind)[:60]!r} (known: "
                                    f"{', '.join(kinds)})"))
        else:
            try:
                typed_launcher = kinds[kind].model_validate(spec)
            except ValidationError as e:
                ps = _pydantic_problems(file, lines, e, data, ("launcher",))
                for p in ps:
                    if p.message.startswith("unknown field"):
                        p.message += f" of launcher {kind} (known: " \
                            f"{_known_fields(kinds[kind])})"
                    # a case's launcher is the file's merged with its own: say which part
                    # came from the top level
                    p.message += lines.merged_note(tuple(p.field.split(".")))
                problems += ps
    return typed_launcher


def _scenario(data: Dict[str, Any], file: str, lines: Lines, problems: List[Problem],
              typed: List[Any], typed_launcher: Any) -> Scenario:
    """The Scenario of the case's data with its typed faults and launcher; the problems so far
    and the model's own are raised together."""
    raw_faults = data.get("faults")
    raw_launcher = data.get("launcher")
    merged = dict(data)
    if isinstance(raw_faults, list):
        merged["faults"] = typed
    if typed_launcher is not None:
        merged["launcher"] = typed_launcher
    elif raw_launcher is not None:
        merged.pop("launcher")
    try:
        scn = Scenario.model_validate(merged)
    except ValidationError as e:
        ps = _pydantic_problems(file, lines, e, data)
        for p in ps:
            if p.message.startswith("unknown field") and "." not in p.field \
                    and "[" not in p.field:
                p.message += f" (known: {_known_fields(Scenario)}, cases)"
        raise ScenarioFileError(_capped(file, problems + ps)) from None
    if problems:
        raise ScenarioFileError(_capped(file, problems))
    return scn


def _whole_case_problems(scn: Scenario, data: Dict[str, Any], file: str, lines: Lines,
                         problems: List[Problem]) -> None:
    """What looks at the whole case: the fields its launcher honours, the launcher's, the
    program's and each fault's own checks, and the number of processes the run starts."""
    # every field the case sets is one its launcher honours with its program kind (the table
    # harness.launchers.fields), else refused where it is written (null: not set)
    for name, msg in field_problems(scn, [k for k, v in data.items()
                                          if k != "case" and v is not None]):
        problems.append(Problem(file, lines.line_of((name,)), name,
                                msg + lines.merged_note((name,))))
    # the launcher's and the program's own checks (they see the whole scenario)
    loc: Tuple[Any, ...]
    for where, msg in scn.launcher.check(scn):
        loc = ("launcher",) + where
        problems.append(Problem(file, lines.line_of(loc), _field(loc),
                                msg + lines.merged_note(loc)))
    if scn.program is not None:
        why = scn.program.problem(file)
        if why:
            loc = ("program", "script") if scn.program.script else ("program",)
            problems.append(Problem(file, lines.line_of(loc), _field(loc), why))

    # each fault's own checks (it sees the whole scenario)
    extra: List[Tuple[Tuple[Any, ...], int, str]] = []   # (where, processes added, kind)
    for i, fault in enumerate(scn.faults):
        loc = ("faults", i)
        for where, msg in fault.check(scn):
            problems.append(Problem(file, lines.line_of(loc + where), _field(loc + where), msg))
        added = fault.extra_labels(scn)
        if added:
            where = ("world_size",) if "world_size" in fault.model_fields_set else ("kind",)
            extra.append((loc + where, len(added), fault.kind))

    # limits on the whole run: every process counts (ranks on all hosts, ranks faults add)
    total = scn.world_size + sum(n for _, n, _ in extra)
    if extra and total > MAX_WORLD:
        where, n, kind = extra[-1]
        problems.append(Problem(file, lines.line_of(where), _field(where),
                                f"the run would start {total} processes ({scn.world_size} ranks "
                                f"+ {total - scn.world_size} of {kind}): at most {MAX_WORLD}"))


def _expectation_problems(scn: Scenario, data: Dict[str, Any], file: str, lines: Lines,
                          problems: List[Problem]) -> None:
    """Each expectation keeps the line it is written on, and names only processes a run of
    the case can have."""
    # expectations may only name processes a run can have; each keeps the line it came from,
    # so that a failed one names file.yaml:LINE
    row_sets = scn.row_sets()
    scn._about_line = lines.line_of(_yaml_loc(data, ("about",)))
    for j, block in enumerate(scn.expect):
        block._line = lines.line_of(_yaml_loc(data, ("expect", j)))
        if block.job is not None:
            block._job_line = lines.line_of(_yaml_loc(data, ("expect", j, "job")))
        if block.counters:
            block._counters_line = lines.line_of(_yaml_loc(data, ("expect", j, "counters")))
        if block.tally:
            block._tally_line = lines.line_of(_yaml_loc(data, ("expect", j, "tally")))
        for key in block.tally:
            yloc = _yaml_loc(data, ("expect", j, "tally", key))
            why = key_ok(key, row_sets)
            if why:
                problems.append(Problem(file, lines.line_of(yloc), _field(yloc), why))
        for key, rank_expect in block.ranks.items():
            yloc = _yaml_loc(data, ("expect", j, "ranks", key))
            rank_expect._line = lines.line_of(yloc)
            why = key_ok(key, row_sets)
            if why and key.isdigit() and scn.launcher.STARTS_RANKS:
                why = (f"rank {key[:40]} is outside the world (world_size "
                       f"{scn.world_size}: ranks 0..{scn.world_size - 1})")
            if why:
                problems.append(Problem(file, lines.line_of(yloc), _field(yloc), why))


def _address_problems(scn: Scenario, file: str, lines: Lines, problems: List[Problem]) -> None:
    # addresses: bare, and only where the harness may send traffic
    suggest = REGISTRY.kind_for("a name that does not resolve")
    why = refuse_address(scn.master_addr, unresolvable=suggest)
    if why:
        problems.append(Problem(file, lines.line_of(("master_addr",)), "master_addr", why))
    if "MASTER_ADDR" in scn.env:
        addr = scn.env["MASTER_ADDR"]
        # a name the run's own hosts files give (a host's own name, a names: entry) resolves
        # only to the run's addresses or loopback: the hosts ask no one else
        own = {n.lower() for n in scn.hosts_file_names()}
        why = (f"an address of {len(addr)} characters: at most {MAX_ADDR}"
               if len(addr) > MAX_ADDR
               else None if addr.lower() in own else refuse_address(addr, unresolvable=suggest))
        if why:
            problems.append(Problem(file, lines.line_of(("env", "MASTER_ADDR")),
                                    "env.MASTER_ADDR", why))

    if scn.init_url is not None:
        _scheme, host, _path = init_url_parts(scn.init_url)   # {addr} stands as 127.0.0.1
        if host:
            why = refuse_address(host, unresolvable=suggest)
            if why:
                problems.append(Problem(file, lines.line_of(("init_url",)), "init_url", why))

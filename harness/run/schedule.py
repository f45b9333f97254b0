"""Which scenario case starts first: the longest, by the durations earlier runs recorded.

A catalog run is as long as its longest worker's queue. pytest-xdist hands out cases in
collection order, so the order decides the tail: a 300 s race case collected last starts when
the others are nearly done and the run waits for it alone. Started first, it runs beside the
short ones instead (the longest-processing-time-first rule of list scheduling).

Durations come from two places, the later winning:

* the catalog's own ``durations.json`` (beside its YAML files, copied into the wheel with it):
  one catalog run's per-case walls, the default a fresh clone or an image starts from;
* pytest's cache (``harness/durations``), updated at the end of every session from what its
  cases took here (a case's setup and call: a scenario runs in its setup).

A case neither knows is estimated as the median known case times its repeats. The keys are
``FILE.yaml::ITEM`` (the file's name, not its folder), so that a catalog run from a checkout
(``scenarios/FILE.yaml``) and from the wheel (``FILE.yaml``) share them, as ``harness diff``
pairs them.

Nothing here does I/O but the two small readers and the writer; the order itself is pure.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, TypeVar

FILE_NAME = "durations.json"
CACHE_KEY = "harness/durations"
FORMAT = 1

T = TypeVar("T")


def key_of(nodeid: str) -> str:
    """``FILE.yaml::ITEM`` of a node id (``scenarios/FILE.yaml::ITEM`` or ``FILE.yaml::ITEM``)."""
    file, sep, rest = nodeid.partition("::")
    return f"{Path(file).name}{sep}{rest}"


def read_file(path: Path) -> Dict[str, float]:
    """The per-case seconds of a ``durations.json``; {} when it is missing or not ours (a
    broken file must never stop a catalog run: it only loses the order)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return {}
    return _clean(data.get("cases"))


def _clean(cases: Any) -> Dict[str, float]:
    if not isinstance(cases, dict):
        return {}
    return {str(k): float(v) for k, v in cases.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0}


def merged(default: Mapping[str, float], cached: Any) -> Dict[str, float]:
    """The catalog's defaults overlaid with what this machine's cache recorded."""
    return {**default, **_clean(cached)}


def estimate(key: str, known: Mapping[str, float], repeat: int, median: float) -> float:
    """The expected seconds of one case: as recorded, else the median case times its repeats
    (a race case's recorded time already covers its repeats)."""
    got = known.get(key)
    return got if got is not None else median * max(1, repeat)


def longest_first(items: Sequence[T], keys: Sequence[str], repeats: Sequence[int],
                  known: Mapping[str, float],
                  alone: Optional[Sequence[bool]] = None) -> List[T]:
    """``items`` longest expected first; equal estimates keep their collection order. Items
    that must run alone (``alone``: the admission gate holds every other run while one waits
    and runs) come before all others: started first they wait for nobody, where started
    later they wait for the runs in flight to end and hold the rest meanwhile (19-26 s of the
    smoke tier's 87 s, measured)."""
    median = statistics.median(known.values()) if known else 1.0
    est = [estimate(k, known, r, median) for k, r in zip(keys, repeats)]
    first = list(alone) if alone is not None else [False] * len(items)
    order = sorted(range(len(items)), key=lambda i: (not first[i], -est[i], i))
    return [items[i] for i in order]


def reorder_in_place(items: List[Any], chosen: Iterable[int], keys: Sequence[str],
                     repeats: Sequence[int], known: Mapping[str, float],
                     alone: Optional[Sequence[bool]] = None) -> None:
    """Sort the items at the indices ``chosen`` (the scenario cases) longest first among
    themselves (those that run alone before them), leaving every other item (a plain test)
    where it was."""
    at = list(chosen)
    moved = longest_first([items[i] for i in at], keys, repeats, known, alone)
    for i, item in zip(at, moved):
        items[i] = item


def updated(known: Mapping[str, float], measured: Mapping[str, float]) -> Dict[str, float]:
    """The cache after a session: each case measured now replaces its earlier value."""
    return {**_clean(dict(known)), **_clean(dict(measured))}


def from_report(report: Mapping[str, Any]) -> Dict[str, float]:
    """Per-case seconds of a harness JSON report (``--harness-report`` / ``harness run
    --report``): each case's ``duration`` (a repeated case's runs together) less the time its
    runs waited at the admission gate (``admission_waited``: the load of that run, not the
    case's; the pytest cache leaves it out the same way), skips left out."""
    out: Dict[str, float] = {}
    for c in report.get("cases") or []:
        d = c.get("duration")
        if c.get("status") in ("passed", "failed") and isinstance(d, (int, float)):
            waited = c.get("admission_waited")
            own = float(d) - (float(waited) if isinstance(waited, (int, float)) else 0.0)
            out[key_of(str(c.get("id") or ""))] = round(max(0.0, own), 1)
    return out


def write_file(path: Path, cases: Mapping[str, float], source: str) -> None:
    path.write_text(json.dumps({
        "format": FORMAT,
        "about": "each catalog case's seconds in one whole-catalog run (a repeated case's "
                 "runs together): the order harness.run.schedule starts cases in when this "
                 "machine's pytest cache has none; regenerate with python -m "
                 "harness.run.schedule",
        "source": source,
        "cases": dict(sorted(cases.items())),
    }, indent=1) + "\n")


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m harness.run.schedule",
        description="write a catalog's durations.json from a harness JSON report")
    ap.add_argument("report", type=Path, help="a whole-catalog run's --harness-report file")
    ap.add_argument("--write", type=Path, required=True, metavar="DURATIONS_JSON",
                    help="the file to write, e.g. scenarios/durations.json")
    a = ap.parse_args(argv)
    report = json.loads(a.report.read_text())
    cases = from_report(report)
    if not cases:
        ap.error(f"{a.report}: no passed or failed case with a duration")
    write_file(a.write, cases, f"{a.report.name}, {report.get('created', '')}".strip(", "))
    print(f"wrote {a.write}: {len(cases)} cases, {sum(cases.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Keep a real run's observation in the diagnosis corpus (tests/data/diagnosis/).

    python tests/diagnosis_keep.py EVIDENCE_CASE_DIR NAME [--about TEXT]
    python tests/diagnosis_keep.py --survey EVIDENCE_DIR...

The first form reads EVIDENCE_CASE_DIR/observation.json (a case's evidence folder, as
``harness run`` or pytest on scenarios/ leave it under .harness/evidence/<session>/<case>/),
classifies and diagnoses it with the harness as it is now, and writes
tests/data/diagnosis/NAME.json (NAME.json.gz when large): the observation, whole, and for each
failed row the cause and the rule that gave it. tests/test_diagnosis_corpus.py then holds the
diagnosis to them.

The causes written are what the diagnosis says TODAY, not what is true: read each one against
the observation (and the scenario's about:) before committing the entry, and fix the diagnosis,
not the entry, where a cause is wrong. A row whose cause is `unknown` is kept as unknown: the
corpus pins that too, until a rule explains it.

The second form lists, for every case folder under the given folders, the rules its rows fire
and which of them no corpus entry covers yet: where to take the next entry from.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

CORPUS = Path(__file__).parent / "data" / "diagnosis"
GZIP_OVER = 64 * 1024   # bytes of JSON above which an entry is written gzipped

# The rules no real kept observation covers yet, with where one may come from: a ratchet that
# only shrinks (tests/test_diagnosis_corpus.py and tests/test_diagnosis_registry.py read it;
# a rule that gains an entry leaves it). Never fake an entry: keep a real run's evidence.
UNCOVERED: Set[str] = set()   # every rule has one (starved_in_init, the last, since 2026-12-07)


def diagnosed(observation: Dict[str, Any]) -> Tuple[Any, List[Any]]:
    """The run and its verdicts with causes, as the harness gives them now."""
    from harness.judge.classify import classify_run
    from harness.judge.diagnose import explain_run
    from harness.judge.observation import RunObservation

    run = RunObservation.from_dict(observation)
    return run, explain_run(run, classify_run(run))


def rows_of(verdicts: List[Any]) -> List[Dict[str, str]]:
    """What an entry pins: every failed row's outcome, cause and rule."""
    return [{"label": v.label, "outcome": v.outcome, "cause": v.cause, "rule": v.cause_rule}
            for v in verdicts if v.outcome not in ("ok", "absent")]


def load(path: Path) -> Dict[str, Any]:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return dict(json.loads(raw))


def entries(corpus: Path = CORPUS) -> List[Path]:
    return sorted(list(corpus.glob("*.json")) + list(corpus.glob("*.json.gz")))


def covered(corpus: Path = CORPUS) -> Dict[str, List[str]]:
    """rule name -> the entries that pin it."""
    out: Dict[str, List[str]] = {}
    for p in entries(corpus):
        for row in load(p).get("rows", []):
            if row.get("rule"):
                out.setdefault(row["rule"], []).append(p.name)
    return out


def keep(case_dir: Path, name: str, about: str, corpus: Path = CORPUS) -> Path:
    src = case_dir / "observation.json"
    if not src.is_file():
        raise SystemExit(f"{case_dir}: no observation.json in it (give one case's evidence folder)")
    observation = json.loads(src.read_text())
    _, verdicts = diagnosed(observation)
    rows = rows_of(verdicts)
    if not rows:
        raise SystemExit(f"{case_dir}: every row ended ok or absent: nothing for the diagnosis")
    entry = {"about": about or f"kept from {case_dir.name}",
             "source": case_dir.name,
             "rows": rows,
             "observation": observation}
    text = json.dumps(entry, indent=1, default=str).encode()
    corpus.mkdir(parents=True, exist_ok=True)
    for old in (corpus / f"{name}.json", corpus / f"{name}.json.gz"):
        old.unlink(missing_ok=True)
    if len(text) > GZIP_OVER:
        out = corpus / f"{name}.json.gz"
        out.write_bytes(gzip.compress(text, mtime=0))
    else:
        out = corpus / f"{name}.json"
        out.write_bytes(text + b"\n")
    for r in rows:
        print(f"{r['label']}: {r['outcome']} [{r['rule'] or 'no rule'}] {r['cause']}")
    print(f"wrote {out}: check every cause above against the run before committing it")
    return out


def survey(dirs: List[Path]) -> None:
    have = covered()
    for d in dirs:
        for obs in sorted(d.glob("**/observation.json")):
            if obs.parent.parent.is_symlink() or "latest" in obs.parts:
                continue
            try:
                _, verdicts = diagnosed(json.loads(obs.read_text()))
            except (ValueError, KeyError, TypeError) as e:
                print(f"{obs.parent}: unreadable ({e})")
                continue
            rules = sorted({v.cause_rule or "(unknown)" for v in verdicts
                            if v.outcome not in ("ok", "absent")})
            new = [r for r in rules if r not in have and r != "(unknown)"]
            if rules:
                tail = f"\tNEW: {' '.join(new)}" if new else ""
                print(f"{obs.parent}\t{' '.join(rules)}{tail}")


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="The causes it writes are the diagnosis of today: "
                                 "check each one is right before committing the entry.")
    ap.add_argument("dir", nargs="+", help="a case's evidence folder (with --survey: any "
                    "folders holding evidence)")
    ap.add_argument("--name", help="the entry's name (tests/data/diagnosis/NAME.json)")
    ap.add_argument("--about", default="", help="what the run was and why its causes are right")
    ap.add_argument("--survey", action="store_true",
                    help="list the rules each kept case fires, and those no entry covers")
    args = ap.parse_args(argv)
    if args.survey:
        survey([Path(d) for d in args.dir])
        return 0
    if len(args.dir) == 2 and not args.name:
        args.dir, args.name = args.dir[:1], args.dir[1]
    if len(args.dir) != 1 or not args.name:
        ap.error("give one evidence folder and a NAME")
    keep(Path(args.dir[0]), args.name, args.about)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main(sys.argv[1:]))

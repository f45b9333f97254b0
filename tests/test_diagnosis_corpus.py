"""The diagnosis on its own: real kept observations and the causes they must give.

Each entry of tests/data/diagnosis/ is one observation kept whole from a real run's evidence
(tests/diagnosis_keep.py wrote it; a person checked its causes) and, per failed row, the cause
and the rule of harness.diagnose.RULES that gives it. The observation is fixed, so the
diagnosis of it is too: a failure here is a change of the diagnosis (a rule's text, its place
in RULES, what it reads), never of torch. A torch wording change shows in the catalog instead.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from harness.judge.diagnose import RULES

_spec = importlib.util.spec_from_file_location(
    "diagnosis_keep", Path(__file__).parent / "diagnosis_keep.py")
assert _spec is not None and _spec.loader is not None
keep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(keep)

ENTRIES = keep.entries()

# The rules no real kept observation covers yet. A ratchet: it may only shrink. A rule that
# gains an entry must leave it (test_uncovered_list_only_shrinks fails until it does).
UNCOVERED = keep.UNCOVERED


def test_the_corpus_is_there():
    assert len(ENTRIES) >= 12


@pytest.mark.parametrize("path", ENTRIES, ids=[p.name.split(".")[0] for p in ENTRIES])
def test_each_kept_observation_gives_its_causes(path):
    entry = keep.load(path)
    assert entry["rows"], f"{path.name}: an entry with no failed row tests nothing"
    _, verdicts = keep.diagnosed(entry["observation"])
    got = {r["label"]: r for r in keep.rows_of(verdicts)}
    for want in entry["rows"]:
        have = got.pop(want["label"], None)
        assert have is not None, f"{path.name}: row {want['label']} no longer failed"
        assert have["outcome"] == want["outcome"], (path.name, want["label"])
        assert have["rule"] == want["rule"], (path.name, want["label"], have["cause"])
        assert have["cause"] == want["cause"], (path.name, want["label"])
    assert not got, f"{path.name}: rows failed that the entry does not pin: {sorted(got)}"


def test_every_rule_has_a_kept_observation():
    names = {r.__name__ for r in RULES}
    missing = names - set(keep.covered()) - UNCOVERED
    assert not missing, f"rules with no corpus entry (keep one, or list them): {sorted(missing)}"


def test_uncovered_list_only_shrinks():
    names = {r.__name__ for r in RULES}
    assert UNCOVERED <= names, f"not rules of RULES: {sorted(UNCOVERED - names)}"
    now_covered = UNCOVERED & set(keep.covered())
    assert not now_covered, ("covered now, take them off UNCOVERED in tests/diagnosis_keep.py: "
                             f"{sorted(now_covered)}")


def test_the_tool_keeps_an_evidence_folder(tmp_path):
    """diagnosis_keep writes an entry that this file's test then holds."""
    src = ENTRIES[0]
    case = tmp_path / "case"
    case.mkdir()
    import json

    (case / "observation.json").write_text(json.dumps(keep.load(src)["observation"]))
    out = keep.keep(case, "x", "a copy", corpus=tmp_path / "corpus")
    assert keep.load(out)["rows"] == keep.load(src)["rows"]


def test_the_report_names_the_rule_that_gave_each_cause():
    """The JSON report's rank records carry cause_rule: "" for an ok row, the rule otherwise."""
    from harness.reports.report import rank_record

    entry = keep.load(next(p for p in ENTRIES if p.name.startswith("wrong_port")))
    run, verdicts = keep.diagnosed(entry["observation"])
    obs = {o.label: o for o in run.ranks}
    recs = {v.label: rank_record(v, obs.get(v.label), run.t0) for v in verdicts}
    assert {lbl: r["cause_rule"] for lbl, r in recs.items()} == \
        {r["label"]: r["rule"] for r in entry["rows"]}


def test_a_large_entry_is_kept_gzipped_and_read_back(tmp_path, monkeypatch):
    import json

    case = tmp_path / "case"
    case.mkdir()
    src = keep.load(ENTRIES[0])
    (case / "observation.json").write_text(json.dumps(src["observation"]))
    monkeypatch.setattr(keep, "GZIP_OVER", 0)
    out = keep.keep(case, "big", "a copy", corpus=tmp_path / "corpus")
    assert out.name == "big.json.gz"
    assert keep.load(out)["observation"] == src["observation"]
    assert keep.entries(tmp_path / "corpus") == [out]

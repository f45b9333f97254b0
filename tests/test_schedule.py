"""harness.schedule: the longest expected case first, from recorded durations."""

from __future__ import annotations

import json

from harness.run import schedule


def test_keys_are_the_files_name_and_the_item_from_a_checkout_or_the_wheel():
    assert schedule.key_of("scenarios/a.yaml::a[x]") == "a.yaml::a[x]"
    assert schedule.key_of("a.yaml::a[x]") == "a.yaml::a[x]"


def test_longest_first_with_unknown_cases_at_the_median_times_their_repeats():
    known = {"a": 10.0, "b": 300.0, "c": 2.0}
    order = schedule.longest_first(["a", "b", "c", "new", "new_race"],
                                   ["a", "b", "c", "new", "new_race"], [1, 10, 1, 1, 10], known)
    # the median known case is 10 s: "new" ties with "a" (collection order kept), and a new
    # case repeated 10 times is expected to take 100 s
    assert order == ["b", "new_race", "a", "new", "c"]


def test_only_the_chosen_items_move():
    items = ["t1", "a", "t2", "b"]
    schedule.reorder_in_place(items, [1, 3], ["a", "b"], [1, 1], {"a": 1.0, "b": 5.0})
    assert items == ["t1", "b", "t2", "a"]


def test_the_cache_overrides_the_catalogs_defaults_and_is_updated_by_what_ran():
    known = schedule.merged({"a": 1.0, "b": 2.0}, {"b": 20.0, "junk": "x"})
    assert known == {"a": 1.0, "b": 20.0}
    assert schedule.updated(known, {"a": 3.0}) == {"a": 3.0, "b": 20.0}


def test_a_broken_or_foreign_durations_file_only_loses_the_order(tmp_path):
    p = tmp_path / "durations.json"
    p.write_text("{not json")
    assert schedule.read_file(p) == {}
    p.write_text(json.dumps({"format": 99, "cases": {"a": 1}}))
    assert schedule.read_file(p) == {}
    assert schedule.read_file(tmp_path / "missing.json") == {}


def test_a_report_becomes_a_durations_file(tmp_path):
    report = {"created": "now", "cases": [
        {"id": "scenarios/a.yaml::a[x]", "status": "passed", "duration": 12.34},
        {"id": "scenarios/a.yaml::a[y]", "status": "failed", "duration": 3.0},
        {"id": "scenarios/a.yaml::a[w]", "status": "passed", "duration": 58.6,
         "admission_waited": 51.3},
        {"id": "scenarios/a.yaml::a[z]", "status": "skipped", "duration": 0.0}]}
    (tmp_path / "r.json").write_text(json.dumps(report))
    out = tmp_path / "durations.json"
    assert schedule.main([str(tmp_path / "r.json"), "--write", str(out)]) == 0
    # a case's time at the gate is that run's load, not the case's own
    assert schedule.read_file(out) == {"a.yaml::a[x]": 12.3, "a.yaml::a[y]": 3.0,
                                       "a.yaml::a[w]": 7.3}


def test_cases_that_run_alone_start_before_all_others():
    """The gate holds every run while one that must run alone waits: started first it waits
    for nobody; after others, for the runs in flight to end."""
    order = schedule.longest_first(["long", "alone", "short"], ["l", "a", "s"], [1, 1, 1],
                                   {"l": 60.0, "a": 6.0, "s": 1.0}, alone=[False, True, False])
    assert order == ["alone", "long", "short"]


def test_the_catalogs_durations_file_is_ours_and_names_its_cases():
    from harness.scenario.catalog import builtin_dir

    d = builtin_dir()
    assert d is not None
    known = schedule.read_file(d / schedule.FILE_NAME)
    assert len(known) > 100
    files = {p.name for p in d.glob("*.yaml")}
    assert {k.split("::")[0] for k in known} <= files

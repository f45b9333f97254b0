"""Expectations a run can contradict (harness.determinism, pure) and the race-case format; and
the catalog held to them: no case outside a race case allows two outcomes on a row, ok and a
failure on its job, a vacuous window, or a failing row pinned only by the harness's own cause."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.scenario.determinism import widenings
from harness.scenario.loader import ScenarioFileError, item_name, load_file, load_text

ROOT = Path(__file__).resolve().parent.parent


def case(body: str, head: str = "name: s\nabout: x\ndeadline: 60\n"):
    (scn,) = load_text(head + textwrap.dedent(body), "s.yaml")
    return scn


def found(body: str):
    return [(w.line, w.field) for w in widenings(case(body))]


def test_a_pinned_case_has_no_widening():
    assert found("""\
        expect:
          job: timeout
          ranks:
            "0": {outcome: timeout, exception: DistStoreError, within: [5, 12]}
            "1": {outcome: timeout, phase: init, cause: "never came"}
    """) == []


def test_each_widening_is_found_where_it_is_written():
    assert found("""\
        world_size: 4
        expect:
          job: [ok, timeout]
          ranks:
            "0": [error, timeout]
            "1": {outcome: timeout, within: [0, 60]}
            "2": {outcome: error, cause: "refused"}
            "3": {cause: "refused"}
    """) == [(6, "expect.job"), (8, "expect.ranks.0.outcome"), (9, "expect.ranks.1.within"),
             (10, "expect.ranks.2.cause"), (11, "expect.ranks.3.cause")]


def test_a_job_of_two_failures_is_a_widening_too():
    # the job is the most severe of its rows: pinned rows give one job outcome
    w = widenings(case('expect:\n  job: [timeout, error]\n  ranks:\n    "0": timeout\n'))
    assert [(x.line, x.field) for x in w] == [(5, "expect.job")]
    assert "allows timeout|error" in w[0].message


def test_a_window_that_ends_before_the_deadline_or_starts_later_is_not_vacuous():
    assert found('expect:\n  ranks:\n    "0": {outcome: ok, within: [0, 59]}\n'
                 '    "1": {outcome: ok, within: [1, 90]}\n') == []


def test_a_cause_beside_an_ok_row_pins_nothing_and_is_no_widening():
    assert found('expect:\n  ranks:\n    "0": {outcome: ok, cause: x}\n') == []


def test_frequency_bounds_outside_a_race_case_are_a_widening():
    assert found('repeat: 5\nexpect:\n  ranks:\n    "0": {outcome: {ok: ">= 0.9"}}\n') == \
        [(7, "expect.ranks.0.outcome")]


def test_blocks_of_several_torch_ranges_are_named_by_their_index():
    assert found("""\
        expect:
          - torch: ">=2.14"
            ranks: {"0": ok}
          - ranks: {"0": [ok, error]}
    """) == [(7, "expect[1].ranks.0.outcome")]


RACE = """\
    race: "gloo's connect retry against the pause: 10 runs gave ok 7, timeout 3"
    repeat: 10
    expect:
      job: [ok, timeout]
      ranks:
        "*": {outcome: {ok: ">= 0.3", timeout: "<= 0.7"}, phase: init}
"""


def test_a_race_case_may_race_and_is_still_held_to_windows_and_causes():
    assert found(RACE) == []
    assert found(RACE + '        "1": {outcome: {ok: ">= 0.3", timeout: any}, cause: x, '
                 'within: [0, 60]}\n') == [(10, "expect.ranks.1.within"),
                                          (10, "expect.ranks.1.cause")]


@pytest.mark.parametrize("change, line, field", [
    (("repeat: 10\n", ""), 1, "repeat"),
    (("repeat: 10\n", "repeat: 9\n"), 4, "repeat"),
    (('{ok: ">= 0.3", timeout: "<= 0.7"}', "[ok, timeout]"), 8, "expect.ranks.*.outcome"),
    (('{ok: ">= 0.3", timeout: "<= 0.7"}', "{ok: any, timeout: any}"), 8,
     "expect.ranks.*.outcome"),
    (('race: "gloo', 'race: ""\n#'), 3, "race"),
])
def test_a_race_case_that_cannot_measure_is_refused_where_written(change, line, field):
    text = "name: s\nabout: x\n" + textwrap.dedent(RACE).replace(*change)
    with pytest.raises(ScenarioFileError) as e:
        load_text(text, "s.yaml")
    assert [(p.line, p.field) for p in e.value.problems] == [(line, field)]


def test_race_is_refused_as_a_plain_mark():
    with pytest.raises(ScenarioFileError, match="declare one with race:"):
        load_text("name: s\nabout: x\nmarks: [race]\n", "s.yaml")


# -- the catalog ----------------------------------------------------------------------------------

# Cases of scenarios/ still widened when the strict reading came (issue 40): each is to be pinned
# (the order that decides it found and gated) or declared a race case with measured bounds. The
# list only shrinks: a new widened case fails below, and so does a listed case that no longer is.
WIDENED = ROOT / "tests" / "data" / "widened-cases.txt"


def test_the_catalog_adds_no_widened_case_and_the_list_of_old_ones_only_shrinks():
    widened = {}
    for f in sorted((ROOT / "scenarios").glob("*.yaml")):
        for scn in load_file(f):
            ws = widenings(scn)
            if ws:
                widened[f"{f.name}::{item_name(scn)}"] = ws
    known = {ln.strip() for ln in WIDENED.read_text().splitlines()
             if ln.strip() and not ln.startswith("#")}
    new = {k: [f"{w.line}: {w.field}: {w.message}" for w in v]
           for k, v in widened.items() if k not in known}
    assert not new, f"widened expectations (pin them or declare race:): {new}"
    assert not known - set(widened), (f"no longer widened: take them off {WIDENED.name}: "
                                      f"{sorted(known - set(widened))}")


def test_a_row_whose_outcomes_a_tally_counts_is_pinned_by_the_tally():
    head = ("name: s\nabout: x\ndeadline: 60\nlauncher: {kind: torchrun}\n"
            "hosts: [{name: a}, {name: b}]\n")
    body = textwrap.dedent("""\
        expect:
          tally:
            agent:*: {ok: 1, error: 1}
          ranks:
            agent:*: {outcome: [ok, error], cause: {error: "redundant"}}
    """)
    assert [(w.line, w.field) for w in widenings(case(body, head))] == []
    # an outcome the tally does not count, or no tally, is a widening again
    w = widenings(case(body.replace("[ok, error]", "[ok, error, hang]"), head))
    assert [x.field for x in w] == ["expect.ranks.agent:*.outcome"]
    untallied = body.replace("  tally:\n    agent:*: {ok: 1, error: 1}\n", "")
    assert [x.field for x in widenings(case(untallied, head))] == \
        ["expect.ranks.agent:*.outcome", "expect.ranks.agent:*.cause"]


def test_an_about_that_still_holds_the_templates_todo_is_not_written_down():
    w = widenings(case('expect:\n  ranks:\n    "0": ok\n',
                       head="name: s\nabout: 'TODO: reported in <link>'\ndeadline: 60\n"))
    assert [(x.line, x.field) for x in w] == [(2, "about")]   # where about: is written
    assert "TODO" in w[0].message

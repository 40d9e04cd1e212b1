"""case_switch_problems: a case's own defect switches checked against the runner's table, one message per rule."""

import pytest

from ansible_collections.orbite.qualification.plugins.filter.gate import case_switch_problems

TABLE = {"installed-lost-completion": ["fabricate_cqe", "lost_debt_cleared"],
         "installed-cleanup-failure": ["retry_destroy"]}


def _case(defects, mode="installed-lost-completion", case_id="c1"):
    return {"id": case_id, "profile": {"mode": mode}, "defects": defects}


def test_switches_of_the_cases_own_mode_and_cases_without_switches_pass():
    cases = [_case(["fabricate_cqe", "lost_debt_cleared"]), {"id": "healthy", "profile": {"mode": "x"}},
             _case(["retry_destroy"], mode="installed-cleanup-failure", case_id="c2")]
    assert case_switch_problems(cases, TABLE, "sim") == []


def test_another_modes_switch_and_an_unknown_one_are_each_named():
    problems = case_switch_problems([_case(["fabricate_cqe", "retry_destroy", "no_such_switch"])], TABLE, "sim")
    assert problems == [
        'case c1: defects[1]="retry_destroy": is a switch of installed-cleanup-failure, not of '
        "installed-lost-completion (installed-lost-completion takes fabricate_cqe, lost_debt_cleared)",
        'case c1: defects[2]="no_such_switch": is not a defect switch of the simulated runner '
        "(installed-lost-completion takes fabricate_cqe, lost_debt_cleared)",
    ]


@pytest.mark.parametrize(("defects", "kind", "message"), [
    ("fabricate_cqe", "sim", 'case c1: defects="fabricate_cqe": must be a list of defect switch names'),
    (["fabricate_cqe"], "native", 'case c1: defects=["fabricate_cqe"]: a case\'s own defect switches are the '
     "simulated runner's; this run's runner is native"),
])
def test_a_switch_list_that_is_no_list_or_a_native_run_is_named(defects, kind, message):
    assert case_switch_problems([_case(defects)], TABLE, kind) == [message]


def test_the_control_relays_own_switch_is_one_of_installed_interruption_whatever_the_runner():
    """leak_grant is the relay's (plugins/module_utils/_run/relay.py), not the runner's: a case variant of
    installed-interruption may carry it, with a native runner too; another mode's case is told whose it is."""
    table = dict(TABLE, **{"installed-interruption": ["free_busy_ok"]})
    interruption = _case(["leak_grant", "free_busy_ok"], mode="installed-interruption")
    assert case_switch_problems([interruption], table, "sim") == []
    assert case_switch_problems([_case(["leak_grant"], mode="installed-interruption")], {}, "native") == []
    assert case_switch_problems([interruption], table, "native") == [
        'case c1: defects=["leak_grant", "free_busy_ok"]: a case\'s own defect switches are the simulated '
        "runner's; this run's runner is native"]
    assert case_switch_problems([_case(["leak_grant"])], table, "sim") == [
        'case c1: defects[0]="leak_grant": is a switch of installed-interruption, not of installed-lost-completion '
        "(installed-lost-completion takes fabricate_cqe, lost_debt_cleared)"]

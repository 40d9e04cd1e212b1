"""run_plan: the run directory's plan is written whole, checked, and never mixed with another run."""

import json

import pytest

from ansible_collections.orbite.qualification.plugins.module_utils._run.plan import RunPlanError, write_plan

PROFILE = {"source": "sim-a", "requester": "sim-b", "mode": "installed-host"}


def test_writes_run_json_and_each_case(tmp_path):
    cases = [{"id": "read-polling", "profile": PROFILE}, {"id": "write-events", "profile": PROFILE}]
    assert write_plan(str(tmp_path), "run-1", cases) is True
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["cases"] == ["read-polling", "write-events"] and run["run_id"] == "run-1"
    case = json.loads((tmp_path / "cases" / "write-events" / "case.json").read_text())
    assert case["schema"] == "orbite.case" and case["hosts"] == {"source": "sim-a", "requester": "sim-b"}
    assert write_plan(str(tmp_path), "run-1", cases) is False  # same plan: unchanged


def test_check_mode_writes_nothing(tmp_path):
    assert write_plan(str(tmp_path), "run-1", [{"id": "a", "profile": PROFILE}], check_mode=True) is True
    assert list(tmp_path.iterdir()) == []


def test_another_runs_directory_is_refused(tmp_path):
    write_plan(str(tmp_path), "run-1", [{"id": "a", "profile": PROFILE}])
    with pytest.raises(RunPlanError, match="holds run 'run-1', not 'run-2'"):
        write_plan(str(tmp_path), "run-2", [{"id": "a", "profile": PROFILE}])


@pytest.mark.parametrize(("cases", "message"), [
    ([{"id": "../escape", "profile": PROFILE}], r"cases\[0\].id='../escape': must be 1..64 ASCII"),
    ([{"id": "a", "profile": PROFILE}, {"id": "a", "profile": PROFILE}], r"cases\[1\].id='a': must be unique"),
    ([{"id": "a", "profile": "x"}], r"cases\[0\].profile: must be the validated profile"),
    (["not-a-dict"], r"cases\[0\].id=None"),
])
def test_bad_cases_are_named(tmp_path, cases, message):
    with pytest.raises(RunPlanError, match=message):
        write_plan(str(tmp_path), "run-1", cases)
    assert list(tmp_path.iterdir()) == []

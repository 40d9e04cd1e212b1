"""A case's own defect switches and left-out observers (run.json case_defects, case_left_out; docs/reports.md
"Defect matrix"), on direct runner pairs: the verifier reads a case's switches as the run's plus its own, the run
and that case are diagnostic and name them, and a switch the plan records but the runner was never told fails
identity.defects. Red check: dropping the per-case reading in verdict.py fails the first two tests."""

import json

import pytest
from helpers.sim_restart_pair import findings_by_code, mode_profile, run_restart_pair

from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run

# The lost-completion direct pairs' smallest shape and one of their switches (test_sim_lost_completion.py).
SHAPE = {"parents": 8, "payload": 1 << 20, "block": 1 << 20, "num_lanes": 1, "mask": 3}
PROFILE = mode_profile("installed-lost-completion", SHAPE, "requester", 2, "write", True)
SWITCH, CODE = "fabricate_cqe", "lost_completion.withheld"


def _edit_plan(run_dir, change):
    path = run_dir / "run.json"
    plan = json.loads(path.read_text())
    change(plan)
    path.write_text(json.dumps(plan))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("case-defects")
    switched, healthy = base / "switched", base / "healthy"
    run_restart_pair(switched, "c1", PROFILE, defects=[SWITCH])
    run_restart_pair(healthy, "c1", PROFILE)
    return switched, healthy


def test_a_switch_recorded_for_its_case_fails_exactly_its_code_and_names_the_case(runs):
    switched, _ = runs
    _edit_plan(switched, lambda plan: plan.update(defects=[], case_defects={"c1": [SWITCH]}))
    verdict = verify_run(str(switched), write=False)
    assert sorted(verdict["failed_codes"]) == sorted(["run.diagnostic", CODE]), verdict["failed_codes"]
    assert verdict["defects"] == [SWITCH] and verdict["diagnostic_only"]
    (run_diagnostic,) = [f for f in verdict["run_findings"] if f["code"] == "run.diagnostic"]
    assert f"{SWITCH} (case c1)" in run_diagnostic["message"]
    case = findings_by_code(verdict)
    assert case["run.diagnostic"]["status"] == "FAIL" and SWITCH in case["run.diagnostic"]["message"]
    assert case["identity.defects"]["status"] == "PASS"


def test_a_case_switch_the_runner_was_never_told_fails_identity_defects(runs):
    _, healthy = runs
    _edit_plan(healthy, lambda plan: plan.update(case_defects={"c1": [SWITCH]}))
    verdict = verify_run(str(healthy), write=False)
    findings = findings_by_code(verdict)
    assert findings["identity.defects"]["status"] == "FAIL", findings["identity.defects"]
    assert f"the plan ['{SWITCH}']" in findings["identity.defects"]["message"]
    _edit_plan(healthy, lambda plan: plan.pop("case_defects"))
    assert verify_run(str(healthy), write=False)["verdict"] == "PASS"


def test_an_observer_left_out_makes_the_run_and_the_case_diagnostic(runs):
    _, healthy = runs
    _edit_plan(healthy, lambda plan: plan.update(case_left_out={"c1": ["cq_fault"]}))
    verdict = verify_run(str(healthy), write=False)
    assert verdict["verdict"] == "FAIL" and verdict["diagnostic_only"]
    assert sorted(verdict["failed_codes"]) == ["run.diagnostic"]
    assert "left cq_fault out of the preload" in findings_by_code(verdict)["run.diagnostic"]["message"]
    _edit_plan(healthy, lambda plan: plan.pop("case_left_out"))


@pytest.mark.parametrize(("field", "value"), [("case_defects", {"c1": "fabricate_cqe"}),
                                              ("case_left_out", {"c1": ["no/such"]})])
def test_a_malformed_per_case_record_fails_the_plan_by_field(runs, field, value):
    _, healthy = runs
    _edit_plan(healthy, lambda plan: plan.update({field: value}))
    verdict = verify_run(str(healthy), write=False)
    (plan_finding,) = [f for f in verdict["run_findings"] if f["code"] == "run.plan"]
    assert plan_finding["status"] == "FAIL" and f"run.json: {field}=" in plan_finding["message"]
    _edit_plan(healthy, lambda plan: plan.pop(field))

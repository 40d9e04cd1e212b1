"""The controller's steps in the task's worker (plugins/plugin_utils/_in_process.py and the action plugins on it).

Each action plugin's result is its module's on the same input (the module run as Ansible runs it, a Python of
its own); a bad argument fails with the module's own message naming the field and the value; check mode is
the module's; an error the job did not expect is a coded failure, never a traceback.
"""

import ast
import json
import os
import stat
import subprocess
import sys
import types
from unittest import mock

import pytest
from helpers.modules import run_module
from helpers.paths import REPO

from ansible_collections.orbite.qualification.plugins.action import (
    fleet_merge,
    fleet_plan,
    fleet_verdict,
    profile_info,
    result_check,
    run_origin,
    run_plan,
    sim_runner_package,
)
from ansible_collections.orbite.qualification.plugins.plugin_utils import _in_process

ACTIONS = {m.__name__.rsplit(".", 1)[1]: m for m in (fleet_merge, fleet_plan, fleet_verdict, profile_info,
                                                      result_check, run_origin, run_plan, sim_runner_package)}
PROFILE = str(REPO / "profiles" / "rail_accounting.json")
SIM = str(REPO / "sim")


def act(name, args, check_mode=False):
    """The task's result as the action plugin returns it in the worker."""
    task = mock.Mock(args=args, check_mode=check_mode, async_val=0, action=f"orbite.qualification.{name}")
    plugin = ACTIONS[name].ActionModule(task, mock.MagicMock(), mock.MagicMock(), None, None)
    return plugin.run(task_vars={})


def module(name, work, args, check_mode=False):
    # The module's name as Ansible hands it over (AnsibleModule's messages name it).
    return run_module(name, work, dict(args, _ansible_check_mode=check_mode,
                                       _ansible_module_name=f"orbite.qualification.{name}"))


def same(name, tmp_path, args, check_mode=False, prepare=None):
    """(module's result, action's result) on ``args`` in two twin directories (``{d}`` in a string argument names
    the twin), the module's paths put in the action's twin; the two must be equal."""
    results = []
    for side in ("module", "action"):
        twin = tmp_path / side
        twin.mkdir(exist_ok=True)
        given = json.loads(json.dumps(args).replace("{d}", str(twin)))
        if prepare:
            prepare(twin)
        results.append(module(name, twin, given, check_mode) if side == "module" else act(name, given, check_mode))
    by_module = json.loads(json.dumps(results[0]).replace(str(tmp_path / "module"), str(tmp_path / "action")))
    by_module.pop("exception", None)  # a traceback only when traceback capture is on
    assert by_module == results[1]
    return results[1]


def planned(twin, verdict=False):
    """A run directory of the frozen rail-accounting case, planned by the action plugins (no receipts)."""
    derived = act("profile_info", {"path": PROFILE})
    case = {"id": "read-polling", "profile": derived["profile"], "workload": derived["workload"]}
    done = act("run_plan", {"run_dir": str(twin / "run"), "run_id": "r1", "cases": [case], "verdict": verdict})
    assert not done.get("failed"), done
    return case


# ---------------------------------------------------------------- each action is its module


@pytest.mark.parametrize("args", [
    {"path": PROFILE},
    {"cases": [{"id": "a", "path": PROFILE}, {"id": "b", "path": PROFILE, "changes": {"parents": 0}}]},
    {"profile": {"mode": "nope"}},
    {"profile": {}, "path": PROFILE},  # mutually exclusive
    {"path": PROFILE, "bogus": 1},  # not an option
    {"cases": "a"},  # not a list of mappings
])
def test_profile_info_action_is_the_module(tmp_path, args):
    result = same("profile_info", tmp_path, args)
    assert result.get("changed", False) is False


def test_profile_info_bad_arguments_name_field_and_value(tmp_path):
    assert same("profile_info", tmp_path, {"path": PROFILE, "bogus": 1})["msg"] == (
        "Unsupported parameters for (orbite.qualification.profile_info) module: bogus. "
        "Supported parameters include: cases, path, profile.")
    bad = same("profile_info", tmp_path, {"cases": [{"id": "b", "path": PROFILE, "changes": {"parents": 0}}]})
    assert bad["failed"] and bad["code"] == "profile.invalid" and "parents" in bad["msg"] and "b:" in bad["msg"]


def test_run_plan_action_is_the_module_check_mode_included(tmp_path):
    case = planned(tmp_path)
    args = {"run_dir": "{d}/run", "run_id": "r1", "cases": [case], "verdict": True}
    checked = same("run_plan", tmp_path, args, check_mode=True)
    assert checked["changed"] is True and checked["verdict"] is None
    assert not (tmp_path / "action" / "run").exists()  # check mode writes nothing
    written = same("run_plan", tmp_path, args)
    assert written["changed"] is True and written["verdict"] == str(tmp_path / "action" / "run" / "verdict.json")
    first = json.loads((tmp_path / "action" / "run" / "verdict.json").read_text())
    assert first["verdict"] == "INCOMPLETE"
    assert same("run_plan", tmp_path, args)["changed"] is False  # the same plan again
    refused = same("run_plan", tmp_path, dict(args, runner_kind="qemu"))
    assert refused["failed"] and refused["msg"] == "value of runner_kind must be one of: sim, native, got: qemu"
    other = same("run_plan", tmp_path, dict(args, run_id="r2"))
    assert other["failed"] and other["code"] == "run_plan.invalid" and "'r1', not 'r2'" in other["msg"]


def test_result_check_action_is_the_module_check_mode_included(tmp_path):
    args = {"run_dir": "{d}/run"}
    checked = same("result_check", tmp_path, args, check_mode=True, prepare=planned)
    assert checked["changed"] is False and checked["verdict"] == "FAIL"
    assert not (tmp_path / "action" / "run" / "verdict.json").exists()  # check mode writes no verdict
    verified = same("result_check", tmp_path, args)  # no receipts: a FAIL with coded receipt failures
    assert verified["changed"] is True and verified["verdict"] == "FAIL" and verified["failed_codes"]
    assert json.loads((tmp_path / "action" / "run" / "verdict.json").read_text())["verdict"] == "FAIL"
    missing = same("result_check", tmp_path, {"run_dir": "{d}/nothing"})
    assert missing["failed"] and missing["code"] == "run_dir.missing"
    assert same("result_check", tmp_path, {})["msg"] == "missing required arguments: run_dir"


def test_run_origin_action_is_the_module(tmp_path):
    for twin in ("module", "action"):
        (tmp_path / twin).mkdir()
        planned(tmp_path / twin)
    origin = same("run_origin", tmp_path, {"run": "{d}/run"})
    # Never verified: verified now (no receipts, so FAIL) and planned again.
    assert origin["origin"]["cases"] == ["read-polling"] and origin["verdict"] == "FAIL" and origin["verified"]
    unknown = same("run_origin", tmp_path, {"run": "nope", "runs_dir": "{d}"})
    assert unknown["failed"] and unknown["code"] and "nope" in unknown["msg"]


def test_sim_runner_package_action_is_the_module_made_once_and_private(tmp_path):
    args = {"src": SIM, "zipapp": "{d}/run/orbite-sim-runner.pyz", "defect_table": True}
    checked = same("sim_runner_package", tmp_path, args, check_mode=True)
    assert checked["changed"] is True and checked["defect_table"] is None
    assert not (tmp_path / "action" / "run").exists()  # check mode writes nothing
    made = same("sim_runner_package", tmp_path, args)
    assert made["changed"] is True and made["sha256"] == checked["sha256"]
    path = tmp_path / "action" / "run" / "orbite-sim-runner.pyz"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    import hashlib

    assert made["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    # The table is the one that very file prints.
    printed = subprocess.run([sys.executable, str(path), "--defect-table"], capture_output=True, text=True,
                             check=True).stdout
    assert made["defect_table"] == json.loads(printed) and made["defect_table"]
    # Made once: an existing zipapp is hashed as it is, never rebuilt (the run pins the file it deploys).
    path.write_bytes(path.read_bytes() + b"")
    os.utime(path, (1, 1))
    again = act("sim_runner_package", json.loads(json.dumps(args).replace("{d}", str(tmp_path / "action"))))
    assert again["changed"] is False and again["sha256"] == made["sha256"] and path.stat().st_mtime == 1


def test_a_source_that_is_no_runner_tree_is_a_coded_failure(tmp_path):
    failed = same("sim_runner_package", tmp_path, {"src": "{d}", "zipapp": "{d}/run/app.pyz"})
    assert failed["failed"] and failed["code"] == "zipapp.src" and "__main__.py" in failed["msg"]
    assert not (tmp_path / "action" / "run").exists()


def test_a_zipapp_that_prints_no_table_is_a_coded_failure(tmp_path):
    fake = tmp_path / "fake.pyz"
    fake.write_text("import sys\nsys.exit(3)\n")
    failed = act("sim_runner_package", {"src": SIM, "zipapp": str(fake), "defect_table": True})
    assert failed["failed"] and failed["code"] == "sim_runner_package.defect_table" and "exited 3" in failed["msg"]


def test_fleet_plan_verdict_and_merge_actions_are_the_modules(tmp_path):
    derived = act("profile_info", {"path": PROFILE})
    cases = [{"id": "read-polling", "profile": dict(derived["profile"], source="sim-c", requester="sim-d"),
              "workload": derived["workload"]}]
    fleet = {"hosts": ["sim-a", "sim-b", "sim-c", "sim-d"], "pairing": "list", "pairs": [["sim-a", "sim-b"],
             ["sim-c", "sim-d"]], "fleet_id": "f1", "fleet_dir": "{d}/f1", "cases": ["read-polling"],
             "runs": {"p2": {"cases": cases}}}
    checked = same("fleet_plan", tmp_path, fleet, check_mode=True)
    assert [p["id"] for p in checked["pairs"]] == ["p1", "p2"] and not (tmp_path / "action" / "f1").exists()
    planned_fleet = same("fleet_plan", tmp_path, fleet)
    assert planned_fleet["changed"] is True and (tmp_path / "action" / "f1" / "f1-p2" / "run.json").is_file()
    bad = same("fleet_plan", tmp_path, dict(fleet, fleet_id="f2", fleet_dir="{d}/f2",
                                            runs={"p2": {"cases": [{"id": "bad id", "profile": {}}]}}))
    assert bad["failed"] and bad["code"] == "run_plan.invalid" and bad["msg"].startswith("runs[p2] (run_dir=")
    verdict = same("fleet_verdict", tmp_path, {"output_dir": "{d}/f1"})  # no pair ran: never PASS
    assert verdict["verdict"] in ("FAIL", "INCOMPLETE") and verdict["changed"] is True
    missing = same("fleet_verdict", tmp_path, {"output_dir": "{d}/nothing"})
    assert missing["failed"] and missing["code"] == "fleet.plan"
    merged = same("fleet_merge", tmp_path, {"fleet_dir": "{d}/f1", "fleet_id": "f1", "pairing": "list",
                                            "fleet_hosts": fleet["hosts"], "pairs": fleet["pairs"],
                                            "expected_slices": 2})
    assert merged["verdict"] in ("FAIL", "INCOMPLETE")  # no slice left a verdict: never PASS
    assert same("fleet_merge", tmp_path, {"fleet_dir": "{d}/f1", "fleet_id": "f1", "fleet_hosts": ["sim-a"],
                                          "expected_slices": "two"})["msg"].startswith("argument 'expected_slices'")


# ---------------------------------------------------------------- the shared in-process runner


def _job(run, **options):
    return types.SimpleNamespace(SPEC={"argument_spec": dict({"name": {"type": "str", "required": True}},
                                                             **options)}, run=run)


def test_an_error_the_job_did_not_expect_is_a_coded_failure_not_a_traceback():
    def run(module):
        module.warn("before the error")
        raise KeyError(f"lost {module.params['token']}")

    job = _job(run, token={"type": "str", "no_log": True})
    result = _in_process.run_job("orbite.qualification.x", job, {"name": "a", "token": "s3cret"}, False)
    assert result["failed"] and result["code"] == "error.KeyError" and result["msg"].startswith("'lost ")
    assert result["warnings"] == ["before the error"]
    assert "Traceback" not in json.dumps(result) and "s3cret" not in json.dumps(result)


def test_a_job_that_returns_without_a_result_fails_by_name():
    result = _in_process.run_job("orbite.qualification.x", _job(lambda module: None), {"name": "a"}, False)
    assert result["failed"] and result["code"] == "job.no_result"


def test_check_mode_warnings_defaults_and_no_log_reach_the_job_and_the_result():
    seen = {}

    def run(module):
        seen.update(check_mode=module.check_mode, params=dict(module.params))
        module.warn("careful")
        module.exit_json(changed=False, echo=f"token {module.params['token']}")

    job = _job(run, token={"type": "str", "no_log": True}, count={"type": "int", "default": 3})
    result = _in_process.run_job("orbite.qualification.x", job, {"name": "a", "token": "s3cret"}, True)
    assert seen == {"check_mode": True, "params": {"name": "a", "token": "s3cret", "count": 3}}
    assert result["warnings"] == ["careful"] and "s3cret" not in json.dumps(result)
    assert result["invocation"]["module_args"]["count"] == 3


def _deep(levels=100_000):
    nested = []
    for _ in range(levels):
        nested = [nested]
    return nested


def test_an_argument_nested_past_the_recursion_limit_is_a_coded_failure_not_a_recursion_error():
    job = _job(lambda module: pytest.fail("the job ran on arguments it could not read"), data={"type": "raw"})
    result = _in_process.run_job("orbite.qualification.x", job, {"name": "a", "data": _deep()}, False)
    assert result["failed"] and result["code"] == "job.not_json", result
    assert result["msg"].startswith("the arguments of orbite.qualification.x: cannot be read as JSON data")
    assert "recursion limit" in result["msg"] and "Traceback" not in json.dumps(result)


def test_a_result_nested_past_the_recursion_limit_is_a_coded_failure_with_the_jobs_warnings():
    def run(module):
        module.warn("made it")
        module.exit_json(changed=False, deep=_deep())

    result = _in_process.run_job("orbite.qualification.x", _job(run), {"name": "a"}, False)
    assert result["failed"] and result["code"] == "job.not_json" and result["warnings"] == ["made it"], result
    assert result["msg"].startswith("the job's result: cannot be read as JSON data")


@pytest.mark.parametrize(("args", "message"), [
    ({}, "missing required arguments: name"),
    ({"name": "a", "count": "many"}, "argument 'count' is of type str and we were unable to convert to int: "
                                     "\"'many'\" cannot be converted to an int"),
    ({"name": "a", "colour": 1}, "Unsupported parameters for (orbite.qualification.x) module: colour. "
                                 "Supported parameters include: count, name."),
])
def test_a_bad_argument_fails_with_the_modules_message_and_the_job_never_runs(args, message):
    job = _job(lambda module: pytest.fail("the job ran on bad arguments"), count={"type": "int"})
    result = _in_process.run_job("orbite.qualification.x", job, args, False)
    assert result["failed"] and result["msg"] == message


def test_every_in_process_action_is_documented_as_one_by_its_module():
    """Each action plugin on the in-process runner has its module, whose DOCUMENTATION says so."""
    found = []
    for path in sorted((REPO / "plugins" / "action").glob("*.py")):
        tree = ast.parse(path.read_text())
        if not any(isinstance(n, ast.ClassDef) and any(getattr(b, "id", "") == "InProcessAction" for b in n.bases)
                   for n in tree.body):
            continue
        found.append(path.stem)
        documented = (REPO / "plugins" / "modules" / path.name).read_text()
        assert "orbite.qualification._attributes.controller_action" in documented, path.name
    assert sorted(ACTIONS) == found

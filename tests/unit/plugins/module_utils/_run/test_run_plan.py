"""run_plan: the run directory's plan is written whole, checked, and never mixed with another run."""

import json
import os
import stat

import pytest
from helpers import bounded

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


# --- the run directory is private by default (issue 13) ----------------------------------------

def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_run_directory_and_plan_are_private(tmp_path):
    # <work>/runs/<run id> with neither yet made: every directory made is 0700, every file 0600,
    # whatever the umask lets through (os.makedirs would give the parents 0755).
    run_dir = tmp_path / "work" / "runs" / "run-1"
    old = os.umask(0o022)
    try:
        write_plan(str(run_dir), "run-1", [{"id": "a", "profile": PROFILE}])
    finally:
        os.umask(old)
    for directory in (tmp_path / "work", tmp_path / "work" / "runs", run_dir, run_dir / "cases",
                      run_dir / "cases" / "a"):
        assert _mode(directory) == 0o700, directory
    assert _mode(run_dir / "run.json") == 0o600 and _mode(run_dir / "cases" / "a" / "case.json") == 0o600


def test_an_existing_run_directory_keeps_its_owners_mode(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    write_plan(str(shared), "run-1", [{"id": "a", "profile": PROFILE}])
    assert _mode(shared) == 0o755 and _mode(shared / "cases") == 0o700 and _mode(shared / "run.json") == 0o600


@pytest.mark.parametrize("content", ["[]", '"run-1"', "null", "[" * 100_000])
def test_a_run_json_that_is_not_a_plan_is_refused_by_name(tmp_path, content):
    (tmp_path / "run.json").write_text(content)
    with pytest.raises(RunPlanError, match=r"run\.json"):
        write_plan(str(tmp_path), "run-1", [{"id": "a", "profile": PROFILE}])


_PLAN_IN_CHILD = """
from ansible_collections.orbite.qualification.plugins.module_utils._run.plan import RunPlanError, write_plan
try:
    write_plan(sys.argv[1], "run-1", [{"id": "a", "profile": {"source": "sim-a"}}])
    print(json.dumps("written"))
except RunPlanError as error:
    print(json.dumps(str(error)))
"""


def test_a_run_json_that_is_a_fifo_is_refused_not_a_hang(tmp_path):
    os.mkfifo(tmp_path / "run.json")
    run = bounded.run_bounded(_PLAN_IN_CHILD, timeout=20, args=[tmp_path])
    assert not run.hung and run.returncode == 0, run.explain()
    assert "run.json exists but cannot be read" in run.result and "is a FIFO" in run.result


# --- the plan binds the run's identity (issue 12) ---------------------------------------------

SHA = "a" * 64
ARTIFACTS = {"runner": {"kind": "sim", "path": "/runs/r/orbite-sim-runner.pyz", "sha256": SHA},
             "verbs_library": {"path": "/build/provider/libibverbs.so.1", "sha256": "b" * 64},
             "observers": {"accounting": {"path": "/build/liborbite_accounting.so", "sha256": "c" * 64}}}


def test_the_plan_names_profiles_hosts_ids_defects_and_artifacts(tmp_path):
    write_plan(str(tmp_path), "run-1", [{"id": "ra", "profile": PROFILE}], runner_kind="sim",
               defects=["corrupt_byte"], artifacts=ARTIFACTS)
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["profiles"] == {"ra": PROFILE} and run["hosts"] == {"ra": {"source": "sim-a", "requester": "sim-b"}}
    assert (run["runner_kind"], run["defects"], run["artifacts"]) == ("sim", ["corrupt_byte"], ARTIFACTS)
    case = json.loads((tmp_path / "cases" / "ra" / "case.json").read_text())
    assert case["supervisor_run_id"] == "run-1-ra"
    assert case["registrations"] == {"source": "run-1-ra-source", "requester": "run-1-ra-requester"}


def test_artifacts_are_optional_and_an_absent_verbs_library_is_null(tmp_path):
    write_plan(str(tmp_path), "run-1", [{"id": "a", "profile": PROFILE}])
    assert "artifacts" not in json.loads((tmp_path / "run.json").read_text())
    write_plan(str(tmp_path), "run-1", [{"id": "a", "profile": PROFILE}], artifacts={"runner": ARTIFACTS["runner"]})
    assert json.loads((tmp_path / "run.json").read_text())["artifacts"] == {
        "runner": ARTIFACTS["runner"], "verbs_library": None, "observers": {}}


def _with(path, value):
    """ARTIFACTS with the entry at ``path`` (a tuple of keys) replaced, or removed for ``...``."""
    artifacts = json.loads(json.dumps(ARTIFACTS))
    node = artifacts
    for key in path[:-1]:
        node = node[key]
    if value is ...:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return artifacts


@pytest.mark.parametrize(("artifacts", "message"), [
    ("x", r"artifacts='x': must be a mapping"),
    (_with(("binary",), {}), r"artifacts.binary: is not a field"),
    (_with(("runner",), ...), r"artifacts.runner=None: must be a mapping of kind, path, sha256"),
    (_with(("runner", "kind"), "native"), r"artifacts.runner.kind='native': must be the run's runner_kind 'sim'"),
    (_with(("runner", "sha256"), "A" * 64), r"artifacts.runner.sha256='A{64}': must be 64 lowercase hex digits"),
    (_with(("runner", "path"), "relative.pyz"), r"artifacts.runner.path='relative.pyz': must be an absolute path"),
    (_with(("runner", "size"), 3), r"artifacts.runner.size: is not a field"),
    (_with(("verbs_library", "sha256"), ...), r"artifacts.verbs_library.sha256: is required"),
    (_with(("observers",), []), r"artifacts.observers=\[\]: must be a mapping of observer tool"),
    (_with(("observers", "../x"), {"path": "/x", "sha256": SHA}), r"artifacts.observers key '../x': must be"),
    (_with(("observers", "accounting", "path"), None), r"artifacts.observers.accounting.path: is required"),
])
def test_bad_artifacts_are_named(tmp_path, artifacts, message):
    with pytest.raises(RunPlanError, match=message):
        write_plan(str(tmp_path), "run-1", [{"id": "a", "profile": PROFILE}], artifacts=artifacts)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("options", "message"), [
    ({"runner_kind": "emulated"}, r"runner_kind='emulated': must be one of sim, native"),
    ({"defects": 5}, r"defects=5: must be a list of defect switch names or one string"),
    ({"defects": "ok,no such/switch"}, r"defects\[1\]='no such/switch': must be"),
    ({"defects": ["ok", "no such/switch"]}, r"defects\[1\]='no such/switch': must be"),
])
def test_bad_runner_kind_and_defects_are_named(tmp_path, options, message):
    with pytest.raises(RunPlanError, match=message):
        write_plan(str(tmp_path), "run-1", [{"id": "a", "profile": PROFILE}], **options)


def test_ids_too_long_for_the_nodes_are_refused_at_plan_time(tmp_path):
    with pytest.raises(RunPlanError, match=r"cases\[0\].id='c{40}': the ID 'r{20}-c{40}-source' \(run_id-case_id"):
        write_plan(str(tmp_path), "r" * 20, [{"id": "c" * 40, "profile": PROFILE}])


def test_the_module_checks_artifacts_like_the_plan(tmp_path):
    from helpers.modules import run_module

    base = {"run_dir": str(tmp_path / "run"), "run_id": "run-1", "cases": [{"id": "a", "profile": PROFILE}]}
    result = run_module("run_plan", tmp_path, dict(base, artifacts=ARTIFACTS))
    assert result["changed"] is True and result["cases"] == {
        "a": {"supervisor_run_id": "run-1-a", "registrations": {"source": "run-1-a-source",
                                                                 "requester": "run-1-a-requester"}}}
    assert json.loads((tmp_path / "run" / "run.json").read_text())["artifacts"] == ARTIFACTS
    unknown = run_module("run_plan", tmp_path, dict(base, artifacts=_with(("runner", "size"), 3)))
    assert unknown["failed"] is True and "size" in unknown["msg"]
    bad = run_module("run_plan", tmp_path, dict(base, artifacts=_with(("observers", "accounting", "sha256"), "x")))
    assert bad["failed"] is True and bad["code"] == "run_plan.invalid"
    assert "artifacts.observers.accounting.sha256='x': must be 64 lowercase hex digits" in bad["msg"]


def _origin_run(tmp_path, verdicts):
    """An earlier run: its plan (two cases) and, unless ``verdicts`` is None, its verdict by case."""
    run_dir = tmp_path / "runs" / "ra-1"
    cases = [{"id": "read-polling", "profile": dict(PROFILE, operation="read")},
             {"id": "write-events", "profile": dict(PROFILE, operation="write", source="sim-c")}]
    write_plan(str(run_dir), "ra-1", cases)
    if verdicts is not None:
        (run_dir / "verdict.json").write_text(json.dumps({
            "schema": "orbite.verdict", "run_id": "ra-1", "verdict": "FAIL",
            "cases": [{"case": case, "verdict": verdict} for case, verdict in verdicts.items()]}))
    return run_dir


def test_a_rerun_plans_only_the_cases_that_did_not_pass_and_names_its_origin(tmp_path):
    from ansible_collections.orbite.qualification.plugins.module_utils._run.plan import rerun_origin

    origin_dir = _origin_run(tmp_path, {"read-polling": "PASS", "write-events": "FAIL"})
    found = rerun_origin(str(origin_dir))
    assert found["origin"] == {"run_id": "ra-1", "run_dir": str(origin_dir), "cases": ["write-events"]}
    assert found["profiles"] == {"write-events": dict(PROFILE, operation="write", source="sim-c")}
    assert found["hosts"] == {"write-events": {"source": "sim-c", "requester": "sim-b"}}
    rerun = tmp_path / "runs" / "ra-2"
    write_plan(str(rerun), "ra-2", [{"id": c, "profile": p} for c, p in found["profiles"].items()],
               origin=found["origin"])
    run = json.loads((rerun / "run.json").read_text())
    assert run["cases"] == ["write-events"] and run["origin"] == found["origin"]
    # INCOMPLETE (not verified) did not pass either; a run never verified passed nothing.
    assert rerun_origin(str(_origin_run(tmp_path / "b", {"read-polling": "INCOMPLETE", "write-events": "PASS"})))[
        "origin"]["cases"] == ["read-polling"]
    assert rerun_origin(str(_origin_run(tmp_path / "c", None)))["origin"]["cases"] == ["read-polling", "write-events"]


def test_a_rerun_of_a_run_that_passed_or_is_no_run_is_refused_by_name(tmp_path):
    from ansible_collections.orbite.qualification.plugins.module_utils._run.plan import rerun_origin

    passed = _origin_run(tmp_path, {"read-polling": "PASS", "write-events": "PASS"})
    with pytest.raises(RunPlanError, match="every planned case of run ra-1 passed") as caught:
        rerun_origin(str(passed))
    assert caught.value.code == "run_plan.nothing_to_rerun"
    with pytest.raises(RunPlanError, match="holds no run plan"):
        rerun_origin(str(tmp_path))
    with pytest.raises(RunPlanError, match="must be an absolute run directory"):
        rerun_origin("runs/ra-1")


@pytest.mark.parametrize(("origin", "message"), [
    ({"run_id": "ra 1", "run_dir": "/r", "cases": ["a"]}, r"origin.run_id='ra 1'"),
    ({"run_id": "ra-1", "run_dir": "r", "cases": ["a"]}, r"origin.run_dir='r': must be an absolute path"),
    ({"run_id": "ra-1", "run_dir": "/r", "cases": ["a", "b"]}, r"origin.cases=\['a', 'b'\]: must be exactly"),
    ({"run_id": "ra-1", "run_dir": "/r", "cases": ["a"], "x": 1}, r"origin.x: is not a field"),
])
def test_a_bad_origin_is_named(tmp_path, origin, message):
    with pytest.raises(RunPlanError, match=message):
        write_plan(str(tmp_path), "run-1", [{"id": "a", "profile": PROFILE}], origin=origin)


def test_the_module_writes_the_runs_first_verdict_incomplete_when_asked(tmp_path):
    """The gate's first verdict, before any node is touched: INCOMPLETE, every planned case pending, in every
    format; a controller killed before the final verification leaves this, never PASS."""
    from helpers.modules import run_module

    run_dir = tmp_path / "runs" / "r1"
    base = {"run_dir": str(run_dir), "run_id": "r1",
            "cases": [{"id": "a", "profile": PROFILE}, {"id": "b", "profile": PROFILE}]}
    plain = run_module("run_plan", tmp_path, base)
    assert plain["verdict"] is None and not (run_dir / "verdict.json").exists()
    first = run_module("run_plan", tmp_path, dict(base, verdict=True))
    assert first["verdict"] == str(run_dir / "verdict.json") and not first.get("failed")
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["verdict"] == "INCOMPLETE" and verdict["complete"] is False
    assert [(c["case"], c["verdict"]) for c in verdict["cases"]] == [("a", "INCOMPLETE"), ("b", "INCOMPLETE")]
    assert verdict["failed_codes"] == ["run.incomplete"]
    assert (run_dir / "verdict.md").read_text().splitlines()[0] == "# Verdict: INCOMPLETE"
    assert not (tmp_path / "runs" / "index.json").exists()  # the runs index is the final verification's


def test_a_cases_own_switches_and_left_out_observers_are_recorded_for_it(tmp_path):
    cases = [{"id": "a", "profile": PROFILE, "defects": ["corrupt_byte"], "leave_out": ["cq_fault"]},
             {"id": "b", "profile": PROFILE, "defects": None}]
    write_plan(str(tmp_path), "run-1", cases, defects=["extra_qp"])
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["defects"] == ["extra_qp"]
    assert run["case_defects"] == {"a": ["corrupt_byte"]} and run["case_left_out"] == {"a": ["cq_fault"]}
    assert json.loads((tmp_path / "cases" / "a" / "case.json").read_text())["defects"] == ["corrupt_byte"]
    assert "defects" not in json.loads((tmp_path / "cases" / "b" / "case.json").read_text())
    with pytest.raises(RunPlanError, match=r"cases\[0\].leave_out\[0\]='../x': must be"):
        write_plan(str(tmp_path / "other"), "run-2", [{"id": "a", "profile": PROFILE, "leave_out": ["../x"]}])


def test_a_rerun_of_a_run_left_incomplete_verifies_it_first_and_a_final_verdict_is_kept(tmp_path):
    from ansible_collections.orbite.qualification.plugins.module_utils._controller.run_origin import origin_of

    killed = _origin_run(tmp_path, {"read-polling": "INCOMPLETE", "write-events": "INCOMPLETE"})
    (killed / "verdict.json").write_text(json.dumps({
        "schema": "orbite.verdict", "run_id": "ra-1", "verdict": "INCOMPLETE", "complete": False,
        "cases": [{"case": "read-polling", "verdict": "PASS"}, {"case": "write-events", "verdict": "INCOMPLETE"}]}))
    looked = origin_of(str(killed), write=False)  # check mode: verified, nothing written
    assert looked["verified"] is True and json.loads((killed / "verdict.json").read_text())["complete"] is False
    # Verified now: no case left receipts, so neither passed (the stale PASS of the INCOMPLETE file is not read).
    found = origin_of(str(killed))
    assert found["verified"] is True and found["origin"]["cases"] == ["read-polling", "write-events"]
    written = json.loads((killed / "verdict.json").read_text())
    assert written["complete"] is True and written["verdict"] == found["verdict"] == "FAIL"
    # The verdict is final now: a second rerun reads it as it is.
    again = origin_of(str(killed))
    assert again["verified"] is False and again["origin"] == found["origin"]
    assert json.loads((killed / "verdict.json").read_text())["started_at"] == written["started_at"]


def test_the_module_writes_the_case_schedule_beside_run_json_and_nothing_in_check_mode(tmp_path):
    from helpers.modules import run_module

    schedule = {"mode": "lanes", "lanes": [{"lane": 0}], "slots": [[{"id": "a", "lane": 0}]], "total": 1.0}
    base = {"run_dir": str(tmp_path / "run"), "run_id": "run-1", "cases": [{"id": "a", "profile": PROFILE}]}
    assert run_module("run_plan", tmp_path, dict(base, schedule=schedule, _ansible_check_mode=True))["changed"] is True
    assert not (tmp_path / "run" / "schedule.json").exists()
    run_module("run_plan", tmp_path, dict(base, schedule=schedule))
    written = tmp_path / "run" / "schedule.json"
    assert json.loads(written.read_text()) == schedule and _mode(written) == 0o600
    run_module("run_plan", tmp_path, dict(base, run_dir=str(tmp_path / "plain")))
    assert not (tmp_path / "plain" / "schedule.json").exists()

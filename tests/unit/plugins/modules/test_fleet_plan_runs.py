"""fleet_plan's write call with `runs`: every named pair's run.json (and case.json) from that pair's cases, in one
call; nothing in check mode; a bad case is named with its pair and the fleet plan is not written."""

import json

from ansible_collections.orbite.qualification.plugins.module_utils._profile.model import load_and_derive
from helpers.modules import run_module


def _cases(repo_root, source, requester):
    profile, workload = load_and_derive(path=str(repo_root / "profiles" / "rail_accounting.json"),
                                        changes={"source": source, "requester": requester})
    return [{"id": "read-polling", "profile": profile, "workload": workload}]


def _args(tmp_path, repo_root, **extra):
    return dict({"hosts": ["sim-a", "sim-b", "sim-c", "sim-d"], "pairing": "list",
                 "pairs": [["sim-a", "sim-b"], ["sim-c", "sim-d"]], "fleet_id": "f1",
                 "fleet_dir": str(tmp_path / "f1"), "cases": ["read-polling"]}, **extra)


def test_the_write_call_writes_every_named_pairs_run_plan(tmp_path, repo_root):
    runs = {"p2": {"cases": _cases(repo_root, "sim-c", "sim-d")}}
    result = run_module("fleet_plan", tmp_path, _args(tmp_path, repo_root, runs=runs, defects=["leak_grant"]))
    assert result.get("failed") is not True, result
    p2 = tmp_path / "f1" / "f1-p2"
    plan = json.loads((p2 / "run.json").read_text())
    assert (plan["run_id"], plan["cases"], plan["defects"]) == ("f1-p2", ["read-polling"], ["leak_grant"])
    assert plan["hosts"] == {"read-polling": {"source": "sim-c", "requester": "sim-d"}}
    assert json.loads((p2 / "cases" / "read-polling" / "case.json").read_text())["hosts"]["source"] == "sim-c"
    assert not (tmp_path / "f1" / "f1-p1").exists()  # p1's run.json is the preflight's, not named here
    assert (tmp_path / "f1" / "fleet.json").is_file()


def test_check_mode_writes_no_run_plan(tmp_path, repo_root):
    runs = {"p2": {"cases": _cases(repo_root, "sim-c", "sim-d")}}
    result = run_module("fleet_plan", tmp_path, dict(_args(tmp_path, repo_root, runs=runs), _ansible_check_mode=True))
    assert result.get("failed") is not True and [p["id"] for p in result["pairs"]] == ["p1", "p2"], result
    assert not (tmp_path / "f1").exists()


def test_a_bad_case_is_named_with_its_pair_and_nothing_of_the_fleet_is_written(tmp_path, repo_root):
    runs = {"p2": {"cases": [{"id": "bad id", "profile": {}}]}}
    result = run_module("fleet_plan", tmp_path, _args(tmp_path, repo_root, runs=runs))
    assert result["failed"] is True and result["code"] == "run_plan.invalid", result
    assert result["msg"].startswith(f"runs[p2] (run_dir={tmp_path / 'f1' / 'f1-p2'}): cases[0].id=")
    assert not (tmp_path / "f1" / "fleet.json").exists()

"""fleet_plan's write call with `runs`: every named pair's run.json (and case.json) from that pair's cases, in one
call; nothing in check mode; a bad case is named with its pair and the fleet plan is not written."""

import json

from ansible_collections.orbite.qualification.plugins.filter.fleet import fleet_pairs, fleet_schedule
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


def test_a_pairs_lanes_give_its_case_hosts_and_its_schedule_json(tmp_path, repo_root):
    cases = _cases(repo_root, "sim-c", "sim-d")
    cases.append(dict(cases[0], id="write-events"))
    rails = {h: [{"device": f"mlx5_{i}", "port": 1, "gid_index": 3} for i in range(4)]
             for h in ("sim-a", "sim-b", "sim-c", "sim-d")}
    addresses = {h: f"127.0.0.{11 + i}:7471" for i, h in enumerate(("sim-a", "sim-b", "sim-c", "sim-d"))}
    args = _args(tmp_path, repo_root)
    planned = fleet_pairs(args["hosts"], "f1", args["fleet_dir"], pairing="list", pairs=args["pairs"])
    lanes = fleet_schedule({"p2": {"cases": cases}}, planned, rails, addresses)
    runs = {"p2": dict({"cases": cases}, **lanes["pairs"]["p2"])}
    result = run_module("fleet_plan", tmp_path, dict(args, runs=runs, cases=["read-polling", "write-events"],
                        rails={lane["name"]: lane["rails"] for lane in lanes["lane_hosts"]},
                        service_addresses={lane["name"]: lane["service_address"] for lane in lanes["lane_hosts"]}))
    assert result.get("failed") is not True, result
    p2 = tmp_path / "f1" / "f1-p2"
    assert json.loads((p2 / "schedule.json").read_text()) == lanes["pairs"]["p2"]["schedule"]
    launch = json.loads((p2 / "cases" / "write-events" / "case.json").read_text())["launch"]["roles"]
    assert (launch["source"]["host"], launch["source"]["locks"], launch["source"]["service_address"]) == (
        "sim-c~lane1", ["mlx5_2", "mlx5_3"], "127.0.0.13:7472")
    assert (launch["requester"]["host"], launch["requester"]["locks"]) == ("sim-d~lane1", ["mlx5_2", "mlx5_3"])
    first = json.loads((p2 / "cases" / "read-polling" / "case.json").read_text())["launch"]["roles"]
    assert first["source"]["host"] == "sim-c" and first["source"]["locks"] == ["mlx5_0", "mlx5_1"]

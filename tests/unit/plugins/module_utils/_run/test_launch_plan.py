"""The run plan's launch entries: what each role of a case launches, computed once (case.json "launch") and put
under the node's run directory by node_launch, which roles/runner passes on as it is."""

import json

from pathlib import Path

import pytest
import yaml

from ansible_collections.orbite.qualification.plugins.module_utils._run.plan import (
    SECONDS,
    RunPlanError,
    case_launch,
    node_launch,
    write_plan,
)

SHA_RUNNER, SHA_LIB, SHA_ACC, SHA_FAULT = "a" * 64, "b" * 64, "c" * 64, "d" * 64
ARTIFACTS = {"runner": {"kind": "sim", "path": "/runs/r/orbite-sim-runner.pyz", "sha256": SHA_RUNNER},
             "verbs_library": {"path": "/build/provider/libibverbs.so.1", "sha256": SHA_LIB},
             "observers": {"accounting": {"path": "/build/liborbite_accounting.so", "sha256": SHA_ACC},
                           "uverbs_fault": {"path": "/build/liborbite_uverbs_fault.so", "sha256": SHA_FAULT}}}
PROFILE = {"source": "sim-a", "requester": "sim-b", "mode": "installed-cleanup-failure", "generations": 2}
# accounting on both roles; uverbs_fault armed on generation 1's requester only; cq_fault pinned nowhere.
WORKLOAD = {"observers": [
    {"tool": "uverbs_fault", "role": "requester", "generation": 1, "env": {"ORBITE_FAULT": "destroy"}},
    {"tool": "accounting", "role": "source"},
    {"tool": "accounting", "role": "requester", "env": {"ORBITE_ACC": "1"}},
    {"tool": "cq_fault", "role": "source"},
]}


def _launch(tmp_path, runner_kind="sim", artifacts=ARTIFACTS, defects=("corrupt_byte", "leak_grant")):
    case = {"id": "cf", "profile": PROFILE, "workload": WORKLOAD, "defects": ["leak_grant", "stale_epoch_qp"]}
    write_plan(str(tmp_path), "run-1", [case], runner_kind=runner_kind, defects=list(defects), artifacts=artifacts)
    return json.loads((tmp_path / "cases" / "cf" / "case.json").read_text())["launch"]


def test_ids_and_defects_are_the_plans_with_the_relays_switch_apart(tmp_path):
    launch = _launch(tmp_path)
    assert launch["supervisor_run_id"] == "run-1-cf"
    source, requester = launch["roles"]["source"], launch["roles"]["requester"]
    assert (source["registration_id"], source["peer_registration_id"]) == ("run-1-cf-source", None)
    assert (requester["registration_id"], requester["peer_registration_id"]) == ("run-1-cf-requester",
                                                                                  "run-1-cf-source")
    # The run's switches, then the case's own, once each; leak_grant is the control relay's, never a runner's.
    assert source["defects"] == requester["defects"] == ["corrupt_byte", "stale_epoch_qp"]
    assert source["relay_defects"] == ["leak_grant"]


def test_each_generation_has_its_own_observers_and_environment(tmp_path):
    requester = _launch(tmp_path)["roles"]["requester"]
    assert [{key: g[key] for key in ("generation", "observers", "env")} for g in requester["generations"]] == [
        {"generation": 1, "observers": ["accounting", "uverbs_fault"],
         "env": {"ORBITE_ACC": "1", "ORBITE_FAULT": "destroy"}},
        {"generation": 2, "observers": ["accounting"], "env": {"ORBITE_ACC": "1"}}]


def test_the_deploy_pins_every_file_and_names_an_unpinned_one(tmp_path):
    source = _launch(tmp_path)["roles"]["source"]
    assert source["deploy"] == [
        {"name": "runner", "src": "/runs/r/orbite-sim-runner.pyz", "sha256": SHA_RUNNER,
         "file": "orbite-sim-runner.pyz"},
        {"name": "verbs_library", "src": "/build/provider/libibverbs.so.1", "sha256": SHA_LIB,
         "file": "native/libibverbs.so.1"},
        {"name": "accounting", "src": "/build/liborbite_accounting.so", "sha256": SHA_ACC,
         "file": "native/liborbite_accounting.so"},
        {"name": "cq_fault", "src": None, "sha256": None, "file": None}]
    assert source["preloads"] == {"accounting": {"file": "native/liborbite_accounting.so", "sha256": SHA_ACC}}


def test_node_launch_puts_the_plan_under_the_nodes_run_directory(tmp_path):
    entry = node_launch(_launch(tmp_path)["roles"]["requester"], "/var/tmp/orbite/run-1", "/usr/bin/python3")
    assert entry["runner_argv"] == ["/usr/bin/python3", "/var/tmp/orbite/run-1/orbite-sim-runner.pyz"]
    assert entry["runner_sha256"] == SHA_RUNNER
    assert entry["verbs_library"] == {"path": "/var/tmp/orbite/run-1/native/libibverbs.so.1", "sha256": SHA_LIB}
    assert [(e["name"], e["dest"]) for e in entry["deploy"]] == [
        ("runner", "/var/tmp/orbite/run-1/orbite-sim-runner.pyz"),
        ("verbs_library", "/var/tmp/orbite/run-1/native/libibverbs.so.1"),
        ("uverbs_fault", "/var/tmp/orbite/run-1/native/liborbite_uverbs_fault.so"),
        ("accounting", "/var/tmp/orbite/run-1/native/liborbite_accounting.so")]
    assert entry["preloads"]["uverbs_fault"] == {"path": "/var/tmp/orbite/run-1/native/liborbite_uverbs_fault.so",
                                                 "sha256": SHA_FAULT}


def test_case_launch_gives_this_roles_entry_with_the_cases_ids_flow_and_seconds(tmp_path):
    _launch(tmp_path)
    plan = json.loads((tmp_path / "cases" / "cf" / "case.json").read_text())
    entry = case_launch(plan, "requester", "sim-b", "/w/run-1", "/usr/bin/python3")
    assert entry == dict(node_launch(plan["launch"]["roles"]["requester"], "/w/run-1", "/usr/bin/python3"),
                         role="requester", source_host="sim-a", supervisor_run_id="run-1-cf", flow="restart",
                         seconds=plan["launch"]["seconds"])
    assert entry["registration_id"] == "run-1-cf-requester"


def test_case_launch_refuses_a_plan_that_gives_the_role_to_another_host(tmp_path):
    _launch(tmp_path)
    plan = json.loads((tmp_path / "cases" / "cf" / "case.json").read_text())
    with pytest.raises(RunPlanError, match=r'case cf: launch\.roles\.source\.host=.sim-a.: is not this host '
                                           r'\(sim-b\); the case schedule and the run plan disagree'):
        case_launch(plan, "source", "sim-b", "/w/run-1", "/usr/bin/python3")


def test_the_filter_names_the_code_and_the_field_of_a_plan_for_another_host(tmp_path):
    from ansible.errors import AnsibleFilterError
    from ansible_collections.orbite.qualification.plugins.filter.gate import FilterModule

    _launch(tmp_path)
    plan = json.loads((tmp_path / "cases" / "cf" / "case.json").read_text())
    node_launch_filter = FilterModule().filters()["node_launch"]
    assert node_launch_filter(plan, "source", "sim-a", "/w/run-1", "/usr/bin/python3")["host"] == "sim-a"
    with pytest.raises(AnsibleFilterError, match=r"^run_plan\.invalid: case cf: launch\.roles\.requester\.host="):
        node_launch_filter(plan, "requester", "sim-a", "/w/run-1", "/usr/bin/python3")


def test_a_native_runner_runs_its_binary_and_deploys_only_the_labs_provider(tmp_path):
    artifacts = dict(ARTIFACTS, runner={"kind": "native", "path": "/opt/orbite/bin/orbite", "sha256": SHA_RUNNER})
    launch = _launch(tmp_path, runner_kind="native", artifacts=artifacts, defects=())
    entry = node_launch(launch["roles"]["source"], "/w/run-1", "/usr/bin/python3")
    assert entry["runner_argv"] == ["/opt/orbite/bin/orbite"]
    assert [e["name"] for e in entry["deploy"]] == ["verbs_library"] and entry["preloads"] == {}
    # On real hosts (no lab provider pinned) nothing is deployed and the system's library is loaded.
    launch = _launch(tmp_path / "real", runner_kind="native", artifacts=dict(artifacts, verbs_library=None),
                     defects=())
    entry = node_launch(launch["roles"]["source"], "/w/run-1", "/usr/bin/python3")
    assert entry["deploy"] == [] and entry["verbs_library"] is None


def test_the_module_casts_a_survey_string_and_names_the_variable_when_bad(tmp_path):
    from helpers.modules import run_module

    base = {"run_dir": str(tmp_path / "run"), "run_id": "run-1", "cases": [{"id": "a", "profile": PROFILE}]}
    result = run_module("run_plan", tmp_path, dict(base, defects="corrupt_byte, extra_qp"))
    assert not result.get("failed"), result
    assert json.loads((tmp_path / "run" / "run.json").read_text())["defects"] == ["corrupt_byte", "extra_qp"]
    bad = run_module("run_plan", tmp_path, dict(base, run_dir=str(tmp_path / "b" / "run"), defects={"a": 1}))
    assert bad["failed"] is True and bad["code"] == "run_plan.invalid"
    assert bad["msg"].startswith("defects (orbite_runner_defects)={'a': 1}: must be a list of defect switch")
    assert not (tmp_path / "b" / "run").exists()  # refused before anything is written


def test_a_tool_listed_case_wide_and_for_a_generation_is_preloaded_once(tmp_path):
    case = {"id": "cf", "profile": PROFILE, "workload": {"observers": [
        {"tool": "accounting", "role": "requester"},
        {"tool": "accounting", "role": "requester", "generation": 1, "env": {"ORBITE_ACC": "g1"}}]}}
    write_plan(str(tmp_path), "run-1", [case], runner_kind="sim", defects=[], artifacts=ARTIFACTS)
    requester = json.loads((tmp_path / "cases" / "cf" / "case.json").read_text())["launch"]["roles"]["requester"]
    assert [g["observers"] for g in requester["generations"]] == [["accounting"], ["accounting"]]
    assert requester["generations"][0]["env"] == {"ORBITE_ACC": "g1"}


def test_the_module_takes_survey_seconds_and_names_a_bad_one(tmp_path):
    from helpers.modules import run_module

    base = {"run_dir": str(tmp_path / "run"), "run_id": "run-1", "cases": [{"id": "a", "profile": PROFILE}]}
    given = {"orbite_lease": "60", "orbite_lock_timeout": 0, "orbite_runner_timeout": " 0.5 ",
             "orbite_runner_poll": None, "orbite_runner_ready_timeout": 30.0}
    assert not run_module("run_plan", tmp_path, dict(base, timeouts=given)).get("failed")
    # ansible-core 2.17 renders an unset variable's default(none) as '': unset, as None is.
    unset = run_module("run_plan", tmp_path, dict(base, run_dir=str(tmp_path / "u"), timeouts={"orbite_lease": ""}))
    assert not unset.get("failed"), unset
    for variable, value, rule in (("orbite_lease", "abc", "(0, 604800]"), ("orbite_lease", "0", "(0, 604800]"),
                                  ("orbite_lock_timeout", "-1", "[0, 3600]"),
                                  ("orbite_runner_poll", True, "(0, 86400]"),
                                  ("orbite_runner_timeout", "nan", "(0, 86400]")):
        run_dir = tmp_path / "bad" / variable / str(value)
        bad = run_module("run_plan", tmp_path, dict(base, run_dir=str(run_dir), timeouts={variable: value}))
        assert bad["failed"] is True and bad["code"] == "run_plan.invalid", bad
        assert bad["msg"] == f"{variable}={value!r}: must be a number of seconds in {rule}", bad["msg"]
        assert not run_dir.exists()  # refused before anything is written
    other = run_module("run_plan", tmp_path, dict(base, run_dir=str(tmp_path / "o"), timeouts={"orbite_leese": 1}))
    assert other["failed"] is True and "'orbite_leese' is not one of orbite_lease" in other["msg"]


RAILS = {"sim-a": [{"device": "mlx5_0", "port": 1, "gid_index": 3}, {"device": "mlx5_1", "port": 1, "gid_index": 3}],
         # An alias host (a lane) of the same node: its own host vars, flowing in unchanged.
         "sim-b": [{"device": "mlx5_1", "port": 1, "gid_index": 3}]}
ADDRESSES = {"sim-a": "127.0.0.11:7471", "sim-b": "127.0.0.12:7471"}


def _case_plan(tmp_path, profile, workload=None, defects=(), **options):
    case = {"id": "c", "profile": profile, "workload": workload or {"rounds_per_generation": 3}}
    options = dict({"rails": RAILS, "service_addresses": ADDRESSES}, **options)
    write_plan(str(tmp_path), "run-1", [case], runner_kind="sim", defects=list(defects), **options)
    return json.loads((tmp_path / "cases" / "c" / "case.json").read_text())["launch"]


def test_rails_and_locks_come_from_each_roles_inventory_host(tmp_path):
    launch = _case_plan(tmp_path, {"source": "sim-a", "requester": "sim-b", "mode": "installed-host"})
    source, requester = launch["roles"]["source"], launch["roles"]["requester"]
    assert (source["host"], source["locks"], source["rails_arguments"]) == ("sim-a", ["mlx5_0", "mlx5_1"],
                                                                            {"rails": RAILS["sim-a"]})
    assert (requester["locks"], requester["rails_arguments"]) == (["mlx5_1"], {"rails": RAILS["sim-b"]})
    assert (launch["flow"], source["service_address"], requester["service_address"]) == (
        "single", "127.0.0.11:7471", None)
    assert [(g["bind"], g["peer"]) for g in source["generations"] + requester["generations"]] == [
        ("configured", None), (None, "source")]


def test_discovery_auto_pins_no_rails_and_lists_exactly_the_locked_rnics_both_ways(tmp_path):
    launch = _case_plan(tmp_path, {"source": "sim-a", "requester": "sim-b", "mode": "installed-rail-accounting",
                                   "discovery": "auto"})
    assert launch["roles"]["source"]["rails_arguments"] == {
        "discovery": {"whitelist": ["mlx5_0", "mlx5_1"], "blacklist": ["mlx5_0", "mlx5_1"]}}
    # Its own flow: the runner role's task file with the discovery inventories around the runners (no other case
    # has a task for them).
    assert launch["flow"] == "discovery"


def test_a_restart_generation_differs_only_by_its_plan_entries(tmp_path):
    launch = _case_plan(tmp_path, {"source": "sim-a", "requester": "sim-b", "mode": "installed-restart",
                                   "generations": 3, "fault_role": "source"})
    steps = [[(g["starts"], g["kill_previous"], g["last"], g["bind"]) for g in launch["roles"][role]["generations"]]
             for role in ("source", "requester")]
    assert steps == [[(True, False, False, "configured"), (True, True, False, "previous"),
                      (True, True, True, "previous")],
                     [(True, False, False, None), (False, False, False, None), (False, False, True, None)]]
    assert launch["flow"] == "restart" and launch["roles"]["source"]["relay"] is None
    assert launch["roles"]["source"]["fetch_files"] == {}


def test_interruptions_relay_arguments_and_seconds_are_computed_once(tmp_path):
    profile = {"source": "sim-a", "requester": "sim-b", "mode": "installed-interruption", "generations": 2,
               "fault_role": "requester"}
    timeouts = {"orbite_lease": "60", "orbite_runner_timeout": "100", "orbite_runner_ready_timeout": None}
    launch = _case_plan(tmp_path, profile, timeouts=timeouts)
    assert launch["seconds"] == {"lease": 60.0, "lock_timeout": 30.0, "ready_timeout": 60.0, "runner_timeout": 100.0,
                                 "poll": 3.0}
    source = launch["roles"]["source"]
    assert source["relay"] == {"state_dir": "c/relay", "listen": "127.0.0.11:0", "hold_after_round": 3,
                               "defects": [], "lease": (100.0 + 60.0) * 2 + 60.0, "timeout": 60.0}
    assert [g["relay_held"] for g in source["generations"]] == [1, None]
    assert [g["peer"] for g in launch["roles"]["requester"]["generations"]] == ["relay", "relay"]
    entry = node_launch(source, "/w/run-1", "/usr/bin/python3")
    assert (entry["relay"]["state_dir"], entry["fetch_files"]) == ("/w/run-1/c/relay",
                                                                   {"relay.jsonl": "/w/run-1/c/relay/relay.jsonl"})
    # The relay's own switch: it holds no grant, and the runners never see the switch.
    leaky = _case_plan(tmp_path / "leak", profile, defects=["leak_grant"])["roles"]["source"]
    assert ([g["relay_held"] for g in leaky["generations"]], leaky["relay"]["defects"], leaky["defects"]) == (
        [0, None], ["leak_grant"], [])


@pytest.mark.parametrize("field, given, message", [
    ("rails", {"sim-a": RAILS["sim-a"]}, "rails.sim-b=None: must be host sim-b's orbite_rails"),
    ("rails", dict(RAILS, **{"sim-b": [{"port": 1}]}), "rails.sim-b=[{'port': 1}]: must be host sim-b's orbite_rails"),
    ("service_addresses", dict(ADDRESSES, **{"sim-a": "127.0.0.11"}),
     "service_addresses.sim-a='127.0.0.11': must be host sim-a's orbite_service_address, host:port"),
])
def test_a_case_host_without_its_host_vars_is_refused_by_name(tmp_path, field, given, message):
    with pytest.raises(RunPlanError) as raised:
        _case_plan(tmp_path, {"source": "sim-a", "requester": "sim-b", "mode": "installed-host"}, **{field: given})
    assert str(raised.value).startswith(message), str(raised.value)
    assert not (tmp_path / "run.json").exists()


def test_the_plans_default_seconds_are_the_runner_roles_defaults():
    defaults = yaml.safe_load((Path(__file__).parents[5] / "roles" / "runner" / "defaults" / "main.yml").read_text())
    assert {variable: entry[-1] for variable, entry in SECONDS.items()} == {
        variable: defaults[variable] for variable in SECONDS}


def test_a_lane_case_takes_its_lane_hosts_rails_address_and_locks(tmp_path):
    # The case schedule put the case on lane 1: its roles run on the alias hosts, with the aliases' host vars.
    lane = {"sim-a~lane1": [{"device": "mlx5_2", "port": 1, "gid_index": 3}, {"device": "mlx5_3", "port": 1,
                                                                               "gid_index": 3}],
            "sim-b~lane1": [{"device": "mlx5_2", "port": 1, "gid_index": 3}]}
    launch = _case_plan(tmp_path, {"source": "sim-a", "requester": "sim-b", "mode": "installed-host"},
                        rails=dict(RAILS, **lane),
                        service_addresses=dict(ADDRESSES, **{"sim-a~lane1": "127.0.0.11:7472",
                                                             "sim-b~lane1": "127.0.0.12:7472"}),
                        case_hosts={"c": {"source": "sim-a~lane1", "requester": "sim-b~lane1"}})
    source, requester = launch["roles"]["source"], launch["roles"]["requester"]
    assert (source["host"], source["locks"], source["service_address"]) == (
        "sim-a~lane1", ["mlx5_2", "mlx5_3"], "127.0.0.11:7472")
    assert (requester["host"], requester["rails_arguments"]) == ("sim-b~lane1", {"rails": lane["sim-b~lane1"]})


@pytest.mark.parametrize("given", [{"c": {"source": "sim-a"}}, {"c": "sim-a"}, ["sim-a", "sim-b"]])
def test_a_bad_case_hosts_entry_is_refused_by_name_before_anything_is_written(tmp_path, given):
    with pytest.raises(RunPlanError) as raised:
        _case_plan(tmp_path, {"source": "sim-a", "requester": "sim-b", "mode": "installed-host"}, case_hosts=given)
    assert str(raised.value).startswith("case_hosts."), str(raised.value)
    assert "must name the inventory host of each role (source, requester)" in str(raised.value)
    assert not (tmp_path / "run.json").exists()


def test_case_launches_reads_each_case_of_this_host_once_with_its_role_from_the_slot(tmp_path):
    from ansible_collections.orbite.qualification.plugins.module_utils._run.plan import case_launches

    launch = _launch(tmp_path)
    # Two slots: this host's case, then none (an idle slot of a lane).
    slots = [{"id": "cf", "source": "sim-a"}, None]
    source = case_launches(str(tmp_path), slots, "sim-a", "/w/run-1", "/usr/bin/python3")
    plan = json.loads((tmp_path / "cases" / "cf" / "case.json").read_text())
    assert source == {"cf": case_launch(plan, "source", "sim-a", "/w/run-1", "/usr/bin/python3")}
    requester = case_launches(str(tmp_path), slots, "sim-b", "/w/run-1", "/usr/bin/python3")
    assert requester["cf"]["registration_id"] == "run-1-cf-requester"
    # Every role's observer tools, whatever the runner kind (a native runner's installation is checked for them).
    assert launch["roles"]["requester"]["tools"] == ["uverbs_fault", "accounting"]
    assert requester["cf"]["tools"] == ["uverbs_fault", "accounting"] and source["cf"]["tools"] == [
        "accounting", "cq_fault"]


@pytest.mark.parametrize(("slots", "message"), [
    ("cf", r"slots='cf': must be a list of this host's case per slot"),
    ([{"id": "../x", "source": "sim-a"}], r"slots\[0\]=.*: must be a mapping with the case's id \(a name\)"),
    ([None, {"id": "nope", "source": "sim-a"}], r"slots\[1\] \(case nope\): .*cases/nope/case.json cannot be read"),
    # The schedule gives sim-c the source; the plan gives it to sim-a.
    ([{"id": "cf", "source": "sim-c"}], r"case cf: launch\.roles\.source\.host=.sim-a.: is not this host \(sim-c\)"),
])
def test_case_launches_names_the_slot_and_the_rule_of_a_bad_plan(tmp_path, slots, message):
    from ansible_collections.orbite.qualification.plugins.module_utils._run.plan import case_launches

    _launch(tmp_path)
    with pytest.raises(RunPlanError, match=message):
        case_launches(str(tmp_path), slots, "sim-c", "/w/run-1", "/usr/bin/python3")


def test_case_launches_refuses_a_slot_whose_source_is_not_the_plans_for_the_requester_too(tmp_path):
    from ansible_collections.orbite.qualification.plugins.module_utils._run.plan import case_launches

    _launch(tmp_path)
    # sim-b is the plan's requester, but the schedule names sim-x as the source it would reach.
    with pytest.raises(RunPlanError, match=r"slots\[0\]\.source='sim-x': is not the plan's source of case cf "
                                           r"\(sim-a\); the case schedule and the run plan disagree"):
        case_launches(str(tmp_path), [{"id": "cf", "source": "sim-x"}], "sim-b", "/w/run-1", "/usr/bin/python3")
    launches = case_launches(str(tmp_path), [{"id": "cf", "source": "sim-a"}], "sim-b", "/w/run-1", "/usr/bin/python3")
    assert (launches["cf"]["role"], launches["cf"]["source_host"]) == ("requester", "sim-a")


def test_the_lookup_returns_one_mapping_and_names_the_code_of_a_bad_plan(tmp_path):
    from ansible.errors import AnsibleLookupError
    from ansible_collections.orbite.qualification.plugins.lookup.case_launches import LookupModule

    _launch(tmp_path)
    options = {"slots": [{"id": "cf", "source": "sim-a"}], "host": "sim-a", "node_run_dir": "/w/run-1",
               "python": "/usr/bin/python3"}
    (found,) = LookupModule().run([str(tmp_path)], variables={}, **options)
    assert list(found) == ["cf"] and found["cf"]["host"] == "sim-a"
    with pytest.raises(AnsibleLookupError, match=r"^run_plan\.invalid: case cf: launch\.roles\.requester\.host="):
        LookupModule().run([str(tmp_path)], variables={}, **dict(options, slots=[{"id": "cf", "source": "sim-b"}]))
    with pytest.raises(AnsibleLookupError, match=r"^run_plan\.invalid: node_run_dir=None: must be a non-empty"):
        LookupModule().run([str(tmp_path)], variables={}, **dict(options, node_run_dir=None))
    with pytest.raises(AnsibleLookupError, match=r"case_launches: hosts: is not an option"):
        LookupModule().run([str(tmp_path)], variables={}, hosts="sim-a", **options)

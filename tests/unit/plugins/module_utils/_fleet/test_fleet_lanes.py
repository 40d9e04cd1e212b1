"""Lanes inside a fleet's pairs (plugins/module_utils/_fleet/schedule.py): every pair scheduled by the single pair's
scheduler, each lane host named by its one grammar and listed once with its host's lane rails and address, every
wave's lane hosts each in one pair with its case per slot, no two cases of one slot of a wave on one machine's RNIC;
serial and 2-RNIC hosts give today's one case at a time; bad rails and a bad switch fail by name."""

import pytest

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError
from ansible_collections.orbite.qualification.plugins.module_utils._fleet import run as fleet_run
from ansible_collections.orbite.qualification.plugins.module_utils._fleet import schedule as fs
from ansible_collections.orbite.qualification.plugins.module_utils._fleet.plan import FleetPlanError, plan_fleet
from ansible_collections.orbite.qualification.plugins.module_utils._run import schedule as sc

HOSTS = ["a", "b", "c", "d"]


def rails(count):
    return [{"device": f"mlx5_{i}", "port": 1, "gid_index": 3} for i in range(count)]


def addresses(hosts=HOSTS):
    return {host: f"127.0.0.{11 + i}:7471" for i, host in enumerate(hosts)}


def cases_of(pair, count=3, reverse_last=False):
    out = []
    for i in range(count):
        source, requester = pair["source"], pair["requester"]
        if reverse_last and i == count - 1:
            source, requester = requester, source
        out.append({"id": f"c{i}", "profile": {"mode": "installed-host", "source": source, "requester": requester},
                    "workload": {"wrs_per_round": 64 * (i + 1), "total_rounds": 4, "generations": 1}})
    return out


def fleet(pairing="ring", pairs=None, count=3, reverse_last=False):
    plan = fleet_run.attach_runs(plan_fleet(HOSTS, pairing, pairs, fleet_id="f"), "/runs/f")
    runs = {pair["id"]: {"cases": cases_of(pair, count, reverse_last)} for pair in plan["pairs"]}
    return plan, runs


def lanes(rnics, mode="lanes", **kwargs):
    plan, runs = fleet(**kwargs)
    host_rails = {host: rails(rnics[host] if isinstance(rnics, dict) else rnics) for host in HOSTS}
    return plan, runs, host_rails, fs.fleet_lanes(plan["pairs"], plan["waves"], runs, host_rails, addresses(), mode)


def test_each_pair_is_scheduled_as_a_single_pair_with_its_case_hosts():
    plan, runs, host_rails, got = lanes(4, reverse_last=True)
    assert got["mode"] == "lanes"
    for pair in plan["pairs"]:
        hosts = [pair["source"], pair["requester"]]
        alone = sc.plan_schedule(runs[pair["id"]]["cases"], {h: host_rails[h] for h in hosts}, "lanes")
        alone["lane_hosts"] = sc.lane_hosts(alone, {h: addresses()[h] for h in hosts})
        assert got["pairs"][pair["id"]]["schedule"] == alone
        assert got["pairs"][pair["id"]]["case_hosts"] == {
            "c0": {"source": pair["source"], "requester": pair["requester"]},
            "c1": {"source": sc.lane_name(pair["source"], 1), "requester": sc.lane_name(pair["requester"], 1)},
            # The reversed case keeps its reversal on every pair.
            "c2": {"source": pair["requester"], "requester": pair["source"]}}


def test_lane_hosts_are_listed_once_with_their_hosts_lane_rails_and_address():
    _plan, _runs, _rails, got = lanes(4)  # a ring of 4: every host in two pairs, in two waves
    names = [lane["name"] for lane in got["lane_hosts"]]
    assert names == ["a", "a~lane1", "b", "b~lane1", "c", "c~lane1", "d", "d~lane1"]
    for lane in got["lane_hosts"]:
        assert lane["name"] == sc.lane_name(lane["host"], lane["lane"])
        assert [r["device"] for r in lane["rails"]] == [f"mlx5_{2 * lane['lane']}", f"mlx5_{2 * lane['lane'] + 1}"]
        assert lane["service_address"] == sc.lane_address(lane["host"], addresses()[lane["host"]], lane["lane"])


def test_every_wave_runs_each_case_once_and_no_two_cases_of_a_slot_share_an_rnic():
    plan, runs, _rails, got = lanes(4, pairing="all")
    assert len(got["waves"]) == len(plan["waves"])
    for wave, mine in zip(plan["waves"], got["waves"]):
        assert {entry["pair"] for entry in mine["hosts"].values()} == set(wave)
        assert mine["slots"] == max(len(got["pairs"][p]["schedule"]["slots"]) for p in wave)
        for slot in range(mine["slots"]):
            held, ran = [], {}
            for name, entry in mine["hosts"].items():
                case = entry["cases"][slot] if slot < len(entry["cases"]) else None
                if case is None:
                    continue
                assert name in (case["source"], case["requester"])
                ran.setdefault((entry["pair"], case["id"]), set()).add(name)
                lane = next(own for own in got["lane_hosts"] if own["name"] == name)
                held += [(lane["host"], rail["device"]) for rail in lane["rails"]]
            assert len(held) == len(set(held)), (wave, slot)  # one machine's RNIC: one case at a time
            assert all(len(hosts) == 2 for hosts in ran.values())  # both roles of each case, in one slot
        every = {(p, c["id"]) for p in wave for c in runs[p]["cases"]}
        assert {(e["pair"], c["id"]) for e in mine["hosts"].values() for c in e["cases"] if c} == every


@pytest.mark.parametrize("rnics, mode", [(2, "lanes"), (4, "serial"), (4, " Serial ")])
def test_serial_and_two_rnic_hosts_run_one_case_at_a_time_on_the_hosts_themselves(rnics, mode):
    plan, runs, _rails, got = lanes(rnics, mode)
    assert got["mode"] == ("lanes" if rnics == 2 else "serial")
    assert [lane["name"] for lane in got["lane_hosts"]] == HOSTS
    for pair in plan["pairs"]:
        schedule = got["pairs"][pair["id"]]["schedule"]
        assert [[(e["id"], e["lane"]) for e in slot] for slot in schedule["slots"]] == [
            [(c["id"], 0)] for c in runs[pair["id"]]["cases"]]
    for wave in got["waves"]:
        assert wave["slots"] == 3 and all(name in HOSTS for name in wave["hosts"])


def test_a_pair_offers_the_lanes_of_its_smaller_host():
    plan, _runs, _rails, got = lanes({"a": 4, "b": 2, "c": 4, "d": 4})
    widths = {p["id"]: len(got["pairs"][p["id"]]["schedule"]["lanes"]) for p in plan["pairs"]}
    by_hosts = {(p["source"], p["requester"]): widths[p["id"]] for p in plan["pairs"]}
    assert by_hosts == {("a", "b"): 1, ("b", "c"): 1, ("c", "d"): 2, ("d", "a"): 2}
    assert "b~lane1" not in [lane["name"] for lane in got["lane_hosts"]]


@pytest.mark.parametrize("host_rails, mode, message", [
    ({"c": rails(3)}, "lanes", "host c: orbite_rails="),
    ({}, "parallel", "orbite_case_schedule='parallel': must be one of lanes, serial"),
])
def test_bad_rails_or_switch_fail_by_name(host_rails, mode, message):
    plan, runs = fleet()
    given = dict({host: rails(4) for host in HOSTS}, **host_rails)
    with pytest.raises(OrbiteError) as error:
        fs.fleet_lanes(plan["pairs"], plan["waves"], runs, given, addresses(), mode)
    assert error.value.code == "schedule.invalid" and message in str(error.value)


def test_a_wave_whose_pairs_share_a_host_is_refused():
    plan, runs = fleet()
    # A planner bug would put a->b and b->c in one wave: lane host b in two pairs at once.
    with pytest.raises(FleetPlanError, match=r"lane host b in pairs p1 and p2"):
        fs.fleet_lanes(plan["pairs"], [["p1", "p2"]], runs, {h: rails(4) for h in HOSTS}, addresses(), "lanes")

"""The case schedule (plugins/module_utils/_run/schedule.py): lanes from a host's rails, cases to lanes and slots so
that no two cases of one slot share an RNIC, each lane keeping its mode's case order; serial (and 2-RNIC hosts) is
today's one case at a time; bad rails, a bad switch and a service address without room fail naming the host, the
field, the value and the rule."""

import pytest

from ansible_collections.orbite.qualification.plugins.module_utils._run import schedule as sc


def rails(count):
    return [{"device": f"mlx5_{i}", "port": 1, "gid_index": 3} for i in range(count)]


def case(case_id, mode="installed-rail-accounting", reverse=False, wrs=64, generations=1):
    hosts = ("b", "a") if reverse else ("a", "b")
    return {"id": case_id, "profile": {"mode": mode, "source": hosts[0], "requester": hosts[1]},
            "workload": {"wrs_per_round": wrs, "total_rounds": 4 * generations, "generations": generations}}


CASES = [case("ra-1"), case("ra-2"), case("ra-3"), case("rr-1", reverse=True),
         case("rs-1", "installed-restart", generations=2), case("rs-2", "installed-restart", generations=3)]


def ids(plan):
    return [[(e["id"], e["lane"]) for e in slot] for slot in plan["slots"]]


def test_two_rnic_hosts_give_todays_serial_order():
    plan = sc.plan_schedule(CASES, {"a": rails(2), "b": rails(2)}, "lanes")
    assert ids(plan) == [[(c["id"], 0)] for c in CASES]
    assert plan["critical_path"] == pytest.approx(plan["total"])


def test_serial_on_four_rnic_hosts_is_todays_order_on_lane_zero():
    plan = sc.plan_schedule(CASES, {"a": rails(4), "b": rails(4)}, "serial")
    assert ids(plan) == [[(c["id"], 0)] for c in CASES]
    assert [lane["lane"] for lane in plan["lanes"]] == [0]
    assert plan["lanes"][0]["hosts"]["a"]["locks"] == ["mlx5_0", "mlx5_1"]


def test_lanes_put_one_modes_cases_side_by_side_on_disjoint_rnics():
    plan = sc.plan_schedule(CASES, {"a": rails(4), "b": rails(4)}, "lanes")
    assert [[e["id"] for e in slot] for slot in plan["slots"]] == [["ra-1", "ra-2"], ["ra-3", "rr-1"], ["rs-1", "rs-2"]]
    for slot in plan["slots"]:
        for host in ("a", "b"):
            held = [d for e in slot for d in e["locks"][host]]
            assert len(held) == len(set(held)) == 2 * len(slot)
    assert plan["critical_path"] < plan["total"]


def test_each_lane_keeps_the_case_order():
    plan = sc.plan_schedule(CASES, {"a": rails(6), "b": rails(6)}, "lanes")
    order = [c["id"] for c in CASES]
    for lane in range(3):
        mine = [e["id"] for slot in plan["slots"] for e in slot if e["lane"] == lane]
        assert mine == sorted(mine, key=order.index)
    assert sorted(e["id"] for slot in plan["slots"] for e in slot) == sorted(order)


def test_a_slot_never_mixes_modes():
    plan = sc.plan_schedule([case("ra-1"), case("rs-1", "installed-restart")], {"a": rails(4), "b": rails(4)})
    assert [[e["id"] for e in slot] for slot in plan["slots"]] == [["ra-1"], ["rs-1"]]


def test_the_least_loaded_lane_takes_the_next_case():
    cases = [case("big", wrs=100000), case("s1"), case("s2"), case("s3")]
    plan = sc.plan_schedule(cases, {"a": rails(4), "b": rails(4)})
    assert ids(plan) == [[("big", 0), ("s1", 1)], [("s2", 1), ("s3", 0)]]


def test_lane_hosts_are_aliases_with_their_rails_address_and_cases():
    plan = sc.plan_schedule(CASES[:4], {"a": rails(4), "b": rails(4)})
    hosts = {h["name"]: h for h in sc.lane_hosts(plan, {"a": "127.0.0.11:7471", "b": "[::1]:7471"})}
    assert sorted(hosts) == ["a", "a~lane1", "b", "b~lane1"]
    assert hosts["a~lane1"]["service_address"] == "127.0.0.11:7472"
    assert hosts["b~lane1"]["service_address"] == "[::1]:7472"
    assert hosts["a"]["service_address"] == "127.0.0.11:7471"
    assert [r["device"] for r in hosts["b~lane1"]["rails"]] == ["mlx5_2", "mlx5_3"]
    assert hosts["a~lane1"]["cases"] == [{"id": "ra-2", "source": "a~lane1", "requester": "b~lane1"},
                                         {"id": "rr-1", "source": "b~lane1", "requester": "a~lane1"}]
    assert hosts["a"]["cases"][1] == {"id": "ra-3", "source": "a", "requester": "b"}


def test_unequal_hosts_offer_the_smaller_lane_count():
    plan = sc.plan_schedule(CASES[:2], {"a": rails(4), "b": rails(2)})
    assert ids(plan) == [[("ra-1", 0)], [("ra-2", 0)]]


def test_a_host_without_rails_is_one_lane():
    plan = sc.plan_schedule(CASES[:2], {"a": None, "b": rails(4)})
    assert ids(plan) == [[("ra-1", 0)], [("ra-2", 0)]]


@pytest.mark.parametrize("value, expected", [(None, "lanes"), ("", "lanes"), (" Serial ", "serial"),
                                             ("lanes", "lanes")])
def test_the_switch_takes_survey_text(value, expected):
    assert sc.schedule_mode(value) == expected


def test_a_bad_switch_is_refused_naming_it():
    with pytest.raises(sc.ScheduleError) as caught:
        sc.plan_schedule(CASES, {"a": rails(4), "b": rails(4)}, "parallel")
    assert caught.value.code == "schedule.invalid"
    assert str(caught.value).startswith("orbite_case_schedule='parallel': must be one of lanes, serial")


@pytest.mark.parametrize("bad, rule", [
    (rails(3), "3 rails; a case locks 2"),
    ([*rails(2), {"device": "mlx5_0", "port": 1, "gid_index": 3}, rails(4)[3]], "device mlx5_0 is listed twice"),
    ([], "must be a non-empty list"),
    ("mlx5_0,mlx5_1", "must be a non-empty list"),
    ([{"port": 1}, {"device": "mlx5_1"}], "every rail must name its device"),
])
def test_bad_rails_are_refused_naming_host_field_value_and_rule(bad, rule):
    with pytest.raises(sc.ScheduleError) as caught:
        sc.plan_schedule(CASES, {"a": rails(4), "b": bad})
    text = str(caught.value)
    assert caught.value.code == "schedule.invalid"
    assert text.startswith("host b: orbite_rails=") and rule in text


@pytest.mark.parametrize("address", ["127.0.0.11", "127.0.0.11:65535", "127.0.0.11:http", None])
def test_a_service_address_without_room_for_the_lane_port_is_refused(address):
    plan = sc.plan_schedule(CASES[:2], {"a": rails(4), "b": rails(4)})
    with pytest.raises(sc.ScheduleError) as caught:
        sc.lane_hosts(plan, {"a": address, "b": "127.0.0.12:7471"})
    assert str(caught.value).startswith("host a: orbite_service_address=")
    assert "port + lane" in str(caught.value)

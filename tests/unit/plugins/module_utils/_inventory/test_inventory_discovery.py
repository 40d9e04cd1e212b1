"""Auto-discovery expectations computed from an inventory: filters, RoCE v2 candidates, tiers, pins."""

import copy
import json
import os

import pytest
from helpers.paths import FIXTURES

from ansible_collections.orbite.qualification.plugins.module_utils._sim import fake_sysfs as fs
from ansible_collections.orbite.qualification.plugins.module_utils._inventory import sysfs as si
from ansible_collections.orbite.qualification.plugins.module_utils._inventory.discovery import (
    DiscoveryExpectError,
    expectations,
)

FIXTURES = str(FIXTURES / "inventory")


def _golden(name):
    with open(os.path.join(FIXTURES, f"{name}.json"), encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def sim():
    return _golden("sim_host")


@pytest.fixture(scope="module")
def odd():
    return _golden("odd_host")


def test_sim_host_expectations(sim):
    exp = expectations(sim, whitelist=["mlx5_0", "mlx5_1"], blacklist=["mlx5_0", "mlx5_1"])
    assert exp["candidates"] == ["mlx5_0", "mlx5_1"]
    assert exp["nic_ids"] == {"mlx5_0": 0, "mlx5_1": 1}
    assert exp["filter"]["applied"] == "whitelist" and exp["filter"]["blacklist_ignored"] is True
    for name, ipv4 in (("mlx5_0", "127.51.100.10"), ("mlx5_1", "127.51.100.11")):
        rnic = exp["rnics"][name]
        assert rnic["active_ethernet_ports"] == ["1"]
        assert [c["index"] for c in rnic["roce_v2_candidates"]] == [3, 1]  # IPv4-mapped first
        assert rnic["ipv4_roce_v2"] == 1
        assert rnic["preferred_gid"]["ipv4"] == ipv4 and rnic["preferred_gid"]["index"] == 3
    assert exp["memory_tiers"] == {"cpu:0": {"mlx5_0": 0, "mlx5_1": 2}, "cpu:1": {"mlx5_0": 2, "mlx5_1": 0}}
    assert exp["strict_gid_pin"] is None


def test_whitelist_wins_and_blacklist_is_ignored(sim):
    # Guards `if whitelist:` before the blacklist branch: an identical blacklist must not empty the list.
    exp = expectations(sim, whitelist=["mlx5_1"], blacklist=["mlx5_1"])
    assert exp["candidates"] == ["mlx5_1"] and exp["nic_ids"] == {"mlx5_1": 0}
    assert exp["filter"]["blacklist_ignored"] is True


def test_blacklist_applies_without_whitelist(sim):
    exp = expectations(sim, blacklist=["mlx5_0"])
    assert exp["candidates"] == ["mlx5_1"]
    assert exp["filter"] == {
        "applied": "blacklist",
        "whitelist": [],
        "blacklist": ["mlx5_0"],
        "blacklist_ignored": False,
        "whitelist_missing": [],
    }


def test_empty_whitelist_keeps_every_available_device(sim):
    assert expectations(sim, whitelist=[])["candidates"] == ["mlx5_0", "mlx5_1"]
    assert expectations(sim, whitelist="")["filter"]["applied"] == "none"


def test_survey_strings_are_split(sim):
    exp = expectations(sim, whitelist="mlx5_1, mlx5_9", strict_gid_index="3")
    assert exp["candidates"] == ["mlx5_1"] and exp["filter"]["whitelist_missing"] == ["mlx5_9"]
    assert exp["strict_gid_pin"]["index"] == 3


def test_strict_pin_255_is_unavailable(sim):
    pin = expectations(sim, strict_gid_index=255)["strict_gid_pin"]
    assert pin == {
        "index": 255,
        "per_rnic": {"mlx5_0": False, "mlx5_1": False},
        "available": False,
        "expected": "Unavailable",
    }


def test_strict_pin_on_a_used_index_is_available(sim):
    pin = expectations(sim, strict_gid_index=3)["strict_gid_pin"]
    assert pin["available"] is True and pin["expected"] == "ok"


def test_strict_pin_missing_on_one_rnic_is_unavailable(sim):
    inv = copy.deepcopy(sim)
    inv["devices"]["mlx5_1"]["ports"]["1"]["gids"] = inv["devices"]["mlx5_1"]["ports"]["1"]["gids"][:3]
    pin = expectations(inv, strict_gid_index=3)["strict_gid_pin"]
    assert pin["per_rnic"] == {"mlx5_0": True, "mlx5_1": False} and pin["expected"] == "Unavailable"


def test_odd_host_availability_and_tiers(odd):
    exp = expectations(odd)
    # mlx5_1's only port is DOWN: not available (the engine skips devices without an ACTIVE port).
    assert exp["unavailable"] == {"mlx5_1": "no ACTIVE port with a GID table"}
    assert exp["candidates"] == ["mlx5_0", "mlx5_2", "rxe0"]
    # The InfiniBand device is a candidate but has no active Ethernet port, hence no RoCE v2 GID.
    assert exp["rnics"]["mlx5_2"]["active_ethernet_ports"] == []
    assert exp["rnics"]["mlx5_2"]["preferred_gid"] is None
    # Sparse table: IPv4-mapped v2 at 5 first, then link-local v2 at 1, then global v2 at 9.
    assert [c["index"] for c in exp["rnics"]["mlx5_0"]["roce_v2_candidates"]] == [5, 1, 9]
    # Unknown NUMA (mlx5_0, rxe0): never tier 0.
    assert exp["memory_tiers"] == {
        "cpu:0": {"mlx5_0": 2, "mlx5_2": 0, "rxe0": 2},
        "cpu:1": {"mlx5_0": 2, "mlx5_2": 2, "rxe0": 2},
    }


def test_unknown_numa_is_never_tier_zero(sim):
    # Guards _tiers: a NIC whose NUMA node is unknown (None, from -1) gets tier 2 on every node.
    inv = copy.deepcopy(sim)
    inv["devices"]["mlx5_0"]["numa_node"] = None
    tiers = expectations(inv)["memory_tiers"]
    assert all(t["mlx5_0"] == 2 for t in tiers.values())


def test_inventory_read_live_gives_the_same_expectations(tmp_path, sim):
    root = str(tmp_path / "h")
    fs.write_host(root, fs.sim_host_spec(0, "sim-a"))
    assert expectations(si.read_inventory(root)) == expectations(sim)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"whitelist": [1]}, r"whitelist \[1\]: expected a list of device names"),
        ({"blacklist": {"a": 1}}, r"blacklist \{'a': 1\}: expected a list"),
        ({"strict_gid_index": "x"}, r"strict_gid_index 'x': expected an integer 0..65535"),
        ({"strict_gid_index": -1}, r"strict_gid_index -1: expected an integer"),
        ({"strict_gid_index": True}, r"strict_gid_index True: expected an integer"),
    ],
)
def test_bad_arguments_name_the_field(sim, kwargs, message):
    with pytest.raises(DiscoveryExpectError, match=message):
        expectations(sim, **kwargs)


def test_not_an_inventory(sim):
    with pytest.raises(DiscoveryExpectError, match=r"inventory\.schema None"):
        expectations({"devices": {}})

"""Inventory comparison: equal trees give nothing, every change is listed by path."""

import copy

import pytest

from ansible_collections.orbite.qualification.plugins.module_utils._sim import fake_sysfs as fs
from ansible_collections.orbite.qualification.plugins.module_utils._inventory import sysfs as si
from ansible_collections.orbite.qualification.plugins.module_utils._inventory.compare import (
    InventoryCompareError,
    diff_inventories,
)

PORT = "sys/class/infiniband/mlx5_0/ports/1"


def _spec():
    """The sim host with 16-slot GID tables: same entries, a tenth of the files to write."""
    spec = fs.sim_host_spec(0, "sim-a")
    for dev in spec["devices"]:
        dev["ports"][0]["gid_tbl_len"] = 16
    return spec


def _inventory(tmp_path, name, spec):
    root = str(tmp_path / name)
    fs.write_host(root, spec)
    return si.read_inventory(root)


@pytest.fixture
def before(tmp_path):
    return _inventory(tmp_path, "before", _spec())


def test_equal_trees_give_no_difference(tmp_path, before):
    assert diff_inventories(before, _inventory(tmp_path, "again", _spec())) == []


def test_changed_port_state(tmp_path, before):
    spec = _spec()
    spec["devices"][0]["ports"][0].update(state="DOWN", phys_state="Disabled")
    diff = diff_inventories(before, _inventory(tmp_path, "after", spec))
    assert diff == [
        {
            "path": "devices/mlx5_0/ports/1/phys_state/name",
            "change": "changed",
            "before": "LinkUp",
            "after": "Disabled",
        },
        {"path": "devices/mlx5_0/ports/1/phys_state/num", "change": "changed", "before": 5, "after": 3},
        {"path": "devices/mlx5_0/ports/1/state/name", "change": "changed", "before": "ACTIVE", "after": "DOWN"},
        {"path": "devices/mlx5_0/ports/1/state/num", "change": "changed", "before": 4, "after": 1},
    ]


def test_new_gid(tmp_path, before):
    spec = _spec()
    gids = spec["devices"][1]["ports"][0]["gids"]
    gids["4"], gids["5"] = fs.roce_gid_pair("2001:db8::7", "ens2f0")
    diff = diff_inventories(before, _inventory(tmp_path, "after", spec))
    assert [(d["path"], d["change"]) for d in diff] == [
        ("devices/mlx5_1/ports/1/gids[4]", "added"),
        ("devices/mlx5_1/ports/1/gids[5]", "added"),
        ("devices/mlx5_1/ports/1/gids_unused", "changed"),
    ]
    assert diff[1]["after"]["type"] == "RoCE v2" and diff[1]["before"] is None
    assert (diff[2]["before"], diff[2]["after"]) == (12, 10)


def test_removed_netdev(tmp_path, before):
    spec = _spec()
    spec["netdevs"] = [n for n in spec["netdevs"] if n["name"] != "ens2f0"]
    diff = diff_inventories(before, _inventory(tmp_path, "after", spec))
    assert [(d["path"], d["change"]) for d in diff] == [
        ("devices/mlx5_1/netdevs", "changed"),
        ("netdevs/ens2f0", "removed"),
    ]
    assert diff[0]["before"] == ["ens2f0"] and diff[0]["after"] == []
    assert diff[1]["before"]["mac"] == "0c:42:a1:00:01:10" and diff[1]["after"] is None


def test_changed_gid_field_and_new_error_are_addressed_by_key(tmp_path, before):
    spec = _spec()
    spec["raw"] = {f"{PORT}/gid_attrs/ndevs/2": "ens9", f"{PORT}/lid": "oops"}
    diff = diff_inventories(before, _inventory(tmp_path, "after", spec))
    assert [(d["path"], d["change"]) for d in diff] == [
        ("devices/mlx5_0/ports/1/gids[2]/ndev", "changed"),
        ("devices/mlx5_0/ports/1/lid", "changed"),
        ("errors[devices/mlx5_0/ports/1/lid]", "added"),
    ]


def test_ignore_patterns(tmp_path, before):
    spec = _spec()
    spec["boot_id"] = "11111111-2222-4333-8444-555555555555"
    after = _inventory(tmp_path, "after", spec)
    assert [d["path"] for d in diff_inventories(before, after)] == ["node/boot_id"]
    assert diff_inventories(before, after, ignore=["node/boot_*"]) == []


def test_type_change_is_a_difference(before):
    # Guards _diff's `type(a) is not type(b)`: True == 1 in Python, but not in an inventory.
    after = copy.deepcopy(before)
    after["devices"]["mlx5_0"]["virtual"] = 0
    assert [d["path"] for d in diff_inventories(before, after)] == ["devices/mlx5_0/virtual"]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda inv: inv.update(schema="other"), r"after.schema 'other': expected 'orbite.rdma-inventory'"),
        (lambda inv: inv.update(version=2), r"after.version 2: expected one of \[1\]"),
    ],
)
def test_wrong_schema_or_version_is_refused(before, mutate, message):
    after = copy.deepcopy(before)
    mutate(after)
    with pytest.raises(InventoryCompareError, match=message):
        diff_inventories(before, after)


def test_not_a_dict_and_bad_ignore(before):
    with pytest.raises(InventoryCompareError, match="before: expected an inventory dict, got list"):
        diff_inventories([], before)
    with pytest.raises(InventoryCompareError, match="ignore 'node/boot_id': expected a list"):
        diff_inventories(before, before, ignore="node/boot_id")

"""The simulated lab's 4-RNIC hosts (sim_lab_rnics: 4): two more RNICs on their own /24, the first two exactly a
2-RNIC host's; the count is recorded only where it is not the default, and a bad count is refused by name."""

import ipaddress

import pytest

from ansible_collections.orbite.qualification.plugins.module_utils._sim import fake_sysfs as fs
from ansible_collections.orbite.qualification.plugins.module_utils._sim import hosts as sh


def ipv4s(spec):
    out = []
    for device in spec["devices"]:
        gid = device["ports"][0]["gids"]["3"]["gid"]
        out.append(str(ipaddress.IPv6Address(gid).ipv4_mapped))
    return out


def test_the_default_host_is_unchanged_by_the_count():
    assert fs.sim_host_spec(1, "sim-b") == fs.sim_host_spec(1, "sim-b", 2)


def test_a_four_rnic_host_keeps_the_first_two_and_adds_two_on_their_own_net():
    two, four = fs.sim_host_spec(1, "sim-b"), fs.sim_host_spec(1, "sim-b", 4)
    assert four["devices"][:2] == two["devices"] and four["netdevs"][:2] == two["netdevs"]
    assert [d["name"] for d in four["devices"]] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert ipv4s(four) == ["127.51.100.12", "127.51.100.13", "127.51.101.12", "127.51.101.13"]
    # No two hosts of the lab share an address, whatever their counts.
    everyone = [a for index in range(4) for a in ipv4s(fs.sim_host_spec(index, f"h{index}", 4))]
    assert len(everyone) == len(set(everyone))


def test_a_four_rnic_root_has_four_devices_and_rails(tmp_path):
    fs.write_host(str(tmp_path), fs.sim_host_spec(0, "sim-a", 4))
    assert sorted(p.name for p in (tmp_path / "sys/class/infiniband").iterdir()) == [f"mlx5_{i}" for i in range(4)]
    assert [r["device"] for r in sh.rails_of(fs.sim_host_spec(0, "sim-a", 4))] == [f"mlx5_{i}" for i in range(4)]


@pytest.mark.parametrize("rnics", [3, 1, "four"])
def test_a_bad_count_is_refused(rnics):
    with pytest.raises(fs.FakeSysfsError, match=r"rnics"):
        fs.sim_host_spec(0, "sim-a", rnics)


@pytest.mark.parametrize("rnics", ["3", "6"])
def test_the_module_request_refuses_a_bad_count_by_name(rnics):
    with pytest.raises(sh.SimLabArgumentError) as caught:
        sh.build_request({"lab_dir": "/tmp/lab", "name": "sim-a", "index": 0, "rnics": rnics})
    assert caught.value.field == "rnics" and str(caught.value).startswith("rnics=")


def test_the_count_is_recorded_only_when_not_the_default(tmp_path):
    two = sh.build_request({"lab_dir": str(tmp_path), "name": "sim-a", "index": 0})
    four = sh.build_request({"lab_dir": str(tmp_path), "name": "sim-b", "index": 1, "rnics": "4"})
    _changed, info = sh.ensure_present(two)
    assert "rnics" not in sh.load_record(two) and len(info["rails"]) == 2
    _changed, info = sh.ensure_present(four)
    assert sh.load_record(four)["rnics"] == 4 and len(info["rails"]) == 4
    with pytest.raises(sh.SimLabStateError, match=r"exists as rnics=4, requested rnics=2"):
        sh.ensure_present(sh.build_request({"lab_dir": str(tmp_path), "name": "sim-b", "index": 1}))

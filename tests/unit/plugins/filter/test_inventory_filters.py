"""The inventory filters: errors surface as AnsibleFilterError; GID <-> IP conversions."""

import json
import os

import pytest
from helpers.paths import FIXTURES
from ansible.errors import AnsibleFilterError

from ansible_collections.orbite.qualification.plugins.filter import inventory as flt

FIXTURES = str(FIXTURES / "inventory")


@pytest.fixture(scope="module")
def sim():
    with open(os.path.join(FIXTURES, "sim_host.json"), encoding="utf-8") as handle:
        return json.load(handle)


def test_filters_are_registered():
    assert set(flt.FilterModule().filters()) == {"inventory_diff", "discovery_expectations", "gid_to_ip", "ip_to_gid"}


def test_inventory_diff_filter(sim):
    assert flt.inventory_diff(sim, sim) == []
    with pytest.raises(AnsibleFilterError, match=r"inventory_diff: after.schema 'x'"):
        flt.inventory_diff(sim, dict(sim, schema="x"))


def test_discovery_expectations_filter(sim):
    assert flt.discovery_expectations(sim, whitelist=["mlx5_0"])["candidates"] == ["mlx5_0"]
    with pytest.raises(AnsibleFilterError, match="discovery_expectations: strict_gid_index 'abc'"):
        flt.discovery_expectations(sim, strict_gid_index="abc")


@pytest.mark.parametrize(
    ("gid", "ip"),
    [
        ("0000:0000:0000:0000:0000:ffff:c633:640a", "198.51.100.10"),
        ("fe80:0000:0000:0000:0e42:a1ff:fe00:0010", "fe80::e42:a1ff:fe00:10"),
    ],
)
def test_gid_ip_round_trip(gid, ip):
    assert flt.gid_to_ip(gid) == ip
    assert flt.ip_to_gid(ip) == gid


def test_every_listed_gid_of_the_golden_round_trips(sim):
    for dev in sim["devices"].values():
        for port in dev["ports"].values():
            for entry in port["gids"]:
                ip = flt.gid_to_ip(entry["gid"])
                assert flt.ip_to_gid(ip) == entry["gid"]
                if entry["ipv4"]:
                    assert ip == entry["ipv4"]


@pytest.mark.parametrize("bad", ["fe80::1", "zzzz:0000:0000:0000:0000:0000:0000:0000", ""])
def test_gid_to_ip_rejects_non_gids(bad):
    with pytest.raises(AnsibleFilterError, match="is not a GID"):
        flt.gid_to_ip(bad)


def test_ip_to_gid_rejects_non_addresses():
    with pytest.raises(AnsibleFilterError, match=r"'300\.1\.1\.1' is not an IPv4 or IPv6 address"):
        flt.ip_to_gid("300.1.1.1")

"""fleet_pairs: the fleet_plan module's plan (pairs, waves, run directories) computed in-process, writing nothing;
bad pairing input fails naming the code and the field."""

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.orbite.qualification.plugins.filter.fleet import fleet_pairs, fleet_schedule


def test_the_plan_names_each_pairs_run_and_writes_nothing(tmp_path):
    fleet_dir = str(tmp_path / "fleet-1")
    plan = fleet_pairs(["sim-a", "sim-b", "sim-c", "sim-d"], "fleet-1", fleet_dir)
    assert [(p["source"], p["requester"]) for p in plan["pairs"]] == [
        ("sim-a", "sim-b"), ("sim-b", "sim-c"), ("sim-c", "sim-d"), ("sim-d", "sim-a")]
    assert plan["pairs"][0]["run_dir"] == f"{fleet_dir}/fleet-1-p1" and len(plan["waves"]) == 2
    assert plan["output_dir"] == fleet_dir and not (tmp_path / "fleet-1").exists()


def test_bad_pairing_input_names_the_code_and_the_field(tmp_path):
    with pytest.raises(AnsibleFilterError, match=r"^fleet\.plan: .*pairs\[0\]\.requester='sim-x'"):
        fleet_pairs(["sim-a", "sim-b"], "fleet-1", str(tmp_path), pairing="list", pairs=[["sim-a", "sim-x"]])


def test_fleet_schedule_names_the_code_the_host_and_the_field(tmp_path):
    plan = fleet_pairs(["sim-a", "sim-b"], "fleet-1", str(tmp_path), pairing="list", pairs=[["sim-a", "sim-b"]])
    cases = [{"id": "c", "profile": {"mode": "installed-host", "source": "sim-a", "requester": "sim-b"}}]
    rails = {"sim-a": [{"device": "mlx5_0"}], "sim-b": [{"device": "mlx5_0"}, {"device": "mlx5_1"}]}
    with pytest.raises(AnsibleFilterError, match=r"^schedule\.invalid: host sim-a: orbite_rails=.*must be even"):
        fleet_schedule({"p1": {"cases": cases}}, plan, rails, {"sim-a": "x:1", "sim-b": "y:1"})

# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The fleet's pairs and waves, planned on the controller in-process (docs/fleet.md)."""

from ansible_collections.orbite.qualification.plugins.plugin_utils._filter_errors import filter_errors


def fleet_pairs(hosts, fleet_id, fleet_dir, pairing="ring", pairs=None, fleet_hosts=None, slice_name=None):
    """The plan the fleet_plan module writes, without writing it: what playbooks/fleet.yml needs before the first
    pair's preflight (its run directory), so that the module is called once, after it, to write."""
    # Imported here, not with the file: Ansible imports every filter file of the collection to find any one
    # filter (in each task's worker), and the fleet's run module brings the verifier with it.
    from ansible_collections.orbite.qualification.plugins.module_utils._fleet import run as fleet_run  # noqa: PLC0415
    from ansible_collections.orbite.qualification.plugins.module_utils._fleet.plan import plan_fleet  # noqa: PLC0415

    with filter_errors():
        plan = fleet_run.attach_runs(plan_fleet(hosts, pairing, pairs, fleet_hosts, fleet_id=fleet_id), fleet_dir)
        out, doc = fleet_run.start(fleet_dir, plan, ["planned"], slice_name or None, check_mode=True)
    return {"output_dir": out, "pairs": doc["pairs"], "waves": doc["waves"], "slots": doc["slots"],
            "elsewhere": doc["elsewhere"], "max_degree": doc["max_degree"]}


def fleet_schedule(runs, plan, rails, addresses, mode="lanes"):
    """Each pair's case schedule on its lanes and every wave's lane hosts (docs/fleet.md "Lanes in a fleet"): the
    single pair's scheduler once per pair, planned in-process before the fleet plan is written."""
    from ansible_collections.orbite.qualification.plugins.module_utils._fleet import schedule  # noqa: PLC0415

    with filter_errors():
        return schedule.fleet_lanes(list(plan["pairs"]), list(plan["waves"]), dict(runs or {}), dict(rails),
                                    dict(addresses), mode)


class FilterModule:
    def filters(self):
        return {"fleet_pairs": fleet_pairs, "fleet_schedule": fleet_schedule}

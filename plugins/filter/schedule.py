# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The run's case schedule, planned on the controller by the preflight (docs/qualification.md "Concurrent cases")."""

from ansible.errors import AnsibleFilterError


def case_schedule(cases, rails, addresses, mode="lanes"):
    """cases + {host: orbite_rails} + {host: orbite_service_address} + the switch -> the schedule and lane hosts."""
    from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError  # noqa: PLC0415
    from ansible_collections.orbite.qualification.plugins.module_utils._run import schedule  # noqa: PLC0415

    try:
        plan = schedule.plan_schedule(list(cases), dict(rails), mode)
        plan["lane_hosts"] = schedule.lane_hosts(plan, dict(addresses))
    except OrbiteError as error:
        raise AnsibleFilterError(f"{error.code}: {error}") from None
    return plan


class FilterModule:
    def filters(self):
        return {"case_schedule": case_schedule}

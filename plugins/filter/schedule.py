# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The run's case schedule, planned on the controller by the preflight (docs/qualification.md "Concurrent cases")."""

from ansible_collections.orbite.qualification.plugins.plugin_utils._filter_errors import filter_errors


def case_schedule(cases, rails, addresses, mode="lanes"):
    """cases + {host: orbite_rails} + {host: orbite_service_address} + the switch -> the schedule and lane hosts."""
    from ansible_collections.orbite.qualification.plugins.module_utils._run import schedule  # noqa: PLC0415

    with filter_errors():
        plan = schedule.plan_schedule(list(cases), dict(rails), mode)
        plan["lane_hosts"] = schedule.lane_hosts(plan, dict(addresses))
    return plan


class FilterModule:
    def filters(self):
        return {"case_schedule": case_schedule}

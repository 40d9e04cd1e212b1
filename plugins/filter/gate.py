# Copyright: OrbiTE qualification contributors
# Apache License 2.0 (see galaxy.yml)
"""Small filters the gate playbooks need to plan cases."""


def case_entry(triple):
    """(profile, workload, variant) -> {"id", "profile", "workload"}.

    The id is the variant's ``id``, else ``<operation>-<polling|events>``.
    """
    profile, workload, variant = triple
    variant = variant or {}
    default_id = f"{profile['operation']}-{'events' if profile['rdma_events'] else 'polling'}"
    return {"id": str(variant.get("id") or default_id), "profile": profile, "workload": workload}


class FilterModule:
    def filters(self):
        return {"case_entry": case_entry}

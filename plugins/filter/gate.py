# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Small filters the gate playbooks need to plan cases."""


def case_entry(triple):
    """(profile, workload, variant) -> {"id", "profile", "workload"[, "defects"]}.

    The id is the variant's ``id``, else ``<operation>-<polling|events>``.
    """
    profile, workload, variant = triple
    variant = variant or {}
    default_id = f"{profile['operation']}-{'events' if profile['rdma_events'] else 'polling'}"
    entry = {"id": str(variant.get("id") or default_id), "profile": profile, "workload": workload}
    # The variant's own defect switches (red checks of one case; the preflight checks them by name).
    if variant.get("defects"):
        entry["defects"] = variant["defects"]
    return entry


def pinned_observer(item, manifest):
    """{key: tool, value: node path} + manifest -> {"path": node path, "sha256": the manifest's pin}."""
    entry = (manifest.get("observers") or {}).get(item["key"]) or {}
    return {"path": item["value"], "sha256": entry.get("sha256")}


class FilterModule:
    def filters(self):
        return {"case_entry": case_entry, "pinned_observer": pinned_observer}

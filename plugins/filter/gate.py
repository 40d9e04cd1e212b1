# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Small filters the gate playbooks need to plan cases."""

from ansible.errors import AnsibleFilterError


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
    # A diagnostic variant may leave observers out of the case's deploy and preload (a red check of the mode's
    # own observer: the verifier still expects what the profile model says, and fails the case by name).
    leave_out = variant.get("leave_out") or []
    if leave_out:
        tools = [o.get("tool") for o in workload.get("observers") or ()]
        if not isinstance(leave_out, list):
            raise AnsibleFilterError(f"case {entry['id']}: leave_out={leave_out!r}: must be a list of observer names")
        for index, tool in enumerate(leave_out):
            if tool not in tools:
                raise AnsibleFilterError(f"case {entry['id']}: leave_out[{index}]={tool!r}: is not an observer this "
                                         f"case preloads (its mode's: {', '.join(map(str, tools)) or 'none'})")
        kept = [o for o in workload["observers"] if o.get("tool") not in leave_out]
        entry["workload"] = dict(workload, observers=kept)
        entry["leave_out"] = list(leave_out)
    return entry


def pinned_observer(item, manifest):
    """{key: tool, value: node path} + manifest -> {"path": node path, "sha256": the manifest's pin}."""
    entry = (manifest.get("observers") or {}).get(item["key"]) or {}
    return {"path": item["value"], "sha256": entry.get("sha256")}


class FilterModule:
    def filters(self):
        return {"case_entry": case_entry, "pinned_observer": pinned_observer}

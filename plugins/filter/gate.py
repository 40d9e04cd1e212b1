# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Small filters the gate playbooks need to plan cases."""

import json

from ansible.errors import AnsibleFilterError
from ansible_collections.orbite.qualification.plugins.module_utils._run.relay import DEFECTS as RELAY_SWITCHES
from ansible_collections.orbite.qualification.plugins.module_utils._run.relay import MODE as RELAY_MODE
from ansible_collections.orbite.qualification.plugins.module_utils._run.plan import case_launch
from ansible_collections.orbite.qualification.plugins.module_utils._run.plan import peer_address as _peer_address
from ansible_collections.orbite.qualification.plugins.plugin_utils._filter_errors import filter_errors


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


def case_switch_problems(cases, table, runner_kind):
    """One message per broken rule of the cases' own defect switches (naming the case, the field, the value and
    the rule), checked against ``table`` ({mode: [switch, ...]}, the simulated runner's own ``--defect-table``)
    and the control relay's own switches (installed-interruption, whatever the runner); [] when every case's
    switches belong to its mode. The runner's per-case switches are the simulated runner's only."""
    runner_switches = table.get(RELAY_MODE) or []
    table = dict(table, **{RELAY_MODE: list(runner_switches) + [s for s in RELAY_SWITCHES if s not in runner_switches]})
    problems = []
    for case in cases:
        defects = case.get("defects")
        if defects is None:
            continue
        where = f"case {case.get('id')}"
        relay_only = isinstance(defects, list) and (case.get("profile") or {}).get("mode") == RELAY_MODE and all(
            name in RELAY_SWITCHES for name in defects)
        if runner_kind != "sim" and not relay_only:
            problems.append(f"{where}: defects={json.dumps(defects)}: a case's own defect switches are the "
                            f"simulated runner's; this run's runner is {runner_kind}")
            continue
        if not isinstance(defects, list):
            problems.append(f"{where}: defects={json.dumps(defects)}: must be a list of defect switch names")
            continue
        mode = (case.get("profile") or {}).get("mode")
        allowed = table.get(mode) or []
        for index, name in enumerate(defects):
            if name in allowed:
                continue
            owners = [owner for owner, switches in table.items() if name in switches]
            rule = f"is a switch of {', '.join(owners)}, not of {mode}" if owners else \
                "is not a defect switch of the simulated runner"
            problems.append(f"{where}: defects[{index}]={json.dumps(name)}: {rule} ({mode} takes "
                            f"{', '.join(allowed)})")
    return problems


def node_launch(case_plan, role, host, node_run_dir, python):
    """This node's launch from its case's case.json (plugins/module_utils/_run/plan.case_launch)."""
    with filter_errors():
        return case_launch(case_plan, role, host, node_run_dir, python)


def peer_address(started, registration_id, peer):
    """The requester's peer address from its source node's start results (module_utils/_run/plan.peer_address)."""
    with filter_errors():
        return _peer_address(started, registration_id, peer)


class FilterModule:
    def filters(self):
        return {"case_entry": case_entry, "pinned_observer": pinned_observer,
                "case_switch_problems": case_switch_problems, "node_launch": node_launch,
                "peer_address": peer_address}

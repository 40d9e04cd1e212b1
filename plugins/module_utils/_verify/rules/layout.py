# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Layout rules: the regions, guards and MRs of both peers, against the documented layout.

docs/runner-contract.md §2 and docs/receipts.md 1.6: one data MR per context over the arena of
parents x (guard + payload + guard) bytes, parent p's payload at p x (payload + 2 x guard) + guard,
4 KiB guards on each side (the profile model's GUARD_BYTES), and one 4 KiB ctrl MR. The ledger's
own `workload.guard_bytes`/`region_stride` are the runner's configuration: never the expectation.
"""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import (
    MAX_PROBLEMS_SHOWN,
    each_ledger,
)

CTRL_MR_BYTES = 4096  # docs/runner-contract.md §4 step 2


@rule("layout.regions", "layout",
      f"every parent's region at its documented offset with {model.GUARD_BYTES} B guards on each side, "
      f"in data MRs of the documented arena and {CTRL_MR_BYTES} B ctrl MRs (both peers)",
      witness=("profile",))
def check_regions(case):
    problems = []
    payload, parents, offsets = case.profile["payload"], case.profile["parents"], case.workload["region_offsets"]
    arena, guard = case.workload["backing_per_peer"], case.workload["guard_bytes"]
    sizes = {"data": arena, "ctrl": CTRL_MR_BYTES}
    for role, generation, ledger, path in each_ledger(case):
        label = f"{role} g{generation}"
        wrong_mrs = [(mr.get("mr"), mr["kind"], mr.get("length")) for context in ledger["contexts"]
                     for mr in context["mrs"] if mr.get("length") != sizes.get(mr["kind"])]
        if wrong_mrs:
            shown = wrong_mrs[:MAX_PROBLEMS_SHOWN]
            problems.append((f"{label}: MRs (name, kind, length) {shown}; the documented "
                             f"data arena is {arena} B ({parents} x ({guard} + {payload} + "
                             f"{guard})), ctrl {CTRL_MR_BYTES} B", f"{path}#contexts",
                             {"expected": {name: sizes.get(kind) for name, kind, _length in shown},
                              "observed": {name: length for name, _kind, length in shown}}))
        for index, rnd in enumerate(ledger["rounds"]):
            where = f"{path}#rounds[{index}].parents"
            misplaced = [(p["parent"], p.get("region_offset"), _documented(offsets, p["parent"]))
                         for p in rnd["parents"] if p.get("region_offset") != _documented(offsets, p["parent"])]
            guards = sorted({p["guard_check"].get("guard_bytes") for p in rnd["parents"]
                             if isinstance(p.get("guard_check"), dict)} - {guard}, key=str)
            if misplaced or guards:
                shown = misplaced[:MAX_PROBLEMS_SHOWN]
                problems.append((f"{label} round {rnd['round']}: regions (parent, offset, documented) "
                                 f"{shown}, guards of {guards} B checked instead of {guard} B", where,
                                 {"expected": {"offsets": {str(p): at for p, _got, at in shown}, "guard_bytes": guard},
                                  "observed": {"offsets": {str(p): got for p, got, _at in shown},
                                               "guard_bytes": guards or guard}}))
                break
    return problems


def _documented(offsets, parent):
    """The workload's offset of ``parent``'s payload; None for a parent the profile does not have."""
    return offsets[parent] if isinstance(parent, int) and 0 <= parent < len(offsets) else None

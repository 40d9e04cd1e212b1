# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Teardown rules: in a healthy mode each runner let go of everything it held, quiesced."""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import applies, rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import each_ledger

MRS_PER_CONTEXT = 2  # a data MR and a ctrl MR (docs/runner-contract.md §4 step 2)


@applies("healthy modes (no fault provoked)")
def healthy_mode(profile, _workload):
    return model.provoked_errors(profile) == ()


@rule("teardown.clean", "teardown",
      "each runner tore down drained and quiesced: the derived QPs, MRs and contexts released, 0 retained owners "
      "(nothing left in the verbs provider), no typed error (no Unquiesced)",
      witness=("profile",), applies=healthy_mode, after=("qps.bound", "qps.reuse", "mrs.persistent"))
def check_teardown(case):
    problems = []
    want = {
        "qps_destroyed": case.workload["qp_bound_per_peer_operation"],
        "mrs_deregistered": MRS_PER_CONTEXT * model.RAIL_COUNT,
        "contexts_closed": model.RAIL_COUNT,
        "retained_owners": 0,
        "drained": True,
        "debt_wrs": 0,
        "debt_bytes": 0,
        "debt_grants": 0,
    }
    for role, generation, ledger, path in each_ledger(case):
        teardown = ledger.get("teardown")
        if not isinstance(teardown, dict):
            problems.append((f"{role} g{generation}: no teardown recorded", f"{path}#teardown"))
            continue
        wrong = {k: teardown.get(k) for k, v in want.items() if teardown.get(k) != v}
        errors = [e.get("error") if isinstance(e, dict) else e for e in teardown.get("errors") or []]
        # What the verbs provider itself still holds, where the runner reports it (its own count).
        held = teardown.get("provider_held")
        if isinstance(held, dict) and any(held.values()):
            wrong["provider_held"] = held
        if wrong or errors:
            wanted = {k: want.get(k, "all 0") for k in wrong}
            problems.append((f"{role} g{generation}: teardown {wrong} (expected {wanted}), typed errors {errors}",
                             f"{path}#teardown", {"expected": {**wanted, "errors": []},
                                                  "observed": {**wrong, "errors": errors}}))
    return problems

# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Rendezvous rules: control only on the rendezvous, the payload moved by the verbs provider."""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import rounds


# Rendezvous carries small control messages only: this budget per round is far below one slice of
# any profile that could hide payload in it, and far above what the control protocol needs.
RENDEZVOUS_BASE_BUDGET = 64 * 1024
RENDEZVOUS_PER_PARENT_BUDGET = 2 * 1024
# The provider's own byte counter of each role, per operation (docs/receipts.md section 1.6).
PROVIDER_BYTES = {
    ("requester", "read"): "read_bytes_landed",
    ("source", "read"): "read_bytes_served",
    ("requester", "write"): "write_bytes_sent",
    ("source", "write"): "write_bytes_landed",
}


@rule("rendezvous.no_payload", "rendezvous",
      "rendezvous carried control only; the verbs provider moved the payload (by its own counters, where the plan "
      "loads the loopback provider)",
      witness=("profile", "provider"))
def check_rendezvous(case):
    problems = []
    budget = RENDEZVOUS_BASE_BUDGET + RENDEZVOUS_PER_PARENT_BUDGET * case.profile["parents"]
    expected = case.workload["bytes_per_round"]
    for role, generation, rnd, where in rounds(case):
        rendezvous = rnd["rendezvous"]["bytes_sent"] + rnd["rendezvous"]["bytes_received"]
        if rendezvous > budget:
            problems.append(
                (
                    f"{role} g{generation} round {rnd['round']}: {rendezvous} B on rendezvous, over the "
                    f"control budget of {budget} B: payload travelled on rendezvous",
                    f"{where}.rendezvous",
                )
            )
        if not case.provider_planned():
            continue  # a real lab: the payload's only witness here is the requester's (counters.*)
        counter = PROVIDER_BYTES[(role, case.profile["operation"])]
        moved = rnd["provider"][counter]
        if moved != expected:
            problems.append(
                (
                    f"{role} g{generation} round {rnd['round']}: the verbs provider's {counter} is {moved} B, "
                    f"expected {expected}",
                    f"{where}.provider",
                )
            )
    return problems

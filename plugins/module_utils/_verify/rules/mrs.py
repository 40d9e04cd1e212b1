# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""MR rules: the persistent memory registrations of both contexts of both peers."""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import each_ledger


@rule("mrs.persistent", "mrs",
      "persistent MRs on both contexts of both peers, even under a one-rail mask",
      witness=("profile",))
def check_persistent_mrs(case):
    problems = []
    for role, generation, ledger, path in each_ledger(case):
        contexts = {c["rail"]: c for c in ledger["contexts"]}
        for rail in range(model.RAIL_COUNT):
            mrs = contexts.get(rail, {}).get("mrs", [])
            persistent = [
                mr
                for mr in mrs
                if mr["kind"] == "data"
                and mr.get("registered_round") == 0
                and (mr["live"] or mr.get("deregistered_round") == "teardown")
            ]
            if not persistent:
                problems.append(
                    (
                        f"{role} g{generation}: context of rail {rail} holds no persistent data MR "
                        f"(both contexts must, whatever the mask)",
                        f"{path}#contexts",
                    )
                )
    return problems

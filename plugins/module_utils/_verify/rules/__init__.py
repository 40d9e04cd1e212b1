# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The verifier's rules, one module per group; importing this package registers every code.

A new rule goes into its group's module (or a new module imported below), beside its check:

    @rule("group.name", "group", "PASS when ...", witness=("journal",), needs=("ledgers", "journals"))
    def check_something(case):
        return [(message, evidence path), ...]   # empty: PASS

The import order below is the order the codes are reported in and documented (docs/verifier.md,
scripts/verifier_codes_table.py): the plan's codes, the receipts', then the rules by group, the
identity rules after them (they bind every receipt to the run, and give way to the journal's own checks), the
rails and the locks across the run's cases (masked by the journal's and the rails' checks), then the
fault modes' rules (restart: masked by identity.epochs where a reused epoch is the one broken fact). A rule
can be masked (``after``) only by rules registered before it.
"""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import REGISTRY
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import (  # noqa: F401 - registers
    plan,
    receipts,
    ledger,
    counters,
    qps,
    mrs,
    layout,
    progress,
    rendezvous,
    accounting,
    digests,
    journal,
    discovery,
    teardown,
    identity,
    rails,
    locks,
    restart,
    steps,
    interruption,
    lost_completion,
    cleanup,
    memory_cleanup,
    inflight_dma,
)

RULES = REGISTRY.rules()
RECEIPT_CODES = tuple(entry.code for entry in REGISTRY if entry.group == "receipts")

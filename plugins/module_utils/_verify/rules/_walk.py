# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Helpers the rule modules share: walking the ledgers and rounds of a case."""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._verify.case import ROLES

__all__ = ("MAX_PROBLEMS_SHOWN", "ROLES", "each_ledger", "enabled_rails", "rounds")

MAX_PROBLEMS_SHOWN = 5


def each_ledger(case, roles=ROLES):
    """(role, generation, ledger, path) of every ledger of the case."""
    for generation in case.generations():
        for role in roles:
            yield role, generation, case.ledger(role, generation), case.ledger_path(role, generation)


def rounds(case, roles=ROLES):
    """(role, generation, round, evidence path) of every round of every ledger."""
    for role, generation, ledger, path in each_ledger(case, roles):
        for index, rnd in enumerate(ledger["rounds"]):
            yield role, generation, rnd, f"{path}#rounds[{index}]"


def enabled_rails(case):
    return set(case.workload["rails"])

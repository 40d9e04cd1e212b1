# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Helpers the rule modules share: walking the ledgers and rounds of a case."""

from __future__ import annotations

import os
import re
from itertools import chain

from ansible_collections.orbite.qualification.plugins.module_utils._verify.case import ROLES

__all__ = ("MAX_PROBLEMS_SHOWN", "ROLES", "each_ledger", "enabled_rails", "ledger_wrs", "part", "rounds",
           "runner_starts", "wr_rows")

MAX_PROBLEMS_SHOWN = 5
_GENERATION_DIR = re.compile(r"g([1-9][0-9]{0,5})", re.ASCII)


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


def wr_rows(columns, indices, names=None):
    """The WRs at ``indices`` of a round's WR columns (docs/receipts.md 1.6) as objects (of the columns
    ``names``, default all): for messages about a few WRs; rules compare whole columns."""
    picked = [(name, columns[name]) for name in (names or columns)]
    return [{name: values[i] for name, values in picked} for i in indices]


def ledger_wrs(ledger, names):
    """{column: values over every round, in round order} of a ledger's WR columns ``names``."""
    return {name: list(chain.from_iterable(rnd["wrs"][name] for rnd in ledger["rounds"])) for name in names}


def part(record, key):
    """``record[key]`` when it is an object, else {} (a receipt part missing or of another type)."""
    value = record.get(key) if isinstance(record, dict) else None
    return value if isinstance(value, dict) else {}


def enabled_rails(case):
    return set(case.workload["rails"])


def _generation_of(start):
    """The generation a runner start was for: its --output directory ``.../<role>/g<N>``; None if none."""
    argv = start.get("argv")
    if not isinstance(argv, list) or "--output" not in argv:
        return None
    index = argv.index("--output") + 1
    if index >= len(argv) or not isinstance(argv[index], str):
        return None
    match = _GENERATION_DIR.fullmatch(os.path.basename(os.path.normpath(argv[index])))
    return int(match.group(1)) if match else None


def runner_starts(case, role):
    """{generation: [child_start events]} of the role's journal, read once per case."""
    key = ("runner_starts", role)
    if key not in case.memo:
        found = {}
        for event in case.journals[role].data["events"]:
            if event.get("ev") == "child_start":
                found.setdefault(_generation_of(event), []).append(event)
        case.memo[key] = found
    return case.memo[key]

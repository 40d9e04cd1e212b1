# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The receipts of one case, loaded from the run directory layout of docs/verifier.md, for the rules."""

from __future__ import annotations

from dataclasses import dataclass, field

from ansible_collections.orbite.qualification.plugins.module_utils._verify.reading import Budget
from ansible_collections.orbite.qualification.plugins.module_utils._verify.loader import (
    INVENTORY_SCHEMA,
    ObserverLog,
    load_journal,
    load_json,
    load_ledger,
    load_observer_log,
    observer_log_path,
)

ROLES = ("source", "requester")


@dataclass
class CaseReceipts:
    case_id: str
    case_dir: str
    profile: dict
    workload: dict
    ledgers: dict = field(default_factory=dict)  # (role, generation) -> Receipt
    observer_logs: dict = field(default_factory=dict)  # (role, generation, tool) -> ObserverLog
    journals: dict = field(default_factory=dict)  # role -> Receipt of {"header", "events"}
    inventories: dict = field(default_factory=dict)  # (role, generation, "before"|"after") -> Receipt
    relay: object = None  # installed-interruption: Receipt of the control relay's journal {"header", "events"}
    # Facts several rules derive from the same receipt (an observer log's replay), computed once.
    memo: dict = field(default_factory=dict)
    # The plan the identity rules hold the receipts against: run.json and case.json (verdict.py), and
    # the run directory no file outside of which is read.
    plan: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    root: str | None = None
    # Facts of the whole run several cases read (the other cases' lock holds: rules/locks.py), computed
    # once per run (verdict.verify_run shares one dict among its cases).
    run_memo: dict = field(default_factory=dict)

    def ledger(self, role, generation=1):
        return self.ledgers[(role, generation)].data

    def ledger_path(self, role, generation=1):
        return self.ledgers[(role, generation)].path

    def generations(self):
        return range(1, self.workload["generations"] + 1)

    def destination_role(self):
        return "requester" if self.profile["operation"] == "read" else "source"

    def data_role(self):
        return "source" if self.profile["operation"] == "read" else "requester"

    def problems(self):
        """Every receipt problem of the case, in a stable order."""
        found = [r.problem for r in self.ledgers.values() if r.problem]
        found += [log.problem for log in self.observer_logs.values() if log.problem]
        found += [r.problem for r in self.journals.values() if r.problem]
        found += [r.problem for r in self.inventories.values() if r.problem]
        if self.relay is not None and self.relay.problem:
            found.append(self.relay.problem)
        return found

    def usable(self):
        return {
            "ledgers": all(r.ok for r in self.ledgers.values()),
            "observers": all(log.ok for log in self.observer_logs.values()),
            "journals": all(r.ok for r in self.journals.values()),
            "inventories": all(r.ok for r in self.inventories.values()),
            "relay": self.relay is not None and self.relay.ok,
            "provider": self.provider_planned(),
        }

    def provider_planned(self):
        """The plan (never a ledger) loads the loopback verbs provider, whose own counters are then a
        witness; with the system libibverbs (`verbs_library` null, a real lab) there are none to read."""
        return bool((self.plan.get("artifacts") or {}).get("verbs_library"))


def case_receipts(case_dir, case_id, profile, workload, root=None):
    """Load every receipt the case's profile implies; ``root`` (the run directory) bounds every path."""
    # Imported here: the rules package imports this module (ROLES).
    from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import (  # noqa: PLC0415
        _lifecycle as lifecycle,
    )

    root = root if root is not None else case_dir
    budget = Budget()  # all the receipts of the case together (reading.py)
    case = CaseReceipts(case_id=case_id, case_dir=case_dir, profile=profile, workload=workload, root=root)
    for generation in range(1, workload["generations"] + 1):
        for role in ROLES:
            case.ledgers[(role, generation)] = load_ledger(f"{case_dir}/{role}/g{generation}/ledger.json", root,
                                                           budget)
        for observer in workload["observers"]:
            if lifecycle.process_generation(profile, observer["role"], generation) != generation:
                continue  # one log per process: the restart survivor's is in the directory it started with (g1)
            if not lifecycle.observer_loaded(observer, observer["role"], generation):
                continue  # scoped to another generation (installed-cleanup-failure: generation 1 only)
            key = (observer["role"], generation, observer["tool"])
            stem = f"{case_dir}/{observer['role']}/g{generation}/observer-{observer['tool']}"
            path, problem = observer_log_path(stem)
            case.observer_logs[key] = ObserverLog(path, problem=problem) if problem else load_observer_log(
                # A runner SIGKILLed at its restart point never closes its log (journal.children checks the kill).
                path, root, budget, killed=lifecycle.killed(profile, observer["role"], generation))
    if profile.get("mode") == "installed-interruption":
        # The control relay's journal (docs/interruption.md), fetched from the source node.
        case.relay = load_journal(f"{case_dir}/source/relay.jsonl", root, budget)
    for role in ROLES:
        case.journals[role] = load_journal(f"{case_dir}/{role}/journal.jsonl", root, budget)
        if profile.get("discovery") == "auto":
            for generation in range(1, workload["generations"] + 1):
                for when in ("before", "after"):
                    path = f"{case_dir}/{role}/g{generation}/inventory-{when}.json"
                    case.inventories[(role, generation, when)] = load_json(path, INVENTORY_SCHEMA, root, budget)
    return case

# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Supervisor journal rules (docs/supervisor.md): what each node's supervisor saw, against the ledgers."""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import ROLES


def _journal(case, role):
    return case.journals[role].data, case.journals[role].path


def _events(journal, name):
    return [e for e in journal["events"] if e.get("ev") == name]


@rule("journal.identity", "journal",
      "each supervisor rechecked its node inside the locks, where the runner ran",
      witness=("journal",), needs=("ledgers", "journals"))
def check_journal_identity(case):
    problems = []
    for role in ROLES:
        journal, path = _journal(case, role)
        checks = [e for e in _events(journal, "identity_check") if e.get("stage") == "inside_locks"]
        if not checks or not all(e.get("ok") is True for e in checks):
            problems.append((f"{role}: no passing identity recheck inside the locks", path))
            continue
        observed = checks[-1].get("observed") or {}
        for generation in case.generations():
            ledger = case.ledger(role, generation)
            seen = (ledger.get("hostname"), ledger.get("boot_id"))
            if seen != (observed.get("hostname"), observed.get("boot_id")):
                problems.append((f"{role} g{generation}: the runner ran on {seen}, the supervisor checked "
                                 f"{(observed.get('hostname'), observed.get('boot_id'))}", path))
    return problems


@rule("journal.distinct_nodes", "journal",
      "source and requester differ in hostname and boot ID",
      witness=("journal",), needs=("ledgers", "journals"))
def check_distinct_nodes(case):
    identities = {}
    for role in ROLES:
        journal = _journal(case, role)[0]
        checks = _events(journal, "identity_check")
        observed = (checks[-1].get("observed") or {}) if checks else {}
        identities[role] = (observed.get("hostname"), observed.get("boot_id"))
    source, requester = identities["source"], identities["requester"]
    same = [name for name, a, b in zip(("hostname", "boot ID"), source, requester) if a == b or a is None]
    if same:
        return [(f"source and requester share {' and '.join(same)} ({source} vs {requester}): the gate needs "
                 "two distinct nodes", case.journals["requester"].path)]
    return []


@rule("journal.locks", "journal",
      "every RNIC used was locked, and every lock released at the end",
      witness=("journal",), needs=("ledgers", "journals"))
def check_journal_locks(case):
    problems = []
    for role in ROLES:
        journal, path = _journal(case, role)
        rnics = {rail["device"] for rail in case.ledger(role, 1)["rails"]}
        acquired = {e.get("rnic") for e in _events(journal, "lock_acquire")}
        released = {e.get("rnic") for e in _events(journal, "lock_release") if e.get("ok") is True}
        closing = _events(journal, "journal_close")
        if not rnics <= acquired:
            problems.append((f"{role}: RNICs used without their lock: {sorted(rnics - acquired)}", path))
        if acquired - released:
            problems.append((f"{role}: locks never released: {sorted(acquired - released)}", path))
        if not closing or closing[-1].get("locks_released") is not True:
            problems.append((f"{role}: the journal does not close with the locks released", path))
    return problems


@rule("journal.children", "journal",
      "each runner was the supervisor's child, reaped with the ledger's exit status",
      witness=("journal",), needs=("ledgers", "journals"))
def check_journal_children(case):
    problems = []
    for role in ROLES:
        journal, path = _journal(case, role)
        starts = {e.get("pid"): e for e in _events(journal, "child_start")}
        exits = {e.get("pid"): e for e in _events(journal, "child_exit")}
        expected_pids = set()
        for generation in case.generations():
            ledger = case.ledger(role, generation)
            pid = ledger.get("pid")
            expected_pids.add(pid)
            if pid not in starts:
                problems.append((f"{role} g{generation}: runner pid {pid} was not a child of the supervisor", path))
            elif pid not in exits:
                problems.append((f"{role} g{generation}: runner pid {pid} was never reaped", path))
            elif (exits[pid].get("exit_code"), exits[pid].get("exit_signal")) != (ledger.get("exit_code"), None):
                problems.append((f"{role} g{generation}: the supervisor reaped pid {pid} with exit "
                                 f"{exits[pid].get('exit_code')!r} signal {exits[pid].get('exit_signal_name')!r}, "
                                 f"the ledger says exit {ledger.get('exit_code')!r}", path))
        stray = sorted(set(starts) - expected_pids, key=str)
        if stray:
            problems.append((f"{role}: children the case does not account for: pids {stray}", path))
        signals = _events(journal, "signal") + _events(journal, "lease_expired")
        if signals:
            problems.append((f"{role}: {len(signals)} signal/lease event(s) in a mode without faults", path))
    return problems


@rule("journal.env", "journal",
      "no RDMAV_ALLOW_DISASSOC_DESTROY; LD_PRELOAD only where the mode needs it",
      witness=("journal", "runner", "profile"), needs=("ledgers", "journals"))
def check_journal_env(case):
    problems = []
    for role in ROLES:
        journal, path = _journal(case, role)
        wants_preload = case.ledger(role, 1)["runner"].get("kind") == "native" and any(
            o["role"] == role for o in case.workload["observers"])
        for start in _events(journal, "child_start"):
            keys = start.get("env_keys") or []
            if "RDMAV_ALLOW_DISASSOC_DESTROY" in keys:
                problems.append((f"{role}: pid {start.get('pid')} ran with RDMAV_ALLOW_DISASSOC_DESTROY", path))
            if bool(start.get("ld_preload")) != wants_preload or ("LD_PRELOAD" in keys) != wants_preload:
                problems.append((f"{role}: pid {start.get('pid')} LD_PRELOAD {start.get('ld_preload')!r}, expected "
                                 f"{'the observer' if wants_preload else 'none'} for this mode and runner", path))
    return problems

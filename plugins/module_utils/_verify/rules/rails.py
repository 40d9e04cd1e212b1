# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Rail rules outside `discovery: auto`: the rails the engine used against the rails the gate pinned.

The gate pins each node's rails from its inventory (`orbite_rails`: device, port and GID index per rail)
into the runner's case file, which the supervisor pinned and journaled; it locks the same RNICs. The
engine's `rails` are held to that journaled case, and where the accounting observer runs, the device
of every payload WR it saw to the pinned device of the WR's rail: the engine's word is never the
expectation. (`discovery: auto` gets no pins: discovery.* compare its choice with the inventory.)
"""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import applies, rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import MAX_PROBLEMS_SHOWN
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules.discovery import locked_rnics
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules.identity import told_cases

_PINNED = ("device", "port", "gid_index")


@applies("outside `discovery: auto` (pinned rails)")
def pinned_rails(profile, _workload):
    return profile.get("discovery") != "auto"


def _triples(rails):
    """[(device, port, GID index)] of a list of rails, in rail order (None for a rail that is no object)."""
    return [tuple(rail.get(k) for k in _PINNED) if isinstance(rail, dict) else None for rail in rails]


def _pins(told):
    """The rails the runner was told (its case file's `rails`), or None when it names no list."""
    rails = told.get("rails")
    return _triples(rails) if isinstance(rails, list) else None


def _rails_of_qps(case, pid):
    """{QPN: rail} of every QP the requester process ``pid`` listed, over all its generations (a restart
    survivor's one observer log spans them)."""
    return {qp["qpn"]: qp["rail"] for generation in case.generations()
            for ledger in (case.ledger("requester", generation),) if ledger.get("pid") == pid for qp in ledger["qps"]}


def _observed_devices(case, generation, ledger, pins):
    """(rail, device) pairs the accounting observer saw that are not the rail's pinned device: each
    accepted payload WR's device, its rail the ledger's rail of its QP."""
    log = case.observer_logs.get(("requester", generation, "accounting"))
    if log is None or not log.ok:
        return None, []
    table = log.wrs()
    rail_of = _rails_of_qps(case, ledger.get("pid"))
    wrong = set()
    for qpn, device in set(zip(table["qpn"], table["dev"])):
        rail = rail_of.get(qpn)
        if rail is None:
            continue  # a WR of a QP no ledger lists: accounting.ledger_join's (restart.stale_no_effect's) finding
        pinned = pins[rail][0] if isinstance(rail, int) and 0 <= rail < len(pins) and pins[rail] else None
        if device != pinned:
            wrong.add((rail, device))
    return log.path, sorted(wrong, key=str)


@rule("rails.pinned", "rails",
      "outside `discovery: auto` each rail's device, port and GID index are the ones the gate pinned (the runner's "
      "case as its supervisor journaled it), on RNICs the supervisor locked; every payload WR the accounting "
      "observer saw went through its rail's pinned device",
      witness=("journal", "observer"), needs=("ledgers", "journals"), applies=pinned_rails,
      after=("accounting.native_bytes",))
def check_pinned_rails(case):
    problems = []
    for role, generation, told, journal_path in told_cases(case):
        ledger, path = case.ledger(role, generation), case.ledger_path(role, generation)
        pins = _pins(told)
        if pins is None:
            problems.append((f"{role} g{generation}: the case the runner was told pins no rails", journal_path))
            continue
        locks = locked_rnics(case, role)
        unlocked = [pin[0] for pin in pins if pin and pin[0] not in locks]
        used = _triples(ledger["rails"])
        if used != pins or unlocked:
            problems.append((f"{role} g{generation}: rails (device, port, GID index) {used}, the gate pinned {pins}"
                             + (f"; pinned RNICs {unlocked} not locked ({locks})" if unlocked else ""),
                             f"{path}#rails",
                             {"expected": {"rails": pins, "locked": [p[0] for p in pins if p]},
                              "observed": {"rails": used, "locked": list(locks)}}))
        if role == "requester":
            log_path, wrong = _observed_devices(case, generation, ledger, pins)
            if wrong:
                devices = [p[0] if p else None for p in pins]
                problems.append((f"requester g{generation}: the observer saw payload WRs of (rail, device) "
                                 f"{wrong[:MAX_PROBLEMS_SHOWN]}, off the rails' pinned devices {devices}", log_path,
                                 {"expected": {"devices by rail": devices},
                                  "observed": {"(rail, device) off its pin": wrong[:MAX_PROBLEMS_SHOWN]}}))
    return problems

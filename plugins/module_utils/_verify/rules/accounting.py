# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Accounting observer rules: the requester's observer log, replayed, against the ledger and the workload.

Every rule here reads one replay of the log (``_replay``): a single pass in log order, made once
per generation and kept in ``case.memo``, so a log of a million records is walked once, not seven times.
"""

from __future__ import annotations

from collections import defaultdict

from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import applies, rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import (
    MAX_PROBLEMS_SHOWN,
    enabled_rails,
)

_OBS = ("ledgers", "observers")


@applies("modes loading the accounting observer")
def has_accounting(_profile, workload):
    return any(o["tool"] == "accounting" for o in workload["observers"])


@applies("installed-rail-accounting")
def rail_accounting(profile, _workload):
    return profile["mode"] == "installed-rail-accounting"


def _accounting_logs(case):
    for generation in case.generations():
        key = ("requester", generation, "accounting")
        if key in case.observer_logs:
            yield generation, case.observer_logs[key], case.ledger("requester", generation)


def _ledger_wrs(ledger):
    return {(wr["qpn"], wr["wr_id"]): wr for rnd in ledger["rounds"] for wr in rnd["wrs"]}


def _device_rails(ledger):
    return {rail["device"]: rail["rail"] for rail in ledger["rails"]}


class Replay:
    """What one walk of the log in order shows: joins by (context, CQ, QPN, WR ID), WRs and distinct
    parents in flight per QP (the parent of a WR from the ledger), and the WRs against the ledger's.

    One loop with everything in locals: it runs once per record of logs a million records long.
    In-flight figures can only grow on a posted WR, so their maxima are taken there.
    """

    def __init__(self, log, ledger):
        listed = _ledger_wrs(ledger)
        accepted, joined, seen, devices = {}, set(), set(), set()
        orphans, duplicates, failed, unlisted, differing = [], [], [], [], []
        per_qp = {}  # qpn -> [{key: parent} in flight, {parent: its WRs in flight}, most WRs, most parents]
        joined_bytes = defaultdict(int)
        wrs = total = 0
        for event in log.events:
            kind = event["ev"]
            if kind == "wr":
                qpn, wr_id = event["qpn"], event["wr_id"]
                key = (event["ctx"], event["cq"], qpn, wr_id)
                if key in accepted:
                    duplicates.append(key)
                accepted[key] = event
                wrs += 1
                total += event["bytes"]
                devices.add(event["dev"])
                short = (qpn, wr_id)
                seen.add(short)
                wr = listed.get(short)
                if wr is None:
                    if len(unlisted) < MAX_PROBLEMS_SHOWN:
                        unlisted.append(short)
                elif (wr["bytes"] != event["bytes"] or wr["opcode"] != event["opcode"] or wr["context"] != key[0]
                      or wr["cq"] != key[1]) and len(differing) < MAX_PROBLEMS_SHOWN:
                    differing.append((short, wr, event))
                state = per_qp.get(qpn)
                if state is None:
                    state = per_qp[qpn] = [{}, {}, 0, 0]
                current, counts = state[0], state[1]
                if key in current:
                    _leave(counts, current[key])
                parent = current[key] = None if wr is None else wr["parent"]
                if parent is not None:
                    counts[parent] = counts.get(parent, 0) + 1
                state[2] = max(state[2], len(current))
                state[3] = max(state[3], len(counts))
            elif kind in ("cqe", "withheld"):
                qpn = event["qpn"]
                key = (event["ctx"], event["cq"], qpn, event["wr_id"])
                if kind == "cqe":
                    if key not in accepted:
                        orphans.append(key)
                    elif event["status"] != 0:
                        failed.append(key)
                    elif key in joined:
                        duplicates.append(key)
                    else:
                        joined.add(key)
                        posted = accepted[key]
                        joined_bytes[posted["dev"]] += posted["bytes"]
                state = per_qp.get(qpn)
                if state is not None and key in state[0]:
                    _leave(state[1], state[0].pop(key))
        self.accepted, self.joined, self.devices = accepted, joined, devices
        self.orphans, self.duplicates, self.failed = orphans, duplicates, failed
        self.unlisted, self.differing, self.missing = unlisted, differing, sorted(set(listed) - seen)
        self.wrs, self.bytes = wrs, total
        self.max_wrs = {qpn: state[2] for qpn, state in per_qp.items()}
        self.max_parents = {qpn: state[3] for qpn, state in per_qp.items()}
        self.joined_bytes = joined_bytes  # device -> bytes of the WRs joined to a successful completion


def _leave(counts, parent):
    if parent is not None:
        counts[parent] -= 1
        if not counts[parent]:
            del counts[parent]


def _replays(case):
    """(generation, log, ledger, Replay) of every accounting log; each replay made once per case."""
    for generation, log, ledger in _accounting_logs(case):
        memo = ("accounting.replay", generation)
        if memo not in case.memo:
            case.memo[memo] = Replay(log, ledger)
        yield generation, log, ledger, case.memo[memo]


@rule("accounting.join", "accounting",
      "every accepted payload WR joins exactly one successful completion by (context, CQ, QPN, WR ID)",
      witness=("observer",), needs=_OBS, applies=has_accounting)
def check_observer_join(case):
    problems = []
    for generation, log, _ledger, replay in _replays(case):
        accepted, joined = replay.accepted, replay.joined
        unjoined = [k for k in accepted if k not in joined]
        if unjoined or replay.orphans or replay.duplicates or replay.failed:
            problems.append(
                (
                    f"g{generation}: {len(unjoined)} accepted payload WR(s) without exactly one successful "
                    f"completion (first {unjoined[:2]}), {len(replay.orphans)} completion(s) of unknown WRs, "
                    f"{len(replay.duplicates)} duplicate(s), {len(replay.failed)} error completion(s)",
                    log.path,
                )
            )
        summary = log.summary
        if (summary["accepted_wrs"], summary["joined"], summary["unjoined"]) != (
            len(accepted),
            len(joined),
            len(accepted) - len(joined),
        ):
            problems.append(
                (
                    f"g{generation}: the log's summary says accepted/joined/unjoined "
                    f"{summary['accepted_wrs']}/{summary['joined']}/{summary['unjoined']}, its lines give "
                    f"{len(accepted)}/{len(joined)}/{len(accepted) - len(joined)}",
                    log.path,
                )
            )
    return problems


@rule("accounting.ledger_join", "accounting",
      "the observer's WRs and the ledger's WRs are the same set",
      witness=("observer",), needs=_OBS, applies=has_accounting)
def check_observer_ledger_join(case):
    problems = []
    for generation, log, _ledger, replay in _replays(case):
        for qpn, wr_id in replay.unlisted:
            problems.append((f"g{generation}: observer WR qpn {qpn} wr_id {wr_id} is not in the ledger", log.path))
        for key, wr, event in replay.differing:
            problems.append(
                (
                    f"g{generation}: WR {key} differs between ledger and observer (bytes/opcode/ctx/cq "
                    f"{wr['bytes']}/{wr['opcode']}/{wr['context']}/{wr['cq']} vs {event['bytes']}/"
                    f"{event['opcode']}/{event['ctx']}/{event['cq']})",
                    log.path,
                )
            )
        if replay.missing:
            problems.append(
                (
                    f"g{generation}: {len(replay.missing)} ledger WR(s) the observer never saw accepted "
                    f"(first {replay.missing[:2]})",
                    log.path,
                )
            )
        if len(problems) >= MAX_PROBLEMS_SHOWN:
            break
    return problems[:MAX_PROBLEMS_SHOWN]


@rule("accounting.native_bytes", "accounting",
      "observed native bytes per rail equal the public counters",
      witness=("observer",), needs=_OBS, applies=has_accounting, after=("accounting.join", "counters.native_public"))
def check_observer_native_bytes(case):
    problems = []
    for generation, log, ledger, replay in _replays(case):
        rails = _device_rails(ledger)
        native = defaultdict(int)
        for device, value in replay.joined_bytes.items():
            native[rails.get(device, device)] += value
        public = defaultdict(int)
        for rnd in ledger["rounds"]:
            for rail, value in rnd["counters"]["public"]["per_rail"].items():
                public[int(rail)] += value
        if dict(native) != {k: v for k, v in public.items() if v}:
            problems.append(
                (
                    f"g{generation}: observer's completed bytes per rail {dict(native)} != the engine's "
                    f"public counters {dict(public)}",
                    log.path,
                )
            )
    return problems


@rule("accounting.exact_counts", "accounting",
      "exactly the derived payload WRs and bytes a round, as observed",
      witness=("observer", "profile"), needs=_OBS, applies=has_accounting,
      after=("counters.slicing", "accounting.ledger_join"))
def check_observer_exact_counts(case):
    problems = []
    rounds = case.workload["rounds_per_generation"]
    want_wrs, want_bytes = case.workload["wrs_per_round"] * rounds, case.workload["bytes_per_round"] * rounds
    for generation, log, _ledger, replay in _replays(case):
        if (replay.wrs, replay.bytes) != (want_wrs, want_bytes):
            problems.append(
                (
                    f"g{generation}: observer accepted {replay.wrs} payload WRs / {replay.bytes} B over {rounds} "
                    f"rounds, expected {want_wrs} / {want_bytes} "
                    f"({case.workload['wrs_per_round']} WRs, {case.workload['bytes_per_round']} B a round)",
                    log.path,
                )
            )
    return problems


@rule("accounting.both_rails", "accounting",
      "accepted payload on every enabled rail, as observed",
      witness=("observer", "profile"), needs=_OBS, applies=has_accounting, after=("counters.rails",))
def check_observer_rails(case):
    problems = []
    for generation, log, ledger, replay in _replays(case):
        rails = _device_rails(ledger)
        carried = {rails.get(device) for device in replay.devices}
        idle = sorted(r for r in enabled_rails(case) if r not in carried)
        if idle:
            problems.append((f"g{generation}: enabled rail(s) {idle} carried no accepted payload WR", log.path))
    return problems


@rule("accounting.sq_depth", "accounting",
      "at most eight payload WRs in flight per QP, as observed",
      witness=("observer", "profile"), needs=_OBS, applies=has_accounting, after=("accounting.join", "qps.sq_depth"))
def check_observer_sq_depth(case):
    problems = []
    depth = case.workload["send_queue_depth"]
    for generation, log, _ledger, replay in _replays(case):
        over = {qpn: n for qpn, n in replay.max_wrs.items() if n > depth}
        if over:
            problems.append((f"g{generation}: payload WRs in flight per QP over {depth}: {over}", log.path))
    return problems


@rule("accounting.outstanding", "accounting",
      "at least two parents outstanding at once on each rail's QP",
      witness=("observer", "profile"), needs=_OBS, applies=rail_accounting, after=("accounting.join", "counters.rails"))
def check_observer_outstanding(case):
    problems = []
    least = case.workload.get("min_outstanding_parents_per_rail_qp", 0)
    for generation, log, ledger, replay in _replays(case):
        rail_of_qp = {qp["qpn"]: qp["rail"] for qp in ledger["qps"]}
        for rail in sorted(enabled_rails(case)):
            qps = [q for q, r in rail_of_qp.items() if r == rail]
            best = max((replay.max_parents.get(q, 0) for q in qps), default=0)
            if best < least:
                problems.append(
                    (
                        f"g{generation} rail {rail}: at most {best} parent(s) outstanding at once on its "
                        f"shared QP, expected at least {least}",
                        log.path,
                    )
                )
    return problems

# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""installed-cleanup-failure rules (seed 000, "Native cleanup failure"; docs/cleanup_failure.md).

The mode runs the restart roles (rules/restart.py holds the kill, the survivor, the replacement and the
stale epochs) with the requester as fault role over two generations. After generation 1's three rounds
the requester submits one more round of one parent and one slice; the real ``uverbs_fault`` observer
(preloaded into that process only) withholds its successful completion and then fails the real
``ibv_destroy_qp`` with EIO through its seccomp filter on the context's uverbs descriptor. The batch must
fail Unquiesced and not locally drained; free stays busy, CPU writes stay excluded, the SQ, byte and batch
charges stay held; a repeated close neither retries the destroy nor claims a drain; after the caller drops
its handles a weak owner and a real QP query still show the allocation and the QP.

Witnesses: the observer's own log (what it withheld and which destroys it saw and failed), the profile
model (one parent, one slice, its bytes), the survivor's ledger (the grant it issued and kept), and the
requester's ledger, whose word is one witness among these.
"""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._verify.loader import WITHHELD
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import applies, rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import _lifecycle as lifecycle
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import part as _part
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._lifecycle import (
    fault_round,
    restart_section,
)

EIO = 5
TOOL = "uverbs_fault"
FAULT_GENERATION = 1
# QP states in which a queried QP still exists (a destroyed one cannot be queried at all).
LIVE_QP_STATES = ("RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR")


@applies("installed-cleanup-failure")
def cleanup_mode(profile, _workload):
    return profile.get("mode") == lifecycle.CLEANUP_MODE


def _record(case):
    """(the requester's restart.cleanup record or None, its evidence path)."""
    path = case.ledger_path("requester", FAULT_GENERATION)
    return restart_section(case.ledger("requester", FAULT_GENERATION), "cleanup"), f"{path}#restart.cleanup"


def _log(case):
    return case.observer_logs.get(("requester", FAULT_GENERATION, TOOL))


def _destroys(log):
    """The observer's destroy events in log order."""
    return [event for _pos, event in sorted(log.texts.items()) if event.get("ev") == "destroy"]


def _expected_charges(case):
    """The quarantined batch's charges from the profile model: its WRs (one per slice), bytes and the batch."""
    workload = case.workload
    return {"sq_slots": workload["wrs_per_round"], "bytes": workload["bytes_per_round"], "batches": 1}


@rule("cleanup.fault", "cleanup",
      "the real uverbs_fault observer withheld exactly the cleanup round's completion and failed that round's QP "
      "destroy with EIO (its first destroy, injected), which is the failure the requester recorded",
      witness=("observer", "runner"), needs=("ledgers", "observers"), applies=cleanup_mode)
def check_fault(case):
    record, where = _record(case)
    log = _log(case)
    if log is None or not log.ok:
        return [("requester g1: no usable uverbs_fault observer log (the profile model loads it there)",
                 log.path if log is not None else case.ledger_path("requester", FAULT_GENERATION))]
    refused = [event.get("reason") for _pos, event in sorted(log.texts.items()) if event.get("ev") == "not_armed"]
    if refused:
        return [(f"requester g1: the uverbs_fault observer refused to arm ({refused[0]}): no fault was injected",
                 log.path)]
    problems = []
    withheld = list(zip(log.column(WITHHELD, "qpn"), log.column(WITHHELD, "wr_id")))
    destroys = _destroys(log)
    if record is None:
        return [("requester g1: no cleanup round recorded (restart.cleanup)", where)]
    batch = _part(record, "batch")
    wanted = [(record.get("qpn"), batch.get("wr_id"))]
    if withheld != wanted:
        problems.append((f"requester g1: the observer withheld {withheld} (qpn, wr_id), the cleanup round's WR is "
                         f"{wanted}", log.path))
    first = destroys[0] if destroys else None
    if first is None or (first.get("kind"), first.get("errno"), first.get("injected"), first.get("retry")) != (
            "qp", EIO, True, False):
        problems.append((f"requester g1: the observer's first destroy is {first}, expected a qp destroy failed with "
                         f"EIO ({EIO}), injected, not a retry: the fault never reached the uverbs descriptor",
                         log.path))
    close = _part(record, "close")
    destroy = _part(close, "destroy")
    if (destroy.get("call"), destroy.get("errno")) != ("ibv_destroy_qp", "EIO"):
        problems.append((f"requester g1: the close recorded destroy {close.get('destroy')}, the observer failed "
                         "ibv_destroy_qp with EIO", f"{where}.close"))
    return problems


@rule("cleanup.unquiesced", "cleanup",
      "the cleanup round's wait timed out and its close failed Unquiesced, not locally drained, with the batch "
      "Failed and its QP still live",
      witness=("runner", "profile"), needs=("ledgers",), applies=cleanup_mode, after=("cleanup.fault",))
def check_unquiesced(case):
    record, where = _record(case)
    if record is None:
        return [("requester g1: no cleanup round recorded (restart.cleanup)", where)]
    problems = []
    wait = _part(record, "wait")
    close = _part(record, "close")
    batch = _part(record, "batch")
    if wait.get("result") != "Timeout" or wait.get("completions"):
        problems.append((f"requester g1: the wait ended {wait.get('result')!r} with completions "
                         f"{wait.get('completions')}; the withheld completion must never arrive", f"{where}.wait"))
    if (close.get("result"), close.get("locally_drained")) != ("Unquiesced", False) or batch.get("state") != "Failed":
        problems.append((f"requester g1: close {close.get('result')!r} locally_drained "
                         f"{close.get('locally_drained')!r}, batch {batch.get('state')!r} (expected Unquiesced, false, "
                         "Failed)", f"{where}.close"))
    round_no = fault_round(case)
    errors = [e for e in case.ledger("requester", FAULT_GENERATION)["errors"] if isinstance(e, dict)
              and (e.get("error"), e.get("operation"), e.get("round")) == ("Unquiesced", "close", round_no)]
    if not errors or any(e.get("locally_drained") is not False for e in errors):
        problems.append((f"requester g1: typed errors Unquiesced in close of round {round_no}: {errors} (expected at "
                         "least one, none locally drained)", case.ledger_path("requester", FAULT_GENERATION)))
    return problems


@rule("cleanup.repeated_close", "cleanup",
      "a repeated close of the quarantined batch reports Unquiesced again, claims no drain and never retries the "
      "destroy (the observer saw no second destroy of the QP)",
      witness=("observer", "runner"), needs=("ledgers", "observers"), applies=cleanup_mode, after=("cleanup.fault",))
def check_repeated_close(case):
    record, where = _record(case)
    if record is None:
        return [("requester g1: no cleanup round recorded (restart.cleanup)", where)]
    problems = []
    again = _part(record, "repeated_close")
    if (again.get("result"), again.get("locally_drained"), again.get("destroy_called")) != ("Unquiesced", False,
                                                                                            False):
        problems.append((f"requester g1: the repeated close gave {again.get('result')!r}, locally_drained "
                         f"{again.get('locally_drained')!r}, destroy called {again.get('destroy_called')!r} (expected "
                         "Unquiesced, false, false)", f"{where}.repeated_close"))
    log = _log(case)
    if log is not None and log.ok:
        destroys = _destroys(log)
        qp = [e for e in destroys if e.get("kind") == "qp"]
        if len(qp) > 1 or any(e.get("retry") for e in destroys):
            problems.append((f"requester g1: the observer saw {len(qp)} qp destroy(s), retries "
                             f"{[e for e in destroys if e.get('retry')]}: a failed destroy was tried again", log.path))
    return problems


@rule("cleanup.free_busy", "cleanup",
      "free() of the quarantined batch returns BatchBusy",
      witness=("runner",), needs=("ledgers",), applies=cleanup_mode, after=("cleanup.unquiesced",))
def check_free_busy(case):
    record, where = _record(case)
    if record is None:
        return [("requester g1: no cleanup round recorded (restart.cleanup)", where)]
    if record.get("free") != "BatchBusy":
        return [(f"requester g1: free() of the unquiesced batch returned {record.get('free')!r}, expected BatchBusy",
                 f"{where}.free")]
    return []


@rule("cleanup.cpu_excluded", "cleanup",
      "a CPU write into the quarantined batch's allocation is refused (Unquiesced, nothing written)",
      witness=("runner",), needs=("ledgers",), applies=cleanup_mode, after=("cleanup.unquiesced",))
def check_cpu_excluded(case):
    record, where = _record(case)
    if record is None:
        return [("requester g1: no cleanup round recorded (restart.cleanup)", where)]
    write = _part(record, "cpu_write")
    if (write.get("result"), write.get("bytes_written")) != ("Unquiesced", 0):
        return [(f"requester g1: a CPU write into the quarantined allocation gave {write}, expected Unquiesced with "
                 "0 bytes written", f"{where}.cpu_write")]
    return []


@rule("cleanup.retained", "cleanup",
      "after the caller drops its handles the quarantine keeps the allocation (a weak owner is still alive) and the "
      "QP (a real query answers for its QPN, and the verbs provider still holds every QP the profile model "
      "creates, before and after: none was destroyed)",
      witness=("runner", "profile"), needs=("ledgers",), applies=cleanup_mode, after=("cleanup.fault",))
def check_retained(case):
    record, where = _record(case)
    if record is None:
        return [("requester g1: no cleanup round recorded (restart.cleanup)", where)]
    retained = _part(record, "retained")
    query = _part(retained, "qp_query")
    held = _part(retained, "provider_held")
    before = _part(record, "before")
    held_before = _part(before, "provider_held")
    problems = []
    if retained.get("weak_owner_alive") is not True:
        problems.append(("requester g1: the weak owner of the quarantined allocation died once the caller dropped "
                         "its handle: the backing was released", f"{where}.retained"))
    if query.get("qpn") != record.get("qpn") or query.get("state") not in LIVE_QP_STATES:
        problems.append((f"requester g1: the real query of QP {record.get('qpn')} gave {retained.get('qp_query')}: "
                         "the quarantined QP is gone", f"{where}.retained"))
    # The expectation is the profile model's (rails x lanes QPs, made in the healthy rounds and never destroyed),
    # not the record's own "before".
    bound = case.workload["qp_bound_per_peer_operation"]
    if (held.get("qp"), held_before.get("qp")) != (bound, bound):
        problems.append((f"requester g1: the verbs provider holds {held.get('qp')!r} QP(s) after the handles were "
                         f"dropped, {held_before.get('qp')!r} before the cleanup round; the profile model creates "
                         f"{bound}", f"{where}.retained"))
    return problems


@rule("cleanup.charges", "cleanup",
      "the quarantined batch's SQ, byte and batch charges stay held, before and after the caller drops its handles, "
      "as the profile model counts them and as many bytes as the WR the observer saw posted",
      witness=("profile", "observer", "runner"), needs=("ledgers", "observers"), applies=cleanup_mode,
      after=("cleanup.fault", "cleanup.retained"))
def check_charges(case):
    record, where = _record(case)
    if record is None:
        return [("requester g1: no cleanup round recorded (restart.cleanup)", where)]
    want = _expected_charges(case)
    problems = []
    retained = _part(record, "retained")
    for label, found in (("after the failure", record.get("charges")), ("after the handles were dropped",
                                                                        retained.get("charges"))):
        charges = found if isinstance(found, dict) else {}
        wrong = {k: charges.get(k) for k, v in want.items() if charges.get(k) != v}
        if wrong:
            problems.append((f"requester g1: charges {label} {wrong}, expected {want}", where))
    log = _log(case)
    if log is not None and log.ok:
        wrs = log.wrs()
        batch = _part(record, "batch")
        seen = [b for q, w, b in zip(wrs["qpn"], wrs["wr_id"], wrs["bytes"])
                if (q, w) == (record.get("qpn"), batch.get("wr_id"))]
        if seen != [want["bytes"]]:
            problems.append((f"requester g1: the observer saw the cleanup round's WR posted with bytes {seen}, the "
                             f"byte charge must be {want['bytes']}", log.path))
    return problems


@rule("cleanup.grant_unresolved", "cleanup",
      "the surviving source kept the cleanup round's grant unresolved until the requester died (pending at its "
      "restart point) and released it after",
      witness=("peer", "profile"), needs=("ledgers",), applies=cleanup_mode)
def check_grant_unresolved(case):
    parents = case.profile["parents"]
    path = case.ledger_path("source", FAULT_GENERATION)
    held = restart_section(case.ledger("source", FAULT_GENERATION), "cleanup")
    problems = []
    if held is None or (held.get("round"), held.get("grants_pending")) != (fault_round(case), parents):
        problems.append((f"source g1: the cleanup round's grant at the restart point is {held} (expected round "
                         f"{fault_round(case)} with {parents} pending)", f"{path}#restart.cleanup"))
    following = FAULT_GENERATION + 1
    recovery = restart_section(case.ledger("source", following), "recovery")
    if recovery is None or recovery.get("grants_released") != parents:
        problems.append((f"source g{following}: recovery {recovery}, expected the {parents} unresolved grant(s) "
                         "released once the requester died", f"{case.ledger_path('source', following)}#restart"))
    return problems

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

The cq, channel and pd kinds (seed 000, "CQ, completion-channel and PD dependency failures") fail by themselves:
the fixture's dependent object (a RESET QP on the CQ, an extra CQ on the channel, a type-2 MW on the PD) makes
the destroy return EBUSY once; the observer injects nothing and logs the destroy verb's result. cq and channel
reuse the withheld completion (the batch rules above apply); pd is idle. ``cleanup.owners`` holds the
provider's counts of live objects per kind against the profile model's table of what stays retained.

Witnesses: the observer's own log (what it withheld and which destroys it saw and failed), the profile
model (one parent, one slice, its bytes), the survivor's ledger (the grant it issued and kept), and the
requester's ledger, whose word is one witness among these.
"""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify.loader import WITHHELD
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import applies, rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules import _lifecycle as lifecycle
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import part as _part
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._lifecycle import (
    fault_round,
    restart_section,
)

EIO = 5
EBUSY = 16
MRS_PER_CONTEXT = 2  # a data MR and a ctrl MR per context (docs/runner-contract.md section 4)
TOOL = "uverbs_fault"
FAULT_GENERATION = 1
# QP states in which a queried QP still exists (a destroyed one cannot be queried at all).
LIVE_QP_STATES = ("RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR")


@applies("installed-cleanup-failure")
def cleanup_mode(profile, _workload):
    return profile.get("mode") == lifecycle.CLEANUP_MODE


def _kind(profile):
    return profile.get("cleanup_kind", "qp")


@applies("installed-cleanup-failure, cleanup_kind qp")
def qp_kind(profile, _workload):
    return cleanup_mode(profile, _workload) and _kind(profile) == "qp"


@applies("installed-cleanup-failure, cleanup_kind qp, cq or channel")
def withheld_kind(profile, _workload):
    return cleanup_mode(profile, _workload) and _kind(profile) in model.CLEANUP_WITHHELD_KINDS


@applies("installed-cleanup-failure, cleanup_kind qp or cq")
def charged_kind(profile, _workload):
    return cleanup_mode(profile, _workload) and _kind(profile) in ("qp", "cq")


@applies("installed-cleanup-failure, cleanup_kind cq, channel or pd")
def dependency_kind(profile, _workload):
    return cleanup_mode(profile, _workload) and _kind(profile) in model.CLEANUP_OWNERS


@applies("installed-cleanup-failure, cleanup_kind channel")
def channel_kind(profile, _workload):
    return cleanup_mode(profile, _workload) and _kind(profile) == "channel"


def _record(case):
    """(the requester's restart.cleanup record or None, its evidence path)."""
    path = case.ledger_path("requester", FAULT_GENERATION)
    return restart_section(case.ledger("requester", FAULT_GENERATION), "cleanup"), f"{path}#restart.cleanup"


def _log(case):
    return case.observer_logs.get(("requester", FAULT_GENERATION, TOOL))


def _destroys(log):
    """The observer's destroy events in log order."""
    return log.text_events("destroy")


def _expected_charges(case):
    """The quarantined batch's charges from the profile model: its WRs (one per slice), bytes and the batch."""
    workload = case.workload
    return {"sq_slots": workload["wrs_per_round"], "bytes": workload["bytes_per_round"], "batches": 1}


@rule("cleanup.fault", "cleanup",
      "the real uverbs_fault observer withheld exactly the cleanup round's completion and failed that round's QP "
      "destroy with EIO (its first destroy, injected), which is the failure the requester recorded",
      witness=("observer", "runner"), needs=("ledgers", "observers"), applies=qp_kind)
def check_fault(case):
    record, where = _record(case)
    log = _log(case)
    if log is None or not log.ok:
        return [("requester g1: no usable uverbs_fault observer log (the profile model loads it there)",
                 log.path if log is not None else case.ledger_path("requester", FAULT_GENERATION))]
    refused = [event.get("reason") for event in log.text_events("not_armed")]
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


# The verbs call that destroys each dependency kind's owner (the seed's names).
DESTROY_CALLS = {"cq": "ibv_destroy_cq", "channel": "ibv_destroy_comp_channel", "pd": "ibv_dealloc_pd"}


def _usable_log(case):
    """(the g1 requester's uverbs_fault log, None) or (None, [problem]) when it is missing or did not arm."""
    log = _log(case)
    if log is None or not log.ok:
        return None, [("requester g1: no usable uverbs_fault observer log (the profile model loads it there)",
                       log.path if log is not None else case.ledger_path("requester", FAULT_GENERATION))]
    refused = [event.get("reason") for event in log.text_events("not_armed")]
    if refused:
        return None, [(f"requester g1: the uverbs_fault observer refused to arm ({refused[0]}): nothing was observed",
                       log.path)]
    return log, []


@rule("cleanup.dependency", "cleanup",
      "cq, channel, pd: the fault rail's CQ, completion channel or PD destroy failed once with EBUSY by itself (the "
      "uverbs_fault observer injected nothing and logged the destroy verb's EBUSY; for cq and pd after the uverbs "
      "command went through the descriptor), the failure the requester recorded; the observer withheld exactly the "
      "cleanup round's completion (cq, channel) or none (pd: idle)",
      witness=("observer", "runner"), needs=("ledgers", "observers"), applies=dependency_kind)
def check_dependency(case):
    record, where = _record(case)
    log, problems = _usable_log(case)
    if log is None:
        return problems
    if record is None:
        return [("requester g1: no cleanup step recorded (restart.cleanup)", where)]
    kind = _kind(case.profile)
    target = model.CLEANUP_OWNERS[kind]["destroy"]
    destroys = _destroys(log)
    mine = [e for e in destroys if e.get("kind") == target]
    first = mine[0] if mine else None
    got = None if first is None else (first.get("errno"), first.get("injected"), first.get("retry"),
                                      first.get("dependency"))
    if got != (EBUSY, False, False, True):
        problems.append((f"requester g1: the observer's first {target} destroy is {first}, expected EBUSY ({EBUSY}) "
                         "from the dependent object, not injected, not a retry", log.path))
    elif target != "channel" and first.get("command") is not True:
        problems.append((f"requester g1: the {target} destroy's uverbs command never reached the observed "
                         "descriptor", log.path))
    injected = [e for e in destroys if e.get("injected")]
    if injected:
        problems.append((f"requester g1: the observer injected {injected}: a dependency failure is never injected",
                         log.path))
    withheld = list(zip(log.column(WITHHELD, "qpn"), log.column(WITHHELD, "wr_id")))
    wanted = [(record.get("qpn"), _part(record, "batch").get("wr_id"))] if kind in model.CLEANUP_WITHHELD_KINDS \
        else []
    if withheld != wanted:
        problems.append((f"requester g1: the observer withheld {withheld} (qpn, wr_id), expected {wanted}", log.path))
    destroy = _part(_part(record, "close"), "destroy")
    if (destroy.get("call"), destroy.get("errno")) != (DESTROY_CALLS[kind], "EBUSY"):
        problems.append((f"requester g1: the close recorded destroy {destroy or None}, the observer saw "
                         f"{DESTROY_CALLS[kind]} fail with EBUSY", f"{where}.close"))
    return problems


@rule("cleanup.unquiesced", "cleanup",
      "the cleanup round's wait timed out and its close failed Unquiesced, not locally drained, with the batch "
      "Failed (the runner's word; that the QP stays live is cleanup.retained's real query, qp kind)",
      witness=("runner", "profile"), needs=("ledgers",), applies=withheld_kind,
      after=("cleanup.fault", "cleanup.dependency"))
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


@rule("cleanup.events", "cleanup",
      "channel: the cleanup round's wait progressed through the rail's completion channel (the CQ armed, the "
      "channel waited on, every event acknowledged), as the profile's event progress asks; the arms and polls are "
      "the runner's own count (no observer or provider figure counts them)",
      witness=("runner", "profile"), needs=("ledgers",), applies=channel_kind, after=("cleanup.dependency",))
def check_events(case):
    record, where = _record(case)
    if record is None:
        return [("requester g1: no cleanup round recorded (restart.cleanup)", where)]
    progress = _part(_part(record, "wait"), "progress")
    arms, polls = progress.get("cq_arms"), progress.get("poll_calls")
    if case.profile.get("rdma_events") is not True or not isinstance(arms, int) or isinstance(arms, bool) \
            or arms < 1 or not isinstance(polls, int) or polls < 1:
        return [(f"requester g1: the cleanup round's wait progress {progress or None} with rdma_events "
                 f"{case.profile.get('rdma_events')!r}: a channel failure needs the CQ armed and the channel waited "
                 "on", f"{where}.wait")]
    return []


@rule("cleanup.repeated_close", "cleanup",
      "a repeated close of the quarantined batch reports Unquiesced again, claims no drain and never retries the "
      "destroy (the observer saw no second destroy of the QP)",
      witness=("observer", "runner"), needs=("ledgers", "observers"), applies=cleanup_mode,
      after=("cleanup.fault", "cleanup.dependency"))
def check_repeated_close(case):
    record, where = _record(case)
    if record is None:
        return [("requester g1: no cleanup round recorded (restart.cleanup)", where)]
    problems = []
    again = _part(record, "repeated_close")
    kind = _kind(case.profile)
    drained = kind not in model.CLEANUP_WITHHELD_KINDS  # pd: idle, nothing was ever in flight
    if (again.get("result"), again.get("locally_drained"), again.get("destroy_called")) != ("Unquiesced", drained,
                                                                                            False):
        problems.append((f"requester g1: the repeated close gave {again.get('result')!r}, locally_drained "
                         f"{again.get('locally_drained')!r}, destroy called {again.get('destroy_called')!r} (expected "
                         f"Unquiesced, {str(drained).lower()}, false)", f"{where}.repeated_close"))
    log = _log(case)
    if log is not None and log.ok:
        destroys = _destroys(log)
        qp = [e for e in destroys if e.get("kind") == "qp"]
        target = model.CLEANUP_OWNERS[kind]["destroy"] if kind in model.CLEANUP_OWNERS else "qp"
        if len(qp) > 1 or len([e for e in destroys if e.get("kind") == target]) > 1 \
                or any(e.get("retry") for e in destroys):
            problems.append((f"requester g1: the observer saw {len(qp)} qp destroy(s), retries "
                             f"{[e for e in destroys if e.get('retry')]}: a failed destroy was tried again", log.path))
    return problems


@rule("cleanup.free_busy", "cleanup",
      "free() of the quarantined batch returns BatchBusy",
      witness=("runner",), needs=("ledgers",), applies=withheld_kind, after=("cleanup.unquiesced",))
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
      witness=("runner",), needs=("ledgers",), applies=withheld_kind, after=("cleanup.unquiesced",))
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
      witness=("runner", "profile"), needs=("ledgers",), applies=qp_kind, after=("cleanup.fault",))
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


@rule("cleanup.device_open", "cleanup",
      "cq, channel, pd: the device of the retained owner stays open until the process dies (no premature close): "
      "the observer logged no context close in the faulted requester and the provider still holds every context",
      witness=("observer", "provider", "runner"), needs=("ledgers", "observers"), applies=dependency_kind,
      after=("cleanup.dependency",))
def check_device_open(case):
    record, where = _record(case)
    if record is None:
        return [("requester g1: no cleanup step recorded (restart.cleanup)", where)]
    problems = []
    log = _log(case)
    if log is not None and log.ok:
        closes = log.text_events("context_close")
        if closes:
            problems.append((f"requester g1: the observer saw the device closed {closes} while its "
                             f"{model.CLEANUP_OWNERS[_kind(case.profile)]['destroy']} was retained", log.path))
    retained = _part(record, "retained")
    held = _part(retained, "provider_held")
    if held.get("ctx") != model.RAIL_COUNT or retained.get("device_open") is not True:
        problems.append((f"requester g1: after the handles were dropped the provider holds {held.get('ctx')!r} "
                         f"context(s) (the profile model opens {model.RAIL_COUNT}), device open "
                         f"{retained.get('device_open')!r}", f"{where}.retained"))
    return problems


def _expected_held(case, kind, after):
    """The provider's live objects per kind in the faulted requester, from the profile model: every context's PD,
    CQ, channel (events) and two MRs, the rails x lanes QPs, the fixture's dependent object; ``after`` the handles
    were dropped, less what the seed's table releases on the fault rail (its lanes' QPs, its CQ, channel, MRs)."""
    profile = case.profile
    events = profile.get("rdma_events") is True
    held = {"ctx": model.RAIL_COUNT, "pd": model.RAIL_COUNT, "cq": model.RAIL_COUNT,
            "channel": model.RAIL_COUNT if events else 0, "mr": MRS_PER_CONTEXT * model.RAIL_COUNT, "mw": 0,
            "qp": case.workload["qp_bound_per_peer_operation"]}
    spec = model.CLEANUP_OWNERS[kind]
    held[spec["blocker"]] += 1
    if after:
        per_rail = {"qp": case.workload["qps_per_context_operation"], "cq": 1, "channel": 1 if events else 0,
                    "mr": MRS_PER_CONTEXT}
        for owner in spec["released"]:
            if owner in per_rail:
                held[owner] -= per_rail[owner]
    return held


@rule("cleanup.owners", "cleanup",
      "cq, channel, pd: after the fixture drops its handles the owners the seed's table retains are still held and "
      "the others released: the verbs provider's live objects per kind, before and after, are the profile model's "
      "(with the dependent object), the weak owner of the batch's allocation is alive exactly when the table "
      "retains it, and an idle PD leaves no grant pending at the survivor",
      witness=("profile", "provider", "runner", "peer"), needs=("ledgers",), applies=dependency_kind,
      after=("cleanup.dependency", "cleanup.device_open"))
def check_owners(case):
    record, where = _record(case)
    if record is None:
        return [("requester g1: no cleanup step recorded (restart.cleanup)", where)]
    kind = _kind(case.profile)
    spec = model.CLEANUP_OWNERS[kind]
    problems = []
    for label, found, after in (("before the failure", _part(_part(record, "before"), "provider_held"), False),
                                ("after the handles were dropped", _part(_part(record, "retained"), "provider_held"),
                                 True)):
        want = _expected_held(case, kind, after)
        wrong = {k: found.get(k) for k, v in want.items() if found.get(k) != v}
        if wrong:
            problems.append((f"requester g1: the verbs provider holds {wrong} {label}, the profile model's table "
                             f"gives { {k: want[k] for k in wrong} } (retained {list(spec['retained'])}, released "
                             f"{list(spec['released'])})", f"{where}.retained"))
    alive = _part(record, "retained").get("weak_owner_alive")
    if alive is not ("allocation" in spec["retained"]):
        state = "retained" if "allocation" in spec["retained"] else "released"
        problems.append((f"requester g1: the weak owner of the batch's allocation is alive {alive!r}; the table has "
                         f"it {state}", f"{where}.retained"))
    if "grant" in spec["released"]:
        path = case.ledger_path("source", FAULT_GENERATION)
        held = restart_section(case.ledger("source", FAULT_GENERATION), "cleanup")
        if held is None or held.get("grants_pending") != 0:
            problems.append((f"source g1: at the restart point {held}: an idle {kind} failure leaves no grant pending",
                             f"{path}#restart.cleanup"))
    return problems


@rule("cleanup.charges", "cleanup",
      "the quarantined batch's SQ, byte and batch charges stay held, before and after the caller drops its handles, "
      "as the profile model counts them and as many bytes as the WR the observer saw posted",
      witness=("profile", "observer", "runner"), needs=("ledgers", "observers"), applies=charged_kind,
      after=("cleanup.fault", "cleanup.retained", "cleanup.owners"))
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
      "restart point: the profile's parents, the grants the requester recorded for its quarantined batch) and "
      "released it after",
      witness=("peer", "profile"), needs=("ledgers",), applies=withheld_kind)
def check_grant_unresolved(case):
    parents = case.profile["parents"]
    path = case.ledger_path("source", FAULT_GENERATION)
    held = restart_section(case.ledger("source", FAULT_GENERATION), "cleanup")
    problems = []
    if held is None or (held.get("round"), held.get("grants_pending")) != (fault_round(case), parents):
        problems.append((f"source g1: the cleanup round's grant at the restart point is {held} (expected round "
                         f"{fault_round(case)} with {parents} pending)", f"{path}#restart.cleanup"))
    record, where = _record(case)
    granted = _part(record, "batch").get("grants")
    if held is not None and (not isinstance(granted, list) or len(granted) != held.get("grants_pending")):
        problems.append((f"requester g1: the quarantined batch holds grants {granted!r}, the source has "
                         f"{held.get('grants_pending')!r} pending at its restart point", f"{where}.batch"))
    following = FAULT_GENERATION + 1
    recovery = restart_section(case.ledger("source", following), "recovery")
    if recovery is None or recovery.get("grants_released") != parents:
        problems.append((f"source g{following}: recovery {recovery}, expected the {parents} unresolved grant(s) "
                         "released once the requester died", f"{case.ledger_path('source', following)}#restart"))
    return problems

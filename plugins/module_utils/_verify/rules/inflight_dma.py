# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""installed-inflight-dma rules (seed 000, "In-flight DMA interruption"; docs/inflight_dma.md).

One parent, one lane, one WR per round. After the three healthy rounds (the healthy-path rules hold them) the
requester submits one more: the inflight_fault observer preloaded into it lets that WR's copy start, waits until
the verbs provider has moved the profile's stall bytes, and moves the QP to ERR with the real ibv_modify_qp (no
port or device change). The provider delivers the WR's error completion; the batch fails with zero reported
bytes (WRITE effect Unknown, READ None) after a proven local drain; the QP is destroyed successfully before the
native drain; the destination then holds the copied prefix and the untouched poison sentinel and nothing else
changed. Both engines run three more rounds on a fresh QP (``inflight.survival``).

Witnesses: the observer log (the WR it interrupted, by CQ, QPN and WR ID, the error completion it saw delivered,
the destroy and its result, the local destination's hash at the error completion for READ), the profile model
(the fault's position, the stall point, the payload), the verbs provider's own byte counters, the peer's ledger,
and the verifier's own recomputation of the destination from docs/content.md. The runner's word on its fault
round is one witness, never the expectation.
"""

from __future__ import annotations

import hashlib

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify import content
from ansible_collections.orbite.qualification.plugins.module_utils._verify.loader import CQE, WR, pointer_text
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import applies, rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import (
    MAX_PROBLEMS_SHOWN,
    part,
)

MODE = "installed-inflight-dma"
TOOL = "inflight_fault"
# enum ibv_wc_status (rdma-core <infiniband/verbs.h>), the names the ledgers use.
WC_STATUS = ("SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR", "WR_FLUSH_ERR",
             "MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR", "REM_ACCESS_ERR", "REM_OP_ERR",
             "RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR", "REM_ABORT_ERR",
             "INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR", "RESP_TIMEOUT_ERR", "GENERAL_ERR")
QPS_RTS, QPS_ERR = 3, 6  # enum ibv_qp_state
PORT_ACTIVE = 4  # enum ibv_port_state
_OBS = ("ledgers", "observers")


@applies("installed-inflight-dma")
def inflight_mode(profile, _workload):
    return profile.get("mode") == MODE


def _section(case, role):
    """(the role's ledger ``inflight`` section, or {}, its evidence path)."""
    return part(case.ledger(role, 1), "inflight"), f"{case.ledger_path(role, 1)}#inflight"


def _log(case):
    log = case.observer_logs.get(("requester", 1, TOOL))
    return log if log is not None and log.ok else None  # else its receipt.* finding


def _fault(log):
    """The observer's one inflight_fault event, or None (and the problem)."""
    found = log.text_events("inflight_fault")
    if len(found) != 1:
        refused = [e.get("reason") for e in log.text_events("not_armed")]
        return None, (f"the inflight_fault observer logged {len(found)} interrupted WR(s), expected exactly 1"
                      + (f" (not armed: {refused[0]})" if refused else ""), log.path)
    return found[0], None


def _logged_fault(case):
    """(the usable observer log, its one inflight_fault event) or (log or None, None)."""
    log = _log(case)
    fault = _fault(log)[0] if log is not None else None
    return log, fault


def _stall(case):
    return model.inflight_stall_bytes(case.profile["payload"])


def prefix_holding_content(want, stall):
    """``copied_bytes`` as receipts define it (the longest prefix of the destination holding the round's content) for a
    copy that stopped at ``stall`` over a poisoned region: ``stall``, and one more for each content byte from there
    that happens to be the poison sentinel (such a byte holds both; about one fault round in 256 has one)."""
    copied = stall
    while copied < len(want) and want[copied] == content.POISON:
        copied += 1
    return copied


def _status_name(status):
    return WC_STATUS[status] if isinstance(status, int) and 0 <= status < len(WC_STATUS) else f"status {status!r}"


def _opcode(case):
    return "RDMA_READ" if case.profile["operation"] == "read" else "RDMA_WRITE"


@rule("inflight_dma.fault", "inflight_dma",
      "the inflight_fault observer interrupted exactly one WR: the first payload WR after the three healthy "
      "rounds' (the profile model's count), the fault round's one WR of the payload's size and the profile's "
      "opcode in the requester's ledger (joined by CQ, QPN and WR ID), its copy stopped at the profile model's "
      "stall point, the post accepted", witness=("observer", "profile"), needs=_OBS, applies=inflight_mode)
def check_fault(case):
    log = _log(case)
    if log is None:
        return []
    fault, problem = _fault(log)
    if problem:
        return [problem]
    problems = []
    skip = model.ROUNDS_PER_GENERATION * case.workload["wrs_per_round"]
    qpns, wr_ids = log.column(WR, "qpn"), log.column(WR, "wr_id")
    cqs = [pointer_text(c) for c in log.column(WR, "cq")]
    key = (fault.get("cq"), fault.get("qpn"), fault.get("wr_id"))
    at = [i for i, k in enumerate(zip(cqs, qpns, wr_ids)) if k == key]
    if at != [skip]:
        problems.append((f"the interrupted WR (CQ, QPN, WR ID) {key} is accepted WR {at[:MAX_PROBLEMS_SHOWN]} of the "
                         f"log, the profile model selects WR {skip} (after {skip} healthy payload WR(s)), once",
                         log.path))
    want = {"bytes": case.profile["payload"], "opcode": _opcode(case), "stall_bytes": _stall(case), "stalled": 1,
            "post_ret": 0}
    got = {k: fault.get(k) for k in want}
    if got != want:
        problems.append((f"the interrupted WR: {got}, expected {want} (profile model)", log.path))
    section, where = _section(case, "requester")
    wr = part(section, "wr")
    mine = (wr.get("cq"), wr.get("qpn"), wr.get("wr_id"))
    if mine != key or wr.get("bytes") != case.profile["payload"] or wr.get("opcode") != _opcode(case):
        problems.append((f"the fault round's WR in the ledger (CQ, QPN, WR ID) {mine}, {wr.get('bytes')!r} bytes "
                         f"{wr.get('opcode')!r}: not the WR the observer interrupted {key}", f"{where}.wr"))
    return problems


@rule("inflight_dma.qp_error", "inflight_dma",
      "the interrupted WR's QP went from RTS to ERR through the observer's real ibv_modify_qp (returned 0), after "
      "the copy reached its stall point; no port or device changed (the port ACTIVE before and after)",
      witness=("observer",), needs=_OBS, applies=inflight_mode, after=("inflight_dma.fault",))
def check_qp_error(case):
    log, fault = _logged_fault(case)
    if fault is None:
        return []  # inflight_dma.fault's, or its receipt.* finding
    want = {"stalled": 1, "modify_qp": 0, "state_before": QPS_RTS, "state_after": QPS_ERR,
            "port_state_before": PORT_ACTIVE, "port_state_after": PORT_ACTIVE}
    got = {k: fault.get(k) for k in want}
    if got != want:
        return [(f"the QP of the interrupted WR: {got}, expected {want}: moved to ERR by ibv_modify_qp alone, the "
                 "port untouched", log.path)]
    return []


@rule("inflight_dma.error_cqe", "inflight_dma",
      "the provider delivered exactly one completion of the interrupted WR, an error, which the observer joined to "
      "it by CQ, QPN and WR ID; the runner records that status (no success nobody delivered)",
      witness=("observer",), needs=_OBS, applies=inflight_mode, after=("inflight_dma.fault",))
def check_error_cqe(case):
    log, fault = _logged_fault(case)
    if fault is None:
        return []
    problems = []
    key = (fault.get("ctx"), fault.get("cq"), fault.get("qpn"), fault.get("wr_id"))
    joined = [e for e in log.text_events("inflight_cqe")
              if (e.get("ctx"), e.get("cq"), e.get("qpn"), e.get("wr_id")) == key]
    statuses = [s for q, w, s in zip(log.column(CQE, "qpn"), log.column(CQE, "wr_id"), log.column(CQE, "status"))
                if (q, w) == key[2:]]
    if len(joined) != 1 or joined[0].get("status") in (0, None) or statuses != [joined[0].get("status")]:
        problems.append((f"completions of the interrupted WR {key[2:]}: joined {[e.get('status') for e in joined]}, "
                         f"delivered {statuses}; expected exactly one error completion", log.path))
        return problems
    name = _status_name(joined[0]["status"])
    section, where = _section(case, "requester")
    recorded = part(section, "wr").get("status")
    if recorded != name:
        problems.append((f"the runner records the interrupted WR as {recorded!r}; the provider delivered {name}",
                         f"{where}.wr.status"))
    return problems


@rule("inflight_dma.batch_failed", "inflight_dma",
      "the fault round's batch failed after a proven local drain: state Failed, zero bytes reported (batch, parent, "
      "public counters, typed error), WRITE effect Unknown (READ None), no send-queue debt by the engine's records "
      "or the provider's, one TransferFailed in wait (the batch's state, bytes and typed error are the runner's "
      "word: no observer sees the public API)", witness=("profile", "runner"), applies=inflight_mode)
def check_batch_failed(case):
    section, where = _section(case, "requester")
    effect = "Unknown" if case.profile["operation"] == "write" else "None"
    batch, drain, parent = part(section, "batch"), part(section, "drain"), part(section, "parent")
    public = part(section, "public")
    got = {"state": batch.get("state"), "bytes": batch.get("bytes"), "remote_effect": batch.get("remote_effect"),
           "locally_drained": batch.get("locally_drained"), "parent_bytes": parent.get("completed_bytes"),
           "public_bytes": public.get("bytes"), "sq_debt": drain.get("sq_debt"),
           "provider_outstanding": drain.get("provider_outstanding"),
           "wrs_without_completion": drain.get("wrs_without_completion")}
    want = {"state": "Failed", "bytes": 0, "remote_effect": effect, "locally_drained": True, "parent_bytes": 0,
            "public_bytes": 0, "sq_debt": 0, "provider_outstanding": 0, "wrs_without_completion": 0}
    problems = []
    if got != want:
        wrong = {k: got[k] for k in want if got[k] != want[k]}
        problems.append((f"the fault round's batch: {wrong}, expected {({k: want[k] for k in wrong})}",
                         f"{where}.batch"))
    errors = case.ledger("requester", 1).get("errors")
    fault_round = model.ROUNDS_PER_GENERATION + 1
    typed = [e for e in errors if isinstance(e, dict) and e.get("round") == fault_round] if isinstance(
        errors, list) else []
    shape = [(e.get("error"), e.get("operation"), e.get("bytes"), e.get("remote_effect"), e.get("locally_drained"))
             for e in typed]
    if shape != [("TransferFailed", "wait", 0, effect, True)]:
        problems.append((f"typed errors of round {fault_round}: {shape}, expected one TransferFailed in wait with 0 "
                         f"bytes, effect {effect}, locally drained", f"{case.ledger_path('requester', 1)}#errors"))
    return problems


@rule("inflight_dma.destroy_before_drain", "inflight_dma",
      "the interrupted QP was destroyed successfully (the runner's receipt and the observer's destroy, after the "
      "error completion) before the engine's one drain receipt, when the provider held no QP; the source destroyed "
      "its QP towards it", witness=("observer", "runner", "peer"), needs=_OBS, applies=inflight_mode,
      after=("inflight_dma.fault", "steps.times"))
def check_destroy_before_drain(case):
    section, where = _section(case, "requester")
    qpn = part(section, "wr").get("qpn")
    recovery = part(section, "recovery")
    steps = [s for s in recovery.get("steps") or [] if isinstance(s, dict)]
    actions = [(s.get("action"), s.get("qpn") if s.get("action") == "destroy_qp" else None, s.get("result"))
               for s in steps]
    drains = [s for s in steps if s.get("action") == "drain"]
    problems = []
    if actions[:1] != [("destroy_qp", qpn, "Ok")] or [a[0] for a in actions] != ["destroy_qp", "drain"] or (
            drains and drains[0].get("provider_qps") != 0):
        problems.append((f"recovery steps {actions} (drain with {drains[0].get('provider_qps') if drains else None!r} "
                         f"provider QPs): expected the successful destroy of QP {qpn} first, then one drain with no "
                         "QP held", f"{where}.recovery"))
    log = _log(case)
    if log is not None:
        destroys = [e for e in log.text_events("inflight_destroy") if e.get("qpn") == qpn]
        seen = [(e.get("ret"), e.get("after_cqe")) for e in destroys]
        if seen != [(0, 1)]:
            problems.append((f"the observer saw QP {qpn} destroyed {seen} (result, after the error completion); "
                             "expected once, successfully, after it", log.path))
    source, swhere = _section(case, "source")
    retired = [(r.get("peer_qpn"), r.get("result")) for r in source.get("retired") or [] if isinstance(r, dict)]
    if retired != [(qpn, "Ok")]:
        problems.append((f"the source's QPs towards QP {qpn} destroyed: {retired}, expected one, Ok",
                         f"{swhere}.retired"))
    return problems


def _landed(case):
    """What the verbs provider says landed at the destination in the fault round (the destination side's own
    per-device count), and the observer's count for a READ (its destination is local)."""
    role = case.destination_role()
    section, _where = _section(case, role)
    counter = "read_bytes_landed" if case.profile["operation"] == "read" else "write_bytes_landed"
    rail = str(case.workload["rails"][0])
    return part(part(section, "device"), rail).get(counter)


@rule("inflight_dma.destination", "inflight_dma",
      "after the drain the destination holds exactly the copied prefix up to the profile model's stall point and "
      "the untouched poison sentinel after it (recomputed from docs/content.md; a zero-progress or fully completed "
      "copy fails), guards unchanged; the provider counted those bytes landed and, for READ, the observer's hash "
      "of the destination at the error completion agrees", witness=("profile", "observer", "peer"), needs=_OBS,
      applies=inflight_mode)
def check_destination(case):
    role, payload, stall = case.destination_role(), case.profile["payload"], _stall(case)
    section, where = _section(case, role)
    data, _dwhere = _section(case, case.data_role())
    dest = part(section, "destination")
    seed, guard_seed = data.get("input_seed"), section.get("guard_seed")
    try:
        region = content.RoundContent(seed, 1, payload)
        expected = hashlib.sha256(bytes(region.payload_of(0)[:stall]) + bytes([content.POISON]) * (payload - stall))
        lead, trail = content.guard_digests(guard_seed, 0)
    except ValueError as error:
        return [(f"the fault round's seeds: {error}", where)]
    problems = []
    if not 0 < stall < payload:
        problems.append((f"stall point {stall} of a {payload}-byte WR: no partial copy is possible", where))
    copied = prefix_holding_content(region.payload_of(0), stall)
    want = {"sha256": expected.hexdigest(), "copied_bytes": copied, "untouched_bytes": payload - copied,
            "other_changed": 0}
    got = {k: dest.get(k) for k in want}
    guard = part(dest, "guard_check")
    if got != want:
        problems.append((f"{role}'s destination after the drain: {got}; expected {copied} copied and "
                         f"{payload - copied} untouched sentinel bytes, sha256 {want['sha256'][:16]}...",
                         f"{where}.destination"))
    if (guard.get("leading_sha256"), guard.get("trailing_sha256")) != (lead.hex(), trail.hex()):
        problems.append((f"{role}'s guards after the fault round differ from the guard seed's", f"{where}.destination"))
    landed = _landed(case)
    if landed != stall:
        problems.append((f"the provider counted {landed!r} bytes landed at the {role}, the stall point is {stall}",
                         f"{where}.device"))
    log, fault = _logged_fault(case)
    if fault is not None and case.profile["operation"] == "read":
        cqes = log.text_events("inflight_cqe")
        seen = fault.get("landed_local"), [e.get("dest_sha256") for e in cqes]
        if seen != (stall, [expected.hexdigest()]):
            problems.append((f"the observer saw {seen[0]!r} bytes land and hashed the destination {seen[1]} at the "
                             f"error completion; expected {stall} and {expected.hexdigest()[:16]}...", log.path))
    return problems


@rule("inflight_dma.survival", "inflight_dma",
      "both engines survived: the same process and epoch ran three more rounds after the fault (5..7) on one fresh "
      "QP per peer (created in round 5, reused after, never the interrupted one), every parent completed with its "
      "bytes and guards checked at the destination", witness=("profile", "peer"), applies=inflight_mode)
def check_survival(case):
    problems = []
    first = model.ROUNDS_PER_GENERATION + 2
    wanted = list(range(first, first + model.INFLIGHT_SURVIVAL_ROUNDS))
    faulted = part(_section(case, "requester")[0], "wr").get("qpn")
    retired = {r.get("qpn") for r in _section(case, "source")[0].get("retired") or [] if isinstance(r, dict)}
    for role in ("source", "requester"):
        section, where = _section(case, role)
        ledger = case.ledger(role, 1)
        rounds = [r for r in section.get("survival") or [] if isinstance(r, dict)]
        if [r.get("round") for r in rounds] != wanted:
            problems.append((f"{role}: survival rounds {[r.get('round') for r in rounds]}, expected {wanted}",
                             f"{where}.survival"))
            continue
        used = set()
        for index, rnd in enumerate(rounds):
            at = f"{where}.survival[{index}]"
            created, reused = (1, 0) if index == 0 else (0, 1)
            observed = (rnd.get("epoch"), rnd.get("qps_created"), rnd.get("qps_reused"))
            if observed != (ledger.get("epoch"), created, reused):
                problems.append((f"{role} round {rnd.get('round')}: epoch {rnd.get('epoch')!r}, "
                                 f"{rnd.get('qps_created')!r} QP(s) created, {rnd.get('qps_reused')!r} reused; "
                                 f"expected the process's epoch, {created} created, {reused} reused", at))
            parents = [p for p in rnd.get("parents") or [] if isinstance(p, dict)]
            used |= {p.get("qpn") for p in parents}
            good = "Completed" if role == "requester" else "Released"
            checked = role == case.destination_role()
            bad = [p.get("parent") for p in parents if p.get("status") != good or (checked and not (
                part(p, "byte_check").get("ok") and part(p, "guard_check").get("ok")))]
            if len(parents) != case.profile["parents"] or bad:
                problems.append((f"{role} round {rnd.get('round')}: parents {bad} not {good} with their checks "
                                 f"({len(parents)} listed)", at))
        if len(used) != 1 or used & ({faulted} if role == "requester" else retired):
            problems.append((f"{role}: survival rounds on QP(s) {sorted(used, key=str)}; expected one fresh QP, not "
                             f"the interrupted {faulted} or the retired {sorted(retired, key=str)}",
                             f"{where}.survival"))
    return problems

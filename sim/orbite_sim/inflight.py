# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""installed-inflight-dma (docs/inflight_dma.md): one WR interrupted part way through its DMA; both engines survive.

After the three healthy rounds the requester submits round 4 as any round: one parent, one WR. The preloaded
inflight_fault observer lets that post reach the provider, waits until the copy has moved the profile's stall
bytes and moves the QP to ERR with the real ibv_modify_qp; the engine only sees the WR complete in error. Its
batch fails with zero reported bytes (WRITE effect Unknown, READ None) once the error completion is polled (local
drain proven by the provider's send queue), the QP is destroyed before the drain receipt, and the destination side
(the requester for READ, the source for WRITE) checks its region: a copied prefix, the rest still the poison
sentinel, guards unchanged. Both engines then run three more rounds on a fresh QP, recorded in ``inflight.survival``.

The engine classes call in here from small hooks (requester.run, source.serve); everything of the mode is here.
"""

import hashlib
import select
import time

from . import content
from .engine import ROUNDS, Round
from .errors import EngineError, protocol_error
from .verbs import WC_STATUS_NAMES, VerbsError

FAULT_ROUND = ROUNDS + 1
SURVIVAL_ROUNDS = 3
POLL_BATCH = 16


# ------------------------------------------------------------------------------------------------ requester


def run_requester(eng):
    """After round 3: the fault round, then the survival rounds on a fresh QP (no_survival: none)."""
    fault_round(eng)
    eng.checkpoint()
    if "inflight_no_survival" in eng.defects:  # the defect: the engines stop after the fault
        return
    eng.survival_rounds = eng.doc["inflight"]["survival"]
    for round_no in range(FAULT_ROUND + 1, FAULT_ROUND + 1 + SURVIVAL_ROUNDS):
        eng.run_round(round_no)
        eng.checkpoint()
    eng.survival_rounds = None


def _effect(eng):
    """What a peer may hold of a WRITE stopped part way is unknown; a READ changes nothing remote."""
    return "Unknown" if eng.operation == "write" else "None"


def fault_round(eng):
    section = eng.doc["inflight"]
    round_no = FAULT_ROUND
    eng.round_no = round_no
    rnd = Round(round_no)
    rnd.started = time.time()
    eng.mark_counters(rnd)
    rail, lane = eng.placement()[0]
    qp = eng.live_qps[(rail, lane)]
    parents_msg = [{"parent": 0, "rail": rail, "lane": lane, "bytes": eng.payload}]
    ready, seed, guard_seed = eng.begin_fault_round(round_no, parents_msg)
    eng.held_grants = {int(p) for p in ready.get("grants", [])}
    received = sorted(eng.held_grants)
    parent = eng.parent_entry(0, rail, lane, qp.qpn, eng.payload, 0, 1, "Pending")
    eng.wr_info = {}
    cq = eng.contexts[rail]["cq"]
    channel = eng.contexts[rail]["channel"] if eng.events else None
    progress = {"mode": "events" if eng.events else "polling", "poll_calls": 0, "cqes_polled": 0, "cq_arms": 0,
                "cq_events": 0}
    if eng.events:
        progress["cq_events"] += channel.drain_events(cq)  # an event round 3 left pending is round 3's
        cq.req_notify()
        progress["cq_arms"] += 1
    # The observer interrupts this post: the copy stops part way, the QP goes to ERR, then the post returns.
    wr = eng._post(round_no, qp, parent, 0, eng.payload, parent["region_offset"])
    _reap(eng, qp, cq, channel, wr, progress, time.monotonic() + eng.timeouts["round_s"])
    delivered = wr["status"]
    failed = delivered != "SUCCESS"
    if "inflight_fabricate_success" in eng.defects:  # the defect: a success completion nobody delivered
        wr["status"] = "SUCCESS"
    # Local drain, proven before anything is released: the engine's own send-queue debt and the provider's.
    drain = {"sq_debt": qp.outstanding, "provider_outstanding": qp.provider_outstanding(),
             "wrs_without_completion": 0 if wr["completed_seq"] is not None else 1}
    locally_drained = not any(drain.values())
    reported = eng.payload if (not failed or "inflight_reports_bytes" in eng.defects) else 0
    parent.update(status="Failed" if failed else "Completed", completed_bytes=reported)
    effect = _effect(eng)
    batch = {"batch": round_no, "parents": [0], "state": "Failed" if failed else "Completed", "bytes": reported,
             "remote_effect": effect, "locally_drained": locally_drained,
             "wait": {"result": "TransferFailed" if failed else "Ok", "status": delivered}, "free": None}
    if failed:
        error = EngineError("TransferFailed", "wait", f"batch {round_no}: WR {wr['wr_id']} on QP {qp.qpn} completed "
                            f"{delivered}", round_no=round_no, parent=0, remote_effect=effect,
                            locally_drained=locally_drained, wrs_posted=1, nbytes=reported, expected=True)
        eng.doc["errors"].append(error.as_dict())

    def loans():
        """The fault round's buffer lent to the device: its WR until a completion of it was polled."""
        return sum(1 for w in (wr,) if w["completed_seq"] is None)

    def release():
        debt = {"wrs": qp.outstanding, "grants": len(eng.held_grants), "loans": loans()}
        return {"debt_before": debt, "debt_after": {"wrs": qp.outstanding, "grants": len(eng.held_grants),
                                                    "loans": loans()}, "locally_drained": locally_drained}

    # The interrupted QP is destroyed (a receipt) before the drain receipt (inflight_drain_first: after it).
    recovery = eng.recover_lost([qp], release, FAULT_ROUND)
    batch["free"] = eng.free(batch, round_no, [wr])
    public = eng.new_public()
    if reported:
        public["bytes"] = public["per_rail"][str(rail)] = reported
    destination = None
    if eng.operation == "read":
        destination = check_destination(eng, seed, guard_seed)
        if not destination["ok"]:
            eng.rounds_failed_checks = True
    eng.rv.send("ROUND_DONE", round=round_no, released=sorted(eng.held_grants), retire=[qp.qpn])
    drained = eng.rv.recv(eng.timeouts["round_s"], ["ROUND_DRAINED"])
    eng.held_grants -= {int(p) for p in drained.get("released", [])}
    now = eng.provider.counters()
    section.update(
        wr={k: wr[k] for k in ("wr_id", "parent", "rail", "lane", "qpn", "context", "cq", "opcode", "bytes", "status",
                               "posted_seq", "completed_seq")},
        delivered_status=delivered, input_seed=seed, guard_seed=guard_seed, batch=batch, parent=parent,
        public=public, drain=drain, recovery=recovery, destination=destination, grants_received=received,
        grants_after=sorted(eng.held_grants), device=eng.device_counters(rnd.device_before),
        provider={k: now[k] - rnd.provider_before[k] for k in now}, progress=progress,
        started_at=rnd.started, finished_at=time.time())


def _reap(eng, qp, cq, channel, wr, progress, deadline):
    """Wait for the WR's completion: polling, or the completion channel the CQ was armed on."""
    while wr["completed_seq"] is None:
        if time.monotonic() > deadline:
            raise EngineError("Timeout", "wait", f"WR {wr['wr_id']}: no completion", round_no=FAULT_ROUND,
                              remote_effect="Unknown", locally_drained=False, wrs_posted=1)
        progress["poll_calls"] += 1
        got = cq.poll(POLL_BATCH)
        for wr_id, status, _len, qpn in got:
            progress["cqes_polled"] += 1
            if wr_id != wr["wr_id"] or qpn != qp.qpn:
                raise EngineError("Internal", "wait", f"completion of wr_id {wr_id} on QP {qpn}: not the fault "
                                  "round's WR", round_no=FAULT_ROUND)
            qp.retire()
            wr.update(status=WC_STATUS_NAMES.get(status, str(status)), completed_seq=eng.seq)
            eng.seq += 1
        if got:
            continue
        if channel is not None:
            if select.select([channel], [], [], max(0.0, min(1.0, deadline - time.monotonic())))[0]:
                progress["cq_events"] += channel.drain_events(cq)
        else:
            time.sleep(0.0005)


# ------------------------------------------------------------------------------------------------ destination


def check_destination(eng, seed, guard_seed):
    """The destination region after the drain: the longest prefix holding the round's content, how many of the
    bytes after it still hold the poison sentinel, how many hold anything else, the region's SHA-256 and the guard
    check. A copy that stopped part way: both a copied prefix and untouched sentinel bytes, nothing else changed.
    inflight_full_copy / inflight_untouched: the region is made a full copy / left untouched and accepted."""
    expected = content.RoundInput(seed, 1, eng.payload)
    off = content.region_offset(0, eng.payload)
    want = expected.parent(0)
    if "inflight_full_copy" in eng.defects:  # the defect: as if the copy had run to the end
        eng.arena[off : off + eng.payload] = want
    if "inflight_untouched" in eng.defects:  # the defect: as if nothing had landed
        eng.arena[off : off + eng.payload] = bytes([content.POISON]) * eng.payload
    region = eng.arena[off : off + eng.payload]
    copied = _common_prefix(region, want)
    tail = region[copied:]
    untouched = tail.count(content.POISON)
    _byte, guard = content.check_region(eng.arena, 0, expected, guard_seed)
    ok = 0 < copied and untouched > 0 and untouched == len(tail) and guard["ok"]
    if "inflight_full_copy" in eng.defects or "inflight_untouched" in eng.defects:
        ok = guard["ok"]  # the defect: accepted
    return {"parent": 0, "region_offset": off, "payload_bytes": eng.payload, "copied_bytes": copied,
            "untouched_bytes": untouched, "other_changed": len(tail) - untouched,
            "sha256": hashlib.sha256(region).hexdigest(), "guard_check": guard, "ok": ok}


def _common_prefix(have, want):
    """Length of the common prefix of two equal-length buffers (halving: one memcmp per step)."""
    low, high = 0, len(want)
    have, want = memoryview(have), memoryview(want)
    while low < high:
        mid = (low + high + 1) // 2
        if have[:mid] == want[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


# ------------------------------------------------------------------------------------------------ source


def finish_source_fault_round(eng, msg, rnd):
    """ROUND_DONE of the fault round at the source: a WRITE's destination checked here (after the requester's
    destroy and drain), the returned grants released, the QPs towards the interrupted one destroyed (receipts)."""
    if int(msg["round"]) != eng.round_no:
        raise protocol_error("drain", f"ROUND_DONE for round {msg['round']} during round {eng.round_no}")
    section = eng.doc["inflight"]
    if eng.operation == "write":
        section["destination"] = check_destination(eng, rnd.seed, rnd.guard_seed)
        if not section["destination"]["ok"]:
            eng.rounds_failed_checks = True
    released = {int(p) for p in msg.get("released", [])} & eng.grants
    eng.grants -= released
    for peer_qpn in msg.get("retire", []):
        for qp in [q for q in eng.by_qpn.values() if q.peer_qpn == peer_qpn]:
            del eng.by_qpn[qp.qpn]
            try:
                eng.destroy_qp(qp, FAULT_ROUND)
                result = "Ok"
            except VerbsError as exc:
                result = f"Failed: {exc}"
            receipt = {"qpn": qp.qpn, "peer_qpn": peer_qpn, "at": time.time(), "result": result}
            section.setdefault("retired", []).append(receipt)
    section.update(input_seed=rnd.seed, guard_seed=rnd.guard_seed, grants_issued=rnd.issued,
                   grants_released=sorted(released), grants_after=sorted(eng.grants),
                   device=eng.device_counters(rnd.device_before))
    eng.rv.send("ROUND_DRAINED", round=FAULT_ROUND, drained=not eng.grants, debt_grants=len(eng.grants),
                released=sorted(released))
    eng.survival_rounds = section["survival"]

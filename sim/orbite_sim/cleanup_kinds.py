# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""installed-cleanup-failure, cleanup kinds cq, channel and pd (seed 000, "CQ, completion-channel and PD
dependency failures"; docs/cleanup_failure.md).

Each kind is a real dependency failure: the fixture keeps a dependent object the provider really counts (a
RESET QP on the CQ, an extra CQ on the completion channel, a type-2 MW on the PD), so the engine's destroy
returns EBUSY once from that object. Nothing is injected: the uverbs_fault observer (dependency mode) only
logs what the destroy verb returned and rejects a retry. cq and channel reuse the withheld completion of the
qp kind's cleanup round (the batch stays Unquiesced); pd is idle (the generation's rounds all completed).
After the failure the caller drops its handles; a weak owner and the provider's own count of live objects per
kind show what the quarantine kept and what was released. Everything goes to the ledger's ``restart.cleanup``.
"""

import gc
import select
import time
import weakref

from .content import region_offset
from .engine import CQ_DEPTH, HELD_ROUND
from .errors import EngineError
from .verbs import MW_TYPE_2, WC_STATUS_NAMES, VerbsError

DEPENDENCY_KINDS = ("cq", "channel", "pd")
# The kinds whose cleanup round waits for a completion the observer withholds (pd is idle).
WITHHELD_KINDS = ("cq", "channel")
# Per kind: the object whose destroy fails and the verbs call that destroys it.
TARGETS = {"cq": ("cq", "ibv_destroy_cq"), "channel": ("channel", "ibv_destroy_comp_channel"),
           "pd": ("pd", "ibv_dealloc_pd")}


def is_dependency_kind(profile):
    return profile.get("cleanup_kind", "qp") in DEPENDENCY_KINDS


def run(eng, allocation_type, wr_id):
    """The requester's cleanup step of generation 1 for the profile's dependency kind."""
    kind = eng.profile["cleanup_kind"]
    rail, lane = eng.placement()[0]
    entry = eng.contexts[rail]
    qp = eng.live_qps[(rail, lane)]
    blocker = _blocker(eng, kind, entry, lane)
    record = {"round": HELD_ROUND if kind in WITHHELD_KINDS else None, "kind": kind, "rail": rail, "lane": lane,
              "qpn": qp.qpn, "blocker": {"kind": blocker.kind, "handle": blocker.handle, "query": _query(blocker)}}
    allocation = allocation_type(eng.arena, region_offset(0, eng.payload), eng.payload)
    if kind == "pd":
        _idle(eng, record, entry, allocation, blocker)
    else:
        _withheld(eng, record, entry, qp, allocation, blocker, wr_id)
    owner = weakref.ref(allocation)
    kept = weakref.ref(blocker)
    del allocation, qp, blocker  # the caller drops every handle: only the quarantine may keep them
    if "release_quarantined" in eng.defects:  # the defect: the engine forgets what it must keep
        eng.quarantine = None
    gc.collect()
    record["retained"] = {"weak_owner_alive": owner() is not None, "provider_held": eng.provider.held(),
                          "table_live": eng.table.live_count(), "device_open": entry["ctx"].live,
                          "charges": _charges(eng),
                          "blocker_query": _query(kept()) if kept() is not None else None}
    eng.doc["restart"]["cleanup"] = record
    eng.checkpoint()


def _query(blocker):
    """A real ibv_query_qp of the cq kind's dependent QP ({qpn, state}: RESET); None for the other kinds."""
    if blocker.kind != "qp":
        return None
    try:
        return blocker.query()
    except VerbsError as exc:
        return {"error": exc.code}


def _charges(eng):
    """What the quarantine still charges: the batch's (cq, channel), none for the idle pd case."""
    if eng.quarantine is not None and "batch" in eng.quarantine:
        return eng.held_charges()
    return {"sq_slots": 0, "provider_sq_slots": 0, "bytes": 0, "batches": 0}


def _blocker(eng, kind, entry, lane):
    """The dependent object the fixture keeps: a QP on the rail's CQ left in RESET, a second CQ on the rail's
    completion channel, a type-2 memory window on the rail's PD."""
    ctx = entry["ctx"]
    try:
        if kind == "cq":
            return ctx.create_qp(entry["pd"], entry["cq"], lane, eng.operation, 1)
        if kind == "channel":
            return ctx.create_cq(CQ_DEPTH, entry["channel"])
        return ctx.alloc_mw(entry["pd"], MW_TYPE_2)
    except VerbsError as exc:
        raise EngineError("Internal", "close", f"the cleanup fixture's dependent object: {exc}") from None


def _destroy(owner, call):
    """One destroy of ``owner``: {call, errno} (errno None when it was destroyed)."""
    try:
        owner.destroy() if call != "ibv_dealloc_pd" else owner.dealloc()
    except VerbsError as exc:
        return {"call": exc.call, "errno": exc.code}
    return {"call": call, "errno": None}


def _target(eng, entry):
    return entry[TARGETS[eng.profile["cleanup_kind"]][0]]


# ------------------------------------------------------------------------------------------- cq, channel


def _withheld(eng, record, entry, qp, allocation, blocker, wr_id):
    round_no = HELD_ROUND
    rail, lane = record["rail"], record["lane"]
    mr = entry["mrs"]["data"]
    offset = region_offset(0, eng.payload)
    record["before"] = {"provider_held": eng.provider.held()}
    parents_msg = [{"parent": 0, "rail": rail, "lane": lane, "bytes": eng.payload}]
    ready, _seed, _guard_seed = eng.begin_fault_round(round_no, parents_msg)
    grants = sorted(int(p) for p in ready.get("grants", []))
    peer_addr, peer_rkey = eng.remote[qp.qpn]
    batch = {"batch": round_no * 10 + rail, "rail": rail, "parents": [0], "state": "Running", "qpn": qp.qpn,
             "wr_id": wr_id, "bytes": eng.payload, "grants": grants}
    channel = entry["channel"] if record["kind"] == "channel" else None
    progress = {"cq_arms": 0, "cq_events": 0, "poll_calls": 0}  # counted where each verb is called
    if channel is not None:
        entry["cq"].req_notify()  # armed before the post: the completion, withheld or not, signals the channel
        progress["cq_arms"] += 1
    qp.post_send(wr_id, mr.addr + offset, eng.payload, mr.lkey, peer_addr + offset, peer_rkey)
    eng.quarantine = {"batch": batch, "qp": qp, "allocation": allocation, "blocker": blocker, "entry": entry,
                      "closed": False}
    record["batch"] = batch
    if channel is None:
        record["wait"] = eng._cleanup_wait(qp, batch, round_no)
    else:
        record["wait"] = _event_wait(eng, entry, qp, batch, round_no, progress)
    record["close"] = close(eng, batch, round_no)
    record["free"] = eng.free(batch, round_no)
    record["cpu_write"] = eng.cpu_write(allocation, round_no)
    record["charges"] = eng.held_charges()
    record["repeated_close"] = close(eng, batch, round_no)


def _event_wait(eng, entry, qp, batch, round_no, progress):
    """wait(batch) through the rail's completion channel, bounded: armed (before the post, counted in
    ``progress``), the channel selected, every event fetched and acknowledged, the CQ polled after each; the
    withheld completion never comes (Timeout)."""
    timeout = eng.timeouts["grant_s"]
    deadline = time.monotonic() + timeout
    cq, channel = entry["cq"], entry["channel"]
    polled = []
    while not polled:
        progress["poll_calls"] += 1
        for wr_id, status, byte_len, qpn in cq.poll():
            qp.retire()
            polled.append({"wr_id": wr_id, "status": WC_STATUS_NAMES.get(status, str(status)),
                           "byte_len": byte_len, "qpn": qpn})
        left = deadline - time.monotonic()
        if polled or left <= 0:
            break
        if select.select([channel], [], [], min(left, 0.05))[0]:
            progress["cq_events"] += channel.drain_events(cq)
            cq.req_notify()
            progress["cq_arms"] += 1
    if polled:
        batch["state"] = "Completed" if all(c["status"] == "SUCCESS" for c in polled) else "Failed"
        return {"timeout_s": timeout, "result": "Ok", "completions": polled, "state_after": batch["state"],
                "progress": progress}
    error = EngineError("Timeout", "wait", f"batch {batch['batch']}: no completion event within {timeout:g} s",
                        round_no=round_no, remote_effect="Unknown", locally_drained=False, expected=True)
    eng.doc["errors"].append(error.as_dict())
    return {"timeout_s": timeout, "result": "Timeout", "completions": [], "state_after": batch["state"],
            "progress": progress}


def close(eng, batch, round_no):
    """Quiesce the batch: its QP to ERR and destroyed, for channel also the rail's engine CQ, then the object
    that may still hold its completion (the CQ, the channel): that destroy fails EBUSY from the fixture's
    dependent object, so the batch fails Unquiesced, not locally drained. A later close says so again without
    calling destroy (retry_destroy: it calls it again; drain_after_eio: it claims a drain; keep_released:
    the QP and engine CQ that must go are kept)."""
    q = eng.quarantine
    entry = q["entry"]
    first = not q["closed"]
    released = []
    destroy = None
    if first:
        q["closed"] = True
        if "keep_released" not in eng.defects:
            qp = q["qp"]
            qp.to_error()
            eng.destroy_qp(qp, HELD_ROUND)
            eng.live_qps.pop((qp.context.rail, qp.lane), None)
            released.append({"kind": "qp", "handle": qp.handle})
            if eng.profile["cleanup_kind"] == "channel":
                result = _destroy(entry["cq"], "ibv_destroy_cq")
                if result["errno"] is not None:
                    raise EngineError("Internal", "close", f"the engine CQ of rail {q['batch']['rail']}: {result}")
                released.append({"kind": "cq", "handle": entry["cq"].handle})
    target = _target(eng, entry)
    if first or "retry_destroy" in eng.defects:
        destroy = _destroy(target, TARGETS[eng.profile["cleanup_kind"]][1])
    drained = not target.live or (not first and "drain_after_eio" in eng.defects)
    batch["state"] = "Failed"
    if drained:
        return {"result": "Ok", "destroy_called": destroy is not None, "destroy": destroy, "locally_drained": True,
                "released": released}
    error = EngineError("Unquiesced", "close", f"batch {batch['batch']}: the {target.kind} that may hold its "
                        f"completion could not be destroyed ({destroy['errno'] if destroy else 'quarantined'})",
                        round_no=round_no, remote_effect="Unknown", locally_drained=False, expected=True)
    eng.doc["errors"].append(error.as_dict())
    return {"result": "Unquiesced", "destroy_called": destroy is not None, "destroy": destroy,
            "locally_drained": False, "released": released}


# ------------------------------------------------------------------------------------------------- pd


def _idle(eng, record, entry, allocation, blocker):
    """Idle PD destruction: every batch of the generation completed and was freed. The rail's QPs, MRs, CQ and
    channel are released, then the PD's dealloc fails EBUSY from the fixture's type-2 window: the quarantine
    keeps the PD and the device (its context) only. keep_released: the MRs and the allocation are kept;
    premature_device_close: the device is closed with the PD still failed; retry_destroy: the dealloc is
    tried again."""
    rail = record["rail"]
    keep = "keep_released" in eng.defects
    record["before"] = {"provider_held": eng.provider.held()}
    released = []
    for key, qp in sorted(eng.live_qps.items()):
        if key[0] == rail and qp.live:
            eng.destroy_qp(qp, eng.round_no)  # idle: after the generation's last round
            eng.live_qps.pop(key)
            released.append({"kind": "qp", "handle": qp.handle})
    if not keep:
        for mr in entry["mrs"].values():
            mr.dereg()
            released.append({"kind": "mr", "handle": mr.handle})
    for owner in (entry["cq"], entry["channel"]):
        if owner is not None:
            result = _destroy(owner, "ibv_destroy_cq" if owner.kind == "cq" else "ibv_destroy_comp_channel")
            if result["errno"] is not None:
                raise EngineError("Internal", "close", f"rail {rail}: {result}")
            released.append({"kind": owner.kind, "handle": owner.handle})
    pd = entry["pd"]
    eng.quarantine = {"pd": pd, "ctx": entry["ctx"], "blocker": blocker, "entry": entry,
                      "allocation": allocation if keep else None}
    destroy = _destroy(pd, "ibv_dealloc_pd")
    record["close"] = {"result": "Unquiesced" if pd.live else "Ok", "destroy_called": True, "destroy": destroy,
                       "locally_drained": True, "released": released}
    if pd.live:
        eng.doc["errors"].append(EngineError(
            "Unquiesced", "close", f"PD {pd.handle} of rail {rail} could not be deallocated ({destroy['errno']})",
            remote_effect="None", locally_drained=True, expected=True).as_dict())
    again = _destroy(pd, "ibv_dealloc_pd") if "retry_destroy" in eng.defects and pd.live else None
    record["repeated_close"] = {"result": "Unquiesced" if pd.live else "Ok", "destroy_called": again is not None,
                                "destroy": again, "locally_drained": True}
    if "premature_device_close" in eng.defects:  # the defect: the device closed under a retained PD
        entry["ctx"].close()

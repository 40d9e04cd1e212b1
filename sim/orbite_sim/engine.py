# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The engine both roles share: rails, contexts, persistent MRs, QP records, round records, teardown.

Shape (docs/runner-contract.md section 4): one context per rail with persistent MRs on both,
``num_lanes`` QPs per enabled rail created once and reused, three rounds with fresh input, all
parents of a round submitted as one batch and posted interleaved on their shared QPs (at most the
send-queue depth in flight per QP), completions reaped by polling or through completion channels.
Every verbs operation goes to the verbs provider (``verbs``); the provider moves the payload. The
ledger's native counters are counted here at the engine's verbs calls; the provider's own byte
counters are recorded beside them (``provider``), and the provider's count of held objects is the
cross-check of the resource table at teardown.
"""

import base64
import copy
import hashlib
import os
import random
import sys
import time

from . import content, sysfs
from .case import CLEANUP_MODE, INFLIGHT_MODE, INTERRUPTION_MODE, LOST_MODE, RESTART_MODES
from .errors import EngineError, peer_lost, unavailable
from .ledger import Ledger, wr_columns, write_json_atomic
from .progress import report as report_progress
from .verbs import (
    ACCESS_MW_BIND,
    DATA_ACCESS,
    PROVIDER_COUNTERS,
    WC_STATUS_NAMES,
    ResourceTable,
    VerbsError,
    gid_text,
    open_device,
)

RAILS = (0, 1)
SEND_QUEUE_DEPTH = 8
ROUNDS = 3
CQ_DEPTH = 256
CTRL_BYTES = 4096
RESTART_POINT_NAME = "restart-point.json"
# A generation's seed space: round r of generation g mixes g into the round number, so the survivor
# (one epoch throughout) never repeats an earlier generation's input.
ROUNDS_PER_SEED_SPACE = 16
BYTE_COUNTERS = ("read_bytes_landed", "read_bytes_served", "write_bytes_sent", "write_bytes_landed")
# installed-interruption (docs/interruption.md): the round after a nonfinal generation's three is the one
# whose authorization the relay holds; the source's MW bind and completion receive have WR IDs of their own.
HELD_ROUND = ROUNDS + 1
BIND_WR_ID = 1 << 40
RECV_WR_ID = 2 << 40
RECLAIM_S = 10.0
# installed-lost-completion (docs/lost_completion.md): the round after a nonfinal generation's three is the one
# whose payload completions the cq_fault observer withholds.
LOST_ROUND = ROUNDS + 1

_rng = random.SystemRandom()


def peer_gone(message):
    return peer_lost("restart", message)


def fresh_u64():
    return _rng.getrandbits(64)


def slice_plan(payload, block, wrong=False):
    """Slice sizes of one parent: max(1, payload // block) slices, the last takes the rest.

    ``wrong`` is the wrong_slicing defect: ceil(payload / block) slices, the last one short.
    """
    count = -(-payload // block) if wrong else max(1, payload // block)
    return [block] * (count - 1) + [payload - block * (count - 1)]


def profile_key(profile):
    """The profile fields both peers must agree on (sent in HELLO, checked by the source)."""
    return {k: profile[k] for k in ("mode", "operation", "rdma_events", "parents", "payload", "block",
                                    "num_lanes", "mask")}


def strict_gid_request(provider, root, device, port):
    """A separate engine asks for GID index 255 strictly; it must fail Unavailable and hold nothing."""
    table = ResourceTable()
    result, error, ctx = "Ok", None, None
    try:
        ctx = open_device(provider, table, 0, device)
        sysfs.describe_rail(root, device, port, 255)
    except VerbsError as exc:
        result, error = "Unavailable", unavailable("open_device", str(exc), expected=True).as_dict()
    except EngineError as exc:
        result = exc.error
        exc.expected = True
        error = exc.as_dict()
    finally:
        if ctx is not None:
            ctx.close()  # a failed open releases what it acquired; an Ok one is closed as well
    return {"device": device, "port": port, "gid_index": 255, "result": result, "error": error,
            "owners_acquired": table.acquired, "retained_owners": table.live_count()}


def new_progress(events):
    """A round's progress counters (the requester counts them; the source reports zeros)."""
    return {"mode": "events" if events else "polling", "poll_calls": 0, "empty_polls": 0,
            "cqes_polled": 0, "cq_events": 0, "cq_arms": 0}


def qp_usage(qp, created, reused):
    """A QP's usage record for one round, before any WR is counted on it."""
    return {"qpn": qp.qpn, "rail": qp.context.rail, "lane": qp.lane, "operation": qp.operation,
            "created": created, "reused": reused, "wrs_posted": 0, "cqes": 0, "cqes_error": 0, "bytes_posted": 0,
            "bytes_completed": 0, "max_inflight_wrs": 0, "max_outstanding_parents": 0}


def count_public(public, rail, nbytes):
    """Public bytes count a parent whose transfer completed (both roles alike)."""
    public["bytes"] += nbytes
    public["per_rail"][str(rail)] = public["per_rail"].get(str(rail), 0) + nbytes


class Round:
    """What one round gathers for its ledger record, in both roles."""

    def __init__(self, round_no):
        self.round_no = round_no
        self.started = None
        self.provider_before = None  # the provider's own counters when the round's traffic starts
        self.device_before = None  # and its counters per context (rail), {rail: {name: value}}
        self.native_before = None  # native counters per rail when the transfer starts
        self.created = set()  # QPNs created for this round
        self.seed = None
        self.origin = None  # "local" on the data side, "peer" on the destination side
        self.guard_seed = None  # destination side only
        self.placement = None  # source: the parents ROUND_BEGIN placed
        self.issued = []  # source: the grants ROUND_READY issued


class Engine:
    """What both roles share: rails, contexts, persistent MRs, QP records, round records, teardown."""

    role = None

    def __init__(self, case, output, ledger, provider):
        self.case = case
        self.output = output
        self.ledger = ledger
        self.doc = ledger.doc
        self.provider = provider
        self.profile = case["profile"]
        self.defects = set(case["defects"])
        self.timeouts = case["timeouts"]
        self.operation = self.profile["operation"]
        self.events = self.profile["rdma_events"]
        self.parents = self.profile["parents"]
        self.payload = self.profile["payload"]
        self.block = self.profile["block"]
        self.lanes = self.profile["num_lanes"]
        self.mask = self.profile["mask"]
        self.enabled_rails = [r for r in RAILS if self.mask & (1 << r)]
        self.generation = case["generation"]
        self.generations = self.profile.get("generations", 1)
        self.restart = self.profile["mode"] in RESTART_MODES
        self.interruption = self.profile["mode"] == INTERRUPTION_MODE
        self.lost_mode = self.profile["mode"] == LOST_MODE
        self.cleanup = self.profile["mode"] == CLEANUP_MODE
        self.inflight = self.profile["mode"] == INFLIGHT_MODE
        self.survival_rounds = None  # installed-inflight-dma: where the rounds after the fault are recorded
        self.survivor = case.get("survivor", False)
        # installed-memory-cleanup (memory_cleanup.py): a fresh engine replacing one in the same process, and the
        # source's data MRs open to memory-window binds.
        self.replacement = False
        self.binds_window = False
        if "reuse_epoch" in self.defects:
            # The defect: an epoch derived from the registration, so every process of it has the same one.
            digest = hashlib.sha256(case["registration_id"].encode()).digest()
            self.epoch = int.from_bytes(digest[:8], "little") % ((1 << 63) - 1) + 1
        else:
            self.epoch = _rng.randrange(1, 1 << 63)
        self.peer_epochs = []  # every epoch a peer announced to this process, in order (the survivor's stale ones)
        self.base_seed = case["seed"] if case["seed"] is not None else fresh_u64()
        self.first_seed = None  # round 1's input seed (the stale_input defect reuses it)
        self.table = ResourceTable()
        self.arena = bytearray(self.parents * content.stride(self.payload))
        self.contexts = {}  # rail -> {"ctx", "pd", "cq", "channel", "mrs": {kind: mr}, "ctrl", "port", ...}
        self.qp_records = {}  # qpn -> ledger record
        self.all_qps = []  # every QP this engine created, destroyed or not
        self.kept_dead_qps = []  # keep_a_dead_peers_qp: a dead peer's QP the survivor kept past its restart
        self.listeners = []  # the source's listening socket
        self.round_no = 0
        self.rv = None
        self.rounds_failed_checks = False
        self.doc["epoch"] = self.epoch
        self.doc["restart"] = self.restart_record() if self.restart else None
        if self.inflight:
            self.doc["inflight"] = {"round": ROUNDS + 1, "survival": []}  # filled by inflight.py
        self.doc["verbs_library"] = provider.record()
        self.doc["workload"] = {
            "parents": self.parents,
            "payload": self.payload,
            "block": self.block,
            "num_lanes": self.lanes,
            "mask": self.mask,
            "enabled_rails": self.enabled_rails,
            "guard_bytes": content.GUARD_BYTES,
            "region_stride": content.stride(self.payload),
            "arena_bytes": len(self.arena),
            "send_queue_depth": SEND_QUEUE_DEPTH,
            "rounds": ROUNDS,
        }
        ident = sysfs.host_identity(case["root"])
        self.doc["hostname"] = ident["hostname"]
        self.doc["boot_id"] = ident["boot_id"]

    # ------------------------------------------------------------------ setup

    def choose_rails(self):
        root = self.case["root"]
        if self.case["discovery"] is None:
            return [sysfs.describe_rail(root, r["device"], r["port"], r["gid_index"]) for r in self.case["rails"]]
        disc = self.case["discovery"]
        found = sysfs.discover(root, disc["whitelist"], disc["blacklist"])
        self.doc["discovery"] = found
        if not found["candidates"]:
            found["strict_gid_request"] = None
            raise unavailable("open_device", "discovery: no candidate RNIC (see discovery.excluded)")
        first = found["candidates"][0]
        found["strict_gid_request"] = strict_gid_request(self.provider, root, first["device"], first["port"])
        if len(found["candidates"]) < len(RAILS):
            raise unavailable("open_device", f"discovery: {len(found['candidates'])} candidate RNIC(s), "
                              f"both rails need one (chosen {found['chosen_nic_ids']})")
        return [sysfs.describe_rail(root, c["device"], c["port"], c["gid_index"])
                for c in found["candidates"][: len(RAILS)]]

    def open(self):
        rails = self.choose_rails()
        for rail, info in zip(RAILS, rails):
            try:
                self._open_rail(rail, info)
            except VerbsError as exc:
                raise unavailable("open_device", f"rail {rail} ({info['device']}): {exc}") from None
        self._render_contexts()

    def _open_rail(self, rail, info):
        ctx = open_device(self.provider, self.table, rail, info["device"])
        entry = {"ctx": ctx, "pd": None, "cq": None, "channel": None, "mrs": {}, "ctrl": bytearray(CTRL_BYTES),
                 "port": info["port"], "gid_index": info["gid_index"]}
        self.contexts[rail] = entry  # before the rest, so teardown releases what was acquired
        # The AV's source GID is the provider's; it must be the GID the host's sysfs shows.
        raw = ctx.query_gid(info["port"], info["gid_index"])
        if gid_text(raw) != info["gid"]:
            raise unavailable("open_device", f"{info['device']} port {info['port']} GID {info['gid_index']}: "
                              f"the verbs library reports {gid_text(raw)}, sysfs {info['gid']}")
        entry["gid"] = raw
        entry["pd"] = ctx.alloc_pd()
        entry["channel"] = ctx.create_comp_channel() if self.events else None
        entry["cq"] = ctx.create_cq(CQ_DEPTH, entry["channel"])
        # Persistent MRs on every context, whatever the mask (mr_one_context: only enabled rails).
        if "mr_one_context" not in self.defects or rail in self.enabled_rails:
            # installed-interruption: the source binds a memory window over its data MR to grant a round.
            access = DATA_ACCESS | ACCESS_MW_BIND if self.interruption or self.binds_window else DATA_ACCESS
            entry["mrs"]["data"] = ctx.reg_mr(entry["pd"], self.arena, "data", access)
            entry["mrs"]["ctrl"] = ctx.reg_mr(entry["pd"], entry["ctrl"], "ctrl")
        self.doc["rails"].append({
            "rail": rail, "device": info["device"], "port": info["port"], "gid_index": info["gid_index"],
            "gid": info["gid"], "gid_type": info["gid_type"], "netdev": info["netdev"],
            "numa_node": info["numa_node"], "enabled": rail in self.enabled_rails,
            "context": ctx.handle, "nic_id": info["nic_id"],
        })

    def segment(self, rail):
        """What a peer needs of this engine's MRs on ``rail`` (keys and iova addresses), or None."""
        mrs = self.contexts[rail]["mrs"]
        if "data" not in mrs:
            return None
        return {"rail": rail, "data_rkey": mrs["data"].rkey, "data_addr": mrs["data"].addr,
                "data_length": mrs["data"].length, "ctrl_rkey": mrs["ctrl"].rkey, "ctrl_addr": mrs["ctrl"].addr}

    def _render_contexts(self):
        out = []
        for rail in RAILS:
            entry = self.contexts.get(rail)
            if entry is None or entry["cq"] is None:
                continue  # a set-up that failed half-way: its owners are counted at teardown
            ch, cq = entry["channel"], entry["cq"]
            mrs = []
            for mr in entry["mrs"].values():
                mrs.append({"mr": mr.handle, "kind": mr.kind_name, "length": mr.length, "lkey": mr.lkey,
                            "rkey": mr.rkey, "registered_round": 0,
                            "deregistered_round": "teardown" if not mr.live else None, "live": mr.live})
            out.append({"context": entry["ctx"].handle, "rail": rail, "device": entry["ctx"].device,
                        "pd": entry["pd"].handle,
                        "cqs": [{"cq": cq.handle, "depth": cq.depth, "channel": ch.handle if ch else None}],
                        "completion_channel": ch.handle if ch else None, "mrs": mrs})
        self.doc["contexts"] = out

    # ------------------------------------------------------------------ QPs

    def new_qp(self, rail, lane, round_no, max_send_wr=SEND_QUEUE_DEPTH):
        entry = self.contexts[rail]
        try:
            qp = entry["ctx"].create_qp(entry["pd"], entry["cq"], lane, self.operation, max_send_wr)
        except VerbsError as exc:
            raise unavailable("connect_qp", f"rail {rail} lane {lane}: {exc}", round_no=round_no) from None
        record = {"qpn": qp.qpn, "context": entry["ctx"].handle, "rail": rail, "lane": lane,
                  "operation": self.operation, "cq": entry["cq"].handle, "peer_qpn": None,
                  "max_send_wr": max_send_wr, "created_round": round_no, "destroyed_round": None, "state": "RTS"}
        self.qp_records[qp.qpn] = record
        self.doc["qps"].append(record)
        self.all_qps.append(qp)
        return qp

    def qp_offer(self, qp):
        """This QP as the peer needs it (QPN, GID, the data MR's rkey and address), as on RoCE."""
        entry = self.contexts[qp.context.rail]
        seg = self.segment(qp.context.rail) or {"data_rkey": 0, "data_addr": 0}
        return {"rail": qp.context.rail, "lane": qp.lane, "operation": qp.operation, "qpn": qp.qpn,
                "gid": gid_text(entry["gid"]), "rkey": seg["data_rkey"], "addr": seg["data_addr"]}

    def connect_qp(self, qp, peer, round_no):
        """Move ``qp`` to RTS towards the peer QP ``peer`` (an offer: qpn, gid)."""
        entry = self.contexts[qp.context.rail]
        try:
            qp.connect(entry["port"], entry["gid_index"], int(peer["qpn"]), bytes.fromhex(
                str(peer["gid"]).replace(":", "")))
        except (VerbsError, ValueError) as exc:
            raise EngineError("ProtocolError", "connect_qp", f"QP {qp.qpn} to peer {peer}: {exc}",
                              round_no=round_no) from None
        self.qp_records[qp.qpn]["peer_qpn"] = qp.peer_qpn

    def destroy_qp(self, qp, when):
        qp.destroy()
        record = self.qp_records[qp.qpn]
        record["destroyed_round"] = when
        record["state"] = "DESTROYED"

    # ------------------------------------------------------------------ rounds

    def local_input(self, round_no):
        """Data side: this round's input seed, its payload written into the arena.

        stale_input: from round 2 on, round 1's seed again and the arena left as it is."""
        if "stale_input" in self.defects and self.first_seed is not None:
            return self.first_seed
        seed = content.round_seed(self.base_seed, self.epoch,
                                  round_no + ROUNDS_PER_SEED_SPACE * (self.generation - 1))
        content.fill_input(self.arena, self.parents, self.payload, seed)
        if self.first_seed is None:
            self.first_seed = seed
        return seed

    def poison_destination(self):
        """Destination side: poison every payload region behind fresh guards; returns the guard seed."""
        guard_seed = fresh_u64()
        content.prepare_destination(self.arena, self.parents, self.payload, guard_seed)
        return guard_seed

    def spoil_landed(self, first, last):
        """Destination-side defects, applied by this engine to its own buffer once bytes of parent 0 landed
        (round 1 only; the provider moved them intact): ``first`` = its first slice landed (corrupt_byte
        flips the first payload byte), ``last`` = its last one (overwrite_guard flips the byte after it)."""
        if self.round_no != 1:
            return
        start = content.region_offset(0, self.payload)
        if "corrupt_byte" in self.defects and first:
            self.arena[start] ^= 0xFF
        if "overwrite_guard" in self.defects and last:
            self.arena[start + self.payload] ^= 0xFF

    def ship_payload_over_rendezvous(self, round_no):
        """payload_over_rendezvous: the data side also sends every parent's payload as rendezvous messages."""
        for p in range(self.parents):
            off = content.region_offset(p, self.payload)
            self.rv.send("PAYLOAD", round=round_no, parent=p,
                         data=base64.b64encode(self.arena[off : off + self.payload]).decode())

    def parent_entry(self, pid, rail, lane, qpn, requested, completed, slices, status):
        return {"parent": pid, "rail": rail, "lane": lane, "qpn": qpn, "requested_bytes": requested,
                "completed_bytes": completed, "slices": slices, "status": status,
                "region_offset": content.region_offset(pid, self.payload), "byte_check": None,
                "guard_check": None, "error": None}

    def check_parent(self, entry, expected, guard_seed, operation, round_no):
        """Destination side: the byte and guard checks of one parent; a parent not already failed
        fails CheckFailed when they differ. True when this check failed it."""
        byte_check, guard_check = content.check_region(self.arena, entry["parent"], expected, guard_seed)
        entry["byte_check"], entry["guard_check"] = byte_check, guard_check
        if entry["status"] == "Failed" or (byte_check["ok"] and guard_check["ok"]):
            return False
        entry["status"] = "Failed"
        entry["error"] = EngineError("CheckFailed", operation, "destination bytes or guards differ",
                                     round_no=round_no, parent=entry["parent"]).as_dict()
        return True

    def new_public(self):
        return {"bytes": 0, "per_rail": {str(r): 0 for r in self.enabled_rails}}

    def mark_counters(self, rnd):
        """Snapshot the provider's counters, for the process and per rail's context, at the round's start."""
        rnd.provider_before = self.provider.counters()
        rnd.device_before = self.device_snapshot()

    def device_snapshot(self):
        return {rail: entry["ctx"].device_counters() for rail, entry in self.contexts.items() if entry["ctx"].live}

    def device_counters(self, before):
        """What the provider moved through each rail's context since ``before``: its own per-device count."""
        now = self.device_snapshot()
        return {str(rail): {k: now[rail][k] - before[rail][k] for k in now[rail]} for rail in sorted(now)
                if rail in before}

    def drain_state(self, wrs, qps, grants):
        """A round's drain record, counted from this engine's own state: WRs of its records without a
        completion and their bytes, the send-queue slots the provider says its QPs still hold, the grants
        it still holds."""
        pending = [w for w in wrs if w["completed_seq"] is None]
        slots = sum(qp.provider_outstanding() for qp in qps)
        debt = {"wrs": max(len(pending), slots), "bytes": sum(w["bytes"] for w in pending), "grants": grants}
        return {"drained": not any(debt.values()), "debt_wrs": debt["wrs"], "debt_bytes": debt["bytes"],
                "debt_grants": debt["grants"], "provider_outstanding_wrs": slots}

    def record_round(self, rnd, *, batches, parents, wrs, usage, public, drain, progress, skew_rail=None,
                     at_drain=None):
        """Append the round's ledger record (docs/receipts.md section 1) and return it. ``at_drain``: the
        provider's counters (``provider``, ``device``) read before the drain was announced to the peer (whose
        next round may start at once), else they are read here."""
        report_progress(self, rnd.round_no, ROUNDS, "drained", sum(1 for w in wrs if w["completed_seq"] is not None),
                        len(wrs), len(wrs))
        at_drain = at_drain or {}
        now = at_drain.get("provider") or self.provider.counters()
        finished = time.time()
        record = {
            "round": rnd.round_no, "epoch": self.epoch, "peer_epoch": self.rv.peer_epoch, "input_seed": rnd.seed,
            "seed_origin": rnd.origin, "guard_seed": rnd.guard_seed, "started_at": rnd.started, "finished_at": finished,
            "duration_s": round(finished - rnd.started, 6), "batches": batches, "parents": parents,
            "wrs": wr_columns(wrs),
            "qp_usage": usage, "qps_created": len(rnd.created),
            "qps_reused": sum(1 for u in usage if u["reused"]),
            "counters": {"public": public, "native": self.native_counters(rnd.native_before, skew_rail)},
            "drain": drain, "progress": progress, "rendezvous": self.rv.counters(rnd.round_no),
            "provider": {k: now[k] - rnd.provider_before[k] for k in now},
            "device": at_drain.get("device") or self.device_counters(rnd.device_before),
            "errors": [],
        }
        (self.doc["rounds"] if self.survival_rounds is None else self.survival_rounds).append(record)
        return record

    def native_snapshot(self):
        return {rail: self.contexts[rail]["ctx"].native.snapshot() for rail in RAILS}

    def native_counters(self, before, skew_rail=None):
        per_rail = {}
        for rail in self.enabled_rails:
            now = self.contexts[rail]["ctx"].native.snapshot()
            per_rail[str(rail)] = {k: now[k] - before[rail][k] for k in ("bytes", "wrs", "cqes")}
        if skew_rail is not None:
            per_rail[str(skew_rail)]["bytes"] += 1
        return {"bytes": sum(v["bytes"] for v in per_rail.values()),
                "wrs": sum(v["wrs"] for v in per_rail.values()),
                "cqes": sum(v["cqes"] for v in per_rail.values()),
                "per_rail": per_rail}

    def checkpoint(self):
        self.ledger.checkpoint()

    # ------------------------------------------------------------------ restart (docs/restart.md)

    def restart_record(self):
        record = {"fault_role": self.profile["fault_role"], "survivor": self.survivor, "generation": self.generation,
                  "retired_qps": [], "stale_probes": [], "restart_point": None}
        if self.interruption:
            record.update(interruption=None, recovery=None)
        if self.lost_mode:
            record.update(lost=None, recovery=None)
        if self.cleanup:
            record.update(cleanup=None, recovery=None)
        return record

    # ------------------------------------------------------------------ lost completions (docs/lost_completion.md)

    def recover_lost(self, qps, drain, when="restart"):
        """The survivor after its peer died while completions were lost: every affected QP is destroyed first,
        each destroy a receipt (result and time), and only then ``drain()`` releases what the engine still owns
        (SQ debt, loans, grants) and returns its receipt; ``when``: the QP records' destroyed_round.
        drain_before_destroy (installed-inflight-dma: inflight_drain_first): the drain comes first;
        drain_first_renumbered: it comes first and the steps are written as if it came last."""
        steps = []

        def destroy_all():
            for qp in qps:
                if not qp.live:
                    continue
                try:
                    self.destroy_qp(qp, when)
                    result = "Ok"
                except VerbsError as exc:
                    result = f"Failed: {exc}"
                steps.append({"step": len(steps), "at": time.time(), "action": "destroy_qp", "qpn": qp.qpn,
                              "result": result})

        def drain_all():
            record = drain()
            # The provider's own count of live QPs when the drain is receipted (0 once every destroy came first).
            record.update(step=len(steps), at=time.time(), action="drain", provider_qps=self.provider.held()["qp"])
            steps.append(record)

        renumbered = "drain_first_renumbered" in self.defects
        drain_first = renumbered or "drain_before_destroy" in self.defects or "inflight_drain_first" in self.defects
        for action in ((drain_all, destroy_all) if drain_first else (destroy_all, drain_all)):
            action()
        if renumbered:  # the defect: the steps told as destroys first (the provider's count too), times kept
            steps.sort(key=lambda step: step["action"] != "destroy_qp")
            for number, step in enumerate(steps):
                step["step"] = number
                if step["action"] == "drain":
                    step["provider_qps"] = 0
        self.forget_qps()
        return {"affected_qps": sorted(qp.qpn for qp in qps), "steps": steps}

    # ------------------------------------------------------------------ interruption (docs/interruption.md)

    def held_snapshot(self):
        """What must not move while an authorization is held: bytes (the provider's and the engine's own),
        QPs created (the engine's table and the provider's count of live ones)."""
        provider = self.provider.counters()
        return {"at": time.time(), "provider_bytes": sum(provider[k] for k in BYTE_COUNTERS),
                "native_bytes": sum(e["ctx"].native.bytes for e in self.contexts.values()),
                "qps_created": self.table.acquired_kinds.get("qp", 0), "provider_qps": self.provider.held()["qp"]}

    def reclaim_lanes(self, deadline_s=RECLAIM_S):
        """The survivor after its peer died holding an authorization: every QP towards the dead peer goes to
        ERR, what was still queued on it (the source's completion receive) completes flushed and is polled,
        and the CQs are polled empty; the QPs are retired afterwards (next_generation). skip_rq_drain: the
        QPs are retired as they are, the receive never polled."""
        lanes, flushed = [], []
        qps = self.live_qp_list()
        if "skip_rq_drain" not in self.defects:
            for qp in qps:
                if qp.state != "ERR":
                    qp.to_error()
            by_qpn = {qp.qpn: qp for qp in qps}
            deadline = time.monotonic() + deadline_s
            while any(qp.receives or qp.outstanding for qp in qps) and time.monotonic() < deadline:
                got = 0
                for rail in self.enabled_rails:
                    for wr_id, status, _len, qpn in self.contexts[rail]["cq"].poll():
                        got += 1
                        qp = by_qpn.get(qpn)
                        kind = "recv" if wr_id >= RECV_WR_ID else "send"
                        if qp is not None and kind == "recv":
                            qp.receives -= 1
                        elif qp is not None:
                            qp.retire()
                        flushed.append({"qpn": qpn, "wr_id": wr_id, "kind": kind,
                                        "status": WC_STATUS_NAMES.get(status, str(status))})
                if not got:
                    time.sleep(0.005)
        empty = all(not self.contexts[rail]["cq"].poll() for rail in self.enabled_rails)
        for qp in qps:
            lanes.append({"rail": qp.context.rail, "lane": qp.lane, "qpn": qp.qpn, "state": qp.state,
                          "receives_pending": qp.receives, "wrs_pending": qp.outstanding})
        return {"lanes": lanes, "flushed": flushed, "cqs_empty": empty,
                "pds": [e["pd"].handle for _r, e in sorted(self.contexts.items())]}

    def note_peer_epoch(self, epoch):
        self.peer_epochs.append(epoch)

    def at_restart_point(self):
        """End of a nonfinal generation, three rounds drained: write this generation's ledger as final
        ('idle') with what is still held, then the restart-point receipt the controller waits for before
        it kills the fault role. Cached QPs and the persistent MRs stay live (drop_cached_qps: the QPs go)."""
        if "drop_cached_qps" in self.defects:
            for qp in self.live_qp_list():
                self.destroy_qp(qp, "restart")
            self.forget_qps()
        live_qps = [qp.qpn for qp in self.all_qps if qp.live]
        self._render_contexts()
        self.doc["restart"]["restart_point"] = {
            "at": time.time(), "qps_live": live_qps,
            "mrs_live": sum(1 for e in self.contexts.values() for mr in e["mrs"].values() if mr.live),
            "provider_held": self.provider.held(), "table_live": self.table.live_count(),
        }
        self.totals()  # of this generation: its ledger is final
        self.ledger.idle()
        write_json_atomic(os.path.join(self.output, RESTART_POINT_NAME), {
            "schema": "orbite.runner-restart-point", "version": 1, "protocol": self.case["protocol"],
            "pid": os.getpid(), "role": self.role, "generation": self.generation, "epoch": self.epoch,
            "survivor": self.survivor, "rounds": len(self.doc["rounds"])})
        print(f"orbite-runner: restart point of generation {self.generation}", flush=True)

    def await_kill(self):
        """The fault role after its restart point: idle with everything cached until the supervisor kills it."""
        try:  # no message is due: any one is a ProtocolError, the end of the rendezvous a PeerLost
            msg = self.rv.recv(self.timeouts["restart_s"], [])
        except EngineError as exc:
            if exc.error == "PeerLost":
                raise peer_gone(f"the survivor went away at the restart point ({exc.message})") from None
            if exc.error != "Timeout":
                raise
            raise EngineError("Timeout", "restart", f"not killed within {self.timeouts['restart_s']:g} s of the "
                              "restart point") from None
        raise EngineError("ProtocolError", "restart", f"unexpected {msg['kind']} while idle for the kill")

    def await_peer_death(self):
        """The survivor after its restart point: its peer's rendezvous ends when the supervisor kills it."""
        try:  # no message is due: only the end of the rendezvous
            msg = self.rv.recv(self.timeouts["restart_s"], [])
        except EngineError as exc:
            if exc.error == "Timeout":
                raise EngineError("Timeout", "restart", f"the {self.peer_role()} was not killed within "
                                  f"{self.timeouts['restart_s']:g} s of the restart point") from None
            if exc.error != "PeerLost":
                raise
            self.rv.close()
            return
        raise EngineError("ProtocolError", "restart", f"unexpected {msg['kind']} while the peer should die")

    def peer_role(self):
        return "requester" if self.role == "source" else "source"

    def next_generation(self):
        """The survivor moves to the next generation: a ledger of its own in the sibling ``g<N>`` directory,
        same pid, engine, epoch, registration and MRs; the QPs of the dead peer are retired (destroyed);
        survivor_reregisters: the MRs are registered again (new keys), which the survivor must never do."""
        self.generation += 1
        self.output = os.path.join(os.path.dirname(os.path.normpath(self.output)), f"g{self.generation}")
        os.makedirs(self.output, mode=0o700, exist_ok=True)
        previous = self.doc
        case = dict(self.case, generation=self.generation)
        self.ledger = Ledger(os.path.join(self.output, "ledger.json"), case, case["defects"])
        self.doc = self.ledger.doc
        self.doc["pid"] = previous["pid"]
        self.doc["started_at"] = previous["started_at"]
        for key in ("hostname", "boot_id", "epoch", "verbs_library", "workload", "rails", "discovery",
                    "service_address", "peer_registration_id"):
            self.doc[key] = copy.deepcopy(previous[key])
        self.doc["restart"] = self.restart_record()
        retired = []
        live = self.live_qp_list()
        if "keep_a_dead_peers_qp" in self.defects:  # the defect: one QP of the dead peer kept, untold, to teardown
            self.kept_dead_qps.append(live.pop())
            self.all_qps.remove(self.kept_dead_qps[-1])
        for qp in live:
            self.destroy_qp(qp, "restart")
            retired.append(qp.qpn)
        self.forget_qps()
        self.doc["restart"]["retired_qps"] = retired
        self.qp_records = {}
        if "survivor_reregisters" in self.defects:
            for entry in self.contexts.values():
                for kind, mr in list(entry["mrs"].items()):
                    buffer = self.arena if kind == "data" else entry["ctrl"]
                    mr.dereg()
                    entry["mrs"][kind] = entry["ctx"].reg_mr(entry["pd"], buffer, kind)
        self._render_contexts()
        self.round_no = 0
        self.checkpoint()

    def stale_probes(self):
        """The survivor, with its peer's fresh epoch known: every earlier epoch of the peer must fail both
        open_segment and a data submission with EpochMismatch, before any verbs call (no QP, no WR, no byte,
        RemoteEffect None, drained locally). The typed errors go to ``errors``, the probes' before/after
        counts to ``restart.stale_probes``."""
        current = self.rv.peer_epoch
        for stale in self.peer_epochs[:-1]:
            for operation in ("open_segment", "submit"):
                self.doc["restart"]["stale_probes"].append(self._stale_probe(operation, stale, current))
        self.checkpoint()

    def _stale_probe(self, operation, stale, current):
        provider_before, held_before = self.provider.counters(), self.provider.held()
        native_before, qps_before = self.native_snapshot(), self.table.acquired_kinds.get("qp", 0)
        probe_qp = None
        if "stale_epoch_qp" in self.defects:  # the defect: a QP for the stale segment before the epoch check
            rail = self.enabled_rails[0]
            entry = self.contexts[rail]
            probe_qp = entry["ctx"].create_qp(entry["pd"], entry["cq"], 0, self.operation, SEND_QUEUE_DEPTH)
        error = None
        if stale != current and "stale_epoch_accepted" not in self.defects:
            peer = self.doc.get("peer_registration_id") or "the peer"
            error = EngineError("EpochMismatch", operation, f"segment of {peer} at epoch {stale}, the peer is now "
                                f"epoch {current}", remote_effect="None", locally_drained=True, expected=True)
        if "stale_epoch_wr" in self.defects:
            self._stale_wr(operation)
        if probe_qp is not None:
            probe_qp.destroy()
        provider_after, native_after = self.provider.counters(), self.native_snapshot()
        qps_created = self.table.acquired_kinds.get("qp", 0) - qps_before
        wrs = sum(native_after[r]["wrs"] - native_before[r]["wrs"] for r in RAILS)
        nbytes = sum(provider_after[k] - provider_before[k] for k in BYTE_COUNTERS)
        drained = all(qp.outstanding == 0 for qp in self.all_qps if qp.live)
        if "stale_epoch_wr" in self.defects:  # the defect's engine keeps its probe record clean
            qps_created, wrs = 0, 0
        if error is not None:
            error.qps_created, error.wrs_posted, error.nbytes, error.locally_drained = qps_created, wrs, nbytes, drained
            self.doc["errors"].append(error.as_dict())
        return {"operation": operation, "peer_epoch": stale, "current_peer_epoch": current,
                "result": "EpochMismatch" if error is not None else "Ok", "qps_created": qps_created,
                "wrs_posted": wrs, "bytes": nbytes, "remote_effect": "None", "locally_drained": drained,
                "provider_held_before": held_before, "provider_held_after": self.provider.held()}

    def _stale_wr(self, operation):
        """stale_epoch_wr: one WR posted towards the stale segment before the epoch check, on a QP of its own
        moved to ERR (the provider accepts it and flushes it at once), its completion reaped, the QP destroyed."""
        rail = self.enabled_rails[0]
        entry = self.contexts[rail]
        mr = entry["mrs"]["data"]
        qp = entry["ctx"].create_qp(entry["pd"], entry["cq"], 0, self.operation, SEND_QUEUE_DEPTH)
        try:
            qp.to_error()
            qp.post_send((1 << 62) + len(self.doc["restart"]["stale_probes"]), mr.addr, 1, mr.lkey, 0, 0)
            deadline = time.monotonic() + 5
            while qp.outstanding and time.monotonic() < deadline:
                for _wc in entry["cq"].poll(1):
                    qp.retire()
        finally:
            qp.destroy()  # never listed in the ledger's QPs

    def live_qp_list(self):
        return [qp for qp in self.all_qps if qp.live]

    def forget_qps(self):
        """Drop the role's map of live QPs (each role keeps its own)."""

    # ------------------------------------------------------------------ end

    def teardown(self, qps, debt):
        """Destroy everything this engine holds and record what was released and what stayed."""
        for qp in self.kept_dead_qps:  # keep_a_dead_peers_qp: destroyed here, counted nowhere
            qp.destroy()
        record = {"drained": not any(debt.values()), "debt_wrs": debt.get("wrs", 0),
                  "debt_bytes": debt.get("bytes", 0), "debt_grants": debt.get("grants", 0),
                  "qps_destroyed": 0, "mrs_deregistered": 0, "contexts_closed": 0, "retained_owners": 0,
                  "provider_held": None, "errors": []}

        def attempt(action, *args):
            try:
                action(*args)
                return True
            except VerbsError as exc:  # the object stays held: it is counted in retained_owners
                record["errors"].append(EngineError("Unquiesced", "close", str(exc)).as_dict())
                return False

        for qp in qps:
            if qp.live and attempt(self.destroy_qp, qp, "teardown"):
                record["qps_destroyed"] += 1
        window = getattr(self, "mw", None)  # a grant's memory window still bound (a failed interruption)
        if window is not None and window.live:
            attempt(window.dealloc)
        for rail in RAILS:
            entry = self.contexts.get(rail)
            if entry is None:
                continue
            for mr in entry["mrs"].values():
                if mr.live and attempt(mr.dereg):
                    record["mrs_deregistered"] += 1
            for owner, release in ((entry["cq"], "destroy"), (entry["channel"], "destroy"), (entry["pd"], "dealloc")):
                if owner is not None and owner.live:
                    attempt(getattr(owner, release))
            if entry["ctx"].live and attempt(entry["ctx"].close):
                record["contexts_closed"] += 1
        record["retained_owners"] = self.table.live_count()
        # The provider's own count is the second witness of what stayed held.
        held = self.provider.held()
        record["provider_held"] = held
        if sum(held.values()) != record["retained_owners"] + self.held_elsewhere():
            record["errors"].append(EngineError(
                "Internal", "close", f"the resource table holds {record['retained_owners']} owner(s), the verbs "
                f"provider {held}").as_dict())
        if self.contexts:
            self._render_contexts()
        self.doc["teardown"] = record
        return record

    def held_elsewhere(self):
        """Provider objects of this process that another engine still owns (installed-memory-cleanup: the old
        engine's quarantine), so the provider's process-wide count is this engine's plus these."""
        return 0

    def abort(self):
        """After a failure: stop the rendezvous and release what is still held, so the ledger says what stayed."""
        if self.doc["teardown"] is not None:
            return
        if self.rv is not None:
            try:
                self.rv.close()
            except Exception as exc:  # recorded, never raised: the original error is the one that counts
                print(f"orbite-runner: cleanup: {exc}", file=sys.stderr)
        for listener in self.listeners:
            listener.close()
        try:
            self.teardown(self.all_qps, {})
        except Exception as exc:
            print(f"orbite-runner: teardown: {exc}", file=sys.stderr)

    def totals(self):
        rounds = self.doc["rounds"]
        persistent = sum(1 for c in self.doc["contexts"] for m in c["mrs"] if m["registered_round"] == 0)
        provider = dict.fromkeys(PROVIDER_COUNTERS, 0)
        for rnd in rounds:
            for key, value in rnd["provider"].items():
                provider[key] += value
        self.doc["totals"] = {
            "rounds_completed": len(rounds),
            "wrs_posted": sum(r["counters"]["native"]["wrs"] for r in rounds),
            "cqes": sum(r["counters"]["native"]["cqes"] for r in rounds),
            "public_bytes": sum(r["counters"]["public"]["bytes"] for r in rounds),
            "native_bytes": sum(r["counters"]["native"]["bytes"] for r in rounds),
            "qps_created": len(self.doc["qps"]),
            "persistent_mrs": persistent,
            "rendezvous_bytes_sent": sum(r["rendezvous"]["bytes_sent"] for r in rounds),
            "rendezvous_bytes_received": sum(r["rendezvous"]["bytes_received"] for r in rounds),
            "provider": provider,
        }

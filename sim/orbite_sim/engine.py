# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The engine both roles share: rails, contexts, persistent MRs, QP records, round records, teardown.

Shape (docs/runner-contract.md section 4): one context per rail with persistent MRs on both,
``num_lanes`` QPs per enabled rail created once and reused, three rounds with fresh input, all
parents of a round submitted as one batch and posted interleaved on their shared QPs (at most the
send-queue depth in flight per QP), completions reaped by polling or through completion channels.
Every ledger figure is counted here, in the role engines (``requester``, ``source``) or in the
verbs/NIC layers from the operations themselves.

Fault modes fit here later: generations and epochs are already on every rendezvous message, typed
errors carry RemoteEffect and drain facts, the resource table counts retained owners, the NIC can
withhold or fail completions, and teardown records each destroy.
"""

import os
import random
import sys
import time

from . import content, sysfs
from .errors import EngineError, unavailable
from .observer import AccountingObserver
from .verbs import Allocator, Context, ResourceTable

RAILS = (0, 1)
SEND_QUEUE_DEPTH = 8
ROUNDS = 3
CQ_DEPTH = 256
CTRL_BYTES = 4096

_rng = random.SystemRandom()


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


def strict_gid_request(root, device, port):
    """A separate engine asks for GID index 255 strictly; it must fail Unavailable and hold nothing."""
    table = ResourceTable()
    ctx = Context(table, Allocator(0), 0, device)
    result, error = "Ok", None
    try:
        sysfs.describe_rail(root, device, port, 255)
    except EngineError as exc:
        result = exc.error
        exc.expected = True
        error = exc.as_dict()
    finally:
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
        self.data_before = None  # data-channel counters when the round's traffic starts
        self.native_before = None  # native counters per rail when the transfer starts
        self.created = set()  # QPNs created for this round
        self.seed = None
        self.origin = None  # "local" on the data side, "peer" on the destination side
        self.guard_seed = None  # destination side only
        self.placement = None  # source: the parents ROUND_BEGIN placed


class Engine:
    """What both roles share: rails, contexts, persistent MRs, QP records, round records, teardown."""

    role = None

    def __init__(self, case, output, ledger):
        self.case = case
        self.output = output
        self.ledger = ledger
        self.doc = ledger.doc
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
        self.epoch = _rng.randrange(1, 1 << 63)
        self.base_seed = case["seed"] if case["seed"] is not None else fresh_u64()
        self.first_seed = None  # round 1's input seed (the stale_input defect reuses it)
        self.table = ResourceTable()
        self.alloc = Allocator(_rng.randrange(0x100, 0xF00000))
        self.arena = bytearray(self.parents * content.stride(self.payload))
        self.contexts = {}  # rail -> {"ctx", "pd", "cq", "channel", "mrs": {kind: mr}, "ctrl": bytearray}
        self.qp_records = {}  # qpn -> ledger record
        self.all_qps = []  # every QP this engine created, destroyed or not
        self.listeners = []  # the source's listening sockets
        self.observer = None
        self.round_no = 0
        self.rv = None
        self.nic = None
        self.rounds_failed_checks = False
        self.doc["epoch"] = self.epoch
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
        found["strict_gid_request"] = strict_gid_request(root, first["device"], first["port"])
        if len(found["candidates"]) < len(RAILS):
            raise unavailable("open_device", f"discovery: {len(found['candidates'])} candidate RNIC(s), "
                              f"both rails need one (chosen {found['chosen_nic_ids']})")
        return [sysfs.describe_rail(root, c["device"], c["port"], c["gid_index"])
                for c in found["candidates"][: len(RAILS)]]

    def open(self):
        rails = self.choose_rails()
        arena_view = memoryview(self.arena)
        for rail, info in zip(RAILS, rails):
            ctx = Context(self.table, self.alloc, rail, info["device"])
            pd = ctx.alloc_pd()
            channel = ctx.create_comp_channel() if self.events else None
            cq = ctx.create_cq(CQ_DEPTH, channel)
            ctrl = bytearray(CTRL_BYTES)
            mrs = {}
            # Persistent MRs on every context, whatever the mask (mr_one_context: only enabled rails).
            if "mr_one_context" not in self.defects or rail in self.enabled_rails:
                mrs["data"] = ctx.reg_mr(pd, arena_view, "data")
                mrs["ctrl"] = ctx.reg_mr(pd, memoryview(ctrl), "ctrl")
            self.contexts[rail] = {"ctx": ctx, "pd": pd, "cq": cq, "channel": channel, "mrs": mrs, "ctrl": ctrl}
            self.doc["rails"].append({
                "rail": rail, "device": info["device"], "port": info["port"], "gid_index": info["gid_index"],
                "gid": info["gid"], "gid_type": info["gid_type"], "netdev": info["netdev"],
                "numa_node": info["numa_node"], "enabled": rail in self.enabled_rails,
                "context": ctx.handle, "nic_id": info["nic_id"],
            })
        self._render_contexts()

    def attach_observer(self, parent_of):
        if "accounting" not in self.case["observers"]:
            return
        log_dir = self.case["observer_log_dir"] or self.output
        os.makedirs(log_dir, mode=0o700, exist_ok=True)
        self.observer = AccountingObserver(os.path.join(log_dir, "observer-accounting.jsonl"), parent_of,
                                           drop_first_completion="drop_observer_completion" in self.defects)
        for entry in self.contexts.values():
            entry["ctx"].observer = self.observer

    def _render_contexts(self):
        out = []
        for rail in RAILS:
            entry = self.contexts[rail]
            ch = entry["channel"]
            mrs = []
            for mr in entry["mrs"].values():
                mrs.append({"mr": mr.handle, "kind": mr.kind, "length": mr.length, "lkey": mr.lkey,
                            "rkey": mr.rkey, "registered_round": 0,
                            "deregistered_round": "teardown" if not mr.live else None, "live": mr.live})
            out.append({"context": entry["ctx"].handle, "rail": rail, "device": entry["ctx"].device,
                        "pd": entry["pd"].handle,
                        "cqs": [{"cq": entry["cq"].handle, "depth": entry["cq"].depth,
                                 "channel": ch.handle if ch else None}],
                        "completion_channel": ch.handle if ch else None, "mrs": mrs})
        self.doc["contexts"] = out

    # ------------------------------------------------------------------ QPs

    def new_qp(self, rail, lane, round_no, max_send_wr=SEND_QUEUE_DEPTH):
        entry = self.contexts[rail]
        qp = entry["ctx"].create_qp(entry["pd"], entry["cq"], lane, self.operation, max_send_wr)
        record = {"qpn": qp.qpn, "context": entry["ctx"].handle, "rail": rail, "lane": lane,
                  "operation": self.operation, "cq": entry["cq"].handle, "peer_qpn": None,
                  "max_send_wr": max_send_wr, "created_round": round_no, "destroyed_round": None, "state": "RTS"}
        self.qp_records[qp.qpn] = record
        self.doc["qps"].append(record)
        self.all_qps.append(qp)
        return qp

    def connect_qp(self, qp, peer_qpn, transmit):
        qp.connect(peer_qpn, transmit)
        self.qp_records[qp.qpn]["peer_qpn"] = peer_qpn

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
        seed = content.round_seed(self.base_seed, self.epoch, round_no)
        content.fill_input(self.arena, self.parents, self.payload, seed)
        if self.first_seed is None:
            self.first_seed = seed
        return seed

    def poison_destination(self):
        """Destination side: poison every payload region behind fresh guards; returns the guard seed."""
        guard_seed = fresh_u64()
        content.prepare_destination(self.arena, self.parents, self.payload, guard_seed)
        return guard_seed

    def after_land(self, offset, length):
        """Destination-side defects, called by the NIC when payload lands here: parent 0, round 1 only."""
        if self.round_no != 1:
            return
        start = content.region_offset(0, self.payload)
        if not start <= offset < start + self.payload:
            return
        if "corrupt_byte" in self.defects and offset == start:
            self.arena[offset] ^= 0xFF
        if "overwrite_guard" in self.defects and offset + length == start + self.payload:
            self.arena[offset + length] ^= 0xFF

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

    def record_round(self, rnd, *, batches, parents, wrs, usage, public, drain, progress, skew_rail=None):
        """Append the round's ledger record (docs/receipts.md section 1) and return it."""
        rendezvous, data_channel = self.traffic(rnd.round_no, rnd.data_before)
        finished = time.time()
        record = {
            "round": rnd.round_no, "epoch": self.epoch, "peer_epoch": self.rv.peer_epoch, "input_seed": rnd.seed,
            "seed_origin": rnd.origin, "started_at": rnd.started, "finished_at": finished,
            "duration_s": round(finished - rnd.started, 6), "batches": batches, "parents": parents, "wrs": wrs,
            "qp_usage": usage, "qps_created": len(rnd.created),
            "qps_reused": sum(1 for u in usage if u["reused"]),
            "counters": {"public": public, "native": self.native_counters(rnd.native_before, skew_rail)},
            "drain": drain, "progress": progress, "rendezvous": rendezvous, "data_channel": data_channel,
            "errors": [],
        }
        self.doc["rounds"].append(record)
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

    def traffic(self, round_no, data_before):
        data_now = self.nic.ch.counters()
        return self.rv.counters(round_no), {k: data_now[k] - data_before[k] for k in data_now}

    def checkpoint(self):
        self.ledger.checkpoint()
        if self.observer is not None:
            self.observer.flush()

    # ------------------------------------------------------------------ end

    def teardown(self, qps, debt):
        """Destroy everything this engine holds and record what was released and what stayed."""
        record = {"drained": not any(debt.values()), "debt_wrs": debt.get("wrs", 0),
                  "debt_bytes": debt.get("bytes", 0), "debt_grants": debt.get("grants", 0),
                  "qps_destroyed": 0, "mrs_deregistered": 0, "contexts_closed": 0, "retained_owners": 0,
                  "errors": []}
        for qp in qps:
            if qp.state != "DESTROYED":
                self.destroy_qp(qp, "teardown")
                record["qps_destroyed"] += 1
        for rail in RAILS:
            entry = self.contexts.get(rail)
            if entry is None:
                continue
            for mr in entry["mrs"].values():
                if mr.live:
                    mr.dereg()
                    record["mrs_deregistered"] += 1
            entry["cq"].destroy()
            if entry["channel"] is not None:
                entry["channel"].destroy()
            entry["pd"].dealloc()
            if not entry["ctx"].closed:
                entry["ctx"].close()
                record["contexts_closed"] += 1
        record["retained_owners"] = self.table.live_count()
        if self.contexts:
            self._render_contexts()
        self.doc["teardown"] = record
        if self.observer is not None:
            self.observer.close()
        return record

    def abort(self):
        """After a failure: stop threads and release what is still held, so the ledger can say what stayed."""
        if self.doc["teardown"] is not None:
            return
        closers = (self.nic and self.nic.stop, self.rv and self.rv.close)
        for closer in closers:
            if closer:
                try:
                    closer()
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
            "data_payload_bytes_sent": sum(r["data_channel"]["payload_bytes_sent"] for r in rounds),
            "data_payload_bytes_received": sum(r["data_channel"]["payload_bytes_received"] for r in rounds),
        }

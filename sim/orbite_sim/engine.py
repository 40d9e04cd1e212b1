"""The simulated engine: requester and source, rounds, batches, slicing, progress and drain.

Shape (docs/runner-contract.md section 4): one context per rail with persistent MRs on both,
``num_lanes`` QPs per enabled rail created once and reused, three rounds with fresh input, all
parents of a round submitted as one batch and posted interleaved on their shared QPs (at most the
send-queue depth in flight per QP), completions reaped by polling or through completion channels.
Every ledger figure is counted here or in the verbs/NIC layers from the operations themselves.

Fault modes fit here later: generations and epochs are already on every rendezvous message, typed
errors carry RemoteEffect and drain facts, the resource table counts retained owners, the NIC can
withhold or fail completions, and teardown records each destroy.
"""

import collections
import os
import random
import select
import socket
import time

from . import content, sysfs, wire
from .case import format_address, parse_address
from .errors import EngineError, protocol_error, unavailable
from .ledger import write_json_atomic
from .nic import RequesterNic, SourceNic
from .observer import AccountingObserver
from .verbs import OPCODES, WC_STATUS_NAMES, WC_SUCCESS, Allocator, Context, ResourceTable, VerbsError, WorkRequest

RAILS = (0, 1)
SEND_QUEUE_DEPTH = 8
ROUNDS = 3
CQ_DEPTH = 256
CTRL_BYTES = 4096
POLL_BATCH = 64
# Polling backs off after this many empty polls in a row, so the NIC thread gets the GIL.
SPIN_EMPTY_POLLS = 16
BACKOFF_S = 0.0001

_rng = random.SystemRandom()


def fresh_u64():
    return _rng.getrandbits(64)


def slice_plan(payload, block, wrong=False):
    """Slice sizes of one parent: max(1, payload // block) slices, the last takes the rest.

    ``wrong`` is the wrong_slicing defect: ceil(payload / block) slices, the last one short.
    """
    if wrong:
        count = -(-payload // block)
        return [block] * (count - 1) + [payload - block * (count - 1)]
    count = max(1, payload // block)
    return [block] * (count - 1) + [payload - block * (count - 1)]


class Engine:
    """What both roles share: rails, contexts, persistent MRs, QP records, teardown."""

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
        self.table = ResourceTable()
        self.alloc = Allocator(_rng.randrange(0x100, 0xF00000))
        self.arena = bytearray(self.parents * content.stride(self.payload))
        self.contexts = {}  # rail -> {"ctx", "pd", "cq", "channel", "mrs": {kind: mr}, "ctrl": bytearray}
        self.qp_records = {}  # qpn -> ledger record
        self.live_qps = {}  # (rail, lane) -> QueuePair for the requester; qpn -> QueuePair for the source
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

    def new_qp(self, rail, lane, round_no, max_send_wr=SEND_QUEUE_DEPTH):
        entry = self.contexts[rail]
        qp = entry["ctx"].create_qp(entry["pd"], entry["cq"], lane, self.operation, max_send_wr)
        record = {"qpn": qp.qpn, "context": entry["ctx"].handle, "rail": rail, "lane": lane,
                  "operation": self.operation, "cq": entry["cq"].handle, "peer_qpn": None,
                  "max_send_wr": max_send_wr, "created_round": round_no, "destroyed_round": None, "state": "RTS"}
        self.qp_records[qp.qpn] = record
        self.doc["qps"].append(record)
        return qp

    def destroy_qp(self, qp, when):
        qp.destroy()
        record = self.qp_records[qp.qpn]
        record["destroyed_round"] = when
        record["state"] = "DESTROYED"

    def checkpoint(self):
        self.ledger.checkpoint()
        if self.observer is not None:
            self.observer.flush()

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

    def round_input_seed(self, round_no, first_seed):
        if "stale_input" in self.defects and first_seed is not None:
            return first_seed
        return content.round_seed(self.base_seed, self.epoch, round_no)


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


def _listen(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(4)
    return sock


def _tune(sock):
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
        except OSError:
            pass


def _accept(listener, timeout, what):
    listener.settimeout(timeout)
    try:
        sock, _ = listener.accept()
    except socket.timeout:
        raise EngineError("Timeout", "accept", f"no {what} connection within {timeout:g} s") from None
    sock.settimeout(None)
    _tune(sock)
    return sock


def _connect(host, port, timeout, what):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            sock = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
            sock.settimeout(None)
            _tune(sock)
            return sock
        except OSError as exc:
            last = exc
            time.sleep(0.05)
    raise EngineError("Timeout", "connect", f"{what} {format_address(host, port)} unreachable "
                      f"within {timeout:g} s ({last})")


def _profile_key(profile):
    return {k: profile[k] for k in ("mode", "operation", "rdma_events", "parents", "payload", "block",
                                    "num_lanes", "mask")}


# ====================================================================== requester


class RequesterEngine(Engine):
    role = "requester"

    def __init__(self, case, output, ledger):
        super().__init__(case, output, ledger)
        self.wr_parent = {}  # wr_id -> parent (the observer resolves parents with it)
        self.next_wr_id = 0
        self.seq = 0
        self.segments = {}
        self.first_seed = None
        self.all_qps = []
        self.sq_depth = SEND_QUEUE_DEPTH + 1 if "exceed_sq_depth" in self.defects else SEND_QUEUE_DEPTH

    def run(self):
        self.open()
        self.attach_observer(self.wr_parent.get)
        self.checkpoint()
        host, port = parse_address(self.case["peer_address"], "peer_address")
        sock = _connect(host, port, self.timeouts["connect_s"], "rendezvous")
        self.rv = wire.Rendezvous(sock, self.epoch)
        self.open_segment()
        for round_no in range(1, ROUNDS + 1):
            self.run_round(round_no)
            self.checkpoint()
        self.rv.send("BYE")
        self.rv.recv(self.timeouts["round_s"], ["BYE"])
        self.close()

    def open_segment(self):
        self.rv.send("HELLO", protocol=self.case["protocol"], role=self.role,
                     registration_id=self.case["registration_id"], generation=self.case["generation"],
                     target_registration_id=self.case["peer_registration_id"],
                     profile=_profile_key(self.profile))
        welcome = self.rv.recv(self.timeouts["connect_s"], ["WELCOME"])
        self.rv.peer_epoch = welcome["epoch"]
        self.doc["peer_epoch"] = welcome["epoch"]
        expected = self.case["peer_registration_id"]
        if expected is not None and welcome["registration_id"] != expected:
            raise unavailable("open_segment", f"source announced registration {welcome['registration_id']!r}, "
                              f"expected {expected!r}")
        self.segments = {int(s["rail"]): s for s in welcome["segments"]}
        host, port = parse_address(welcome["data_address"], "WELCOME.data_address")
        self.doc["data_address"] = welcome["data_address"]
        sock = _connect(host, port, self.timeouts["connect_s"], "data channel")
        channel = wire.DataChannel(sock)
        channel.send(wire.BIND, 0, welcome["token"], 0, 0)
        self.nic = RequesterNic(channel, self.rv, oob="payload_over_rendezvous" in self.defects,
                                payload_timeout=self.timeouts["round_s"])
        self.nic.after_land = self._after_land

    # --------------------------------------------------------------- QPs

    def ensure_qps(self, round_no):
        """QPs per enabled rail and lane, created in round 1 and reused (no_qp_reuse: recreated)."""
        retire = []
        if round_no > 1 and "no_qp_reuse" in self.defects:
            for qp in list(self.live_qps.values()):
                retire.append(qp.qpn)
                self.destroy_qp(qp, round_no)
            self.live_qps = {}
        wanted = [(rail, lane) for rail in self.enabled_rails for lane in range(self.lanes)]
        if "extra_qp" in self.defects and round_no == 1:
            wanted.append((self.enabled_rails[0], self.lanes))
        created = []
        for key in wanted:
            if key not in self.live_qps:
                qp = self.new_qp(key[0], key[1], round_no, self.sq_depth)
                self.live_qps[key] = qp
                self.all_qps.append(qp)
                created.append(qp)
        if created or retire:
            self.rv.send("CONNECT_QPS", round=round_no, retire=retire,
                         qps=[{"rail": q.context.rail, "lane": q.lane, "operation": q.operation, "qpn": q.qpn}
                              for q in created])
            reply = self.rv.recv(self.timeouts["connect_s"], ["QPS_ACCEPTED"])
            peers = {int(k): v for k, v in reply["peer_qpns"].items()}
            for qp in created:
                qp.connect(peers[qp.qpn], self.nic.transmit)
                self.qp_records[qp.qpn]["peer_qpn"] = qp.peer_qpn
        return {q.qpn for q in created}

    # --------------------------------------------------------------- one round

    def placement(self):
        rails = self.enabled_rails[:1] if "single_rail" in self.defects else self.enabled_rails
        return [(rails[p % len(rails)], (p // len(rails)) % self.lanes) for p in range(self.parents)]

    def _after_land(self, wr):
        """Destination-side defects (READ lands here): act on parent 0 in round 1 only."""
        info = self.wr_info.get(wr.wr_id)
        if info is None or self.round_no != 1 or info["parent"] != 0:
            return
        if "corrupt_byte" in self.defects and info["slice"] == 0:
            self.arena[wr.local_offset] ^= 0xFF
        if "overwrite_guard" in self.defects and info["slice"] == self.slices_per_parent - 1:
            self.arena[wr.local_offset + wr.length] ^= 0xFF

    def run_round(self, round_no):
        self.round_no = round_no
        self.nic.round_no = round_no
        started = time.time()
        data_before = self.nic.ch.counters()
        existing = {qp.qpn for qp in self.live_qps.values()}
        created = self.ensure_qps(round_no)
        placement = self.placement()
        sizes = slice_plan(self.payload, self.block, wrong="wrong_slicing" in self.defects)
        self.slices_per_parent = len(sizes)
        parents_msg = [{"parent": p, "rail": rail, "lane": lane, "bytes": self.payload}
                       for p, (rail, lane) in enumerate(placement)]
        guard_seed = None
        if self.operation == "read":
            guard_seed = fresh_u64()
            content.prepare_destination(self.arena, self.parents, self.payload, guard_seed)
            self.rv.send("ROUND_BEGIN", round=round_no, parents=parents_msg)
            ready = self.rv.recv(self.timeouts["round_s"], ["ROUND_READY"])
            seed, origin = ready["input_seed"], "peer"
        else:
            seed, origin = self.round_input_seed(round_no, self.first_seed), "local"
            if not ("stale_input" in self.defects and self.first_seed is not None):
                content.fill_input(self.arena, self.parents, self.payload, seed)
            self.rv.send("ROUND_BEGIN", round=round_no, parents=parents_msg, input_seed=seed)
            self.rv.recv(self.timeouts["round_s"], ["ROUND_READY"])
        if self.first_seed is None:
            self.first_seed = seed

        prepared = time.time()
        native_before = self.native_snapshot()
        parents = []
        for p, (rail, lane) in enumerate(placement):
            parents.append({"parent": p, "rail": rail, "lane": lane, "qpn": self.live_qps[(rail, lane)].qpn,
                            "requested_bytes": self.payload, "completed_bytes": 0, "slices": len(sizes),
                            "status": "Pending", "region_offset": content.region_offset(p, self.payload),
                            "byte_check": None, "guard_check": None, "error": None})
        batch = {"batch": round_no, "parents": list(range(self.parents)), "state": "Running", "free": None}
        wrs, usage, progress, public = self.transfer(round_no, parents, sizes, created, existing)
        transferred = time.time()

        failed = [p for p in parents if p["status"] == "Failed"]
        batch["state"] = "Failed" if failed else "Completed"
        batch["free"] = "Ok"  # no WR is in flight any more, so free() succeeds
        if self.operation == "read":
            expected = content.RoundInput(seed, self.parents, self.payload)
            for p in parents:
                byte_check, guard_check = content.check_region(self.arena, p["parent"], expected, guard_seed)
                p["byte_check"], p["guard_check"] = byte_check, guard_check
                if p["status"] == "Completed" and not (byte_check["ok"] and guard_check["ok"]):
                    p["status"] = "Failed"
                    p["error"] = EngineError("CheckFailed", "wait", "destination bytes or guards differ",
                                             round_no=round_no, parent=p["parent"]).as_dict()
        if any(p["status"] != "Completed" for p in parents):
            self.rounds_failed_checks = True
        checked = time.time()
        self.rv.send("ROUND_DONE", round=round_no, released=list(range(self.parents)))
        self.rv.recv(self.timeouts["round_s"], ["ROUND_DRAINED"])
        rendezvous, data_channel = self.traffic(round_no, data_before)
        skew = self.enabled_rails[0] if ("skew_native_counter" in self.defects and round_no == 1) else None
        debt_wrs = sum(1 for w in wrs if w["completed_seq"] is None)
        debt_bytes = sum(w["bytes"] for w in wrs if w["completed_seq"] is None)
        finished = time.time()
        self.doc["rounds"].append({
            "round": round_no, "epoch": self.epoch, "peer_epoch": self.rv.peer_epoch, "input_seed": seed,
            "seed_origin": origin, "started_at": started, "finished_at": finished,
            "duration_s": round(finished - started, 6), "batches": [batch], "parents": parents, "wrs": wrs,
            "qp_usage": usage, "qps_created": len(created),
            "qps_reused": sum(1 for u in usage if u["reused"]),
            "counters": {"public": public, "native": self.native_counters(native_before, skew)},
            "drain": {"drained": debt_wrs == 0, "debt_wrs": debt_wrs, "debt_bytes": debt_bytes, "debt_grants": 0},
            "progress": progress, "rendezvous": rendezvous, "data_channel": data_channel, "errors": [],
            "timing": {"prepare_s": round(prepared - started, 6), "transfer_s": round(transferred - prepared, 6),
                       "check_s": round(checked - transferred, 6), "drain_s": round(finished - checked, 6)},
        })

    def transfer(self, round_no, parents, sizes, created, existing):
        """Post every slice of every parent, interleaved per QP, and reap all completions."""
        queues = collections.OrderedDict()
        for qp in self.live_qps.values():
            queues[qp] = collections.deque()
        serial = "serial_parents" in self.defects
        by_qp = collections.defaultdict(list)
        for p in parents:
            by_qp[self.live_qps[(p["rail"], p["lane"])]].append(p)
        for qp, plist in by_qp.items():
            order = ([(p, s) for p in plist for s in range(len(sizes))] if serial
                     else [(p, s) for s in range(len(sizes)) for p in plist])
            queues[qp].extend(order)
        usage = {}
        for qp in queues:
            usage[qp.qpn] = {"qpn": qp.qpn, "rail": qp.context.rail, "lane": qp.lane, "operation": qp.operation,
                             "created": qp.qpn in created, "reused": qp.qpn in existing, "wrs_posted": 0,
                             "cqes": 0, "cqes_error": 0, "bytes_posted": 0, "bytes_completed": 0,
                             "max_inflight_wrs": 0, "max_outstanding_parents": 0}
        flight = {qp.qpn: collections.Counter() for qp in queues}  # qpn -> parent -> WRs in flight
        remaining = {p["parent"]: len(sizes) for p in parents}
        failed = set()
        public = {"bytes": 0, "per_rail": {str(r): 0 for r in self.enabled_rails}}
        progress = {"mode": "events" if self.events else "polling", "poll_calls": 0, "empty_polls": 0,
                    "cqes_polled": 0, "cq_events": 0, "cq_arms": 0}
        wrs = []
        self.wr_info = {}
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        total = len(parents) * len(sizes)
        done = 0
        empty_run = 0
        armed = False
        deadline = time.monotonic() + self.timeouts["round_s"]
        cqs = [self.contexts[r]["cq"] for r in self.enabled_rails]
        channels = [self.contexts[r]["channel"] for r in self.enabled_rails] if self.events else []

        while done < total:
            for qp, queue in queues.items():
                counts = flight[qp.qpn]
                while queue and qp.outstanding < qp.max_send_wr:
                    parent, s = queue[0]
                    if serial and counts and parent["parent"] not in counts:
                        break
                    queue.popleft()
                    self.next_wr_id += 1
                    wr_id = self.next_wr_id
                    rail = qp.context.rail
                    local = parent["region_offset"] + offsets[s]
                    seg = self.segments[rail]
                    mr = self.contexts[rail]["mrs"].get("data")
                    if mr is None:
                        raise EngineError("InvalidArgument", "submit", f"rail {rail}: no data MR registered",
                                          round_no=round_no, parent=parent["parent"])
                    record = {"wr_id": wr_id, "parent": parent["parent"], "slice": s, "rail": rail,
                              "lane": qp.lane, "qpn": qp.qpn, "context": qp.context.handle, "cq": qp.cq.handle,
                              "opcode": OPCODES[qp.operation], "bytes": sizes[s], "local_offset": local,
                              "remote_offset": local, "status": "PENDING", "posted_seq": self.seq,
                              "completed_seq": None}
                    self.seq += 1
                    wrs.append(record)
                    self.wr_info[wr_id] = record
                    self.wr_parent[wr_id] = parent["parent"]
                    try:
                        qp.post_send(WorkRequest(wr_id, qp.operation, mr, local, sizes[s], local,
                                                 int(seg["data_rkey"])))
                    except VerbsError as exc:
                        raise EngineError("Internal", "submit", str(exc), round_no=round_no,
                                          parent=parent["parent"]) from None
                    except OSError as exc:
                        raise EngineError("PeerLost", "submit", f"data channel: {exc}", round_no=round_no,
                                          parent=parent["parent"], remote_effect="Unknown") from None
                    counts[parent["parent"]] += 1
                    u = usage[qp.qpn]
                    u["wrs_posted"] += 1
                    u["bytes_posted"] += sizes[s]
                    u["max_inflight_wrs"] = max(u["max_inflight_wrs"], qp.outstanding)
                    u["max_outstanding_parents"] = max(u["max_outstanding_parents"], len(counts))

            got = 0
            for cq in cqs:
                progress["poll_calls"] += 1
                for cqe in cq.poll(POLL_BATCH):
                    got += 1
                    self._complete(cqe, flight, usage, remaining, failed, parents, public)
            progress["cqes_polled"] += got
            done += got
            if got:
                empty_run = 0
                armed = False
                continue
            progress["empty_polls"] += 1
            if time.monotonic() > deadline:
                raise EngineError("Timeout", "wait", f"{total - done} of {total} WRs without completion",
                                  round_no=round_no, remote_effect="Unknown", locally_drained=False,
                                  wrs_posted=len(wrs))
            if self.events:
                armed = self._wait_events(cqs, channels, progress, deadline, armed)
            else:
                empty_run += 1
                time.sleep(BACKOFF_S if empty_run > SPIN_EMPTY_POLLS else 0)
        if self.nic.error:
            raise EngineError("PeerLost", "wait", f"data channel: {self.nic.error}", round_no=round_no,
                              remote_effect="Unknown", locally_drained=True, wrs_posted=len(wrs))
        for p in parents:
            if p["parent"] in failed:
                p["status"] = "Failed"
        return wrs, list(usage.values()), progress, public

    def _complete(self, cqe, flight, usage, remaining, failed, parents, public):
        record = self.wr_info[cqe.wr_id]
        record["status"] = WC_STATUS_NAMES.get(cqe.status, str(cqe.status))
        record["completed_seq"] = self.seq
        self.seq += 1
        pid = record["parent"]
        counts = flight[record["qpn"]]
        counts[pid] -= 1
        if counts[pid] == 0:
            del counts[pid]
        u = usage[record["qpn"]]
        u["cqes"] += 1
        parent = parents[pid]
        if cqe.status == WC_SUCCESS:
            u["bytes_completed"] += cqe.byte_len
            parent["completed_bytes"] += cqe.byte_len
        else:
            u["cqes_error"] += 1
            failed.add(pid)
        remaining[pid] -= 1
        if remaining[pid] == 0 and pid not in failed:
            # The public API reports a parent's bytes when the whole parent has completed.
            parent["status"] = "Completed"
            public["bytes"] += parent["completed_bytes"]
            public["per_rail"][str(parent["rail"])] += parent["completed_bytes"]

    def _wait_events(self, cqs, channels, progress, deadline, armed):
        """Completion-channel progress. Not armed yet: arm every CQ and let the caller poll once more
        (a completion that raced the arming is reaped then). Armed: block on the channels."""
        if not armed:
            for cq in cqs:
                cq.req_notify()
                progress["cq_arms"] += 1
            return True
        timeout = max(0.0, min(1.0, deadline - time.monotonic()))
        ready, _, _ = select.select(channels, [], [], timeout)
        for ch in ready:
            while ch.get_cq_event() is not None:
                progress["cq_events"] += 1
                ch.ack_cq_events(1)
        return False

    def close(self):
        self.nic.stop()
        self.rv.close()
        self.teardown(self.all_qps, {})


# ====================================================================== source


class SourceEngine(Engine):
    role = "source"

    def __init__(self, case, output, ledger):
        super().__init__(case, output, ledger)
        self.by_qpn = {}
        self.all_qps = []
        self.grants = set()
        self.first_seed = None
        self.token = fresh_u64()
        self.listeners = []

    def run(self):
        self.open()
        self.attach_observer(lambda wr_id: None)
        host, port = parse_address(self.case["service_address"], "service_address")
        rv_listener = _listen(host, port)
        data_listener = _listen(host, 0)
        self.listeners = [rv_listener, data_listener]
        service = format_address(host, rv_listener.getsockname()[1])
        data = format_address(host, data_listener.getsockname()[1])
        self.doc["service_address"], self.doc["data_address"] = service, data
        self.checkpoint()
        write_json_atomic(os.path.join(self.output, "ready.json"), {
            "schema": "orbite.runner-ready", "version": 1, "protocol": self.case["protocol"], "pid": os.getpid(),
            "role": "source", "generation": self.case["generation"], "epoch": self.epoch,
            "registration_id": self.case["registration_id"], "service_address": service, "data_address": data})
        print(f"orbite-runner: ready {service}", flush=True)
        sock = _accept(rv_listener, self.timeouts["connect_s"], "rendezvous")
        self.rv = wire.Rendezvous(sock, self.epoch)
        self.accept_segment(data, data_listener)
        self.serve()
        self.close()

    def accept_segment(self, data_address, data_listener):
        hello = self.rv.recv(self.timeouts["connect_s"], ["HELLO"])
        self.rv.peer_epoch = hello["epoch"]
        self.doc["peer_epoch"] = hello["epoch"]
        if hello.get("protocol") != self.case["protocol"]:
            self._refuse("ProtocolError", f"peer protocol {hello.get('protocol')!r}")
        if hello.get("profile") != _profile_key(self.profile):
            self._refuse("ProtocolError", f"peer profile {hello.get('profile')} differs from "
                         f"{_profile_key(self.profile)}")
        target = hello.get("target_registration_id")
        if target is not None and target != self.case["registration_id"]:
            self._refuse("Unavailable", f"peer asked for registration {target!r}, this engine is "
                         f"{self.case['registration_id']!r}")
        if self.case["peer_registration_id"] is None:
            self.doc["peer_registration_id"] = hello.get("registration_id")
        segments = []
        for rail in RAILS:
            mrs = self.contexts[rail]["mrs"]
            if "data" in mrs:
                segments.append({"rail": rail, "data_rkey": mrs["data"].rkey, "data_length": mrs["data"].length,
                                 "ctrl_rkey": mrs["ctrl"].rkey})
        self.rv.send("WELCOME", registration_id=self.case["registration_id"], data_address=data_address,
                     token=self.token, segments=segments)
        sock = _accept(data_listener, self.timeouts["connect_s"], "data channel")
        channel = wire.DataChannel(sock)
        bind = channel.recv_header()
        if bind is None or bind[0] != wire.BIND or bind[5] != self.token:
            channel.close()
            raise protocol_error("open_segment", "data connection did not bind with this session's token")
        self.nic = SourceNic(channel, self.rv, self.by_qpn, oob="payload_over_rendezvous" in self.defects,
                             payload_timeout=self.timeouts["round_s"])
        self.nic.stride = content.stride(self.payload)
        self.nic.data_mr = {rail: e["mrs"]["data"] for rail, e in self.contexts.items() if "data" in e["mrs"]}
        self.nic.after_land = self._after_land
        self.nic.start()

    def _refuse(self, error, message):
        self.rv.send("ERROR", error=error, operation="open_segment", message=message)
        raise EngineError(error, "open_segment", message)

    def _after_land(self, offset, length):
        """Destination-side defects (WRITE lands here): parent 0, round 1 only."""
        if self.round_no != 1:
            return
        start = content.region_offset(0, self.payload)
        if not start <= offset < start + self.payload:
            return
        if "corrupt_byte" in self.defects and offset == start:
            self.arena[offset] ^= 0xFF
        if "overwrite_guard" in self.defects and offset + length == start + self.payload:
            self.arena[offset + length] ^= 0xFF

    def serve(self):
        data_before = self.nic.ch.counters()
        state = {"created": set()}
        while True:
            msg = self.rv.recv(self.timeouts["round_s"], ["CONNECT_QPS", "ROUND_BEGIN", "ROUND_DONE", "BYE"])
            kind = msg["kind"]
            if kind == "CONNECT_QPS":
                self.connect_qps(msg, state)
            elif kind == "ROUND_BEGIN":
                self.begin_round(msg, state, data_before)
            elif kind == "ROUND_DONE":
                self.finish_round(msg, state)
                data_before = self.nic.ch.counters()  # before the next ROUND_READY, so no frame is lost
                self.checkpoint()
                state = {"created": set()}
            else:
                self.rv.send("BYE")
                return

    def connect_qps(self, msg, state):
        round_no = self.round_no + 1
        for peer_qpn in msg.get("retire", []):
            for qp in list(self.by_qpn.values()):
                if qp.peer_qpn == peer_qpn:
                    del self.by_qpn[qp.qpn]
                    self.destroy_qp(qp, round_no)
        peers = {}
        for item in msg["qps"]:
            rail, lane = int(item["rail"]), int(item["lane"])
            if rail not in RAILS or item["operation"] != self.operation:
                raise protocol_error("connect_qp", f"QP request {item} does not fit this engine")
            qp = self.new_qp(rail, lane, round_no)
            qp.connect(int(item["qpn"]), None)
            self.qp_records[qp.qpn]["peer_qpn"] = qp.peer_qpn
            self.by_qpn[qp.qpn] = qp
            self.all_qps.append(qp)
            state["created"].add(qp.qpn)
            peers[str(item["qpn"])] = qp.qpn
        self.rv.send("QPS_ACCEPTED", round=msg.get("round"), peer_qpns=peers)

    def begin_round(self, msg, state, data_before):
        round_no = int(msg["round"])
        if round_no != self.round_no + 1:
            raise protocol_error("submit", f"round {round_no} after round {self.round_no}")
        self._release_grants()  # skip_drain left the previous round's grants held until now
        self.round_no = round_no
        self.nic.round_no = round_no
        state.update(started=time.time(), data_before=data_before,
                     native_before=self.native_snapshot(), parents=msg["parents"], guard_seed=None)
        if self.operation == "read":
            seed = self.round_input_seed(round_no, self.first_seed)
            if not ("stale_input" in self.defects and self.first_seed is not None):
                content.fill_input(self.arena, self.parents, self.payload, seed)
            state["seed"], state["origin"] = seed, "local"
        else:
            state["guard_seed"] = fresh_u64()
            content.prepare_destination(self.arena, self.parents, self.payload, state["guard_seed"])
            state["seed"], state["origin"] = int(msg["input_seed"]), "peer"
        if self.first_seed is None:
            self.first_seed = state["seed"]
        self.nic.parent_bytes = {}
        self.grants = {int(p["parent"]) for p in msg["parents"]}
        self.rv.send("ROUND_READY", round=round_no, input_seed=state["seed"])

    def _release_grants(self):
        self.grants = set()

    def finish_round(self, msg, state):
        round_no = int(msg["round"])
        if round_no != self.round_no:
            raise protocol_error("drain", f"ROUND_DONE for round {round_no} during round {self.round_no}")
        parents = []
        public = {"bytes": 0, "per_rail": {str(r): 0 for r in self.enabled_rails}}
        qp_of = {(qp.context.rail, qp.lane): qp.qpn for qp in self.by_qpn.values()}
        expected = content.RoundInput(state["seed"], self.parents, self.payload) if self.operation == "write" else None
        for item in state["parents"]:
            pid, rail, lane = int(item["parent"]), int(item["rail"]), int(item["lane"])
            moved = self.nic.parent_bytes.get(pid, 0)
            entry = {"parent": pid, "rail": rail, "lane": lane, "qpn": qp_of.get((rail, lane)),
                     "requested_bytes": int(item["bytes"]), "completed_bytes": moved, "slices": 0,
                     "status": "Granted", "region_offset": content.region_offset(pid, self.payload),
                     "byte_check": None, "guard_check": None, "error": None}
            if self.operation == "write":
                byte_check, guard_check = content.check_region(self.arena, pid, expected, state["guard_seed"])
                entry["byte_check"], entry["guard_check"] = byte_check, guard_check
                if not (byte_check["ok"] and guard_check["ok"]):
                    entry["status"] = "Failed"
                    entry["error"] = EngineError("CheckFailed", "drain", "destination bytes or guards differ",
                                                 round_no=round_no, parent=pid).as_dict()
                    self.rounds_failed_checks = True
            parents.append(entry)
        released = {int(p) for p in msg.get("released", [])}
        if "skip_drain" in self.defects:
            debt = len(self.grants)  # the round ends with the grants still held
        else:
            self.grants -= released
            debt = len(self.grants)
            for entry in parents:
                if entry["status"] == "Granted" and entry["parent"] in released:
                    entry["status"] = "Released"
        for entry in parents:
            # Public bytes count a parent whose transfer completed, as the requester's do; the checks
            # are reported apart (status/byte_check), not folded into the counters.
            if entry["completed_bytes"] == entry["requested_bytes"]:
                public["bytes"] += entry["completed_bytes"]
                public["per_rail"][str(entry["rail"])] = public["per_rail"].get(str(entry["rail"]), 0) + \
                    entry["completed_bytes"]
        drain = {"drained": debt == 0, "debt_wrs": 0, "debt_bytes": 0, "debt_grants": debt}
        self.rv.send("ROUND_DRAINED", round=round_no, drained=drain["drained"], debt_grants=debt)
        rendezvous, data_channel = self.traffic(round_no, state["data_before"])
        usage = []
        for qp in self.by_qpn.values():
            usage.append({"qpn": qp.qpn, "rail": qp.context.rail, "lane": qp.lane, "operation": qp.operation,
                          "created": qp.qpn in state["created"], "reused": qp.qpn not in state["created"],
                          "wrs_posted": 0, "cqes": 0, "cqes_error": 0, "bytes_posted": 0, "bytes_completed": 0,
                          "max_inflight_wrs": 0, "max_outstanding_parents": 0})
        finished = time.time()
        self.doc["rounds"].append({
            "round": round_no, "epoch": self.epoch, "peer_epoch": self.rv.peer_epoch, "input_seed": state["seed"],
            "seed_origin": state["origin"], "started_at": state["started"], "finished_at": finished,
            "duration_s": round(finished - state["started"], 6), "batches": [], "parents": parents, "wrs": [],
            "qp_usage": usage, "qps_created": len(state["created"]),
            "qps_reused": sum(1 for u in usage if u["reused"]),
            "counters": {"public": public, "native": self.native_counters(state["native_before"])},
            "drain": drain,
            "progress": {"mode": "events" if self.events else "polling", "poll_calls": 0, "empty_polls": 0,
                         "cqes_polled": 0, "cq_events": 0, "cq_arms": 0},
            "rendezvous": rendezvous, "data_channel": data_channel, "errors": [],
        })

    def close(self):
        # The requester closes the data channel after BYE; wait for the NIC to see EOF.
        self.nic.join(self.timeouts["connect_s"])
        self.nic.stop()
        self.rv.close()
        for listener in self.listeners:
            listener.close()
        self._release_grants()  # BYE ends the session: every grant, even one skip_drain kept, is returned
        self.teardown(self.all_qps, {"grants": len(self.grants)})

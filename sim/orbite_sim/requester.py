# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The requester side of the simulated engine: opens the segment and drives the rounds.

Each round the requester places the parents on its QPs (created in round 1, reused after), slices
them, posts every slice interleaved per QP within the send-queue depth, reaps the completions by
polling or through completion channels, checks what landed (READ), hands the grants back and
records the round.
"""

import collections
import select
import time

from . import wire
from .case import parse_address
from .content import RoundInput
from .engine import (
    ROUNDS,
    SEND_QUEUE_DEPTH,
    Engine,
    Round,
    count_public,
    new_progress,
    profile_key,
    qp_usage,
    slice_plan,
)
from .errors import EngineError, unavailable
from .nic import RequesterNic
from .verbs import OPCODES, WC_STATUS_NAMES, WC_SUCCESS, VerbsError, WorkRequest

POLL_BATCH = 64
# Polling backs off after this many empty polls in a row, so the NIC thread gets the GIL.
SPIN_EMPTY_POLLS = 16
BACKOFF_S = 0.0001


class RequesterEngine(Engine):
    role = "requester"

    def __init__(self, case, output, ledger):
        super().__init__(case, output, ledger)
        self.wr_parent = {}  # wr_id -> parent (the observer resolves parents with it)
        self.wr_info = {}  # wr_id -> the WR's ledger record, this round
        self.next_wr_id = 0
        self.seq = 0
        self.segments = {}
        self.live_qps = {}  # (rail, lane) -> QueuePair
        self.sq_depth = SEND_QUEUE_DEPTH + 1 if "exceed_sq_depth" in self.defects else SEND_QUEUE_DEPTH

    def run(self):
        self.open()
        self.attach_observer(self.wr_parent.get)
        self.checkpoint()
        host, port = parse_address(self.case["peer_address"], "peer_address")
        sock = wire.connect(host, port, self.timeouts["connect_s"], "rendezvous")
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
                     profile=profile_key(self.profile))
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
        sock = wire.connect(host, port, self.timeouts["connect_s"], "data channel")
        channel = wire.DataChannel(sock)
        channel.send(wire.BIND, 0, welcome["token"], 0, 0)
        self.nic = RequesterNic(channel, self.rv, oob="payload_over_rendezvous" in self.defects,
                                payload_timeout=self.timeouts["round_s"])
        self.nic.after_land = self.after_land
        self.nic.start()

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
                created.append(qp)
        if created or retire:
            self.rv.send("CONNECT_QPS", round=round_no, retire=retire,
                         qps=[{"rail": q.context.rail, "lane": q.lane, "operation": q.operation, "qpn": q.qpn}
                              for q in created])
            reply = self.rv.recv(self.timeouts["connect_s"], ["QPS_ACCEPTED"])
            peers = {int(k): v for k, v in reply["peer_qpns"].items()}
            for qp in created:
                self.connect_qp(qp, peers[qp.qpn], self.nic.transmit)
        return {q.qpn for q in created}

    # --------------------------------------------------------------- one round

    def placement(self):
        rails = self.enabled_rails[:1] if "single_rail" in self.defects else self.enabled_rails
        return [(rails[p % len(rails)], (p // len(rails)) % self.lanes) for p in range(self.parents)]

    def run_round(self, round_no):
        self.round_no = round_no
        self.nic.round_no = round_no
        rnd = Round(round_no)
        rnd.started = time.time()
        rnd.data_before = self.nic.ch.counters()
        existing = {qp.qpn for qp in self.live_qps.values()}
        rnd.created = self.ensure_qps(round_no)
        placement = self.placement()
        sizes = slice_plan(self.payload, self.block, wrong="wrong_slicing" in self.defects)
        parents_msg = [{"parent": p, "rail": rail, "lane": lane, "bytes": self.payload}
                       for p, (rail, lane) in enumerate(placement)]
        if self.operation == "read":
            rnd.guard_seed = self.poison_destination()
            self.rv.send("ROUND_BEGIN", round=round_no, parents=parents_msg)
            ready = self.rv.recv(self.timeouts["round_s"], ["ROUND_READY"])
            rnd.seed, rnd.origin = ready["input_seed"], "peer"
        else:
            rnd.seed, rnd.origin = self.local_input(round_no), "local"
            self.rv.send("ROUND_BEGIN", round=round_no, parents=parents_msg, input_seed=rnd.seed)
            self.rv.recv(self.timeouts["round_s"], ["ROUND_READY"])

        prepared = time.time()
        rnd.native_before = self.native_snapshot()
        parents = [self.parent_entry(p, rail, lane, self.live_qps[(rail, lane)].qpn, self.payload, 0, len(sizes),
                                     "Pending")
                   for p, (rail, lane) in enumerate(placement)]
        batch = {"batch": round_no, "parents": list(range(self.parents)), "state": "Running", "free": None}
        wrs, usage, progress, public = self.transfer(round_no, parents, sizes, rnd.created, existing)
        transferred = time.time()

        failed = [p for p in parents if p["status"] == "Failed"]
        batch["state"] = "Failed" if failed else "Completed"
        batch["free"] = "Ok"  # no WR is in flight any more, so free() succeeds
        if self.operation == "read":
            expected = RoundInput(rnd.seed, self.parents, self.payload)
            for p in parents:
                self.check_parent(p, expected, rnd.guard_seed, "wait", round_no)
        if any(p["status"] != "Completed" for p in parents):
            self.rounds_failed_checks = True
        checked = time.time()
        self.rv.send("ROUND_DONE", round=round_no, released=list(range(self.parents)))
        self.rv.recv(self.timeouts["round_s"], ["ROUND_DRAINED"])
        skew = self.enabled_rails[0] if ("skew_native_counter" in self.defects and round_no == 1) else None
        debt_wrs = sum(1 for w in wrs if w["completed_seq"] is None)
        debt_bytes = sum(w["bytes"] for w in wrs if w["completed_seq"] is None)
        drain = {"drained": debt_wrs == 0, "debt_wrs": debt_wrs, "debt_bytes": debt_bytes, "debt_grants": 0}
        record = self.record_round(rnd, batches=[batch], parents=parents, wrs=wrs, usage=usage, public=public,
                                   drain=drain, progress=progress, skew_rail=skew)
        finished = record["finished_at"]
        record["timing"] = {"prepare_s": round(prepared - rnd.started, 6),
                            "transfer_s": round(transferred - prepared, 6),
                            "check_s": round(checked - transferred, 6), "drain_s": round(finished - checked, 6)}

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
        usage = {qp.qpn: qp_usage(qp, qp.qpn in created, qp.qpn in existing) for qp in queues}
        flight = {qp.qpn: collections.Counter() for qp in queues}  # qpn -> parent -> WRs in flight
        remaining = {p["parent"]: len(sizes) for p in parents}
        failed = set()
        public = self.new_public()
        progress = new_progress(self.events)
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
                    wrs.append(self._post(round_no, qp, parent, s, sizes[s], parent["region_offset"] + offsets[s]))
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

    def _post(self, round_no, qp, parent, s, length, local):
        """Post slice ``s`` of ``parent`` on ``qp`` (same offset on both sides); returns its WR record."""
        self.next_wr_id += 1
        wr_id = self.next_wr_id
        rail = qp.context.rail
        seg = self.segments[rail]
        mr = self.contexts[rail]["mrs"].get("data")
        if mr is None:
            raise EngineError("InvalidArgument", "submit", f"rail {rail}: no data MR registered",
                              round_no=round_no, parent=parent["parent"])
        record = {"wr_id": wr_id, "parent": parent["parent"], "slice": s, "rail": rail,
                  "lane": qp.lane, "qpn": qp.qpn, "context": qp.context.handle, "cq": qp.cq.handle,
                  "opcode": OPCODES[qp.operation], "bytes": length, "local_offset": local,
                  "remote_offset": local, "status": "PENDING", "posted_seq": self.seq,
                  "completed_seq": None}
        self.seq += 1
        self.wr_info[wr_id] = record
        self.wr_parent[wr_id] = parent["parent"]
        try:
            qp.post_send(WorkRequest(wr_id, qp.operation, mr, local, length, local,
                                     int(seg["data_rkey"])))
        except VerbsError as exc:
            raise EngineError("Internal", "submit", str(exc), round_no=round_no,
                              parent=parent["parent"]) from None
        except OSError as exc:
            raise EngineError("PeerLost", "submit", f"data channel: {exc}", round_no=round_no,
                              parent=parent["parent"], remote_effect="Unknown") from None
        return record

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
            count_public(public, parent["rail"], parent["completed_bytes"])

    def _wait_events(self, cqs, channels, progress, deadline, armed):
        """Completion-channel progress. Not armed yet: arm every CQ and let the caller poll once more
        (a completion that raced the arming is reaped then). Armed: block on the channels."""
        if not armed:
            for cq in cqs:
                cq.req_notify()
                progress["cq_arms"] += 1
            return True
        timeout = max(0.0, min(1.0, deadline - time.monotonic()))
        ready = select.select(channels, [], [], timeout)[0]
        for ch in ready:
            while ch.get_cq_event() is not None:
                progress["cq_events"] += 1
                ch.ack_cq_events(1)
        return False

    def close(self):
        self.nic.stop()
        self.rv.close()
        self.teardown(self.all_qps, {})

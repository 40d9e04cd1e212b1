# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The requester side of the simulated engine: opens the segment and drives the rounds.

Each round the requester places the parents on its QPs (created in round 1, reused after), slices
them, posts every slice interleaved per QP within the send-queue depth, reaps the completions by
polling or through completion channels, checks what landed (READ), hands the grants back and
records the round. It only posts and polls: the verbs provider moves the bytes and completes a WR
once they have landed.
"""

import collections
import gc
import select
import time
import weakref

from . import cleanup_kinds, inflight, wire
from .case import parse_address
from .content import RoundInput, region_offset
from .engine import (
    HELD_ROUND,
    LOST_ROUND,
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
from .errors import EngineError, peer_lost, protocol_error, unavailable
from .progress import report as report_progress
from .verbs import OPCODES, WC_STATUS_NAMES, WC_SUCCESS, VerbsError

POLL_BATCH = 64
# The WR ID of the payload the bytes_while_held defect posts before its grant.
HELD_PAYLOAD_WR_ID = 3 << 40
# Polling backs off after this many empty polls in a row, so the provider's threads get a CPU.
SPIN_EMPTY_POLLS = 2
BACKOFF_S = 0.00005
# exceed_sq_depth: QPs of 9 send WRs, up to 9 posted at once (the provider enforces what was asked).
# understate_sq_depth: the same QPs and posts, stated as the documented depth (its QP records and maxima).
EXCEEDED_DEPTH = SEND_QUEUE_DEPTH + 1
# How long the events mode waits, after the last completion, for the event of a CQ armed just before it.
EVENT_GRACE_S = 0.2


# installed-cleanup-failure: the WR ID of the cleanup round's one payload WR.
CLEANUP_WR_ID = 4 << 40


class Allocation:
    """One batch's slice of the arena, as the caller holds it: weakly referable, so a weak owner can show whether
    anything (the engine's quarantine) still keeps it once the caller dropped its handle."""

    def __init__(self, arena, offset, length):
        self.view = memoryview(arena)[offset : offset + length]


class RequesterEngine(Engine):
    role = "requester"

    def __init__(self, case, output, ledger, provider):
        super().__init__(case, output, ledger, provider)
        self.wr_info = {}  # wr_id -> the WR's ledger record, this round
        self.next_wr_id = 0
        self.seq = 0
        self.segments = {}
        self.live_qps = {}  # (rail, lane) -> QueuePair
        self.qp_by_num = {}  # qpn -> live QueuePair
        self.remote = {}  # qpn -> (the peer's data MR address, its rkey) this QP reaches
        self.understated = "understate_sq_depth" in self.defects
        self.sq_depth = EXCEEDED_DEPTH if "exceed_sq_depth" in self.defects or self.understated else SEND_QUEUE_DEPTH
        self.held = None  # installed-interruption: the batches of the round whose grant is held
        self.lost = None  # installed-lost-completion: the round whose completions were withheld
        self.held_grants = set()  # parents the source granted this round and has not taken back
        self.quarantine = None  # installed-cleanup-failure: the batch, QP and allocation a failed destroy left

    def run(self):
        self.open()
        self.checkpoint()
        host, port = parse_address(self.case["peer_address"], "peer_address")
        timeout = self.timeouts["connect_s"]
        while True:
            self.connect_segment(host, port, timeout)
            if self.peer_epochs[:-1]:
                self.stale_probes()
            for round_no in range(1, ROUNDS + 1):
                self.run_round(round_no)
                self.checkpoint()
            if self.inflight:
                inflight.run_requester(self)
            if not self.restart or self.generation >= self.generations:
                break
            if self.interruption:
                self.held_round()
            elif self.lost_mode:
                self.lost_round()
            elif self.cleanup:
                self.cleanup_round()
            # installed-restart: the generation's restart point, both peers drained and idle.
            self.rv.send("RESTART_POINT", generation=self.generation)
            self.rv.recv(self.timeouts["round_s"], ["RESTART_ACK"])
            self.at_restart_point()
            if not self.survivor:
                self.await_kill()
            self.await_peer_death()
            recovery = self.fail_held() if self.interruption else self.fail_lost() if self.lost_mode else None
            self.next_generation()
            if recovery is not None:
                errors = recovery.pop("errors")
                self.doc["errors"].extend(errors)
                self.doc["restart"]["recovery"] = recovery
                self.checkpoint()
            # The replacement source listens on the same service address once the controller started it.
            timeout = self.timeouts["restart_s"]
        self.rv.send("BYE")
        self.rv.recv(self.timeouts["round_s"], ["BYE"])
        self.close()

    def connect_segment(self, host, port, timeout):
        """Connect and open the source's segment. After a restart the dying source's listener can still
        complete a handshake and then reset it: the survivor tries again until ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            sock = wire.connect(host, port, max(0.1, deadline - time.monotonic()), "rendezvous")
            self.rv = wire.Rendezvous(sock, self.epoch)
            try:
                self.open_segment()
                return
            except EngineError as exc:
                first = self.generation == self.case["generation"] and not self.replacement
                if exc.error != "PeerLost" or first or time.monotonic() > deadline:
                    raise
                self.rv.close()
                time.sleep(0.05)

    def open_segment(self):
        self.rv.send("HELLO", protocol=self.case["protocol"], role=self.role,
                     registration_id=self.case["registration_id"], generation=self.case["generation"],
                     target_registration_id=self.case["peer_registration_id"],
                     profile=profile_key(self.profile))
        welcome = self.rv.recv(self.timeouts["connect_s"], ["WELCOME"])
        self.rv.peer_epoch = welcome["epoch"]
        self.doc["peer_epoch"] = welcome["epoch"]
        self.note_peer_epoch(welcome["epoch"])
        expected = self.case["peer_registration_id"]
        if expected is not None and welcome["registration_id"] != expected:
            raise unavailable("open_segment", f"source announced registration {welcome['registration_id']!r}, "
                              f"expected {expected!r}")
        self.segments = {int(s["rail"]): s for s in welcome["segments"]}

    def forget_qps(self):
        self.live_qps = {}
        self.qp_by_num = {}
        self.remote = {}

    # --------------------------------------------------------------- QPs

    def ensure_qps(self, round_no):
        """QPs per enabled rail and lane, created in round 1 and reused (no_qp_reuse: recreated)."""
        retire = []
        if round_no > 1 and "no_qp_reuse" in self.defects:
            for qp in list(self.live_qps.values()):
                retire.append(qp.qpn)
                del self.qp_by_num[qp.qpn]
                self.destroy_qp(qp, round_no)
            self.live_qps = {}
        wanted = [(rail, lane) for rail in self.enabled_rails for lane in range(self.lanes)]
        if "extra_qp" in self.defects and round_no == 1:
            wanted.append((self.enabled_rails[0], self.lanes))
        created = []
        for key in wanted:
            if key not in self.live_qps:
                qp = self.new_qp(key[0], key[1], round_no, self.sq_depth)
                if self.understated:  # the defect: the QP record states the documented depth
                    self.qp_records[qp.qpn]["max_send_wr"] = SEND_QUEUE_DEPTH
                self.live_qps[key] = qp
                self.qp_by_num[qp.qpn] = qp
                created.append(qp)
        if created or retire:
            self.rv.send("CONNECT_QPS", round=round_no, retire=retire, qps=[self.qp_offer(q) for q in created])
            reply = self.rv.recv(self.timeouts["connect_s"], ["QPS_ACCEPTED"])
            peers = reply["peers"]
            for qp in created:
                peer = peers.get(str(qp.qpn))
                if peer is None:
                    raise EngineError("ProtocolError", "connect_qp", f"the source accepted no QP for {qp.qpn}",
                                      round_no=round_no)
                self.connect_qp(qp, peer, round_no)
                self.remote[qp.qpn] = (int(peer["addr"]), int(peer["rkey"]))
        return {q.qpn for q in created}

    # --------------------------------------------------------------- one round

    def placement(self):
        rails = self.enabled_rails[:1] if "single_rail" in self.defects else self.enabled_rails
        return [(rails[p % len(rails)], (p // len(rails)) % self.lanes) for p in range(self.parents)]

    def run_round(self, round_no):
        self.round_no = round_no
        rnd = Round(round_no)
        rnd.started = time.time()
        self.mark_counters(rnd)
        existing = {qp.qpn for qp in self.live_qps.values()}
        rnd.created = self.ensure_qps(round_no)
        placement = self.placement()
        sizes = slice_plan(self.payload, self.block, wrong="wrong_slicing" in self.defects)
        report_progress(self, round_no, ROUNDS, "transfer", 0, self.parents * len(sizes))
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
            ready = self.rv.recv(self.timeouts["round_s"], ["ROUND_READY"])
            if "payload_over_rendezvous" in self.defects:
                self.ship_payload_over_rendezvous(round_no)

        window = ready.get("window")  # installed-memory-cleanup (mw): the grant is a window bound over the source's MR
        if window:
            self.remote = {qpn: (addr, int(window["rkey"])) for qpn, (addr, _rkey) in self.remote.items()}
        # The grants the source issued for this round (ROUND_READY): held until ROUND_DRAINED takes them back.
        self.held_grants = {int(p) for p in ready.get("grants", [])}
        received = sorted(self.held_grants)
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
        batch["free"] = self.free(batch, round_no, wrs)
        if self.operation == "read":
            expected = RoundInput(rnd.seed, self.parents, self.payload)
            for p in parents:
                self.check_parent(p, expected, rnd.guard_seed, "wait", round_no)
        if any(p["status"] != "Completed" for p in parents):
            self.rounds_failed_checks = True
        checked = time.time()
        returned = sorted(self.held_grants)  # every grant goes back once the batch is freed
        self.rv.send("ROUND_DONE", round=round_no, released=returned)
        drained = self.rv.recv(self.timeouts["round_s"], ["ROUND_DRAINED"])
        self.held_grants -= {int(p) for p in drained.get("released", [])}  # what the source took back
        skew = self.enabled_rails[0] if ("skew_native_counter" in self.defects and round_no == 1) else None
        drain = self.drain_state(wrs, self.live_qps.values(), len(self.held_grants))
        drain.update(grants_received=received, grants_returned=returned)
        record = self.record_round(rnd, batches=[batch], parents=parents, wrs=wrs, usage=usage, public=public,
                                   drain=drain, progress=progress, skew_rail=skew)
        finished = record["finished_at"]
        record["timing"] = {"prepare_s": round(prepared - rnd.started, 6),
                            "transfer_s": round(transferred - prepared, 6),
                            "check_s": round(checked - transferred, 6), "drain_s": round(finished - checked, 6)}

    # --------------------------------------------------------------- installed-interruption

    def held_round(self):
        """The round after a nonfinal generation's three: submitted as always, one batch per enabled rail, but
        the source's READY (its grant) never comes, the control relay holds it. Each batch stays Running,
        its wait times out and free() returns BatchBusy (the results of the calls, typed errors of their
        own). Nothing may move meanwhile: no byte, no new QP."""
        round_no = HELD_ROUND
        before = self.held_snapshot()
        placement = self.placement()
        parents_msg = [{"parent": p, "rail": rail, "lane": lane, "bytes": self.payload}
                       for p, (rail, lane) in enumerate(placement)]
        batches = []
        for rail in self.enabled_rails:
            members = [p for p, (r, _lane) in enumerate(placement) if r == rail]
            if members:
                batches.append({"batch": round_no * 10 + rail, "rail": rail, "parents": members, "state": "Running",
                                "pending_grants": len(members), "wait": None, "free": None})
        fields = {"input_seed": self.local_input(round_no)} if self.operation == "write" else {}
        self.rv.send("ROUND_BEGIN", round=round_no, parents=parents_msg, **fields)
        if "qp_while_held" in self.defects:  # the defect: a QP created while the authorization is held
            entry = self.contexts[self.enabled_rails[0]]
            entry["ctx"].create_qp(entry["pd"], entry["cq"], self.lanes, self.operation, SEND_QUEUE_DEPTH).destroy()
        if "bytes_while_held" in self.defects:  # the defect: payload posted before the grant came
            self._post_one_held(round_no, placement[0])
        granted = False
        for batch in batches:
            granted = granted or self._wait_grant(batch, round_no)
            batch["free"] = self.free(batch, round_no)
        if granted:
            # A grant the relay let through: the round runs as any other (its payload moves).
            self._run_granted(round_no, placement, batches)
        self.held = {"round": round_no, "parents": len(placement), "batches": batches, "grant_received": granted,
                     "before": before, "after": self.held_snapshot()}
        self.doc["restart"]["interruption"] = self.held
        self.checkpoint()

    def _wait_grant(self, batch, round_no):
        """wait(batch) for its grant, bounded by timeouts.grant_s: True if READY came (the relay leaked it)."""
        timeout = self.timeouts["grant_s"]
        try:
            self.rv.recv(timeout, ["ROUND_READY"])
        except EngineError as exc:
            if exc.error != "Timeout":
                raise
            error = EngineError("Timeout", "wait", f"batch {batch['batch']}: no grant within {timeout:g} s",
                                round_no=round_no, remote_effect="None", locally_drained=False, expected=True)
            batch["wait"] = {"timeout_s": timeout, "result": "Timeout", "state_after": batch["state"]}
            self.doc["errors"].append(error.as_dict())
            return False
        batch["wait"] = {"timeout_s": timeout, "result": "Ok", "state_after": batch["state"]}
        return True

    def free(self, batch, round_no, wrs=()):
        """The public API's free(batch): BatchBusy while the batch is Running or any WR is in flight (by this
        engine's records of ``wrs`` or by the provider's send queues), a typed error of this call; else the
        batch's resources are released: Ok. free_busy_ok frees a busy batch anyway (the defect)."""
        quarantined = self.quarantine is not None and self.quarantine["batch"] is batch
        if quarantined and "free_unquiesced_ok" in self.defects:  # the defect: a quarantined batch freed
            return "Ok"
        busy = (quarantined or batch["state"] == "Running" or any(w["completed_seq"] is None for w in wrs)
                or any(qp.provider_outstanding() for qp in self.live_qps.values()))
        if busy and "free_busy_ok" not in self.defects:
            error = EngineError("BatchBusy", "free", f"batch {batch['batch']} is {batch['state']} with work in flight",
                                round_no=round_no, remote_effect="None", locally_drained=False, expected=True)
            self.doc["errors"].append(error.as_dict())
            return error.error
        self.wr_info = {}
        return "Ok"

    def _post_one_held(self, round_no, where):
        rail, lane = where
        qp = self.live_qps[(rail, lane)]
        mr = self.contexts[rail]["mrs"]["data"]
        offset = region_offset(0, self.payload)
        peer_addr, peer_rkey = self.remote[qp.qpn]
        qp.post_send(HELD_PAYLOAD_WR_ID, mr.addr + offset, self.payload, mr.lkey, peer_addr + offset, peer_rkey)
        deadline = time.monotonic() + self.timeouts["round_s"]
        while time.monotonic() < deadline:
            if qp.cq.poll(1):
                qp.retire()
                return
            time.sleep(0.001)
        raise EngineError("Timeout", "wait", "the WR posted while held did not complete", round_no=round_no)

    def _run_granted(self, round_no, placement, batches):
        sizes = [self.payload]
        parents = [self.parent_entry(p, rail, lane, self.live_qps[(rail, lane)].qpn, self.payload, 0, 1, "Pending")
                   for p, (rail, lane) in enumerate(placement)]
        existing = {qp.qpn for qp in self.live_qps.values()}
        self.transfer(round_no, parents, sizes, set(), existing)
        for batch in batches:
            batch["state"] = "Completed"
            batch["pending_grants"] = 0
            batch["free"] = self.free(batch, round_no)

    def fail_held(self):
        """The surviving requester after the source died holding the grant: each held batch fails, drained
        locally (nothing was posted), zero bytes, RemoteEffect None; then free() succeeds. The lanes of the
        dead peer are reclaimed (their QPs to ERR, the CQs polled empty) before they are retired."""
        if self.held is None:
            raise protocol_error("restart", "the source died, but no round was held")
        recovery = self.reclaim_lanes()
        lying = "survivor_reports_bytes" in self.defects
        batches, errors = [], []
        for batch in self.held["batches"]:
            nbytes = len(batch["parents"]) * self.payload if lying else 0
            effect = "Unknown" if lying else "None"
            batch["state"] = "Failed"
            error = EngineError("PeerLost", "wait", f"batch {batch['batch']}: the source died before granting",
                                round_no=self.held["round"], remote_effect=effect, locally_drained=True, nbytes=nbytes,
                                expected=True)
            errors.append(error.as_dict())
            batches.append({"batch": batch["batch"], "rail": batch["rail"], "parents": batch["parents"],
                            "state": batch["state"], "bytes": nbytes, "remote_effect": effect,
                            "locally_drained": True, "free": self.free(batch, self.held["round"])})
        recovery.update(batches=batches, errors=errors)
        self.held = None
        return recovery

    def begin_fault_round(self, round_no, parents_msg):
        """ROUND_BEGIN of a fault round (lost completions, cleanup failure, in-flight DMA) and the source's
        ROUND_READY; a READ's destination poisoned first, a WRITE's input seeded here. Returns the ROUND_READY
        message, the round's input seed (READ: the source's) and the guard seed (READ only, else None)."""
        guard_seed = None
        if self.operation == "read":
            guard_seed = self.poison_destination()
            self.rv.send("ROUND_BEGIN", round=round_no, parents=parents_msg)
            ready = self.rv.recv(self.timeouts["round_s"], ["ROUND_READY"])
            return ready, int(ready["input_seed"]), guard_seed
        seed = self.local_input(round_no)
        self.rv.send("ROUND_BEGIN", round=round_no, parents=parents_msg, input_seed=seed)
        return self.rv.recv(self.timeouts["round_s"], ["ROUND_READY"]), seed, guard_seed

    # --------------------------------------------------------------- installed-lost-completion

    def lost_round(self):
        """The round after a nonfinal generation's three (docs/lost_completion.md): submitted and granted as
        always, one batch per enabled rail, every WR posted (the provider moves the bytes), but the cq_fault
        observer withholds the successful completions from poll_cq. Each batch's wait times out and free()
        returns BatchBusy; the engine still owns its SQ debt, the source's grants and the DMA loans (the
        regions lent to the WRs) when the restart point is written."""
        round_no = LOST_ROUND
        self.round_no = round_no
        before = self.held_snapshot()
        placement = self.placement()
        parents_msg = [{"parent": p, "rail": rail, "lane": lane, "bytes": self.payload}
                       for p, (rail, lane) in enumerate(placement)]
        ready, _seed, _guard_seed = self.begin_fault_round(round_no, parents_msg)
        self.held_grants = {int(p) for p in ready.get("grants", [])}
        parents = [self.parent_entry(p, rail, lane, self.live_qps[(rail, lane)].qpn, self.payload, 0, 1, "Pending")
                   for p, (rail, lane) in enumerate(placement)]
        self.wr_info = {}
        wrs = [self._post(round_no, self.live_qps[(p["rail"], p["lane"])], p, 0, self.payload, p["region_offset"])
               for p in parents]
        posted = self.held_snapshot()
        self._reap_lost(wrs, time.monotonic() + self.timeouts["grant_s"])
        # The kill point is defined once the provider consumed every WR (its bytes moved, its completion
        # gone to the observer): the provider's send queues, never the engine's own records.
        deadline = time.monotonic() + self.timeouts["round_s"]
        while any(qp.provider_outstanding() for qp in self.live_qps.values()) and time.monotonic() < deadline:
            time.sleep(0.005)
        events = new_progress(self.events)
        if self.events:
            # A CQ left armed by round 3 signals for the withheld completions: acknowledged here, so the event
            # is this round's and never counted by the next generation's first round.
            cqs = [self.contexts[r]["cq"] for r in self.enabled_rails]
            self._consume_events(cqs, [self.contexts[r]["channel"] for r in self.enabled_rails], events, 0)
        if "fabricate_cqe" in self.defects:  # the defect: a completion nobody delivered, reported as success
            wrs[0].update(status="SUCCESS", completed_seq=self.seq)
            self.seq += 1
        if "lost_debt_cleared" in self.defects:  # the defect: the engine forgets the debt it still owns
            for qp in self.live_qps.values():
                qp.outstanding = 0
        batches = []
        for rail in self.enabled_rails:
            members = [p for p, (r, _lane) in enumerate(placement) if r == rail]
            mine = [w for w in wrs if w["parent"] in members]
            state = "Completed" if all(w["status"] == "SUCCESS" for w in mine) else "Running"
            batch = {"batch": round_no * 10 + rail, "rail": rail, "parents": members, "state": state,
                     "wait": None, "free": None}
            if state == "Running":
                error = EngineError("Timeout", "wait", f"batch {batch['batch']}: {len(members)} WR(s) without "
                                    f"completion within {self.timeouts['grant_s']:g} s", round_no=round_no,
                                    remote_effect=self._lost_effect(), locally_drained=False, expected=True)
                self.doc["errors"].append(error.as_dict())
            batch["wait"] = {"timeout_s": self.timeouts["grant_s"], "result": "Timeout" if state == "Running" else "Ok",
                             "state_after": state}
            batch["free"] = self.free(batch, round_no, mine)
            batches.append(batch)
        sq_debt = {str(qp.qpn): qp.outstanding for qp in self.live_qps.values()}
        self.lost = {
            "round": round_no, "parents": len(parents), "batches": batches,
            "wrs": [{k: w[k] for k in ("wr_id", "parent", "rail", "lane", "qpn", "bytes", "status", "completed_seq")}
                    for w in wrs],
            "sq_debt": sq_debt,
            "provider_outstanding": {str(qp.qpn): qp.provider_outstanding() for qp in self.live_qps.values()},
            "grants_held": sorted(self.held_grants),
            "loans": [{"parent": w["parent"], "offset": w["local_offset"], "bytes": w["bytes"]}
                      for w in wrs if w["completed_seq"] is None],
            "reported_bytes": sum(p["completed_bytes"] for p in parents), "cq_events": events["cq_events"],
            "before": before, "posted": posted, "after": self.held_snapshot(),
        }
        self.doc["restart"]["lost"] = self.lost
        self.checkpoint()

    def _lost_effect(self):
        """What a peer may have seen of a lost WRITE is unknown; a READ changes nothing remote."""
        return "Unknown" if self.operation == "write" else "None"

    def _reap_lost(self, wrs, deadline):
        """Poll (never arming a channel) until every WR completed or ``deadline``: the completions cq_fault
        withholds never come; any that does is recorded as it came."""
        while any(w["completed_seq"] is None for w in wrs) and time.monotonic() < deadline:
            got = 0
            for rail in self.enabled_rails:
                for wr_id, status, _len, qpn in self.contexts[rail]["cq"].poll(POLL_BATCH):
                    got += 1
                    record, qp = self.wr_info.get(wr_id), self.qp_by_num.get(qpn)
                    if record is None or qp is None:
                        raise EngineError("Internal", "wait", f"completion of wr_id {wr_id} on QP {qpn}: not a WR "
                                          "of the lost round", round_no=self.round_no)
                    qp.retire()
                    record.update(status=WC_STATUS_NAMES.get(status, str(status)), completed_seq=self.seq)
                    self.seq += 1
            if not got:
                time.sleep(0.002)

    def fail_lost(self):
        """The surviving requester after the source died with the lost round's completions outstanding: every
        QP that carried a lost WR is destroyed (receipts), then the engine drains locally: its SQ debt, the
        loans and the dead source's grants are dropped; each batch fails with zero reported bytes, WRITE effects
        Unknown (a READ's None), a typed PeerLost of its own, and then free() succeeds."""
        if self.lost is None:
            raise protocol_error("restart", "the source died, but no round was lost")
        lost = self.lost
        pending = [w for w in lost["wrs"] if w["completed_seq"] is None]
        affected = sorted({w["qpn"] for w in pending})
        qps = [self.qp_by_num[q] for q in affected if q in self.qp_by_num]

        # What the engine still owns for the lost round (the WRs without a completion and their buffers lent to
        # the device, beside the QPs' SQ debt and the grants); the drain releases them, and both figures of its
        # receipt are counted from what is held then (the ledger's restart.lost keeps the kill point's record).
        owed, lent = list(pending), list(lost["loans"])

        def owned():
            return {"wrs": sum(qp.outstanding for qp in qps), "bytes": sum(w["bytes"] for w in owed),
                    "grants": len(self.held_grants), "loans": len(lent)}

        def drain():
            debt = owned()
            for qp in qps:
                qp.outstanding = 0
            owed.clear()
            lent.clear()
            self.held_grants = set()
            return {"debt_before": debt, "debt_after": owned(), "locally_drained": True}

        recovery = self.recover_lost(qps, drain)
        lying = "lost_reports_bytes" in self.defects
        effect = self._lost_effect()
        batches, errors = [], []
        for batch in lost["batches"]:
            nbytes = len(batch["parents"]) * self.payload if lying else 0
            batch["state"] = "Failed"
            error = EngineError("PeerLost", "wait", f"batch {batch['batch']}: the source died with its completions "
                                "lost", round_no=lost["round"], remote_effect=effect, locally_drained=True,
                                nbytes=nbytes, expected=True)
            errors.append(error.as_dict())
            batches.append({"batch": batch["batch"], "rail": batch["rail"], "parents": batch["parents"],
                            "state": "Failed", "bytes": nbytes, "remote_effect": effect, "locally_drained": True,
                            "free": self.free(batch, lost["round"], [])})
        recovery.update(batches=batches, errors=errors)
        self.lost = None
        return recovery

    # --------------------------------------------------------------- installed-cleanup-failure

    def cleanup_round(self):
        """docs/cleanup_failure.md: the round after the generation's three, one parent, one slice. The uverbs_fault
        observer withholds its successful completion, so the wait times out; quiescing it (QP to ERR, then
        destroy) fails EIO through the observer's filter on the context's uverbs descriptor. The batch fails
        Unquiesced and not locally drained; free stays busy, CPU writes into its allocation are refused, its SQ,
        byte and batch charges stay held, a repeated close neither retries the destroy nor claims a drain, and
        the quarantine keeps the allocation and the QP after the caller drops its handles (a weak owner and a
        real ibv_query_qp show it). Everything is recorded in ``restart.cleanup``. The cq, channel and pd kinds
        (dependency failures) are sim/orbite_sim/cleanup_kinds.py's."""
        if cleanup_kinds.is_dependency_kind(self.profile):
            return cleanup_kinds.run(self, Allocation, CLEANUP_WR_ID)
        round_no = HELD_ROUND
        rail, lane = self.placement()[0]
        qp = self.live_qps[(rail, lane)]
        mr = self.contexts[rail]["mrs"]["data"]
        offset = region_offset(0, self.payload)
        before = {"provider_held": self.provider.held(), "provider": self.provider.counters()}
        parents_msg = [{"parent": 0, "rail": rail, "lane": lane, "bytes": self.payload}]
        ready, _seed, _guard_seed = self.begin_fault_round(round_no, parents_msg)
        grants = sorted(int(p) for p in ready.get("grants", []))
        peer_addr, peer_rkey = self.remote[qp.qpn]
        allocation = Allocation(self.arena, offset, self.payload)
        batch = {"batch": round_no * 10 + rail, "rail": rail, "parents": [0], "state": "Running", "qpn": qp.qpn,
                 "wr_id": CLEANUP_WR_ID, "bytes": self.payload, "grants": grants}
        qp.post_send(CLEANUP_WR_ID, mr.addr + offset, self.payload, mr.lkey, peer_addr + offset, peer_rkey)
        self.quarantine = {"batch": batch, "qp": qp, "allocation": allocation}
        record = {"round": round_no, "kind": "qp", "rail": rail, "lane": lane, "qpn": qp.qpn, "batch": batch,
                  "before": before}
        record["wait"] = self._cleanup_wait(qp, batch, round_no)
        record["close"] = self.close_batch(batch, round_no)
        record["free"] = self.free(batch, round_no)
        record["cpu_write"] = self.cpu_write(allocation, round_no)
        record["charges"] = self.held_charges()
        record["repeated_close"] = self.close_batch(batch, round_no)
        # The caller drops every handle it had (batch, allocation, QP): only the engine's quarantine may keep them.
        owner = weakref.ref(allocation)
        qpn = qp.qpn
        del allocation, qp
        batch = None
        if "release_quarantined" in self.defects:  # the defect: the engine forgets what it must keep
            self.quarantine = None
        gc.collect()
        kept = self.quarantine["qp"] if self.quarantine is not None else None
        query = None
        if kept is not None:
            try:
                query = kept.query()
            except VerbsError as exc:
                query = {"qpn": qpn, "error": exc.code}
        record["retained"] = {"weak_owner_alive": owner() is not None, "qp_query": query,
                              "provider_held": self.provider.held(), "table_live": self.table.live_count(),
                              "charges": self.held_charges()}
        self.doc["restart"]["cleanup"] = record
        self.checkpoint()

    def _cleanup_wait(self, qp, batch, round_no):
        """wait(batch), bounded: a completion the observer withheld never comes, so this times out (a typed
        Timeout of its own); any completion that does come is polled and recorded."""
        timeout = self.timeouts["grant_s"]
        deadline = time.monotonic() + timeout
        polled = []
        while time.monotonic() < deadline and not polled:
            for wr_id, status, byte_len, qpn in qp.cq.poll():
                qp.retire()
                self.contexts[qp.context.rail]["ctx"].native.cqes += 1
                polled.append({"wr_id": wr_id, "status": WC_STATUS_NAMES.get(status, str(status)),
                               "byte_len": byte_len, "qpn": qpn})
            time.sleep(0.005)
        if polled:
            batch["state"] = "Completed" if all(c["status"] == "SUCCESS" for c in polled) else "Failed"
            return {"timeout_s": timeout, "result": "Ok", "completions": polled, "state_after": batch["state"]}
        error = EngineError("Timeout", "wait", f"batch {batch['batch']}: no completion within {timeout:g} s",
                            round_no=round_no, remote_effect="Unknown", locally_drained=False, expected=True)
        self.doc["errors"].append(error.as_dict())
        return {"timeout_s": timeout, "result": "Timeout", "completions": [], "state_after": batch["state"]}

    def close_batch(self, batch, round_no):
        """Quiesce a batch that did not complete: its QP to ERR, then destroyed. A QP whose destroy failed is
        quarantined: the batch fails Unquiesced, not locally drained, and a later close says so again without
        calling destroy (retry_destroy: it calls it again; drain_after_eio: it claims a drain)."""
        qp = self.quarantine["qp"]
        if batch["state"] == "Completed":
            return {"result": "Ok", "destroy_called": False, "destroy": None, "locally_drained": True}
        first = qp.state != "ERR"
        destroy = None
        if first or "retry_destroy" in self.defects:
            if first:
                qp.to_error()
            try:
                self.destroy_qp(qp, "cleanup")
            except VerbsError as exc:
                destroy = {"call": exc.call, "errno": exc.code}
            else:
                destroy = {"call": "ibv_destroy_qp", "errno": None}
        drained = not qp.live or (not first and "drain_after_eio" in self.defects)
        if drained:
            batch["state"] = "Failed"
            return {"result": "Ok", "destroy_called": destroy is not None, "destroy": destroy, "locally_drained": True}
        batch["state"] = "Failed"
        error = EngineError("Unquiesced", "close", f"batch {batch['batch']}: QP {qp.qpn} could not be destroyed "
                            f"({destroy['errno'] if destroy else 'quarantined'}); its work may still run",
                            round_no=round_no, remote_effect="Unknown", locally_drained=False, expected=True)
        self.doc["errors"].append(error.as_dict())
        return {"result": "Unquiesced", "destroy_called": destroy is not None, "destroy": destroy,
                "locally_drained": False, "qp_state": qp.state}

    def cpu_write(self, allocation, round_no):
        """A CPU write into the batch's allocation: refused (Unquiesced) while the QP that may still write it is
        quarantined (cpu_write_ok: written anyway)."""
        if self.quarantine is not None and "cpu_write_ok" not in self.defects:
            error = EngineError("Unquiesced", "write", f"the allocation of batch {self.quarantine['batch']['batch']} "
                                "is excluded from CPU writes while its QP is quarantined", round_no=round_no,
                                remote_effect="None", locally_drained=False, expected=True)
            self.doc["errors"].append(error.as_dict())
            return {"result": "Unquiesced", "bytes_written": 0}
        allocation.view[0] = allocation.view[0]
        return {"result": "Ok", "bytes_written": 1}

    def held_charges(self):
        """What the quarantine still charges, counted from the engine's own state: send-queue slots of its QP
        (the engine's count and the provider's), the bytes of its batch, the batch itself (drop_charges: the
        defect releases them)."""
        if self.quarantine is None or "drop_charges" in self.defects:
            return {"sq_slots": 0, "provider_sq_slots": 0, "bytes": 0, "batches": 0}
        qp, batch = self.quarantine["qp"], self.quarantine["batch"]
        return {"sq_slots": qp.outstanding, "provider_sq_slots": qp.provider_outstanding(),
                "bytes": batch["bytes"] if batch["state"] != "Completed" else 0,
                "batches": 0 if batch["state"] == "Completed" else 1}

    def transfer(self, round_no, parents, sizes, created, existing):
        """Post every slice of every parent, interleaved per QP, and reap all completions."""
        queues = collections.OrderedDict()
        for qp in self.live_qps.values():
            queues[qp] = collections.deque()
        # serial_round_two: the defect of serial_parents in round 2 only (rounds 1 and 3 concurrent)
        serial = "serial_parents" in self.defects or ("serial_round_two" in self.defects and round_no == 2)
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
        last = len(sizes) - 1
        if self.events:
            # Armed before the first post, so the round's first completion signals its channel even when
            # the polls reap every completion without waiting (a small, fast round).
            armed = self._wait_events(cqs, channels, progress, deadline, False)

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
                    stated = min(qp.outstanding, SEND_QUEUE_DEPTH) if self.understated else qp.outstanding
                    u["max_inflight_wrs"] = max(u["max_inflight_wrs"], stated)
                    u["max_outstanding_parents"] = max(u["max_outstanding_parents"], len(counts))

            got = 0
            for cq in cqs:
                progress["poll_calls"] += 1
                for wr_id, status, byte_len, qpn in cq.poll(POLL_BATCH):
                    got += 1
                    self._complete(wr_id, status, byte_len, qpn, flight, usage, remaining, failed, parents, public,
                                   last)
            progress["cqes_polled"] += got
            done += got
            report_progress(self, round_no, ROUNDS, "transfer", done, total, len(wrs), force=False)
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
        if self.events and progress["cq_arms"] and not progress["cq_events"]:
            # The poll right after arming reaped the last completions: their event still signals the
            # armed channel. Consume and acknowledge it (briefly waiting for it), as every armed
            # notification must be, so it is this round's and never a later one's.
            self._consume_events(cqs, channels, progress, EVENT_GRACE_S)
        if failed and self.rv.closed_reason is not None:
            # The WRs failed because the source went away (its connections broke with it).
            raise peer_lost("wait", f"{len(failed)} parent(s) failed and the rendezvous closed "
                            f"({self.rv.closed_reason})", round_no=round_no, remote_effect="Unknown",
                            locally_drained=True, wrs_posted=len(wrs))
        for p in parents:
            if p["parent"] in failed:
                p["status"] = "Failed"
        return wrs, list(usage.values()), progress, public

    def _post(self, round_no, qp, parent, s, length, local):
        """Post slice ``s`` of ``parent`` on ``qp`` (same offset on both sides); returns its WR record."""
        self.next_wr_id += 1
        wr_id = self.next_wr_id
        rail = qp.context.rail
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
        peer_addr, peer_rkey = self.remote[qp.qpn]
        try:
            qp.post_send(wr_id, mr.addr + local, length, mr.lkey, peer_addr + local, peer_rkey)
        except VerbsError as exc:
            raise EngineError("Internal", "submit", str(exc), round_no=round_no,
                              parent=parent["parent"]) from None
        return record

    def _complete(self, wr_id, status, byte_len, qpn, flight, usage, remaining, failed, parents, public, last):
        record = self.wr_info.get(wr_id)
        qp = self.qp_by_num.get(qpn)
        if record is None or qp is None or record["qpn"] != qpn:
            raise EngineError("Internal", "wait", f"completion of wr_id {wr_id} on QP {qpn}: not a WR this round "
                              "posted there", round_no=self.round_no)
        qp.retire()
        record["status"] = WC_STATUS_NAMES.get(status, str(status))
        record["completed_seq"] = self.seq
        self.seq += 1
        pid = record["parent"]
        counts = flight[qpn]
        counts[pid] -= 1
        if counts[pid] == 0:
            del counts[pid]
        u = usage[qpn]
        u["cqes"] += 1
        parent = parents[pid]
        if status == WC_SUCCESS:
            u["bytes_completed"] += byte_len
            parent["completed_bytes"] += byte_len
            if pid == 0 and self.operation == "read":  # the slice landed here: destination-side defects
                self.spoil_landed(record["slice"] == 0, record["slice"] == last)
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
        by_ptr = {cq.ptr: cq for cq in cqs}
        for ch in ready:
            while select.select([ch], [], [], 0)[0]:
                cq = by_ptr.get(ch.get_cq_event())
                progress["cq_events"] += 1
                if cq is not None:
                    cq.ack_events(1)  # at once: destroying a CQ waits for every event to be acknowledged
        return False

    def _consume_events(self, cqs, channels, progress, timeout):
        by_ptr = {cq.ptr: cq for cq in cqs}
        for ch in select.select(channels, [], [], timeout)[0]:
            while select.select([ch], [], [], 0)[0]:
                cq = by_ptr.get(ch.get_cq_event())
                progress["cq_events"] += 1
                if cq is not None:
                    cq.ack_events(1)

    def close(self):
        self.rv.close()
        self.teardown(self.all_qps, {})

# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The source side of the simulated engine: rendezvous service, QP pairs on request, grants and drain.

The source listens, answers HELLO with its MR keys and addresses, creates and connects a QP for
every QP the requester offers (QPN and GID both ways, as on RoCE), prepares its side of each round
(the input for READ, poisoned destinations for WRITE), and at ROUND_DONE checks what landed
(WRITE), releases the returned grants and reports its drain state. It posts nothing: the
requester's one-sided operations are served by the verbs provider straight from/into its MRs.
"""

import os
import time

from . import content, inflight, wire
from .case import format_address, parse_address
from .engine import (
    BIND_WR_ID,
    HELD_ROUND,
    LOST_ROUND,
    RAILS,
    RECV_WR_ID,
    ROUNDS,
    Engine,
    Round,
    count_public,
    new_progress,
    profile_key,
    qp_usage,
)
from .errors import EngineError, protocol_error
from .ledger import write_json_atomic
from .progress import report as report_progress
from .verbs import ACCESS_REMOTE_READ, ACCESS_REMOTE_WRITE, WC_STATUS_NAMES


class SourceEngine(Engine):
    role = "source"

    def __init__(self, case, output, ledger, provider):
        super().__init__(case, output, ledger, provider)
        self.by_qpn = {}  # qpn -> live QueuePair (the provider serves the requester on these)
        self.grants = set()
        self.held = None  # installed-interruption: the authorization granted and not answered yet
        self.mw = None

    def run(self):
        self.open()
        host, port = parse_address(self.case["service_address"], "service_address")
        rv_listener = wire.listen(host, port)
        self.listeners = [rv_listener]
        service = format_address(host, rv_listener.getsockname()[1])
        self.doc["service_address"] = service
        self.checkpoint()
        write_json_atomic(os.path.join(self.output, "ready.json"), {
            "schema": "orbite.runner-ready", "version": 1, "protocol": self.case["protocol"], "pid": os.getpid(),
            "role": "source", "generation": self.case["generation"], "epoch": self.epoch,
            "registration_id": self.case["registration_id"], "service_address": service})
        print(f"orbite-runner: ready {service}", flush=True)
        timeout = self.timeouts["connect_s"]
        while True:
            sock = wire.accept(rv_listener, timeout, "rendezvous")
            self.rv = wire.Rendezvous(sock, self.epoch)
            self.accept_segment()
            if self.peer_epochs[:-1]:
                self.stale_probes()
            if self.serve() == "bye":
                break
            # installed-restart: the generation ended at its restart point (RESTART_POINT).
            if not self.survivor:
                self.await_kill()
            self.await_peer_death()
            recovery = None
            if self.interruption:
                recovery = self.release_held()
            elif self.lost_mode:
                recovery = self.release_lost()
            elif self.cleanup:
                recovery = self.release_cleanup()
            self.next_generation()
            if recovery is not None:
                self.doc["restart"]["recovery"] = recovery
                self.checkpoint()
            timeout = self.timeouts["restart_s"]  # the replacement requester comes after the kill
        self.close()

    def forget_qps(self):
        self.by_qpn = {}

    def ready_extras(self):
        """More ROUND_READY fields (installed-memory-cleanup mw: the memory window the grant is bound to)."""
        return {}

    def accept_segment(self):
        hello = self.rv.recv(self.timeouts["connect_s"], ["HELLO"])
        self.rv.peer_epoch = hello["epoch"]
        self.doc["peer_epoch"] = hello["epoch"]
        self.note_peer_epoch(hello["epoch"])
        if hello.get("protocol") != self.case["protocol"]:
            self._refuse("ProtocolError", f"peer protocol {hello.get('protocol')!r}")
        if hello.get("profile") != profile_key(self.profile):
            self._refuse("ProtocolError", f"peer profile {hello.get('profile')} differs from "
                         f"{profile_key(self.profile)}")
        target = hello.get("target_registration_id")
        if target is not None and target != self.case["registration_id"]:
            self._refuse("Unavailable", f"peer asked for registration {target!r}, this engine is "
                         f"{self.case['registration_id']!r}")
        if self.case["peer_registration_id"] is None:
            self.doc["peer_registration_id"] = hello.get("registration_id")
        segments = [seg for seg in (self.segment(rail) for rail in RAILS) if seg is not None]
        self.rv.send("WELCOME", registration_id=self.case["registration_id"], segments=segments)

    def _refuse(self, error, message):
        self.rv.send("ERROR", error=error, operation="open_segment", message=message)
        raise EngineError(error, "open_segment", message)

    def serve(self):
        rnd = Round(self.round_no + 1)
        self.mark_counters(rnd)
        while True:
            msg = self.rv.recv(self.timeouts["round_s"], ["CONNECT_QPS", "ROUND_BEGIN", "ROUND_DONE", "BYE",
                                                          "RESTART_POINT"])
            kind = msg["kind"]
            if kind == "CONNECT_QPS":
                self.connect_qps(msg, rnd)
            elif kind == "ROUND_BEGIN" and self.interruption and int(msg["round"]) == HELD_ROUND:
                self.grant_held_round(msg)
            elif kind == "ROUND_BEGIN" and self.cleanup and int(msg["round"]) == HELD_ROUND:
                self.grant_cleanup_round(msg)
            elif kind == "ROUND_BEGIN":
                self.begin_round(msg, rnd)
            elif kind == "ROUND_DONE" and self.inflight and self.round_no == inflight.FAULT_ROUND:
                inflight.finish_source_fault_round(self, msg, rnd)
                rnd = Round(self.round_no + 1)
                self.mark_counters(rnd)
                self.checkpoint()
            elif kind == "ROUND_DONE":
                self.finish_round(msg, rnd)
                rnd = Round(self.round_no + 1)
                self.mark_counters(rnd)  # before the next ROUND_READY: nothing is lost
                self.checkpoint()
            elif kind == "RESTART_POINT":
                # installed-lost-completion: the lost round was begun (granted) and never done.
                last = LOST_ROUND if self.lost_mode else ROUNDS
                if not self.restart or self.generation >= self.generations or self.round_no != last:
                    raise protocol_error("restart", f"RESTART_POINT in generation {self.generation} of "
                                         f"{self.generations} after round {self.round_no}")
                if self.interruption:
                    self.note_held()
                if self.lost_mode:
                    self.note_lost(rnd)
                if self.cleanup:
                    self.note_cleanup()
                self.at_restart_point()
                self.rv.send("RESTART_ACK", generation=self.generation)
                return "restart"
            else:
                self.rv.send("BYE")
                return "bye"

    def connect_qps(self, msg, rnd):
        for peer_qpn in msg.get("retire", []):
            for qp in list(self.by_qpn.values()):
                if qp.peer_qpn == peer_qpn:
                    del self.by_qpn[qp.qpn]
                    self.destroy_qp(qp, rnd.round_no)
        peers = {}
        for item in msg["qps"]:
            rail, lane = int(item["rail"]), int(item["lane"])
            if rail not in RAILS or item["operation"] != self.operation:
                raise protocol_error("connect_qp", f"QP request {item} does not fit this engine")
            qp = self.new_qp(rail, lane, rnd.round_no)
            self.connect_qp(qp, item, rnd.round_no)  # to RTR/RTS before the answer: the requester may post at once
            self.by_qpn[qp.qpn] = qp
            rnd.created.add(qp.qpn)
            peers[str(item["qpn"])] = self.qp_offer(qp)
        self.rv.send("QPS_ACCEPTED", round=msg.get("round"), peers=peers)

    def begin_round(self, msg, rnd):
        round_no = int(msg["round"])
        if round_no != rnd.round_no:
            raise protocol_error("submit", f"round {round_no} after round {self.round_no}")
        self.grants = set()  # skip_drain left the previous round's grants held until now
        self.round_no = round_no
        rnd.started = time.time()
        # The round's start, so the controller's wait shows this round (this engine posts no WR: no count).
        report_progress(self, round_no, ROUNDS, "transfer")
        rnd.native_before = self.native_snapshot()
        rnd.placement = msg["parents"]
        if self.operation == "read":
            rnd.seed, rnd.origin = self.local_input(round_no), "local"
        else:
            rnd.guard_seed = self.poison_destination()
            rnd.seed, rnd.origin = int(msg["input_seed"]), "peer"
        self.grants = {int(p["parent"]) for p in msg["parents"]}
        rnd.issued = sorted(self.grants)
        self.rv.send("ROUND_READY", round=round_no, input_seed=rnd.seed, grants=rnd.issued, **self.ready_extras())
        if self.operation == "read" and "payload_over_rendezvous" in self.defects:
            self.ship_payload_over_rendezvous(round_no)

    def grant_held_round(self, msg):
        """installed-interruption: authorize the round after a nonfinal generation's three as for any payload,
        a memory window bound over the data MR and the completion receive posted on the first parent's QP,
        then READY with the window's key. The control relay holds that READY: the grant stays pending."""
        if self.generation >= self.generations or self.round_no != ROUNDS or self.held is not None:
            raise protocol_error("submit", f"round {msg.get('round')} in generation {self.generation} of "
                                 f"{self.generations} after round {self.round_no}")
        before = self.held_snapshot()
        parents = msg["parents"]
        rail, lane = int(parents[0]["rail"]), int(parents[0]["lane"])
        qp = next((q for q in self.by_qpn.values() if (q.context.rail, q.lane) == (rail, lane)), None)
        if qp is None:
            raise protocol_error("submit", f"no QP on rail {rail} lane {lane} for the grant")
        entry = self.contexts[rail]
        data, ctrl = entry["mrs"]["data"], entry["mrs"]["ctrl"]
        self.mw = entry["ctx"].alloc_mw(entry["pd"])
        access = ACCESS_REMOTE_READ if self.operation == "read" else ACCESS_REMOTE_WRITE
        self.mw.bind(qp, BIND_WR_ID + HELD_ROUND, data, data.addr, data.length, access)
        bind_status = self._reap_bind(entry["cq"], qp)
        qp.post_recv(RECV_WR_ID + HELD_ROUND, ctrl.addr, ctrl.length, ctrl.lkey)
        self.grants = {int(p["parent"]) for p in parents}
        self.held = {"round": HELD_ROUND, "parents": len(parents), "grants_pending": len(self.grants),
                     "mw": {"rail": rail, "handle": self.mw.handle, "rkey": self.mw.rkey, "bind": bind_status},
                     "completion_receive": {"rail": rail, "lane": lane, "qpn": qp.qpn,
                                            "wr_id": RECV_WR_ID + HELD_ROUND, "pending": qp.receives},
                     "ready_sent_at": None, "before": before, "after": None}
        grant = {"rail": rail, "rkey": self.mw.rkey, "parents": sorted(self.grants)}
        self.rv.send("ROUND_READY", round=HELD_ROUND, grant=grant)
        self.held["ready_sent_at"] = time.time()

    def _reap_bind(self, cq, qp, bind_wr_id=BIND_WR_ID + HELD_ROUND):
        """The bind is a send-queue operation: its completion, polled here, says whether the window is bound."""
        deadline = time.monotonic() + self.timeouts["connect_s"]
        while time.monotonic() < deadline:
            for wr_id, status, _len, _qpn in cq.poll(1):
                qp.retire()
                if wr_id == bind_wr_id:
                    return WC_STATUS_NAMES.get(status, str(status))
            time.sleep(0.001)
        raise EngineError("Timeout", "submit", "the memory-window bind did not complete")

    def note_held(self):
        """At the restart point: the grant still pending, what moved meanwhile (nothing may)."""
        if self.held is None:
            raise protocol_error("restart", "RESTART_POINT before the held round was authorized")
        qp = self.by_qpn.get(self.held["completion_receive"]["qpn"])
        self.held["grants_pending"] = len(self.grants)
        self.held["completion_receive"]["pending"] = qp.receives if qp is not None else 0
        self.held["after"] = self.held_snapshot()
        self.doc["restart"]["interruption"] = self.held

    def release_held(self):
        """The surviving source after the requester died: drain the outstanding completion receive (its QP to
        ERR, the flushed receive polled), reclaim the lanes, release the window and the pending grants."""
        recovery = self.reclaim_lanes()
        pending = len(self.grants)
        if self.mw is not None:
            self.mw.dealloc()
        recovery.update(grants_released=pending, mw_released=self.mw is not None and not self.mw.live)
        self.grants, self.held, self.mw = set(), None, None
        return recovery

    def note_lost(self, rnd):
        """installed-lost-completion, at the restart point: the lost round's grants still issued (the source's
        authorization the requester holds) and what this side's devices served or received meanwhile (the
        provider's own count: the payload did move, only its completions were lost)."""
        device = self.device_counters(rnd.device_before)
        moved = "read_bytes_served" if self.operation == "read" else "write_bytes_landed"
        self.doc["restart"]["lost"] = {
            "round": self.round_no, "parents": len(rnd.placement or []), "grants_pending": len(self.grants),
            "grants_issued": rnd.issued, "device_bytes": {rail: counters[moved] for rail, counters in device.items()},
            "qps_live": sorted(self.by_qpn), "at": time.time()}

    def release_lost(self):
        """The surviving source after the requester died owning the lost round: every QP towards it is destroyed
        (receipts), then the drain releases the grants it still holds. source_keeps_grants: they stay held."""
        qps = [self.by_qpn[q] for q in sorted(self.by_qpn)]

        def drain():
            held = len(self.grants)
            if "source_keeps_grants" not in self.defects:
                self.grants = set()
            return {"debt_before": {"grants": held}, "debt_after": {"grants": len(self.grants)},
                    "grants_released": held - len(self.grants), "locally_drained": not self.grants}

        return self.recover_lost(qps, drain)
    # ------------------------------------------------------------ installed-cleanup-failure

    def grant_cleanup_round(self, msg):
        """docs/cleanup_failure.md: grant the round after a nonfinal generation's three as any other. The
        requester's batch never resolves (its completion withheld, its QP quarantined): no ROUND_DONE comes and
        the grant stays unresolved until the requester dies."""
        if self.generation >= self.generations or self.round_no != ROUNDS or self.held is not None:
            raise protocol_error("submit", f"round {msg.get('round')} in generation {self.generation} of "
                                 f"{self.generations} after round {self.round_no}")
        self.grants = {int(p["parent"]) for p in msg["parents"]}
        if self.operation == "read":
            seed = self.local_input(HELD_ROUND)
        else:
            self.poison_destination()
            seed = int(msg["input_seed"])
        self.held = {"round": HELD_ROUND, "grants_issued": sorted(self.grants), "grants_pending": len(self.grants),
                     "input_seed": seed}
        self.rv.send("ROUND_READY", round=HELD_ROUND, input_seed=seed, grants=sorted(self.grants))

    def note_cleanup(self):
        """At the restart point: the cleanup round's grant still unresolved (the requester never returned it)."""
        if self.held is None and self.profile.get("cleanup_kind") == "pd":  # idle: no cleanup round, no grant
            self.held = {"round": None, "grants_issued": [], "grants_pending": len(self.grants), "input_seed": None}
        if self.held is None:
            raise protocol_error("restart", "RESTART_POINT before the cleanup round was granted")
        self.held["grants_pending"] = len(self.grants)
        self.doc["restart"]["cleanup"] = self.held

    def release_cleanup(self):
        """The surviving source after the requester died: its lanes reclaimed, its unresolved grant released."""
        recovery = self.reclaim_lanes()
        recovery["grants_released"] = len(self.grants)
        self.grants, self.held = set(), None
        return recovery

    def finish_round(self, msg, rnd):
        round_no = int(msg["round"])
        if round_no != self.round_no:
            raise protocol_error("drain", f"ROUND_DONE for round {round_no} during round {self.round_no}")
        parents = []
        qp_of = {(qp.context.rail, qp.lane): qp.qpn for qp in self.by_qpn.values()}
        expected = content.RoundInput(rnd.seed, self.parents, self.payload) if self.operation == "write" else None
        if expected is not None:
            self.spoil_landed(True, True)  # corrupt_byte / overwrite_guard: every byte has landed here
        # One-sided operations leave no trace in this engine's verbs calls, and the requester's word on
        # what completed is not this engine's to repeat: a parent's bytes are not known here
        # (completed_bytes null); what this side's devices served or received, per rail, is the
        # provider's own per-context count (the round's `device`), and the public counters are that.
        for item in rnd.placement:
            pid, rail, lane = int(item["parent"]), int(item["rail"]), int(item["lane"])
            entry = self.parent_entry(pid, rail, lane, qp_of.get((rail, lane)), int(item["bytes"]), None, 0,
                                      "Granted")
            if expected is not None and self.check_parent(entry, expected, rnd.guard_seed, "drain", round_no):
                self.rounds_failed_checks = True
            parents.append(entry)
        released = {int(p) for p in msg.get("released", [])} & self.grants
        if "skip_drain" in self.defects:  # skip_drain: the round ends with the grants still held
            released = set()
        self.grants -= released
        for entry in parents:
            if entry["status"] == "Granted" and entry["parent"] in released:
                entry["status"] = "Released"
        debt = len(self.grants)
        public = self.new_public()
        moved = "read_bytes_served" if self.operation == "read" else "write_bytes_landed"
        # The round's figures are read before ROUND_DRAINED: the requester may start the next round (and its
        # provider move bytes through this one's devices) as soon as it arrives.
        at_drain = {"provider": self.provider.counters(), "device": self.device_counters(rnd.device_before)}
        device = at_drain["device"]
        for rail in self.enabled_rails:
            count_public(public, rail, device[str(rail)][moved])
        # This engine posts no WR: its WR debt is what the provider says its QPs still hold.
        drain = self.drain_state([], self.by_qpn.values(), debt)
        drain.update(grants_issued=rnd.issued, grants_released=sorted(released))
        self.rv.send("ROUND_DRAINED", round=round_no, drained=drain["drained"], debt_grants=debt,
                     released=sorted(released))
        usage = [qp_usage(qp, qp.qpn in rnd.created, qp.qpn not in rnd.created) for qp in self.by_qpn.values()]
        self.record_round(rnd, batches=[], parents=parents, wrs=[], usage=usage, public=public, drain=drain,
                          progress=new_progress(self.events), at_drain=at_drain)

    def close(self):
        self.rv.close()
        for listener in self.listeners:
            listener.close()
        self.grants = set()  # BYE ends the session: every grant, even one skip_drain kept, is returned
        self.teardown(self.all_qps, {"grants": len(self.grants)})

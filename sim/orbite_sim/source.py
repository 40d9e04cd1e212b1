# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The source side of the simulated engine: rendezvous service, QP pairs on request, grants and drain.

The source listens, answers HELLO with its MR keys and a session token, creates a QP for every QP
the requester connects, prepares its side of each round (the input for READ, poisoned destinations
for WRITE), and at ROUND_DONE checks what landed (WRITE), releases the returned grants and reports
its drain state. Its NIC serves the requester's one-sided operations.
"""

import os
import time

from . import content, wire
from .case import format_address, parse_address
from .engine import RAILS, Engine, Round, count_public, fresh_u64, new_progress, profile_key, qp_usage
from .errors import EngineError, protocol_error
from .ledger import write_json_atomic
from .nic import SourceNic


class SourceEngine(Engine):
    role = "source"

    def __init__(self, case, output, ledger):
        super().__init__(case, output, ledger)
        self.by_qpn = {}  # qpn -> live QueuePair (the NIC serves these)
        self.grants = set()
        self.token = fresh_u64()

    def run(self):
        self.open()
        self.attach_observer(lambda wr_id: None)
        host, port = parse_address(self.case["service_address"], "service_address")
        rv_listener = wire.listen(host, port)
        data_listener = wire.listen(host, 0)
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
        sock = wire.accept(rv_listener, self.timeouts["connect_s"], "rendezvous")
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
        if hello.get("profile") != profile_key(self.profile):
            self._refuse("ProtocolError", f"peer profile {hello.get('profile')} differs from "
                         f"{profile_key(self.profile)}")
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
        sock = wire.accept(data_listener, self.timeouts["connect_s"], "data channel")
        channel = wire.DataChannel(sock)
        bind = channel.recv_header()
        if bind is None or bind[0] != wire.BIND or bind[5] != self.token:
            channel.close()
            raise protocol_error("open_segment", "data connection did not bind with this session's token")
        data_mr = {rail: e["mrs"]["data"] for rail, e in self.contexts.items() if "data" in e["mrs"]}
        self.nic = SourceNic(channel, self.rv, self.by_qpn, data_mr, content.stride(self.payload),
                             oob="payload_over_rendezvous" in self.defects, payload_timeout=self.timeouts["round_s"])
        self.nic.after_land = self.after_land
        self.nic.start()

    def _refuse(self, error, message):
        self.rv.send("ERROR", error=error, operation="open_segment", message=message)
        raise EngineError(error, "open_segment", message)

    def serve(self):
        rnd = Round(self.round_no + 1)
        rnd.data_before = self.nic.ch.counters()
        while True:
            msg = self.rv.recv(self.timeouts["round_s"], ["CONNECT_QPS", "ROUND_BEGIN", "ROUND_DONE", "BYE"])
            kind = msg["kind"]
            if kind == "CONNECT_QPS":
                self.connect_qps(msg, rnd)
            elif kind == "ROUND_BEGIN":
                self.begin_round(msg, rnd)
            elif kind == "ROUND_DONE":
                self.finish_round(msg, rnd)
                rnd = Round(self.round_no + 1)
                rnd.data_before = self.nic.ch.counters()  # before the next ROUND_READY, so no frame is lost
                self.checkpoint()
            else:
                self.rv.send("BYE")
                return

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
            self.connect_qp(qp, int(item["qpn"]), None)
            self.by_qpn[qp.qpn] = qp
            rnd.created.add(qp.qpn)
            peers[str(item["qpn"])] = qp.qpn
        self.rv.send("QPS_ACCEPTED", round=msg.get("round"), peer_qpns=peers)

    def begin_round(self, msg, rnd):
        round_no = int(msg["round"])
        if round_no != rnd.round_no:
            raise protocol_error("submit", f"round {round_no} after round {self.round_no}")
        self.grants = set()  # skip_drain left the previous round's grants held until now
        self.round_no = round_no
        self.nic.round_no = round_no
        rnd.started = time.time()
        rnd.native_before = self.native_snapshot()
        rnd.placement = msg["parents"]
        if self.operation == "read":
            rnd.seed, rnd.origin = self.local_input(round_no), "local"
        else:
            rnd.guard_seed = self.poison_destination()
            rnd.seed, rnd.origin = int(msg["input_seed"]), "peer"
        self.nic.parent_bytes = {}
        self.grants = {int(p["parent"]) for p in msg["parents"]}
        self.rv.send("ROUND_READY", round=round_no, input_seed=rnd.seed)

    def finish_round(self, msg, rnd):
        round_no = int(msg["round"])
        if round_no != self.round_no:
            raise protocol_error("drain", f"ROUND_DONE for round {round_no} during round {self.round_no}")
        parents = []
        qp_of = {(qp.context.rail, qp.lane): qp.qpn for qp in self.by_qpn.values()}
        expected = content.RoundInput(rnd.seed, self.parents, self.payload) if self.operation == "write" else None
        for item in rnd.placement:
            pid, rail, lane = int(item["parent"]), int(item["rail"]), int(item["lane"])
            entry = self.parent_entry(pid, rail, lane, qp_of.get((rail, lane)), int(item["bytes"]),
                                      self.nic.parent_bytes.get(pid, 0), 0, "Granted")
            if expected is not None and self.check_parent(entry, expected, rnd.guard_seed, "drain", round_no):
                self.rounds_failed_checks = True
            parents.append(entry)
        released = {int(p) for p in msg.get("released", [])}
        if "skip_drain" not in self.defects:  # skip_drain: the round ends with the grants still held
            self.grants -= released
            for entry in parents:
                if entry["status"] == "Granted" and entry["parent"] in released:
                    entry["status"] = "Released"
        debt = len(self.grants)
        public = self.new_public()
        for entry in parents:
            # As the requester's: a parent whose transfer completed; the checks are reported apart
            # (status/byte_check), not folded into the counters.
            if entry["completed_bytes"] == entry["requested_bytes"]:
                count_public(public, entry["rail"], entry["completed_bytes"])
        drain = {"drained": debt == 0, "debt_wrs": 0, "debt_bytes": 0, "debt_grants": debt}
        self.rv.send("ROUND_DRAINED", round=round_no, drained=drain["drained"], debt_grants=debt)
        usage = [qp_usage(qp, qp.qpn in rnd.created, qp.qpn not in rnd.created) for qp in self.by_qpn.values()]
        self.record_round(rnd, batches=[], parents=parents, wrs=[], usage=usage, public=public, drain=drain,
                          progress=new_progress(self.events))

    def close(self):
        # The requester closes the data channel after BYE; wait for the NIC to see EOF.
        self.nic.join(self.timeouts["connect_s"])
        self.nic.stop()
        self.rv.close()
        for listener in self.listeners:
            listener.close()
        self.grants = set()  # BYE ends the session: every grant, even one skip_drain kept, is returned
        self.teardown(self.all_qps, {"grants": len(self.grants)})

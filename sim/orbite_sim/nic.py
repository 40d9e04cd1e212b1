# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The NIC of each simulated process: a thread that moves payload on the data channel.

It plays the part of the RNIC hardware: it reads and writes MR memory directly (``recv_into`` into
and ``sendall`` from memoryviews of the registered buffer) and produces completions on the QP's CQ
only when the peer's response or acknowledgement for that WR has arrived.

Requester NIC: ``transmit`` (called by QP.post_send) sends a READ request or the WRITE payload; the
receive thread lands READ responses into the local MR and turns responses/acks into CQEs.
Source NIC: answers READ requests from its MR and lands WRITE payload into it, after checking the
QPN, the rkey and the bounds (REM_ACCESS_ERR otherwise), and acks WRITEs.
Both move payload the same way: in the frame, or (defect payload_over_rendezvous) as a rendezvous
PAYLOAD message with only the header on the data channel.
"""

import base64
import threading

from . import wire
from .verbs import OPCODES, WC_REM_ACCESS_ERR, WC_SUCCESS, WC_WR_FLUSH_ERR, Cqe


class Nic:
    """What both NICs share: the receive thread, payload in or out of band, stop and join."""

    def __init__(self, channel, rendezvous, name, oob=False, payload_timeout=60.0):
        self.ch = channel
        self.rv = rendezvous
        self.oob = oob
        self.payload_timeout = payload_timeout
        self.round_no = None  # set by the engine; tags rendezvous PAYLOAD messages
        self.after_land = None  # defect hook: callable(offset, length) once payload landed in the local MR
        self.error = None
        self.stopping = False
        self._thread = threading.Thread(target=self._rx_loop, name=name, daemon=True)

    def start(self):
        self._thread.start()

    def send_payload(self, ftype, qpn, wr_id, offset, view, rkey=0):
        """A frame that carries ``view``; under payload_over_rendezvous the bytes go as a PAYLOAD message."""
        if self.oob:
            self.rv.send("PAYLOAD", round=self.round_no, wr_id=wr_id, data=base64.b64encode(view).decode())
            self.ch.send(ftype, qpn, wr_id, offset, len(view), rkey=rkey, flags=wire.FLAG_OOB)
        else:
            self.ch.send(ftype, qpn, wr_id, offset, len(view), rkey=rkey, payload=view)

    def receive_payload(self, flags, dest, length):
        """The payload of the frame just read, into ``dest`` (None: read and drop ``length`` bytes)."""
        if flags & wire.FLAG_OOB:
            data = base64.b64decode(self.rv.recv_payload(self.payload_timeout)["data"])
            if dest is not None:
                dest[:] = data
        elif dest is not None:
            self.ch.recv_payload_into(dest)
        else:
            self.ch.discard(length)

    def on_frame(self, ftype, flags, status, qpn, rkey, wr_id, offset, length):
        raise NotImplementedError

    def on_closed(self):
        """The receive thread ends (EOF, a broken wire or stop())."""

    def _rx_loop(self):
        try:
            while True:
                header = self.ch.recv_header()
                if header is None:
                    break
                self.on_frame(*header)
        except Exception as exc:  # the peer or the wire broke: the engine sees it in ``error``
            if not self.stopping:
                self.error = f"{type(exc).__name__}: {exc}"
        self.on_closed()

    def join(self, timeout):
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, timeout=10.0):
        self.stopping = True
        self.ch.shutdown()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout)
        self.ch.close()


class RequesterNic(Nic):
    """Sends the requester's one-sided operations and turns the answers into completions."""

    def __init__(self, channel, rendezvous, oob=False, payload_timeout=60.0):
        super().__init__(channel, rendezvous, "requester-nic", oob, payload_timeout)
        self.pending = {}  # wr_id -> (qp, wr)
        self.dead = False

    def transmit(self, qp, wr):
        if self.dead:
            raise ConnectionError(f"data channel is down ({self.error})")
        self.pending[wr.wr_id] = (qp, wr)
        if qp.operation == "read":
            self.ch.send(wire.READ_REQ, qp.peer_qpn, wr.wr_id, wr.remote_offset, wr.length, rkey=wr.rkey)
        else:
            self.send_payload(wire.WRITE, qp.peer_qpn, wr.wr_id, wr.remote_offset,
                              wr.mr.buf[wr.local_offset : wr.local_offset + wr.length], rkey=wr.rkey)

    def on_frame(self, ftype, flags, status, qpn, rkey, wr_id, offset, length):
        entry = self.pending.pop(wr_id, None)
        if entry is None or ftype not in (wire.READ_RESP, wire.WRITE_ACK):
            raise ConnectionError(f"unexpected frame type {ftype} for wr_id {wr_id}")
        qp, wr = entry
        if ftype == wire.READ_RESP and status == WC_SUCCESS:
            if length != wr.length:
                raise ConnectionError(f"READ response of {length} B for a {wr.length} B WR")
            self.receive_payload(flags, wr.mr.buf[wr.local_offset : wr.local_offset + wr.length], length)
            if self.after_land is not None:
                self.after_land(wr.local_offset, wr.length)
        byte_len = wr.length if status == WC_SUCCESS else 0
        qp.cq.push(Cqe(qp, wr_id, status, byte_len, OPCODES[qp.operation]))

    def on_closed(self):
        """Every WR still waiting for an answer completes as flushed."""
        self.dead = True
        for wr_id in list(self.pending):
            qp, _wr = self.pending.pop(wr_id)
            qp.cq.push(Cqe(qp, wr_id, WC_WR_FLUSH_ERR, 0, OPCODES[qp.operation]))


class SourceNic(Nic):
    """Serves the requester's one-sided operations against this process's MRs."""

    def __init__(self, channel, rendezvous, qps, data_mr, stride, oob=False, payload_timeout=60.0):
        super().__init__(channel, rendezvous, "source-nic", oob, payload_timeout)
        self.qps = qps  # qpn -> QueuePair, maintained by the source engine
        self.data_mr = data_mr  # rail -> data MR (absent when not registered on that context)
        self.stride = stride  # a parent's region in the arena: offset // stride is its index
        self.parent_bytes = {}  # region index -> payload bytes moved this round

    def _check(self, qp, rkey, offset, length):
        if qp is None or qp.state != "RTS":
            return None, WC_REM_ACCESS_ERR
        mr = self.data_mr.get(qp.context.rail)
        if mr is None or not mr.live or mr.rkey != rkey or offset + length > mr.length:
            return None, WC_REM_ACCESS_ERR
        return mr, WC_SUCCESS

    def _account(self, qp, offset, length):
        native = qp.context.native
        native.wrs += 1
        native.bytes += length
        region = offset // self.stride
        self.parent_bytes[region] = self.parent_bytes.get(region, 0) + length

    def on_frame(self, ftype, flags, status, qpn, rkey, wr_id, offset, length):
        qp = self.qps.get(qpn)
        mr, status = self._check(qp, rkey, offset, length)
        reply_qpn = qp.peer_qpn if qp is not None else 0
        if ftype == wire.READ_REQ:
            if status != WC_SUCCESS:
                self.ch.send(wire.READ_RESP, reply_qpn, wr_id, offset, 0, status=status)
                return
            self._account(qp, offset, length)  # before the reply: the peer may end the round at once
            self.send_payload(wire.READ_RESP, reply_qpn, wr_id, offset, mr.buf[offset : offset + length])
        elif ftype == wire.WRITE:
            landed = status == WC_SUCCESS
            self.receive_payload(flags, mr.buf[offset : offset + length] if landed else None, length)
            if landed:
                self._account(qp, offset, length)
                if self.after_land is not None:
                    self.after_land(offset, length)
            self.ch.send(wire.WRITE_ACK, reply_qpn, wr_id, offset, length, status=status)
        else:
            raise ConnectionError(f"unexpected frame type {ftype}")

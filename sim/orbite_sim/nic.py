"""The NIC of each simulated process: a thread that moves payload on the data channel.

It plays the part of the RNIC hardware: it reads and writes MR memory directly (``recv_into`` into
and ``sendall`` from memoryviews of the registered buffer) and produces completions on the QP's CQ
only when the peer's response or acknowledgement for that WR has arrived.

Requester NIC: ``transmit`` (called by QP.post_send) sends a READ request or the WRITE payload; the
receive thread lands READ responses into the local MR and turns responses/acks into CQEs.
Source NIC: answers READ requests from its MR and lands WRITE payload into it, after checking the
QPN, the rkey and the bounds (REM_ACCESS_ERR otherwise), and acks WRITEs.
"""

import base64
import threading

from . import wire
from .verbs import OPCODES, WC_REM_ACCESS_ERR, WC_SUCCESS, WC_WR_FLUSH_ERR, Cqe


class RequesterNic:
    def __init__(self, channel, rendezvous, oob=False, payload_timeout=60.0):
        self.ch = channel
        self.rv = rendezvous
        self.oob = oob
        self.payload_timeout = payload_timeout
        self.pending = {}  # wr_id -> (qp, wr)
        self.round_no = None  # set by the engine; tags rendezvous PAYLOAD messages
        self.after_land = None  # defect hook: callable(wr), destination-side (READ)
        self.error = None
        self.stopping = False
        self.dead = False
        self._thread = threading.Thread(target=self._rx_loop, name="requester-nic", daemon=True)
        self._thread.start()

    def transmit(self, qp, wr):
        if self.dead:
            raise ConnectionError(f"data channel is down ({self.error})")
        self.pending[wr.wr_id] = (qp, wr)
        if qp.operation == "read":
            self.ch.send(wire.READ_REQ, qp.peer_qpn, wr.wr_id, wr.remote_offset, wr.length, rkey=wr.rkey)
            return
        view = wr.mr.buf[wr.local_offset : wr.local_offset + wr.length]
        if self.oob:
            self.rv.send("PAYLOAD", round=self.round_no, wr_id=wr.wr_id, data=base64.b64encode(view).decode())
            self.ch.send(wire.WRITE, qp.peer_qpn, wr.wr_id, wr.remote_offset, wr.length, rkey=wr.rkey,
                         flags=wire.FLAG_OOB)
        else:
            self.ch.send(wire.WRITE, qp.peer_qpn, wr.wr_id, wr.remote_offset, wr.length, rkey=wr.rkey,
                         payload=view)

    def _rx_loop(self):
        try:
            while True:
                header = self.ch.recv_header()
                if header is None:
                    break
                ftype, flags, status, _qpn, _rkey, wr_id, _offset, length = header
                entry = self.pending.pop(wr_id, None)
                if entry is None or ftype not in (wire.READ_RESP, wire.WRITE_ACK):
                    raise ConnectionError(f"unexpected frame type {ftype} for wr_id {wr_id}")
                qp, wr = entry
                if ftype == wire.READ_RESP and status == WC_SUCCESS:
                    if length != wr.length:
                        raise ConnectionError(f"READ response of {length} B for a {wr.length} B WR")
                    dest = wr.mr.buf[wr.local_offset : wr.local_offset + wr.length]
                    if flags & wire.FLAG_OOB:
                        msg = self.rv.recv_payload(self.payload_timeout)
                        dest[:] = base64.b64decode(msg["data"])
                    else:
                        self.ch.recv_payload_into(dest)
                    if self.after_land is not None:
                        self.after_land(wr)
                byte_len = wr.length if status == WC_SUCCESS else 0
                qp.cq.push(Cqe(qp, wr_id, status, byte_len, OPCODES[qp.operation]))
        except Exception as exc:  # the peer or the wire broke: the engine sees flushed WRs
            if not self.stopping:
                self.error = f"{type(exc).__name__}: {exc}"
        self._flush()

    def _flush(self):
        self.dead = True
        for wr_id in list(self.pending):
            qp, _wr = self.pending.pop(wr_id)
            qp.cq.push(Cqe(qp, wr_id, WC_WR_FLUSH_ERR, 0, OPCODES[qp.operation]))

    def stop(self, timeout=10.0):
        self.stopping = True
        self.ch.shutdown()
        self._thread.join(timeout)
        self.ch.close()


class SourceNic:
    """Serves the requester's one-sided operations against this process's MRs."""

    def __init__(self, channel, rendezvous, qps, oob=False, payload_timeout=60.0):
        self.ch = channel
        self.rv = rendezvous
        self.qps = qps  # qpn -> QueuePair, maintained by the source engine
        self.oob = oob
        self.payload_timeout = payload_timeout
        self.round_no = None  # set by the engine; tags rendezvous PAYLOAD messages
        self.data_mr = {}  # rail -> data MR (absent when not registered on that context)
        self.parent_bytes = {}  # region index -> payload bytes moved this round
        self.stride = 1
        self.after_land = None  # defect hook: callable(offset, length), destination-side (WRITE)
        self.error = None
        self.stopping = False
        self._thread = threading.Thread(target=self._rx_loop, name="source-nic", daemon=True)

    def start(self):
        self._thread.start()

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

    def _rx_loop(self):
        try:
            while True:
                header = self.ch.recv_header()
                if header is None:
                    break
                ftype, flags, _status, qpn, rkey, wr_id, offset, length = header
                qp = self.qps.get(qpn)
                mr, status = self._check(qp, rkey, offset, length)
                reply_qpn = qp.peer_qpn if qp is not None else 0
                if ftype == wire.READ_REQ:
                    if status != WC_SUCCESS:
                        self.ch.send(wire.READ_RESP, reply_qpn, wr_id, offset, 0, status=status)
                        continue
                    view = mr.buf[offset : offset + length]
                    self._account(qp, offset, length)  # before the reply: the peer may end the round at once
                    if self.oob:
                        self.rv.send("PAYLOAD", round=self.round_no, wr_id=wr_id, data=base64.b64encode(view).decode())
                        self.ch.send(wire.READ_RESP, reply_qpn, wr_id, offset, length, flags=wire.FLAG_OOB)
                    else:
                        self.ch.send(wire.READ_RESP, reply_qpn, wr_id, offset, length, payload=view)
                elif ftype == wire.WRITE:
                    if flags & wire.FLAG_OOB:
                        data = base64.b64decode(self.rv.recv_payload(self.payload_timeout)["data"])
                        if status == WC_SUCCESS:
                            mr.buf[offset : offset + length] = data
                    elif status == WC_SUCCESS:
                        self.ch.recv_payload_into(mr.buf[offset : offset + length])
                    else:
                        self.ch.discard(length)
                    if status == WC_SUCCESS:
                        self._account(qp, offset, length)
                        if self.after_land is not None:
                            self.after_land(offset, length)
                    self.ch.send(wire.WRITE_ACK, reply_qpn, wr_id, offset, length, status=status)
                else:
                    raise ConnectionError(f"unexpected frame type {ftype}")
        except Exception as exc:
            if not self.stopping:
                self.error = f"{type(exc).__name__}: {exc}"

    def join(self, timeout):
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, timeout=10.0):
        self.stopping = True
        self.ch.shutdown()
        if self._thread.is_alive() or self._thread.ident is not None:
            self._thread.join(timeout)
        self.ch.close()

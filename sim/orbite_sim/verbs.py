# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The modelled verbs layer: contexts, PDs, MRs, CQs, completion channels and QPs.

It behaves like the parts of libibverbs the engine relies on, so the engine above it is exercised
honestly: a QP refuses a post beyond its send-queue depth (the slot frees when its CQE is polled, as
with mlx5), completions come only from the NIC (``nic.py``), an armed CQ signals its completion
channel once per arming, and every object is an owner in a ``ResourceTable`` so teardown and
"retained owners" are counted. The native byte counters live here, apart from the engine's public
counters. Observers hook post_send and poll_cq, like the LD_PRELOAD ones wrap ``context->ops``.
"""

import collections
import os
import threading

# ibv_wc_status numbering
WC_SUCCESS = 0
WC_LOC_LEN_ERR = 1
WC_LOC_PROT_ERR = 4
WC_WR_FLUSH_ERR = 5
WC_REM_ACCESS_ERR = 10
WC_STATUS_NAMES = {
    WC_SUCCESS: "SUCCESS",
    WC_LOC_LEN_ERR: "LOC_LEN_ERR",
    WC_LOC_PROT_ERR: "LOC_PROT_ERR",
    WC_WR_FLUSH_ERR: "WR_FLUSH_ERR",
    WC_REM_ACCESS_ERR: "REM_ACCESS_ERR",
}
OPCODES = {"read": "RDMA_READ", "write": "RDMA_WRITE"}


class VerbsError(Exception):
    """A verbs call failed (errno-like ``code``)."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code


class ResourceTable:
    """Live owners of one engine: handle -> kind. Counting, not asserting, what is held."""

    def __init__(self):
        self._live = {}
        self.acquired = 0

    def acquire(self, kind, handle):
        if handle in self._live:
            raise VerbsError("EEXIST", f"{kind} {handle} already held")
        self._live[handle] = kind
        self.acquired += 1

    def release(self, handle):
        if self._live.pop(handle, None) is None:
            raise VerbsError("ENOENT", f"{handle} is not held")

    def live_count(self):
        return len(self._live)

    def held(self):
        return dict(self._live)


class Allocator:
    """Process-wide QPN and key numbering (never reused)."""

    def __init__(self, qpn_base):
        self._qpn = qpn_base
        self._key = 0x100

    def next_qpn(self):
        self._qpn += 1
        return self._qpn & 0xFFFFFF

    def next_key(self):
        self._key += 1
        return self._key


class NativeCounters:
    """What the verbs layer itself saw on one context (the ledger's native counters)."""

    def __init__(self):
        self.wrs = 0
        self.cqes = 0
        self.bytes = 0

    def snapshot(self):
        return {"bytes": self.bytes, "wrs": self.wrs, "cqes": self.cqes}


class Cqe:
    __slots__ = ("byte_len", "opcode", "qp", "status", "wr_id")

    def __init__(self, qp, wr_id, status, byte_len, opcode):
        self.qp = qp
        self.wr_id = wr_id
        self.status = status
        self.byte_len = byte_len
        self.opcode = opcode


class WorkRequest:
    __slots__ = ("length", "local_offset", "mr", "opcode", "remote_offset", "rkey", "wr_id")

    def __init__(self, wr_id, opcode, mr, local_offset, length, remote_offset, rkey):
        self.wr_id = wr_id
        self.opcode = opcode
        self.mr = mr
        self.local_offset = local_offset
        self.length = length
        self.remote_offset = remote_offset
        self.rkey = rkey


class _Owner:
    """A verbs object that is an owner in its context's resource table until released (once)."""

    def _own(self, context, kind, handle):
        self.context = context
        self.handle = handle
        self.live = True
        context.table.acquire(kind, handle)

    def _release(self):
        if self.live:
            self.context.table.release(self.handle)
            self.live = False


class Context:
    def __init__(self, table, alloc, rail, device, observer=None):
        self.table = table
        self.alloc = alloc
        self.rail = rail
        self.device = device
        self.handle = f"ctx-{rail}"
        self.observer = observer
        self.native = NativeCounters()
        self.closed = False
        table.acquire("context", self.handle)

    def alloc_pd(self):
        return ProtectionDomain(self)

    def create_comp_channel(self):
        return CompletionChannel(self)

    def create_cq(self, depth, channel=None):
        return CompletionQueue(self, depth, channel)

    def reg_mr(self, pd, buffer, kind):
        return MemoryRegion(pd, buffer, kind)

    def create_qp(self, pd, cq, lane, operation, max_send_wr):
        return QueuePair(pd, cq, lane, operation, max_send_wr)

    def close(self):
        if not self.closed:
            self.table.release(self.handle)
            self.closed = True


class ProtectionDomain(_Owner):
    def __init__(self, context):
        self._own(context, "pd", f"pd-{context.rail}")

    def dealloc(self):
        self._release()


class MemoryRegion(_Owner):
    def __init__(self, pd, buffer, kind):
        ctx = pd.context
        self.pd = pd
        self.kind = kind
        self.buf = buffer
        self.length = len(buffer)
        self.lkey = ctx.alloc.next_key()
        self.rkey = ctx.alloc.next_key()
        self._own(ctx, "mr", f"mr-{ctx.rail}-{kind}")

    def dereg(self):
        self._release()


class CompletionChannel(_Owner):
    """A pipe: the NIC writes one byte per event; the engine selects on ``fileno()``."""

    def __init__(self, context):
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        self._events = collections.deque()
        self.acked = 0
        self._own(context, "channel", f"ch-{context.rail}")

    def fileno(self):
        return self._r

    def notify(self, cq):
        self._events.append(cq)
        os.write(self._w, b"e")

    def get_cq_event(self):
        """The CQ of the next event, or None when none is pending (non-blocking fd)."""
        try:
            if not os.read(self._r, 1):
                return None
        except BlockingIOError:
            return None
        return self._events.popleft()

    def ack_cq_events(self, count):
        self.acked += count

    def destroy(self):
        if self.live:
            os.close(self._r)
            os.close(self._w)
            self._release()


class CompletionQueue(_Owner):
    def __init__(self, context, depth, channel):
        self.depth = depth
        self.channel = channel
        self._entries = collections.deque()
        self._lock = threading.Lock()
        self._armed = False
        self.arms = 0
        self._own(context, "cq", f"cq-{context.rail}")

    def push(self, cqe):
        """Called by the NIC thread: a completion lands; an armed CQ signals its channel once."""
        self._entries.append(cqe)
        with self._lock:
            if self._armed and self.channel is not None:
                self._armed = False
                self.channel.notify(self)

    def req_notify(self):
        with self._lock:
            self._armed = True
            self.arms += 1

    def poll(self, max_entries):
        out = []
        native = self.context.native
        observer = self.context.observer
        while len(out) < max_entries:
            try:
                cqe = self._entries.popleft()
            except IndexError:
                break
            cqe.qp.retire()
            native.cqes += 1
            if cqe.status == WC_SUCCESS:
                native.bytes += cqe.byte_len
            # An observer that returns False withholds the completion (the cq_fault seam): the
            # provider consumed it, the engine never sees it.
            if observer is not None and observer.on_cqe(self, cqe) is False:
                continue
            out.append(cqe)
        return out

    def destroy(self):
        self._release()


class QueuePair:
    def __init__(self, pd, cq, lane, operation, max_send_wr):
        ctx = pd.context
        self.context = ctx
        self.pd = pd
        self.cq = cq
        self.lane = lane
        self.operation = operation
        self.max_send_wr = max_send_wr
        self.qpn = ctx.alloc.next_qpn()
        self.handle = f"qp-{self.qpn}"
        self.peer_qpn = None
        self.state = "RTS"
        self.outstanding = 0
        self.transmit = None  # set by the NIC when the QP is connected
        ctx.table.acquire("qp", self.handle)

    def connect(self, peer_qpn, transmit):
        self.peer_qpn = peer_qpn
        self.transmit = transmit

    def post_send(self, wr):
        if self.state != "RTS":
            raise VerbsError("EINVAL", f"QP {self.qpn} is {self.state}")
        if self.outstanding >= self.max_send_wr:
            raise VerbsError("ENOMEM", f"QP {self.qpn}: send queue full ({self.max_send_wr})")
        if wr.local_offset < 0 or wr.local_offset + wr.length > wr.mr.length:
            raise VerbsError("EINVAL", f"WR {wr.wr_id}: local range outside MR {wr.mr.handle}")
        self.outstanding += 1
        self.context.native.wrs += 1
        if self.context.observer is not None:
            self.context.observer.on_post(self, wr)
        self.transmit(self, wr)

    def retire(self):
        self.outstanding -= 1

    def destroy(self):
        if self.state != "DESTROYED":
            self.context.table.release(self.handle)
            self.state = "DESTROYED"

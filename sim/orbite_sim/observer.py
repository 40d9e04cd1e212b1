# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The modelled accounting observer: writes the observer log of docs/receipts.md section 2.

Like the native ``accounting`` LD_PRELOAD tool it only sees the verbs layer: each accepted payload
WR (from QP.post_send) and each completion (from CQ.poll). It joins a WR to its successful
completion by (ctx, cq, qpn, wr_id) and keeps its own in-flight figures. Parents are resolved
through ``parent_of`` (the engine's wr_id -> parent map, which the ledger's WR list also holds).
"""

import json
import os

from .verbs import OPCODES, WC_STATUS_NAMES, WC_SUCCESS


class AccountingObserver:
    tool = "accounting"

    def __init__(self, path, parent_of, drop_first_completion=False):
        self.path = path
        self._fh = open(path, "w", encoding="utf-8")  # closed in close()
        self._parent_of = parent_of
        self._drop_pending = drop_first_completion
        self._drop_wr = None
        self._accepted = {}  # (ctx, cq, qpn, wr_id) -> joined?
        self._inflight = {}  # qpn -> {wr_id: parent}
        self.max_inflight = {}
        self.max_parents = {}
        self.closed = False
        self._write({"schema": "orbite.observer-log", "version": 1, "tool": self.tool, "pid": os.getpid()})

    def _write(self, obj):
        self._fh.write(json.dumps(obj, separators=(",", ":")) + "\n")

    def on_post(self, qp, wr):
        ctx, cq = qp.context.handle, qp.cq.handle
        self._accepted[(ctx, cq, qp.qpn, wr.wr_id)] = False
        if self._drop_pending and self._drop_wr is None:
            self._drop_wr = wr.wr_id  # defect: the first WR's completion will be left out
        self._write({"ev": "wr", "ctx": ctx, "dev": qp.context.device, "cq": cq, "qpn": qp.qpn,
                     "wr_id": wr.wr_id, "opcode": OPCODES[qp.operation], "bytes": wr.length})
        flight = self._inflight.setdefault(qp.qpn, {})
        flight[wr.wr_id] = self._parent_of(wr.wr_id)
        key = str(qp.qpn)
        self.max_inflight[key] = max(self.max_inflight.get(key, 0), len(flight))
        self.max_parents[key] = max(self.max_parents.get(key, 0), len(set(flight.values())))

    def on_cqe(self, cq, cqe):
        qp = cqe.qp
        self._inflight.get(qp.qpn, {}).pop(cqe.wr_id, None)
        if self._drop_wr is not None and cqe.wr_id == self._drop_wr:
            self._drop_wr = -1  # dropped once; never matches a real wr_id again
            self._drop_pending = False
            return
        key = (qp.context.handle, cq.handle, qp.qpn, cqe.wr_id)
        self._write({"ev": "cqe", "ctx": key[0], "cq": key[1], "qpn": qp.qpn, "wr_id": cqe.wr_id,
                     "status": cqe.status, "status_name": WC_STATUS_NAMES.get(cqe.status, str(cqe.status))})
        if key in self._accepted and cqe.status == WC_SUCCESS:
            self._accepted[key] = True

    def close(self):
        if self.closed:
            return
        joined = sum(1 for v in self._accepted.values() if v)
        self._write({"ev": "summary", "accepted_wrs": len(self._accepted), "joined": joined,
                     "unjoined": len(self._accepted) - joined, "max_inflight_per_qp": self.max_inflight,
                     "max_outstanding_parents_per_qp": self.max_parents})
        self._fh.close()
        self.closed = True

    def flush(self):
        if not self.closed:
            self._fh.flush()

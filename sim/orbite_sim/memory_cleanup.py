# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""installed-memory-cleanup (docs/memory_cleanup.md): MR/MW cleanup failure and in-process engine replacement.

One process per role, two engines in it. The old engine runs three healthy rounds (one parent, one slice, one
QP, both contexts registered, one rail active). In ``mw`` the source grants every round through a type-1
memory window bound over its data MR. Then the old engines close: the fault role's first real
``ibv_dereg_mr`` (``mr``) or ``ibv_dealloc_mw`` (``mw``) fails with EIO through the preloaded uverbs_fault
observer's seccomp filter on the context's uverbs descriptor. The object is quarantined, with what it keeps:
the MR's registration charge and backing, or the window's parent MR borrow, grant, DMA loan, quota and key
domain. A repeated close never calls the release again. The rail's real ``ibv_dealloc_pd`` then still fails
EBUSY in the provider (the PD still has the quarantined MR/MW: a genuine dependency failure, the uverbs
command itself passes). The caller drops the old engine; a weak owner and a real provider query (the key
domain) show what the quarantine keeps. Both processes then create fresh engines at the same addresses: the
peer's old epoch fails open_segment and submit before any QP is created, three healthy rounds pass and the
fresh engine tears down completely, and the old quarantined allocation stays retained until process exit.

Everything is recorded in the ledger's ``memory_cleanup`` section, the fresh engine's own ledger document
nested in it as ``replacement``.
"""

import gc
import time
import weakref

from .engine import BIND_WR_ID
from .errors import EngineError
from .ledger import Ledger
from .requester import Allocation, RequesterEngine
from .source import SourceEngine
from .verbs import ACCESS_REMOTE_READ, ACCESS_REMOTE_WRITE, VerbsError, MrHead, MwHead

# The source's grant window of the mw kind: bound once, over the whole data MR, before round 1's grant.
WINDOW_WR_ID = BIND_WR_ID + 1
RELEASE_CALLS = {"mr": "ibv_dereg_mr", "mw": "ibv_dealloc_mw"}


class Quarantine:
    """What a failed MR/MW release left in the process: the objects (and the owners they need: the PD, the
    context), the allocation they keep, and the charges still held. The only owner once the caller dropped the
    old engine (free_quarantine_early: it lets go before the process exits, the defect)."""

    def __init__(self, table):
        self.table = table  # the old engine's resource table: what is still live in it is quarantined
        self.objects = []
        self.allocation = None
        self.context = None
        self.charges = {}
        self.key = self.parent_key = None

    def held(self):
        return self.table.live_count()

    def drop(self):
        """free_quarantine_early (the defect): the objects and the allocation let go; the provider, whose release
        failed, still holds them."""
        self.objects, self.allocation = [], None


class _SubLedger(Ledger):
    """The fresh engine's ledger document, nested in the process's ledger (``memory_cleanup.replacement``)."""

    def __init__(self, parent, case):
        super().__init__(None, case, case["defects"])
        self.parent = parent

    def checkpoint(self):
        self.parent.checkpoint()


class _MemoryEngine:
    """Mixed into both roles' engines: the old engine's close quarantines, the fresh engine's is a full teardown."""

    def __init__(self, case, output, ledger, provider, process=None, replacement=False):
        super().__init__(case, output, ledger, provider)
        self.process = process
        self.replacement = replacement
        self.kind = self.profile["cleanup_kind"]
        self.faulted = not replacement and self.role == self.profile["fault_role"]
        self.binds_window = self.kind == "mw" and self.role == "source" and not replacement
        self.window = None

    def held_elsewhere(self):
        return self.process.quarantine.held() if self.replacement and self.process.quarantine else 0

    def close(self):
        if not self.faulted:
            super().close()
            return
        self.rv.close()
        for listener in self.listeners:
            listener.close()
        self.process.quarantine_close(self)


class _MemorySource(_MemoryEngine, SourceEngine):
    def connect_qps(self, msg, rnd):
        super().connect_qps(msg, rnd)
        if self.binds_window and self.window is None:
            self._bind_window()

    def _bind_window(self):
        """mw: one type-1 window over the active rail's data MR, bound on its QP (a send-queue operation whose
        completion is reaped here); every round's grant names its rkey, the requester's WRs use it."""
        rail = self.enabled_rails[0]
        entry = self.contexts[rail]
        qp = next(q for q in self.by_qpn.values() if q.context.rail == rail)
        data = entry["mrs"]["data"]
        mw = entry["ctx"].alloc_mw(entry["pd"])
        access = ACCESS_REMOTE_READ if self.operation == "read" else ACCESS_REMOTE_WRITE
        mw.bind(qp, WINDOW_WR_ID, data, data.addr, data.length, access)
        status = self._reap_bind(entry["cq"], qp, WINDOW_WR_ID)
        if status != "SUCCESS":
            raise EngineError("Internal", "submit", f"the grant window's bind completed {status}")
        self.window = {"mw": mw, "mr": data, "rail": rail, "length": data.length, "grant": list(range(self.parents))}

    def ready_extras(self):
        return {"window": {"rkey": self.window["mw"].rkey}} if self.window is not None else {}


class _MemoryRequester(_MemoryEngine, RequesterEngine):
    pass


def _uverbs_handle(obj):
    head = (MrHead if obj.kind == "mr" else MwHead).from_address(obj.ptr)
    return head.handle


class MemoryCleanupProcess:
    """The process of one role: the old engine, its quarantine close, the fresh engine, the check at exit. Stands
    in for the engine towards runner.py (ledger, round_no, rounds_failed_checks, abort, totals)."""

    def __init__(self, case, output, ledger, provider):
        self.case = case
        self.output = output
        self.ledger = ledger
        self.doc = ledger.doc
        self.provider = provider
        self.defects = set(case["defects"])
        self.engine_class = _MemorySource if case["role"] == "source" else _MemoryRequester
        self.engine = None
        self.quarantine = None
        self.failed_checks = False
        self._weak = None  # the weak owner of the quarantined allocation
        self.record = {"kind": case["profile"]["cleanup_kind"], "fault_role": case["profile"]["fault_role"],
                       "faulted": case["role"] == case["profile"]["fault_role"], "old_epoch": None,
                       "old_service_address": None, "close": None, "old_teardown": None, "retained": None,
                       "replacement": None, "at_exit": None}
        self.doc["memory_cleanup"] = self.record

    @property
    def round_no(self):
        return self.engine.round_no if self.engine is not None else 0

    @property
    def rounds_failed_checks(self):
        return self.failed_checks or (self.engine is not None and self.engine.rounds_failed_checks)

    def run(self):
        old = self.engine = self.engine_class(self.case, self.output, self.ledger, self.provider, process=self)
        old.run()
        old.totals()
        self.failed_checks = old.rounds_failed_checks
        self.record["old_epoch"] = old.epoch
        self.record["old_service_address"] = old.doc["service_address"]
        if old.doc["teardown"] is not None:  # the peer's old engine tore down completely
            self.record["old_teardown"] = old.doc["teardown"]
        peer_epoch = old.doc["peer_epoch"]
        case = dict(self.case)
        if self.case["role"] == "source":
            case["service_address"] = old.doc["service_address"]  # the same address (port 0: the one it bound)
        # The caller drops the old engine: from here only the quarantine may keep its objects.
        self.engine = old = None
        gc.collect()
        if self.quarantine is not None:
            self.record["retained"] = self._retained()
            self.ledger.checkpoint()
        fresh_ledger = _SubLedger(self.ledger, case)
        self.record["replacement"] = fresh_ledger.doc
        fresh = self.engine = self.engine_class(case, self.output, fresh_ledger, self.provider, process=self,
                                                replacement=True)
        fresh.doc["restart"] = {"stale_probes": []}
        fresh.peer_epochs = [peer_epoch]  # the old segment's authority: its epoch must fail before any QP
        fresh.run()
        fresh.totals()
        fresh_ledger.doc["status"] = "complete"
        self.doc["teardown"] = fresh.doc["teardown"]  # the process's last teardown: the fresh engine's
        if self.quarantine is not None:
            gc.collect()
            self.record["at_exit"] = self._retained()
        self.ledger.checkpoint()

    def abort(self):
        if self.engine is not None:
            self.engine.abort()

    def totals(self):
        if self.engine is not None and self.engine.doc["totals"] is None:
            self.engine.totals()

    # ------------------------------------------------------------------ the old engine's close (fault role)

    def quarantine_close(self, eng):
        """The fault role's old engine closes: QPs destroyed, then the MR/MW release fails EIO and is quarantined,
        a repeated close calls nothing, the rest of the rail is released but its PD (EBUSY), the other rail
        completely."""
        kind = eng.kind
        rail = eng.enabled_rails[0]
        entry = eng.contexts[rail]
        held_before = self.provider.held()
        for qp in eng.all_qps:
            if qp.live:
                eng.destroy_qp(qp, "teardown")
        if kind == "mr":
            target, parent = entry["mrs"]["data"], None
        else:
            target, parent = eng.window["mw"], eng.window["mr"]
        release = target.dereg if kind == "mr" else target.dealloc
        record = {"kind": kind, "rail": rail, "device": entry["ctx"].device, "context": entry["ctx"].handle,
                  "object": {"kind": kind, "handle": target.handle, "uverbs_handle": _uverbs_handle(target),
                             "key": target.rkey, "length": target.length if kind == "mr" else eng.window["length"]},
                  "held_before": held_before}
        record["release"] = self._release(release, RELEASE_CALLS[kind])
        quarantined = target.live
        if quarantined:
            error = EngineError("Unquiesced", "close", f"{RELEASE_CALLS[kind]} of {kind} {target.handle} failed "
                                f"({record['release']['errno']}): it stays quarantined with what it keeps",
                                remote_effect="Unknown", locally_drained=False, expected=True)
            eng.doc["errors"].append(error.as_dict())
        record["result"] = "Unquiesced" if quarantined else "Ok"
        record["repeated_close"] = self._repeated_close(target, release, kind)
        keep = {target} | ({parent} if parent is not None and quarantined else set())  # a window's borrow
        for mr in entry["mrs"].values():
            if mr not in keep and mr.live:
                mr.dereg()
        for owner in (entry["cq"], entry["channel"]):
            if owner is not None and owner.live:
                owner.destroy()
        record["pd_destroy"] = self._pd_destroy(entry["pd"])
        for other, other_entry in eng.contexts.items():
            if other == rail:
                continue
            for mr in other_entry["mrs"].values():
                if mr.live:
                    mr.dereg()
            for owner, how in ((other_entry["cq"], "destroy"), (other_entry["channel"], "destroy"),
                               (other_entry["pd"], "dealloc")):
                if owner is not None and owner.live:
                    getattr(owner, how)()
            other_entry["ctx"].close()
        if entry["pd"].live:
            record["context_kept"] = True  # its PD cannot go: the context stays until process exit
        else:
            entry["ctx"].close()
            record["context_kept"] = False
        record["charges"] = None
        record["provider_held"] = self.provider.held()
        record["at"] = time.time()
        eng._render_contexts()
        self.record["close"] = record
        if not quarantined:  # the release succeeded (no fault injected): nothing is kept
            eng.checkpoint()
            return
        q = self.quarantine = Quarantine(eng.table)
        q.objects = [o for o in (target, parent, entry["pd"], entry["ctx"]) if o is not None and o.live]
        q.context = entry["ctx"]
        q.allocation = Allocation(eng.arena, 0, len(eng.arena))
        q.key = target.rkey
        q.parent_key = parent.lkey if parent is not None else None
        q.charges = self._charges(eng, target, parent)
        record["charges"] = dict(q.charges)
        self._weak = weakref.ref(q.allocation)
        if "free_quarantine_early" in self.defects:  # the defect: the quarantine lets go before the process exits
            q.drop()
        eng.checkpoint()

    def _release(self, release, call):
        try:
            release()
        except VerbsError as exc:
            return {"call": call, "errno": exc.code}
        return {"call": call, "errno": None}

    def _repeated_close(self, target, release, kind):
        """A second close of the quarantined object: Unquiesced again without calling the release (retry_dereg:
        it calls it again, which the observer rejects and logs as a retry)."""
        if not target.live:
            return {"result": "Ok", "release_called": False, "release": None}
        again = None
        if "retry_dereg" in self.defects:
            again = self._release(release, RELEASE_CALLS[kind])
        return {"result": "Unquiesced" if target.live else "Ok", "release_called": again is not None,
                "release": again}

    def _pd_destroy(self, pd):
        """The rail's real PD destroy, with the quarantined MR/MW still in it: EBUSY from the provider
        (pd_destroy_ok: the engine reports Ok anyway, the defect; the provider still holds the PD)."""
        try:
            pd.dealloc()
        except VerbsError as exc:
            if "pd_destroy_ok" in self.defects:
                return {"call": "ibv_dealloc_pd", "errno": None, "result": "Ok"}
            return {"call": "ibv_dealloc_pd", "errno": exc.code, "result": "Busy"}
        return {"call": "ibv_dealloc_pd", "errno": None, "result": "Ok"}

    def _charges(self, eng, target, parent):
        """What the quarantine still charges, from the engine's own state. mr: the registration (bytes, count).
        mw: the parent MR borrow, the grant, the DMA loan, the window quota. release_registration and
        release_window: the engine lets the charges go (the defects)."""
        if target.kind == "mr":
            if "release_registration" in self.defects:
                return {"registrations": 0, "registered_bytes": 0}
            # counted: the MR is still registered exactly when its dereg failed (the provider's object lives)
            return {"registrations": int(target.live), "registered_bytes": target.length if target.live else 0}
        if "release_window" in self.defects:
            return {"borrows": 0, "grants_pending": 0, "loan_bytes": 0, "windows": 0}
        return {"borrows": 1 if parent.live else 0, "grants_pending": len(eng.window["grant"]),
                "loan_bytes": eng.window["length"], "windows": int(target.live)}

    def _retained(self):
        """After the caller dropped its handles: the weak owner of the allocation, the provider's key domain (a
        real query of the quarantined key and, for a window, its parent MR), what the provider holds, and the
        charges."""
        q = self.quarantine
        return {"weak_owner_alive": self._weak() is not None, "provider_held": self.provider.held(),
                "charges": dict(q.charges), "key_query": q.context.key_query(q.key),
                "parent_query": q.context.key_query(q.parent_key) if q.parent_key is not None else None}


def is_memory_mode(case):
    return case["profile"]["mode"] == "installed-memory-cleanup"

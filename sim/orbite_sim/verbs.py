# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The verbs layer: a ctypes binding of ``libibverbs.so.1`` (the loopback verbs provider in the lab).

The engine only posts and polls, as on hardware: the provider (observers/provider, docs/provider.md)
checks keys, bounds and access, moves READ and WRITE payload between the two processes' registered
memory itself and writes a completion only once the bytes have landed. Every verbs operation of the
engine goes through here: open, PD, MR, CQ, completion channel, QP create/modify/destroy,
post_send, poll_cq, req_notify, get_cq_event/ack, dereg, dealloc, close. The data-path verbs that
``<infiniband/verbs.h>`` inlines are called through the provider's exported ``orbite_ibv_*`` forms,
which go through ``context->ops``: an LD_PRELOAD observer that wrapped the ops sees every call.

The library is loaded RTLD_GLOBAL from a sealed in-memory copy whose sha256 was checked
(``load``), so the preloaded observers' ``RTLD_NEXT`` lookups find it and what runs is what was
pinned. Every object the provider gave is an owner in a ``ResourceTable`` until the provider
released it, so teardown and "retained owners" are counted from the provider's answers
(``Provider.held`` is the provider's own count, a cross-check). Native counters are the engine's
word at its verbs calls; ``Provider.counters`` is what the provider itself moved.
"""

import ctypes
import errno
import fcntl
import hashlib
import os
import select
import stat

from .errors import CaseError

c_u8, c_u16, c_u32, c_u64, c_int, c_uint = (ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64,
                                            ctypes.c_int, ctypes.c_uint)
vp = ctypes.c_void_p

# <infiniband/verbs.h> constants (checked against the header by tests/unit/sim/test_sim_runner_units.py)
QPT_RC = 2
QPS_RESET, QPS_INIT, QPS_RTR, QPS_RTS, QPS_ERR = 0, 1, 2, 3, 6
QP_STATE_NAMES = {QPS_RESET: "RESET", QPS_INIT: "INIT", QPS_RTR: "RTR", QPS_RTS: "RTS", 4: "SQD", 5: "SQE",
                  QPS_ERR: "ERR"}
MTU_1024 = 3
ACCESS_LOCAL_WRITE, ACCESS_REMOTE_WRITE, ACCESS_REMOTE_READ = 1, 2, 4
ACCESS_MW_BIND = 16
MW_TYPE_1 = 1
MW_TYPE_2 = 2  # installed-cleanup-failure pd: a type-2 window the fixture keeps on the PD
WR_RDMA_WRITE, WR_RDMA_READ = 0, 4
SEND_SIGNALED = 2
QP_STATE, QP_ACCESS_FLAGS, QP_PKEY_INDEX, QP_PORT, QP_AV, QP_PATH_MTU = 1, 8, 16, 32, 128, 256
QP_TIMEOUT, QP_RETRY_CNT, QP_RNR_RETRY, QP_RQ_PSN, QP_MAX_QP_RD_ATOMIC = 512, 1024, 2048, 4096, 8192
QP_MIN_RNR_TIMER, QP_SQ_PSN, QP_MAX_DEST_RD_ATOMIC, QP_DEST_QPN = 32768, 65536, 131072, 1048576

WC_SUCCESS = 0
WC_WR_FLUSH_ERR = 5
WC_RECV = 128
# ibv_wc_status numbering, names without the IBV_WC_ prefix (the ledger's WR status)
WC_STATUS_NAMES = dict(enumerate((
    "SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR", "WR_FLUSH_ERR", "MW_BIND_ERR",
    "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR", "REM_ACCESS_ERR", "REM_OP_ERR", "RETRY_EXC_ERR",
    "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR", "REM_ABORT_ERR", "INV_EECN_ERR",
    "INV_EEC_STATE_ERR", "FATAL_ERR", "RESP_TIMEOUT_ERR", "GENERAL_ERR", "TM_ERR", "TM_RNDV_INCOMPLETE",
)))
OPCODES = {"read": "RDMA_READ", "write": "RDMA_WRITE"}
WR_OPCODES = {"read": WR_RDMA_READ, "write": WR_RDMA_WRITE}
DATA_ACCESS = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_WRITE
SYSTEM_LIBRARY = "libibverbs.so.1"
PROVIDER_COUNTERS = ("read_bytes_landed", "read_bytes_served", "write_bytes_sent", "write_bytes_landed",
                     "wr_completed", "wr_failed")
# What one context's (one device's, one rail's) QPs moved, as the provider counts it per context.
DEVICE_COUNTERS = ("read_bytes_landed", "read_bytes_served", "write_bytes_sent", "write_bytes_landed")
HELD_KINDS = ("ctx", "pd", "mr", "mw", "cq", "channel", "qp")
# RC connection attributes: a GRH AV (RoCE), PSNs 0, 7 retries (rnr_retry 7 = forever).
HOP_LIMIT = 64
MIN_RNR_TIMER = 12
TIMEOUT = 14
RETRY_CNT = 7
RNR_RETRY = 7


class Gid(ctypes.Union):
    _fields_ = [("raw", c_u8 * 16), ("_align", c_u64 * 2)]


class GlobalRoute(ctypes.Structure):
    _fields_ = [("dgid", Gid), ("flow_label", c_u32), ("sgid_index", c_u8), ("hop_limit", c_u8),
                ("traffic_class", c_u8)]


class AhAttr(ctypes.Structure):
    _fields_ = [("grh", GlobalRoute), ("dlid", c_u16), ("sl", c_u8), ("src_path_bits", c_u8),
                ("static_rate", c_u8), ("is_global", c_u8), ("port_num", c_u8)]


class QpCap(ctypes.Structure):
    _fields_ = [("max_send_wr", c_u32), ("max_recv_wr", c_u32), ("max_send_sge", c_u32),
                ("max_recv_sge", c_u32), ("max_inline_data", c_u32)]


class QpInitAttr(ctypes.Structure):
    _fields_ = [("qp_context", vp), ("send_cq", vp), ("recv_cq", vp), ("srq", vp), ("cap", QpCap),
                ("qp_type", c_int), ("sq_sig_all", c_int)]


class QpAttr(ctypes.Structure):
    _fields_ = [("qp_state", c_int), ("cur_qp_state", c_int), ("path_mtu", c_int), ("path_mig_state", c_int),
                ("qkey", c_u32), ("rq_psn", c_u32), ("sq_psn", c_u32), ("dest_qp_num", c_u32),
                ("qp_access_flags", c_uint), ("cap", QpCap), ("ah_attr", AhAttr), ("alt_ah_attr", AhAttr),
                ("pkey_index", c_u16), ("alt_pkey_index", c_u16), ("en_sqd_async_notify", c_u8),
                ("sq_draining", c_u8), ("max_rd_atomic", c_u8), ("max_dest_rd_atomic", c_u8),
                ("min_rnr_timer", c_u8), ("port_num", c_u8), ("timeout", c_u8), ("retry_cnt", c_u8),
                ("rnr_retry", c_u8), ("alt_port_num", c_u8), ("alt_timeout", c_u8), ("rate_limit", c_u32)]


class Sge(ctypes.Structure):
    _fields_ = [("addr", c_u64), ("length", c_u32), ("lkey", c_u32)]


class SendWr(ctypes.Structure):
    # Up to wr.rdma; the unions after it (atomic, ud, xrc, bind_mw, tso) are padding here.
    _fields_ = [("wr_id", c_u64), ("next", vp), ("sg_list", vp), ("num_sge", c_int), ("opcode", c_int),
                ("send_flags", c_uint), ("imm_data", c_u32), ("remote_addr", c_u64), ("rkey", c_u32),
                ("_rest", c_u8 * 76)]


class RecvWr(ctypes.Structure):
    _fields_ = [("wr_id", c_u64), ("next", vp), ("sg_list", vp), ("num_sge", c_int)]


class MwBindInfo(ctypes.Structure):
    _fields_ = [("mr", vp), ("addr", c_u64), ("length", c_u64), ("mw_access_flags", c_uint)]


class MwBind(ctypes.Structure):
    _fields_ = [("wr_id", c_u64), ("send_flags", c_uint), ("bind_info", MwBindInfo)]


class MwHead(ctypes.Structure):
    _fields_ = [("context", vp), ("pd", vp), ("rkey", c_u32), ("handle", c_u32), ("type", c_int)]


class Wc(ctypes.Structure):
    _fields_ = [("wr_id", c_u64), ("status", c_int), ("opcode", c_int), ("vendor_err", c_u32),
                ("byte_len", c_u32), ("imm_data", c_u32), ("qp_num", c_u32), ("src_qp", c_u32),
                ("wc_flags", c_uint), ("pkey_index", c_u16), ("slid", c_u16), ("sl", c_u8),
                ("dlid_path_bits", c_u8)]


class MrHead(ctypes.Structure):
    _fields_ = [("context", vp), ("pd", vp), ("addr", vp), ("length", ctypes.c_size_t), ("handle", c_u32),
                ("lkey", c_u32), ("rkey", c_u32)]


class QpHead(ctypes.Structure):
    _fields_ = [("context", vp), ("qp_context", vp), ("pd", vp), ("send_cq", vp), ("recv_cq", vp), ("srq", vp),
                ("handle", c_u32), ("qp_num", c_u32), ("state", c_int)]


class ChannelHead(ctypes.Structure):
    _fields_ = [("context", vp), ("fd", c_int), ("refcnt", c_int)]


# name -> (restype, argtypes); functions returning an int return 0 or an errno value
_SIGNATURES = {
    "ibv_get_device_list": (ctypes.POINTER(vp), [ctypes.POINTER(c_int)]),
    "ibv_free_device_list": (None, [ctypes.POINTER(vp)]),
    "ibv_get_device_name": (ctypes.c_char_p, [vp]),
    "ibv_open_device": (vp, [vp]),
    "ibv_close_device": (c_int, [vp]),
    "ibv_query_gid": (c_int, [vp, c_u8, c_int, ctypes.POINTER(Gid)]),
    "ibv_alloc_pd": (vp, [vp]),
    "ibv_dealloc_pd": (c_int, [vp]),
    "ibv_reg_mr": (vp, [vp, vp, ctypes.c_size_t, c_int]),
    "ibv_dereg_mr": (c_int, [vp]),
    "ibv_create_comp_channel": (vp, [vp]),
    "ibv_destroy_comp_channel": (c_int, [vp]),
    "ibv_create_cq": (vp, [vp, c_int, vp, vp, c_int]),
    "ibv_destroy_cq": (c_int, [vp]),
    "ibv_get_cq_event": (c_int, [vp, ctypes.POINTER(vp), ctypes.POINTER(vp)]),
    "ibv_ack_cq_events": (None, [vp, c_uint]),
    "ibv_create_qp": (vp, [vp, ctypes.POINTER(QpInitAttr)]),
    "ibv_modify_qp": (c_int, [vp, ctypes.POINTER(QpAttr), c_int]),
    "ibv_destroy_qp": (c_int, [vp]),
    "ibv_query_qp": (c_int, [vp, ctypes.POINTER(QpAttr), c_int, ctypes.POINTER(QpInitAttr)]),
    "orbite_ibv_post_send": (c_int, [vp, ctypes.POINTER(SendWr), ctypes.POINTER(vp)]),
    "orbite_ibv_poll_cq": (c_int, [vp, c_int, ctypes.POINTER(Wc)]),
    "orbite_ibv_post_recv": (c_int, [vp, ctypes.POINTER(RecvWr), ctypes.POINTER(vp)]),
    "orbite_ibv_alloc_mw": (vp, [vp, c_int]),
    "orbite_ibv_dealloc_mw": (c_int, [vp]),
    "orbite_ibv_bind_mw": (c_int, [vp, vp, ctypes.POINTER(MwBind)]),
    "orbite_ibv_req_notify_cq": (c_int, [vp, c_int]),
    "orbite_provider_held": (ctypes.c_long, [ctypes.c_char_p]),
    "orbite_provider_counter": (ctypes.c_longlong, [ctypes.c_char_p]),
    "orbite_provider_ctx_counter": (ctypes.c_longlong, [vp, ctypes.c_char_p]),
    "orbite_provider_qp_outstanding": (ctypes.c_long, [vp]),
    "orbite_provider_key_query": (ctypes.c_long, [vp, c_u32, ctypes.c_char_p]),
}


class VerbsError(Exception):
    """A verbs call failed; ``code`` is the errno name (``ENOMEM``, ``EBUSY``, ...)."""

    def __init__(self, call, err, detail=""):
        self.code = errno.errorcode.get(err, str(err))
        super().__init__(f"{call}: {self.code} ({os.strerror(err) if err else 'no errno'})"
                         + (f": {detail}" if detail else ""))
        self.call = call
        self.errno = err


def handle(pointer):
    """An object's opaque handle: its address as C's "%p" writes it (the observers' log does)."""
    return hex(pointer)


# --------------------------------------------------------------------------- loading


def _spec_fail(field, value, rule):
    raise CaseError(f"case field verbs_library.{field} = {value!r}: {rule}")


def _sealed_copy(path, want):
    """A sealed memfd holding the file's bytes, hashed while copying; CaseError when the hash differs."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        src = os.open(path, flags)
    except OSError as exc:
        _spec_fail("path", path, f"cannot be opened ({exc.strerror}); it must be an existing regular file, "
                                 "not a symlink")
    memfd = None
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):
            _spec_fail("path", path, "must be a regular file")
        memfd = os.memfd_create("orbite-verbs-library", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        digest = hashlib.sha256()
        while True:
            chunk = os.read(src, 1 << 20)
            if not chunk:
                break
            digest.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(memfd, view):]
        got = digest.hexdigest()
        if got != want:
            _spec_fail("sha256", want, f"{path} hashes to {got}; only the pinned library is loaded")
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
                    | fcntl.F_SEAL_SEAL)
        fd, memfd = memfd, None
        return fd
    finally:
        os.close(src)
        if memfd is not None:
            os.close(memfd)


class Provider:
    """The loaded verbs library with the signatures the engine uses."""

    def __init__(self, lib, path, sha256):
        self.lib = lib
        self.path = path
        self.sha256 = sha256
        for name, (restype, argtypes) in _SIGNATURES.items():
            func = getattr(lib, name)
            func.restype, func.argtypes = restype, argtypes

    def held(self):
        """The provider's own count of the objects this process holds, by kind."""
        return {kind: self.lib.orbite_provider_held(kind.encode()) for kind in HELD_KINDS}

    def counters(self):
        """What the provider itself moved in this process (bytes, WRs), since it was loaded."""
        return {name: self.lib.orbite_provider_counter(name.encode()) for name in PROVIDER_COUNTERS}

    def record(self):
        return {"path": self.path, "sha256": self.sha256}


def load(spec, root):
    """Load the verbs library of the case (``spec`` = {path, sha256}, or None for the system one).

    The provider reads ORBITE_PROVIDER_ROOT at its first call, so it is set first. A pinned library is
    loaded from a sealed copy whose hash was checked (``/proc/self/fd/N``), RTLD_GLOBAL.
    """
    os.environ["ORBITE_PROVIDER_ROOT"] = root
    if spec is None:
        target, path, sha256 = SYSTEM_LIBRARY, SYSTEM_LIBRARY, None
    else:
        try:
            fd = _sealed_copy(spec["path"], spec["sha256"])
        except OSError as exc:  # reading or sealing the copy: named, never a traceback
            raise CaseError(f"case field verbs_library.path = {spec['path']!r}: cannot be copied for loading "
                            f"({exc.strerror or exc})") from None
        target, path, sha256 = f"/proc/self/fd/{fd}", spec["path"], spec["sha256"]
    try:
        lib = ctypes.CDLL(target, mode=os.RTLD_GLOBAL, use_errno=True)
    except OSError as exc:
        raise CaseError(f"case field verbs_library = {path!r}: cannot be loaded ({exc})") from None
    missing = [name for name in _SIGNATURES if not hasattr(lib, name)]
    if missing:
        raise CaseError(f"case field verbs_library = {path!r}: is not the loopback verbs provider "
                        f"(no {missing[0]}; see docs/provider.md)")
    return Provider(lib, path, sha256)


# --------------------------------------------------------------------------- owners


class ResourceTable:
    """Live owners of one engine: handle -> kind, acquired when the provider gave the object and
    released when the provider destroyed it. Counting, not asserting, what is held."""

    def __init__(self):
        self._live = {}
        self.acquired = 0
        self.acquired_kinds = dict.fromkeys(HELD_KINDS, 0)  # objects ever acquired, by kind

    def acquire(self, kind, key):
        self._live[key] = kind
        self.acquired += 1
        self.acquired_kinds[kind] = self.acquired_kinds.get(kind, 0) + 1

    def release(self, key):
        self._live.pop(key, None)

    def live_count(self):
        return len(self._live)

    def held(self):
        return dict(self._live)


class NativeCounters:
    """What the engine counted at its own verbs calls on one context (the ledger's native counters)."""

    def __init__(self):
        self.wrs = 0
        self.cqes = 0
        self.bytes = 0

    def snapshot(self):
        return {"bytes": self.bytes, "wrs": self.wrs, "cqes": self.cqes}


class _Owner:
    """A provider object that is an owner in its context's resource table until destroyed (once)."""

    kind = None

    def _own(self, context, pointer):
        self.context = context
        self.ptr = pointer
        self.handle = handle(pointer)
        self.live = True
        context.table.acquire(self.kind, self.handle)

    def _destroyed(self, call, ret):
        if ret:
            raise VerbsError(call, ret, f"{self.kind} {self.handle} stays held")
        self.live = False
        self.context.table.release(self.handle)


def _errno():
    return ctypes.get_errno() or errno.EIO


def open_device(provider, table, rail, device):
    """The context of ``device`` (by its verbs name); VerbsError ENODEV when the provider has none."""
    lib = provider.lib
    count = c_int(0)
    devices = lib.ibv_get_device_list(ctypes.byref(count))
    if not devices:
        raise VerbsError("ibv_get_device_list", _errno())
    try:
        names = [lib.ibv_get_device_name(devices[i]).decode() for i in range(count.value)]
        if device not in names:
            raise VerbsError("ibv_open_device", errno.ENODEV, f"{device}: the provider lists {names}")
        ptr = lib.ibv_open_device(devices[names.index(device)])
        if not ptr:
            raise VerbsError("ibv_open_device", _errno(), device)
    finally:
        lib.ibv_free_device_list(devices)
    return Context(provider, table, rail, device, ptr)


class Context(_Owner):
    kind = "ctx"

    def __init__(self, provider, table, rail, device, pointer):
        self.provider = provider
        self.lib = provider.lib
        self.table = table
        self.rail = rail
        self.device = device
        self.native = NativeCounters()
        self._own(self, pointer)

    @property
    def closed(self):
        return not self.live

    def query_gid(self, port, index):
        """The GID at ``index`` of ``port`` as the provider reports it (16 raw bytes)."""
        gid = Gid()
        ret = self.lib.ibv_query_gid(self.ptr, port, index, ctypes.byref(gid))
        if ret:
            raise VerbsError("ibv_query_gid", _errno(), f"{self.device} port {port} index {index}")
        return bytes(gid.raw)

    def device_counters(self):
        """What the provider moved through this context's QPs (its own per-device count, not the engine's)."""
        if not self.live:
            raise VerbsError("orbite_provider_ctx_counter", 0, f"{self.device}: the context is closed")
        return {name: self.lib.orbite_provider_ctx_counter(self.ptr, name.encode()) for name in DEVICE_COUNTERS}

    def key_query(self, key):
        """The provider's key domain on this context for ``key`` (a real query, independent of any handle the
        engine holds): the live object behind it ("mr", "mw" or None), its bound windows and its length."""
        kind = {1: "mr", 2: "mw"}.get(self.lib.orbite_provider_key_query(self.ptr, key, b"kind"))
        return {"key": key, "kind": kind,
                "windows": self.lib.orbite_provider_key_query(self.ptr, key, b"windows") if kind else None,
                "length": self.lib.orbite_provider_key_query(self.ptr, key, b"length") if kind else None}

    def alloc_pd(self):
        return ProtectionDomain(self)

    def create_comp_channel(self):
        return CompletionChannel(self)

    def create_cq(self, depth, channel=None):
        return CompletionQueue(self, depth, channel)

    def reg_mr(self, pd, buffer, kind, access=None):
        return MemoryRegion(pd, buffer, kind, access)

    def alloc_mw(self, pd, mw_type=MW_TYPE_1):
        return MemoryWindow(pd, mw_type)

    def create_qp(self, pd, cq, lane, operation, max_send_wr):
        return QueuePair(pd, cq, lane, operation, max_send_wr)

    def close(self):
        if self.live:
            self._destroyed("ibv_close_device", self.lib.ibv_close_device(self.ptr))


class ProtectionDomain(_Owner):
    kind = "pd"

    def __init__(self, context):
        ptr = context.lib.ibv_alloc_pd(context.ptr)
        if not ptr:
            raise VerbsError("ibv_alloc_pd", _errno(), context.device)
        self._own(context, ptr)

    def dealloc(self):
        if self.live:
            self._destroyed("ibv_dealloc_pd", self.context.lib.ibv_dealloc_pd(self.ptr))


class MemoryRegion(_Owner):
    """An MR over ``buffer`` (a bytearray that must never be resized: its export pins it)."""

    kind = "mr"

    def __init__(self, pd, buffer, kind, access=None):
        ctx = pd.context
        self.kind_name = kind
        self.length = len(buffer)
        self._pin = (ctypes.c_char * self.length).from_buffer(buffer)
        ptr = ctx.lib.ibv_reg_mr(pd.ptr, ctypes.addressof(self._pin), self.length,
                                 DATA_ACCESS if access is None else access)
        if not ptr:
            raise VerbsError("ibv_reg_mr", _errno(), f"{kind} MR of {self.length} B on {ctx.device}")
        head = MrHead.from_address(ptr)
        self.addr, self.lkey, self.rkey = head.addr, head.lkey, head.rkey
        self._own(ctx, ptr)

    def dereg(self):
        if self.live:
            self._destroyed("ibv_dereg_mr", self.context.lib.ibv_dereg_mr(self.ptr))


class MemoryWindow(_Owner):
    """A memory window (type 1 unless asked): bound over part of an MR (a send-queue operation of a QP) to grant
    a peer."""

    kind = "mw"

    def __init__(self, pd, mw_type=MW_TYPE_1):
        ctx = pd.context
        ptr = ctx.lib.orbite_ibv_alloc_mw(pd.ptr, mw_type)
        if not ptr:
            raise VerbsError("ibv_alloc_mw", _errno(), ctx.device)
        self.rkey = MwHead.from_address(ptr).rkey
        self._own(ctx, ptr)

    def bind(self, qp, wr_id, mr, addr, length, access):
        """Post the bind on ``qp`` (signaled); the window's new rkey is known at once."""
        bind = MwBind(wr_id=wr_id, send_flags=SEND_SIGNALED,
                      bind_info=MwBindInfo(mr=mr.ptr, addr=addr, length=length, mw_access_flags=access))
        ret = self.context.lib.orbite_ibv_bind_mw(qp.ptr, self.ptr, ctypes.byref(bind))
        if ret:
            raise VerbsError("ibv_bind_mw", ret, f"MW {self.handle} on QP {qp.qpn}")
        self.rkey = MwHead.from_address(self.ptr).rkey
        qp.outstanding += 1
        self.context.native.wrs += 1

    def dealloc(self):
        if self.live:
            self._destroyed("ibv_dealloc_mw", self.context.lib.orbite_ibv_dealloc_mw(self.ptr))


class CompletionChannel(_Owner):
    """The channel's descriptor becomes readable with each event; the engine selects on ``fileno()``."""

    kind = "channel"

    def __init__(self, context):
        ptr = context.lib.ibv_create_comp_channel(context.ptr)
        if not ptr:
            raise VerbsError("ibv_create_comp_channel", _errno(), context.device)
        self.fd = ChannelHead.from_address(ptr).fd
        self._own(context, ptr)

    def fileno(self):
        return self.fd

    def get_cq_event(self):
        """The CQ pointer of the next event (blocks: call once the descriptor is readable)."""
        cq, cq_context = vp(), vp()
        if self.context.lib.ibv_get_cq_event(self.ptr, ctypes.byref(cq), ctypes.byref(cq_context)):
            raise VerbsError("ibv_get_cq_event", _errno())
        return cq.value

    def drain_events(self, cq):
        """Fetch every event pending now on this channel (its one CQ ``cq``), acknowledging each at once (a CQ's
        destroy waits for every event handed out to be acknowledged); how many."""
        count = 0
        while select.select([self], [], [], 0)[0]:
            self.get_cq_event()
            cq.ack_events(1)
            count += 1
        return count

    def destroy(self):
        if self.live:
            self._destroyed("ibv_destroy_comp_channel", self.context.lib.ibv_destroy_comp_channel(self.ptr))


class CompletionQueue(_Owner):
    kind = "cq"
    BATCH = 64

    def __init__(self, context, depth, channel):
        self.depth = depth
        self.channel = channel
        ptr = context.lib.ibv_create_cq(context.ptr, depth, None, channel.ptr if channel else None, 0)
        if not ptr:
            raise VerbsError("ibv_create_cq", _errno(), context.device)
        self._wc = (Wc * self.BATCH)()
        self._own(context, ptr)

    def poll(self, max_entries=BATCH):
        """[(wr_id, status, byte_len, qp_num)] of up to ``max_entries`` completions, counted into the
        context's native counters (the provider poisons the length of an error completion: it counts
        and is used only with status 0)."""
        got = self.context.lib.orbite_ibv_poll_cq(self.ptr, min(max_entries, self.BATCH), self._wc)
        if got < 0:
            raise VerbsError("ibv_poll_cq", errno.EIO, self.handle)
        wcs = self._wc
        out = [(wcs[i].wr_id, wcs[i].status, wcs[i].byte_len, wcs[i].qp_num) for i in range(got)]
        native = self.context.native
        native.cqes += got
        native.bytes += sum(w[2] for w in out if w[1] == WC_SUCCESS)
        return out

    def req_notify(self):
        ret = self.context.lib.orbite_ibv_req_notify_cq(self.ptr, 0)
        if ret:
            raise VerbsError("ibv_req_notify_cq", ret, self.handle)

    def ack_events(self, count):
        self.context.lib.ibv_ack_cq_events(self.ptr, count)

    def destroy(self):
        if self.live:
            self._destroyed("ibv_destroy_cq", self.context.lib.ibv_destroy_cq(self.ptr))


class QueuePair(_Owner):
    """An RC QP. ``outstanding`` = WRs posted whose completion the engine has not polled yet (the
    provider holds a send-queue slot for each and refuses a post beyond ``max_send_wr``)."""

    kind = "qp"

    def __init__(self, pd, cq, lane, operation, max_send_wr):
        ctx = pd.context
        self.pd = pd
        self.cq = cq
        self.lane = lane
        self.operation = operation
        self.max_send_wr = max_send_wr
        attr = QpInitAttr(send_cq=cq.ptr, recv_cq=cq.ptr, qp_type=QPT_RC, sq_sig_all=0,
                          cap=QpCap(max_send_wr=max_send_wr, max_recv_wr=1, max_send_sge=1, max_recv_sge=1))
        ptr = ctx.lib.ibv_create_qp(pd.ptr, ctypes.byref(attr))
        if not ptr:
            raise VerbsError("ibv_create_qp", _errno(), f"{ctx.device} (max_send_wr {max_send_wr})")
        self.qpn = QpHead.from_address(ptr).qp_num
        self.peer_qpn = None
        self.state = "RESET"
        self.outstanding = 0
        self.receives = 0  # receives posted whose completion the engine has not polled yet
        self._own(ctx, ptr)
        self._wr = SendWr()
        self._sge = Sge()
        self._wr.sg_list = ctypes.addressof(self._sge)
        self._wr.num_sge = 1
        self._wr.opcode = WR_OPCODES[operation]
        self._wr.send_flags = SEND_SIGNALED
        self._bad = vp()

    def _modify(self, attr, mask, state):
        ret = self.context.lib.ibv_modify_qp(self.ptr, ctypes.byref(attr), mask)
        if ret:
            raise VerbsError("ibv_modify_qp", ret, f"QP {self.qpn} to {state}")
        self.state = state

    def connect(self, port, gid_index, peer_qpn, peer_gid):
        """RESET -> INIT -> RTR -> RTS towards the peer QP ``peer_qpn`` at ``peer_gid`` (16 bytes),
        with a GRH address vector from this port's GID ``gid_index``, as on RoCE."""
        init = QpAttr(qp_state=QPS_INIT, pkey_index=0, port_num=port, qp_access_flags=DATA_ACCESS)
        self._modify(init, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS, "INIT")
        rtr = QpAttr(qp_state=QPS_RTR, path_mtu=MTU_1024, dest_qp_num=peer_qpn, rq_psn=0, max_dest_rd_atomic=1,
                     min_rnr_timer=MIN_RNR_TIMER)
        rtr.ah_attr.is_global = 1
        rtr.ah_attr.port_num = port
        rtr.ah_attr.grh.sgid_index = gid_index
        rtr.ah_attr.grh.hop_limit = HOP_LIMIT
        ctypes.memmove(rtr.ah_attr.grh.dgid.raw, peer_gid, 16)
        self._modify(rtr, QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN | QP_MAX_DEST_RD_ATOMIC
                     | QP_MIN_RNR_TIMER, "RTR")
        rts = QpAttr(qp_state=QPS_RTS, timeout=TIMEOUT, retry_cnt=RETRY_CNT, rnr_retry=RNR_RETRY, sq_psn=0,
                     max_rd_atomic=1)
        self._modify(rts, QP_STATE | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_SQ_PSN | QP_MAX_QP_RD_ATOMIC,
                     "RTS")
        self.peer_qpn = peer_qpn

    def to_error(self):
        """Any state -> ERR: a WR posted after it is accepted and flushed at once (docs/provider.md)."""
        self._modify(QpAttr(qp_state=QPS_ERR), QP_STATE, "ERR")

    def post_send(self, wr_id, local_addr, length, lkey, remote_addr, rkey):
        """Post one signaled RDMA READ/WRITE of ``length`` bytes; VerbsError with the provider's errno."""
        wr, sge = self._wr, self._sge
        wr.wr_id = wr_id
        wr.remote_addr = remote_addr
        wr.rkey = rkey
        sge.addr = local_addr
        sge.length = length
        sge.lkey = lkey
        ret = self.context.lib.orbite_ibv_post_send(self.ptr, ctypes.byref(wr), ctypes.byref(self._bad))
        if ret:
            raise VerbsError("ibv_post_send", ret, f"QP {self.qpn} wr_id {wr_id} ({self.outstanding} outstanding "
                             f"of {self.max_send_wr})")
        self.outstanding += 1
        self.context.native.wrs += 1

    def post_recv(self, wr_id, addr, length, lkey):
        """Post one receive (the completion receive a grant waits on)."""
        sge = Sge(addr=addr, length=length, lkey=lkey)
        wr = RecvWr(wr_id=wr_id, next=None, sg_list=ctypes.addressof(sge), num_sge=1)
        ret = self.context.lib.orbite_ibv_post_recv(self.ptr, ctypes.byref(wr), ctypes.byref(self._bad))
        if ret:
            raise VerbsError("ibv_post_recv", ret, f"QP {self.qpn} wr_id {wr_id}")
        self.receives += 1

    def retire(self):
        self.outstanding -= 1

    def provider_outstanding(self):
        """Send-queue slots the provider says this QP still holds (posted, completion not polled)."""
        return self.context.lib.orbite_provider_qp_outstanding(self.ptr) if self.live else 0

    def destroy(self):
        if self.live:
            self._destroyed("ibv_destroy_qp", self.context.lib.ibv_destroy_qp(self.ptr))
            self.state = "DESTROYED"

    def query(self):
        """A real ibv_query_qp: the state the provider reports for this QP ({qpn, state}), VerbsError on failure."""
        attr, init = QpAttr(), QpInitAttr()
        ret = self.context.lib.ibv_query_qp(self.ptr, ctypes.byref(attr), QP_STATE, ctypes.byref(init))
        if ret:
            raise VerbsError("ibv_query_qp", ret, f"QP {self.qpn}")
        state = QP_STATE_NAMES.get(attr.qp_state, str(attr.qp_state))
        return {"qpn": QpHead.from_address(self.ptr).qp_num, "state": state}


def gid_text(raw):
    """sysfs text of a 16-byte GID (8 groups of 4 hex digits)."""
    return ":".join(raw[i : i + 2].hex() for i in range(0, 16, 2))


def gid_raw(text):
    """16 raw bytes of a GID in sysfs text."""
    groups = text.split(":")
    if len(groups) != 8 or not all(len(g) == 4 for g in groups):
        raise ValueError(f"GID {text!r} is not 8 groups of 4 hex digits")
    return bytes.fromhex("".join(groups))

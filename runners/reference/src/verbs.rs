//! The verbs library, through the C shim (shim/verbs_shim.c): loaded from the case's pinned path
//! (a sealed memfd copy whose sha256 was checked, RTLD_GLOBAL) or the system's libibverbs.so.1.
//! Every object the library gave is an owner in the `Table` until its destroy returned 0, so
//! "retained owners" is counted from the library's answers.
//!
//! Two dialects of the data path, one per build: the classic `ibv_create_cq` / `ibv_create_qp` /
//! `ibv_post_send` / `ibv_poll_cq`, and with cargo feature `verbs-ex` the extended
//! `ibv_create_cq_ex` / `ibv_create_qp_ex` / `ibv_wr_*` / `ibv_start_poll`. Both give the engine
//! the same handles and completions, so every receipt is counted the same way.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_long, c_longlong, c_uint, c_void, CStr, CString};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

use crate::hash::sha256_hex;

extern "C" {
    fn orb_load(target: *const c_char, msg: *mut c_char, len: usize) -> c_int;
    fn orb_has_provider_counters() -> c_int;
    fn orb_provider_held(kind: *const c_char) -> c_long;
    fn orb_provider_counter(name: *const c_char) -> c_longlong;
    fn orb_has_ctx_counters() -> c_int;
    fn orb_has_qp_outstanding() -> c_int;
    fn orb_provider_ctx_counter(ctx: *mut c_void, name: *const c_char) -> c_longlong;
    fn orb_provider_qp_outstanding(qp: *mut c_void) -> c_long;
    fn orb_open_device(name: *const c_char, ctx: *mut *mut c_void) -> c_int;
    fn orb_close_device(ctx: *mut c_void) -> c_int;
    fn orb_query_gid(ctx: *mut c_void, port: c_int, index: c_int, out: *mut u8) -> c_int;
    fn orb_alloc_pd(ctx: *mut c_void, pd: *mut *mut c_void) -> c_int;
    fn orb_dealloc_pd(pd: *mut c_void) -> c_int;
    fn orb_reg_mr(
        pd: *mut c_void,
        addr: *mut c_void,
        len: usize,
        mr: *mut *mut c_void,
        mr_addr: *mut u64,
        lkey: *mut u32,
        rkey: *mut u32,
    ) -> c_int;
    fn orb_dereg_mr(mr: *mut c_void) -> c_int;
    fn orb_create_channel(ctx: *mut c_void, ch: *mut *mut c_void, fd: *mut c_int) -> c_int;
    fn orb_destroy_channel(ch: *mut c_void) -> c_int;
    fn orb_create_cq(ctx: *mut c_void, depth: c_int, ch: *mut c_void, cq: *mut *mut c_void) -> c_int;
    fn orb_destroy_cq(cq: *mut c_void) -> c_int;
    fn orb_create_cq_ex(ctx: *mut c_void, depth: c_int, ch: *mut c_void, cq: *mut *mut c_void) -> c_int;
    fn orb_create_qp_ex(
        pd: *mut c_void,
        cq: *mut c_void,
        max_send_wr: u32,
        qp: *mut *mut c_void,
        qpx: *mut *mut c_void,
        qpn: *mut u32,
    ) -> c_int;
    #[allow(clippy::too_many_arguments)]
    fn orb_post_ex(
        qpx: *mut c_void,
        wr_id: u64,
        read: c_int,
        laddr: u64,
        len: u32,
        lkey: u32,
        raddr: u64,
        rkey: u32,
    ) -> c_int;
    fn orb_poll_ex(
        cq: *mut c_void,
        n: c_int,
        wr_id: *mut u64,
        status: *mut c_int,
        byte_len: *mut u32,
        qpn: *mut u32,
    ) -> c_int;
    fn orb_create_qp(pd: *mut c_void, cq: *mut c_void, max_send_wr: u32, qp: *mut *mut c_void, qpn: *mut u32) -> c_int;
    fn orb_connect_qp(
        qp: *mut c_void,
        port: c_int,
        gid_index: c_int,
        peer_qpn: u32,
        peer_gid: *const u8,
        stage: *mut c_int,
    ) -> c_int;
    fn orb_destroy_qp(qp: *mut c_void) -> c_int;
    fn orb_post(
        qp: *mut c_void,
        wr_id: u64,
        read: c_int,
        laddr: u64,
        len: u32,
        lkey: u32,
        raddr: u64,
        rkey: u32,
    ) -> c_int;
    fn orb_poll(
        cq: *mut c_void,
        n: c_int,
        wr_id: *mut u64,
        status: *mut c_int,
        byte_len: *mut u32,
        qpn: *mut u32,
    ) -> c_int;
    fn orb_req_notify(cq: *mut c_void) -> c_int;
    fn orb_get_cq_event(ch: *mut c_void, cq: *mut *mut c_void) -> c_int;
    fn orb_ack_cq_events(cq: *mut c_void, n: c_uint);
    fn orb_wait_readable(fds: *const c_int, n: c_int, timeout_ms: c_int) -> c_int;
    fn orb_sealed_copy(data: *const u8, len: usize) -> c_int;
}

pub const SYSTEM_LIBRARY: &str = "libibverbs.so.1";

/// This build's data-path dialect (cargo feature `verbs-ex`), named in the ledger's `verbs_library`.
pub const EXTENDED: bool = cfg!(feature = "verbs-ex");
pub const DIALECT: &str = if EXTENDED { "extended" } else { "classic" };
/// The call whose return says whether a WR was posted, as error messages name it.
pub const POST_CALL: &str = if EXTENDED { "ibv_wr_complete" } else { "ibv_post_send" };
const CREATE_CQ_CALL: &str = if EXTENDED { "ibv_create_cq_ex" } else { "ibv_create_cq" };
const CREATE_QP_CALL: &str = if EXTENDED { "ibv_create_qp_ex" } else { "ibv_create_qp" };
const POLL_CALL: &str = if EXTENDED { "ibv_start_poll" } else { "ibv_poll_cq" };
pub const PROVIDER_COUNTERS: [&str; 6] = [
    "read_bytes_landed",
    "read_bytes_served",
    "write_bytes_sent",
    "write_bytes_landed",
    "wr_completed",
    "wr_failed",
];
/// What one context's (one device's, one rail's) QPs moved, as the provider counts it per context.
pub const DEVICE_COUNTERS: [&str; 4] = [
    "read_bytes_landed",
    "read_bytes_served",
    "write_bytes_sent",
    "write_bytes_landed",
];
pub const HELD_KINDS: [&str; 6] = ["ctx", "pd", "mr", "cq", "channel", "qp"];
pub const WC_STATUS_NAMES: [&str; 24] = [
    "SUCCESS",
    "LOC_LEN_ERR",
    "LOC_QP_OP_ERR",
    "LOC_EEC_OP_ERR",
    "LOC_PROT_ERR",
    "WR_FLUSH_ERR",
    "MW_BIND_ERR",
    "BAD_RESP_ERR",
    "LOC_ACCESS_ERR",
    "REM_INV_REQ_ERR",
    "REM_ACCESS_ERR",
    "REM_OP_ERR",
    "RETRY_EXC_ERR",
    "RNR_RETRY_EXC_ERR",
    "LOC_RDD_VIOL_ERR",
    "REM_INV_RD_REQ_ERR",
    "REM_ABORT_ERR",
    "INV_EECN_ERR",
    "INV_EEC_STATE_ERR",
    "FATAL_ERR",
    "RESP_TIMEOUT_ERR",
    "GENERAL_ERR",
    "TM_ERR",
    "TM_RNDV_INCOMPLETE",
];

pub fn status_name(status: i32) -> String {
    usize::try_from(status)
        .ok()
        .and_then(|i| WC_STATUS_NAMES.get(i))
        .map_or(status.to_string(), |s| s.to_string())
}

/// "call: ENAME (strerror)"
pub fn verr(call: &str, err: i32, detail: &str) -> String {
    let text = std::io::Error::from_raw_os_error(err).to_string();
    if detail.is_empty() {
        format!("{call}: errno {err} ({text})")
    } else {
        format!("{call}: errno {err} ({text}): {detail}")
    }
}

/// An object's opaque handle: its address as C's "%p" writes it (the observers log the same text).
pub fn handle(p: *mut c_void) -> String {
    format!("{:#x}", p as usize)
}

/// Load the verbs library of the case. `Err` is a case error message (exit 2).
/// Returns the ledger's `verbs_library` record (path, sha256 or None).
pub fn load(spec: &Option<(String, String)>, root: &str) -> Result<(String, Option<String>), String> {
    // The loopback provider reads its fake host from here at its first call.
    std::env::set_var("ORBITE_PROVIDER_ROOT", root);
    let (target, path, sha) = match spec {
        None => (SYSTEM_LIBRARY.to_string(), SYSTEM_LIBRARY.to_string(), None),
        Some((path, want)) => {
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(0o400000 /* O_NOFOLLOW */)
                .open(path)
                .map_err(|e| {
                    format!(
                        "case field verbs_library.path = '{path}': cannot be opened ({e}); it must be an existing \
                         regular file, not a symlink"
                    )
                })?;
            let meta = file
                .metadata()
                .map_err(|e| format!("case field verbs_library.path = '{path}': {e}"))?;
            if !meta.is_file() {
                return Err(format!(
                    "case field verbs_library.path = '{path}': must be a regular file"
                ));
            }
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)
                .map_err(|e| format!("case field verbs_library.path = '{path}': {e}"))?;
            let got = sha256_hex(&bytes);
            if &got != want {
                return Err(format!(
                    "case field verbs_library.sha256 = '{want}': {path} hashes to {got}; only the pinned library is loaded"
                ));
            }
            // What is loaded is the checked copy, never the file again.
            let fd = unsafe { orb_sealed_copy(bytes.as_ptr(), bytes.len()) };
            if fd < 0 {
                return Err(format!(
                    "case field verbs_library.path = '{path}': cannot be copied for loading ({})",
                    std::io::Error::from_raw_os_error(-fd)
                ));
            }
            (format!("/proc/self/fd/{fd}"), path.clone(), Some(want.clone()))
        }
    };
    let c_target = CString::new(target).map_err(|_| "verbs library path holds a NUL".to_string())?;
    let mut msg = vec![0 as c_char; 512];
    if unsafe { orb_load(c_target.as_ptr(), msg.as_mut_ptr(), msg.len()) } != 0 {
        let text = unsafe { CStr::from_ptr(msg.as_ptr()) }.to_string_lossy().into_owned();
        return Err(format!(
            "case field verbs_library = '{path}': cannot be loaded ({text})"
        ));
    }
    Ok((path, sha))
}

pub fn has_provider_counters() -> bool {
    unsafe { orb_has_provider_counters() != 0 }
}

/// The library exports `orbite_provider_ctx_counter` (the loopback provider does, rdma-core does not).
pub fn has_ctx_counters() -> bool {
    unsafe { orb_has_ctx_counters() != 0 }
}

/// The library exports `orbite_provider_qp_outstanding` (the loopback provider does, rdma-core does not).
pub fn has_qp_outstanding() -> bool {
    unsafe { orb_has_qp_outstanding() != 0 }
}

/// The provider's own per-context byte counters of `ctx` (None: the library has no such counter).
pub fn ctx_counters(ctx: *mut c_void) -> Option<[i64; 4]> {
    let mut out = [0i64; 4];
    for (slot, name) in out.iter_mut().zip(DEVICE_COUNTERS) {
        let c = CString::new(name).expect("name");
        let v = unsafe { orb_provider_ctx_counter(ctx, c.as_ptr()) } as i64;
        if v < 0 {
            return None;
        }
        *slot = v;
    }
    Some(out)
}

/// Send-queue slots the provider says `qp` still holds (posted, completion not polled); None
/// without the hook.
pub fn qp_outstanding(qp: *mut c_void) -> Option<u64> {
    let v = unsafe { orb_provider_qp_outstanding(qp) };
    u64::try_from(v).ok()
}

pub fn provider_counters() -> BTreeMap<&'static str, i64> {
    PROVIDER_COUNTERS
        .iter()
        .map(|n| {
            let c = CString::new(*n).expect("name");
            (*n, unsafe { orb_provider_counter(c.as_ptr()) } as i64)
        })
        .collect()
}

pub fn provider_held() -> BTreeMap<&'static str, i64> {
    HELD_KINDS
        .iter()
        .map(|n| {
            let c = CString::new(*n).expect("name");
            (*n, unsafe { orb_provider_held(c.as_ptr()) } as i64)
        })
        .collect()
}

/// Live owners: handle -> kind; acquired when the library gave the object, released when its
/// destroy returned 0.
#[derive(Default)]
pub struct Table {
    live: BTreeMap<String, &'static str>,
    pub acquired: usize,
}

impl Table {
    pub fn acquire(&mut self, kind: &'static str, p: *mut c_void) {
        self.live.insert(handle(p), kind);
        self.acquired += 1;
    }
    pub fn release(&mut self, p: *mut c_void) {
        self.live.remove(&handle(p));
    }
    pub fn live_count(&self) -> usize {
        self.live.len()
    }
}

macro_rules! check {
    ($call:expr, $name:expr, $detail:expr) => {{
        let ret = unsafe { $call };
        if ret != 0 {
            return Err(verr($name, ret, &$detail));
        }
    }};
}

pub fn open_device(table: &mut Table, name: &str) -> Result<*mut c_void, String> {
    let c = CString::new(name).map_err(|_| "device name holds a NUL".to_string())?;
    let mut ctx = std::ptr::null_mut();
    check!(orb_open_device(c.as_ptr(), &mut ctx), "ibv_open_device", name);
    table.acquire("ctx", ctx);
    Ok(ctx)
}

pub fn query_gid(ctx: *mut c_void, port: u32, index: u32) -> Result<[u8; 16], String> {
    let mut out = [0u8; 16];
    check!(
        orb_query_gid(ctx, port as c_int, index as c_int, out.as_mut_ptr()),
        "ibv_query_gid",
        format!("port {port} index {index}")
    );
    Ok(out)
}

pub fn alloc_pd(table: &mut Table, ctx: *mut c_void) -> Result<*mut c_void, String> {
    let mut pd = std::ptr::null_mut();
    check!(orb_alloc_pd(ctx, &mut pd), "ibv_alloc_pd", "");
    table.acquire("pd", pd);
    Ok(pd)
}

pub struct Mr {
    pub ptr: *mut c_void,
    pub addr: u64,
    pub lkey: u32,
    pub rkey: u32,
    pub length: usize,
    pub kind: &'static str,
    pub live: bool,
}

pub fn reg_mr(table: &mut Table, pd: *mut c_void, buf: *mut u8, len: usize, kind: &'static str) -> Result<Mr, String> {
    let mut mr = Mr {
        ptr: std::ptr::null_mut(),
        addr: 0,
        lkey: 0,
        rkey: 0,
        length: len,
        kind,
        live: true,
    };
    check!(
        orb_reg_mr(
            pd,
            buf.cast(),
            len,
            &mut mr.ptr,
            &mut mr.addr,
            &mut mr.lkey,
            &mut mr.rkey
        ),
        "ibv_reg_mr",
        format!("{kind} MR of {len} B")
    );
    table.acquire("mr", mr.ptr);
    Ok(mr)
}

pub fn create_channel(table: &mut Table, ctx: *mut c_void) -> Result<(*mut c_void, i32), String> {
    let (mut ch, mut fd) = (std::ptr::null_mut(), -1);
    check!(orb_create_channel(ctx, &mut ch, &mut fd), "ibv_create_comp_channel", "");
    table.acquire("channel", ch);
    Ok((ch, fd))
}

pub fn create_cq(table: &mut Table, ctx: *mut c_void, depth: i32, ch: *mut c_void) -> Result<*mut c_void, String> {
    let mut cq = std::ptr::null_mut();
    let ret = if EXTENDED {
        unsafe { orb_create_cq_ex(ctx, depth, ch, &mut cq) }
    } else {
        unsafe { orb_create_cq(ctx, depth, ch, &mut cq) }
    };
    if ret != 0 {
        return Err(verr(CREATE_CQ_CALL, ret, ""));
    }
    table.acquire("cq", cq);
    Ok(cq)
}

/// A QP: `qp` its ibv_qp (connect, destroy, the ledger's handle), `sq` what `post` posts on (the
/// ibv_qp itself, or its ibv_qp_ex in the extended dialect).
pub struct QpHandles {
    pub qp: *mut c_void,
    pub sq: *mut c_void,
    pub qpn: u32,
}

pub fn create_qp(table: &mut Table, pd: *mut c_void, cq: *mut c_void, max_send_wr: u32) -> Result<QpHandles, String> {
    let (mut qp, mut qpn) = (std::ptr::null_mut(), 0u32);
    let mut sq = std::ptr::null_mut();
    let ret = if EXTENDED {
        unsafe { orb_create_qp_ex(pd, cq, max_send_wr, &mut qp, &mut sq, &mut qpn) }
    } else {
        let ret = unsafe { orb_create_qp(pd, cq, max_send_wr, &mut qp, &mut qpn) };
        sq = qp;
        ret
    };
    if ret != 0 {
        return Err(verr(CREATE_QP_CALL, ret, &format!("max_send_wr {max_send_wr}")));
    }
    table.acquire("qp", qp);
    Ok(QpHandles { qp, sq, qpn })
}

pub fn connect_qp(
    qp: *mut c_void,
    port: u32,
    gid_index: u32,
    peer_qpn: u32,
    peer_gid: &[u8; 16],
) -> Result<(), String> {
    let mut stage = 0;
    let ret = unsafe {
        orb_connect_qp(
            qp,
            port as c_int,
            gid_index as c_int,
            peer_qpn,
            peer_gid.as_ptr(),
            &mut stage,
        )
    };
    if ret != 0 {
        let state = ["RESET", "INIT", "RTR", "RTS"]
            .get(stage as usize)
            .copied()
            .unwrap_or("?");
        return Err(verr("ibv_modify_qp", ret, &format!("to {state}")));
    }
    Ok(())
}

/// Destroy an object of `kind`; on 0 it leaves the table. Err = the errno (the object stays held).
pub fn destroy(table: &mut Table, kind: &str, p: *mut c_void) -> Result<(), String> {
    let (name, ret) = unsafe {
        match kind {
            "qp" => ("ibv_destroy_qp", orb_destroy_qp(p)),
            "mr" => ("ibv_dereg_mr", orb_dereg_mr(p)),
            "cq" => ("ibv_destroy_cq", orb_destroy_cq(p)),
            "channel" => ("ibv_destroy_comp_channel", orb_destroy_channel(p)),
            "pd" => ("ibv_dealloc_pd", orb_dealloc_pd(p)),
            _ => ("ibv_close_device", orb_close_device(p)),
        }
    };
    if ret != 0 {
        return Err(verr(name, ret, &format!("{kind} {} stays held", handle(p))));
    }
    table.release(p);
    Ok(())
}

/// One signaled RDMA READ or WRITE of one SGE on `sq` (`QpHandles::sq`): 0 or the errno of
/// `POST_CALL`.
#[allow(clippy::too_many_arguments)]
pub fn post(sq: *mut c_void, wr_id: u64, read: bool, laddr: u64, len: u32, lkey: u32, raddr: u64, rkey: u32) -> i32 {
    let read = c_int::from(read);
    if EXTENDED {
        unsafe { orb_post_ex(sq, wr_id, read, laddr, len, lkey, raddr, rkey) }
    } else {
        unsafe { orb_post(sq, wr_id, read, laddr, len, lkey, raddr, rkey) }
    }
}

pub struct Completion {
    pub wr_id: u64,
    pub status: i32,
    pub byte_len: u32,
    pub qpn: u32,
}

pub fn poll(cq: *mut c_void, out: &mut Vec<Completion>) -> Result<usize, String> {
    let (mut ids, mut st, mut len, mut qpn) = ([0u64; 64], [0i32; 64], [0u32; 64], [0u32; 64]);
    let poll = if EXTENDED { orb_poll_ex } else { orb_poll };
    let got = unsafe {
        poll(
            cq,
            64,
            ids.as_mut_ptr(),
            st.as_mut_ptr(),
            len.as_mut_ptr(),
            qpn.as_mut_ptr(),
        )
    };
    if got < 0 {
        return Err(format!("{POLL_CALL}: {got} on CQ {}", handle(cq)));
    }
    for i in 0..got as usize {
        out.push(Completion {
            wr_id: ids[i],
            status: st[i],
            byte_len: len[i],
            qpn: qpn[i],
        });
    }
    Ok(got as usize)
}

pub fn req_notify(cq: *mut c_void) -> Result<(), String> {
    check!(orb_req_notify(cq), "ibv_req_notify_cq", handle(cq));
    Ok(())
}

pub fn get_cq_event(ch: *mut c_void) -> Result<*mut c_void, String> {
    let mut cq = std::ptr::null_mut();
    check!(orb_get_cq_event(ch, &mut cq), "ibv_get_cq_event", "");
    Ok(cq)
}

pub fn ack_cq_events(cq: *mut c_void, n: u32) {
    unsafe { orb_ack_cq_events(cq, n) }
}

/// Bit i set = fds[i] readable within `timeout_ms`.
pub fn wait_readable(fds: &[i32], timeout_ms: i32) -> i32 {
    unsafe { orb_wait_readable(fds.as_ptr(), fds.len() as c_int, timeout_ms) }
}

//! The engine both roles share (docs/runner-contract.md section 4): rails and contexts, the
//! persistent MRs on both contexts, QPs created once per enabled rail and lane and reused, three
//! rounds with fresh seeded input, at most eight payload WRs in flight per QP, byte and guard
//! checks, drain, teardown, and the ledger (docs/receipts.md) written at every checkpoint.
//!
//! The engine only posts and polls: the verbs library moves the payload (the RNIC, or the
//! loopback verbs provider of the simulated lab). Every counter in the ledger is counted at the
//! call it counts.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ffi::c_void;
use std::net::TcpListener;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::case::{format_address, parse_address, Case};
use crate::content::{self, RoundInput};
use crate::json::Json;
use crate::sysfs::{self, RailInfo};
use crate::verbs::{self, Mr, Table};
use crate::wire::{self, Rendezvous};

pub const RAILS: [usize; 2] = [0, 1];
pub const SEND_QUEUE_DEPTH: u32 = 8;
pub const ROUNDS: i64 = 3;
const CQ_DEPTH: i32 = 256;
const CTRL_BYTES: usize = 4096;
const SPIN_EMPTY_POLLS: u32 = 2;
const EVENT_GRACE_MS: i32 = 200;
/// A round's WRs are written as columns (docs/receipts.md 1.6): one array per WR field, in post order.
const WR_COLUMNS: [&str; 15] = [
    "wr_id",
    "parent",
    "slice",
    "rail",
    "lane",
    "qpn",
    "context",
    "cq",
    "opcode",
    "bytes",
    "local_offset",
    "remote_offset",
    "status",
    "posted_seq",
    "completed_seq",
];

pub const EXIT_OK: i32 = 0;
pub const EXIT_CHECK_FAILED: i32 = 1;
pub const EXIT_CASE_ERROR: i32 = 2;
pub const EXIT_UNAVAILABLE: i32 = 3;
pub const EXIT_PEER: i32 = 4;
pub const EXIT_INTERNAL: i32 = 70;

pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// A fresh random 64-bit value from the kernel.
pub fn fresh_u64() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .expect("/dev/urandom");
    u64::from_le_bytes(b)
}

/// A typed engine error (docs/receipts.md section 1.7).
#[derive(Debug, Clone)]
pub struct EngineError {
    pub error: String,
    pub operation: String,
    pub message: String,
    pub round: Option<i64>,
    pub parent: Option<usize>,
    pub remote_effect: &'static str,
    pub locally_drained: Option<bool>,
    pub qps_created: u64,
    pub wrs_posted: u64,
    pub expected: bool,
}

impl EngineError {
    pub fn new(error: &str, operation: &str, message: &str) -> EngineError {
        EngineError {
            error: error.to_string(),
            operation: operation.to_string(),
            message: message.to_string(),
            round: None,
            parent: None,
            remote_effect: "None",
            locally_drained: None,
            qps_created: 0,
            wrs_posted: 0,
            expected: false,
        }
    }

    pub fn in_round(mut self, round: i64) -> EngineError {
        self.round = Some(round);
        self
    }

    pub fn exit_code(&self) -> i32 {
        match self.error.as_str() {
            "Unavailable" => EXIT_UNAVAILABLE,
            "CheckFailed" => EXIT_CHECK_FAILED,
            "InvalidArgument" => EXIT_CASE_ERROR,
            "Internal" => EXIT_INTERNAL,
            _ => EXIT_PEER,
        }
    }

    pub fn to_json(&self) -> Json {
        Json::obj()
            .with("error", self.error.as_str())
            .with("operation", self.operation.as_str())
            .with("round", self.round)
            .with("parent", self.parent)
            .with("remote_effect", self.remote_effect)
            .with("locally_drained", self.locally_drained)
            .with("qps_created", self.qps_created)
            .with("wrs_posted", self.wrs_posted)
            .with("bytes", 0)
            .with("expected", self.expected)
            .with("message", self.message.as_str())
    }
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} in {}: {}", self.error, self.operation, self.message)
    }
}

fn unavailable(op: &str, msg: &str) -> EngineError {
    EngineError::new("Unavailable", op, msg)
}

fn protocol(op: &str, msg: &str) -> EngineError {
    EngineError::new("ProtocolError", op, msg)
}

/// Write `text` to `path` so a reader sees the old file or the whole new one.
pub fn write_atomic(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("json.tmp.{}", std::process::id()));
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

pub fn gid_text(raw: &[u8; 16]) -> String {
    raw.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

fn gid_raw(text: &str) -> Option<[u8; 16]> {
    let hex: String = text.split(':').collect();
    if hex.len() != 32 || text.split(':').count() != 8 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// max(1, payload // block) slices, all `block` bytes but the last, which takes the rest.
pub fn slice_plan(payload: usize, block: usize) -> Vec<usize> {
    let count = (payload / block).max(1);
    let mut sizes = vec![block; count - 1];
    sizes.push(payload - block * (count - 1));
    sizes
}

fn profile_key(case: &Case) -> Json {
    let mut out = Json::obj();
    for k in [
        "mode",
        "operation",
        "rdma_events",
        "parents",
        "payload",
        "block",
        "num_lanes",
        "mask",
    ] {
        out.set(k, case.profile.get(k).cloned().unwrap_or(Json::Null));
    }
    out
}

struct Context {
    rail: usize,
    device: String,
    ptr: *mut c_void,
    pd: *mut c_void,
    cq: *mut c_void,
    channel: Option<(*mut c_void, i32)>,
    mrs: Vec<Mr>,
    ctrl: Vec<u8>,
    port: u32,
    gid_index: u32,
    gid: [u8; 16],
    /// native counters at the engine's own verbs calls: bytes, wrs, cqes
    native: [u64; 3],
    live: [bool; 4], // pd, cq, channel, ctx
}

struct Qp {
    ptr: *mut c_void,
    /// what its WRs are posted on (verbs::QpHandles::sq)
    sq: *mut c_void,
    qpn: u32,
    rail: usize,
    lane: usize,
    max_send_wr: u32,
    outstanding: u32,
    live: bool,
    record: Json,
}

/// The provider's per-context byte counters of each live context: (rail, DEVICE_COUNTERS values).
type DeviceSnapshot = Vec<(usize, [i64; 4])>;

#[derive(Default)]
struct Round {
    no: i64,
    started: f64,
    provider_before: BTreeMap<&'static str, i64>,
    /// the provider's counters per context (rail) when the round's window opens; None: no hook
    device_before: Option<DeviceSnapshot>,
    native_before: Vec<[u64; 3]>,
    created: BTreeSet<u32>,
    seed: u64,
    origin: &'static str,
    /// destination side only: the fresh guard seed of the round
    guard_seed: Option<u64>,
    placement: Vec<(usize, usize, usize)>, // parent, rail, lane (source: from ROUND_BEGIN)
    issued: Vec<usize>,                    // source: the grants ROUND_READY issued
}

/// WR records as the ledger's columns.
fn wr_columns(wrs: &[Json]) -> Json {
    let mut out = Json::obj();
    for name in WR_COLUMNS {
        let column: Vec<Json> = wrs.iter().map(|w| w.get(name).cloned().unwrap_or(Json::Null)).collect();
        out.set(name, Json::Arr(column));
    }
    out
}

fn int_list(msg: &Json, key: &str) -> BTreeSet<usize> {
    msg.get(key)
        .and_then(Json::as_arr)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_int().and_then(|x| usize::try_from(x).ok()))
                .collect()
        })
        .unwrap_or_default()
}

pub struct Engine {
    pub case: Case,
    out: std::path::PathBuf,
    pub doc: Json,
    epoch: u64,
    base_seed: u64,
    table: Table,
    arena: Vec<u8>,
    contexts: Vec<Context>,
    qps: Vec<Qp>,
    enabled: Vec<usize>,
    rv: Option<Rendezvous>,
    pub round_no: i64,
    pub checks_failed: bool,
    segments: HashMap<usize, Json>,
    next_wr_id: u64,
    seq: u64,
    defects: Vec<String>,
    provider: bool,
    /// the library exports orbite_provider_ctx_counter / orbite_provider_qp_outstanding
    ctx_counters: bool,
    qp_outstanding: bool,
}

impl Engine {
    pub fn new(case: Case, out: std::path::PathBuf, doc: Json, library: (String, Option<String>)) -> Engine {
        let enabled: Vec<usize> = RAILS.iter().copied().filter(|r| case.mask & (1 << r) != 0).collect();
        let arena = vec![0u8; case.parents * content::stride(case.payload)];
        let epoch = fresh_u64() % ((1u64 << 63) - 1) + 1;
        let base_seed = case.seed.unwrap_or_else(fresh_u64);
        let mut e = Engine {
            defects: case.defects.clone(),
            case,
            out,
            doc,
            epoch,
            base_seed,
            table: Table::default(),
            arena,
            contexts: Vec::new(),
            qps: Vec::new(),
            enabled,
            rv: None,
            round_no: 0,
            checks_failed: false,
            segments: HashMap::new(),
            next_wr_id: 0,
            seq: 0,
            provider: verbs::has_provider_counters(),
            ctx_counters: verbs::has_ctx_counters(),
            qp_outstanding: verbs::has_qp_outstanding(),
        };
        let (host, boot) = sysfs::host_identity(&e.case.root);
        e.doc.set("hostname", host);
        e.doc.set("boot_id", boot);
        e.doc.set("epoch", epoch);
        e.doc.set(
            "verbs_library",
            Json::obj()
                .with("path", library.0)
                .with("sha256", library.1)
                // The data-path verbs this build calls (cargo feature verbs-ex: the extended ones).
                .with("dialect", verbs::DIALECT)
                // Which second witnesses the library offers (docs/runner-contract.md section 9):
                // without them a round has no `device` and a drain no `provider_outstanding_wrs`.
                .with(
                    "provider_hooks",
                    Json::obj()
                        .with("orbite_provider_ctx_counter", e.ctx_counters)
                        .with("orbite_provider_qp_outstanding", e.qp_outstanding),
                ),
        );
        e.doc.set(
            "workload",
            Json::obj()
                .with("parents", e.case.parents)
                .with("payload", e.case.payload)
                .with("block", e.case.block)
                .with("num_lanes", e.case.lanes)
                .with("mask", e.case.mask)
                .with("enabled_rails", e.enabled.clone())
                .with("guard_bytes", content::GUARD)
                .with("region_stride", content::stride(e.case.payload))
                .with("arena_bytes", e.arena.len())
                .with("send_queue_depth", SEND_QUEUE_DEPTH)
                .with("rounds", ROUNDS),
        );
        e
    }

    fn defect(&self, name: &str) -> bool {
        cfg!(feature = "test-defects") && self.defects.iter().any(|d| d == name)
    }

    fn is_read(&self) -> bool {
        self.case.operation == "read"
    }

    fn rv(&mut self) -> &mut Rendezvous {
        self.rv.as_mut().expect("rendezvous is open")
    }

    pub fn checkpoint(&mut self) {
        self.render();
        let path = self.out.join("ledger.json");
        if let Err(e) = write_atomic(&path, &self.doc.to_text()) {
            eprintln!("orbite-runner: cannot write {}: {e}", path.display());
        }
    }

    fn render(&mut self) {
        let qps: Vec<Json> = self.qps.iter().map(|q| q.record.clone()).collect();
        self.doc.set("qps", Json::Arr(qps));
        let mut out = Vec::new();
        for c in &self.contexts {
            let ch = c.channel.map(|(p, _)| verbs::handle(p));
            let mrs: Vec<Json> = c
                .mrs
                .iter()
                .map(|m| {
                    Json::obj()
                        .with("mr", verbs::handle(m.ptr))
                        .with("kind", m.kind)
                        .with("length", m.length)
                        .with("lkey", m.lkey)
                        .with("rkey", m.rkey)
                        .with("registered_round", 0)
                        .with(
                            "deregistered_round",
                            if m.live { Json::Null } else { Json::from("teardown") },
                        )
                        .with("live", m.live)
                })
                .collect();
            out.push(
                Json::obj()
                    .with("context", verbs::handle(c.ptr))
                    .with("rail", c.rail)
                    .with("device", c.device.as_str())
                    .with("pd", verbs::handle(c.pd))
                    .with(
                        "cqs",
                        Json::Arr(vec![Json::obj()
                            .with("cq", verbs::handle(c.cq))
                            .with("depth", CQ_DEPTH)
                            .with("channel", ch.clone())]),
                    )
                    .with("completion_channel", ch)
                    .with("mrs", Json::Arr(mrs)),
            );
        }
        self.doc.set("contexts", Json::Arr(out));
    }

    // ------------------------------------------------------------------ setup

    fn choose_rails(&mut self) -> Result<Vec<RailInfo>, EngineError> {
        let root = self.case.root.clone();
        if let Some(rails) = &self.case.rails {
            return rails
                .iter()
                .map(|r| {
                    sysfs::describe_rail(&root, &r.device, r.port, r.gid_index)
                        .map_err(|m| unavailable("open_device", &m))
                })
                .collect();
        }
        let (white, black) = self.case.discovery.clone().unwrap_or_default();
        let (mut record, candidates) = sysfs::discover(&root, &white, &black);
        if candidates.is_empty() {
            record.set("strict_gid_request", Json::Null);
            self.doc.set("discovery", record);
            return Err(unavailable(
                "open_device",
                "discovery: no candidate RNIC (see discovery.excluded)",
            ));
        }
        record.set("strict_gid_request", strict_gid_request(&root, &candidates[0]));
        let chosen = record.get("chosen_nic_ids").map(Json::to_text).unwrap_or_default();
        self.doc.set("discovery", record);
        if candidates.len() < RAILS.len() {
            return Err(unavailable(
                "open_device",
                &format!(
                    "discovery: {} candidate RNIC(s), both rails need one (chosen {chosen})",
                    candidates.len()
                ),
            ));
        }
        Ok(candidates.into_iter().take(RAILS.len()).collect())
    }

    pub fn open(&mut self) -> Result<(), EngineError> {
        let rails = self.choose_rails()?;
        let mut records = Vec::new();
        for (rail, info) in RAILS.iter().zip(rails) {
            self.open_rail(*rail, &info)
                .map_err(|m| unavailable("open_device", &format!("rail {rail} ({}): {m}", info.device)))?;
            records.push(
                Json::obj()
                    .with("rail", *rail)
                    .with("device", info.device.as_str())
                    .with("port", info.port)
                    .with("gid_index", info.gid_index)
                    .with("gid", info.gid.as_str())
                    .with("gid_type", info.gid_type.clone())
                    .with("netdev", info.netdev.clone())
                    .with("numa_node", info.numa_node)
                    .with("enabled", self.enabled.contains(rail))
                    .with("context", verbs::handle(self.contexts[*rail].ptr))
                    .with("nic_id", info.nic_id()),
            );
            self.doc.set("rails", Json::Arr(records.clone()));
        }
        Ok(())
    }

    fn open_rail(&mut self, rail: usize, info: &RailInfo) -> Result<(), String> {
        let ptr = verbs::open_device(&mut self.table, &info.device)?;
        self.contexts.push(Context {
            rail,
            device: info.device.clone(),
            ptr,
            pd: std::ptr::null_mut(),
            cq: std::ptr::null_mut(),
            channel: None,
            mrs: Vec::new(),
            ctrl: vec![0u8; CTRL_BYTES],
            port: info.port,
            gid_index: info.gid_index,
            gid: [0; 16],
            native: [0; 3],
            live: [false, false, false, true],
        });
        let c = self.contexts.last_mut().expect("pushed");
        // The AV's source GID is the library's; it must be the GID the host's sysfs shows.
        let raw = verbs::query_gid(ptr, info.port, info.gid_index)?;
        if gid_text(&raw) != info.gid {
            return Err(format!(
                "{} port {} GID {}: the verbs library reports {}, sysfs {}",
                info.device,
                info.port,
                info.gid_index,
                gid_text(&raw),
                info.gid
            ));
        }
        c.gid = raw;
        c.pd = verbs::alloc_pd(&mut self.table, ptr)?;
        c.live[0] = true;
        if self.case.rdma_events {
            c.channel = Some(verbs::create_channel(&mut self.table, ptr)?);
            c.live[2] = true;
        }
        c.cq = verbs::create_cq(
            &mut self.table,
            ptr,
            CQ_DEPTH,
            c.channel.map_or(std::ptr::null_mut(), |(p, _)| p),
        )?;
        c.live[1] = true;
        // Persistent MRs on every context, whatever the mask.
        let len = self.arena.len();
        let data = verbs::reg_mr(&mut self.table, c.pd, self.arena.as_mut_ptr(), len, "data")?;
        c.mrs.push(data);
        let ctrl = verbs::reg_mr(&mut self.table, c.pd, c.ctrl.as_mut_ptr(), CTRL_BYTES, "ctrl")?;
        c.mrs.push(ctrl);
        Ok(())
    }

    fn segment(&self, rail: usize) -> Json {
        let c = &self.contexts[rail];
        let (data, ctrl) = (&c.mrs[0], &c.mrs[1]);
        Json::obj()
            .with("rail", rail)
            .with("data_rkey", data.rkey)
            .with("data_addr", data.addr)
            .with("data_length", data.length)
            .with("ctrl_rkey", ctrl.rkey)
            .with("ctrl_addr", ctrl.addr)
    }

    // ------------------------------------------------------------------ QPs

    fn new_qp(&mut self, rail: usize, lane: usize, round: i64, max_send_wr: u32) -> Result<usize, EngineError> {
        let c = &self.contexts[rail];
        let (pd, cq, ctx) = (c.pd, c.cq, c.ptr);
        let handles = verbs::create_qp(&mut self.table, pd, cq, max_send_wr)
            .map_err(|m| unavailable("connect_qp", &format!("rail {rail} lane {lane}: {m}")).in_round(round))?;
        let qpn = handles.qpn;
        let record = Json::obj()
            .with("qpn", qpn)
            .with("context", verbs::handle(ctx))
            .with("rail", rail)
            .with("lane", lane)
            .with("operation", self.case.operation.as_str())
            .with("cq", verbs::handle(cq))
            .with("peer_qpn", Json::Null)
            .with("max_send_wr", max_send_wr)
            .with("created_round", round)
            .with("destroyed_round", Json::Null)
            .with("state", "RTS");
        self.qps.push(Qp {
            ptr: handles.qp,
            sq: handles.sq,
            qpn,
            rail,
            lane,
            max_send_wr,
            outstanding: 0,
            live: true,
            record,
        });
        Ok(self.qps.len() - 1)
    }

    fn qp_offer(&self, i: usize) -> Json {
        let q = &self.qps[i];
        let c = &self.contexts[q.rail];
        Json::obj()
            .with("rail", q.rail)
            .with("lane", q.lane)
            .with("operation", self.case.operation.as_str())
            .with("qpn", q.qpn)
            .with("gid", gid_text(&c.gid))
            .with("rkey", c.mrs[0].rkey)
            .with("addr", c.mrs[0].addr)
    }

    fn connect_qp(&mut self, i: usize, peer: &Json, round: i64) -> Result<(), EngineError> {
        let peer_qpn = peer.get("qpn").and_then(Json::as_int).unwrap_or(-1);
        let gid = peer.get("gid").and_then(Json::as_str).and_then(gid_raw);
        let q = &self.qps[i];
        let c = &self.contexts[q.rail];
        let (Ok(peer_qpn), Some(gid)) = (u32::try_from(peer_qpn), gid) else {
            return Err(protocol(
                "connect_qp",
                &format!("QP {} to peer {}: bad QPN or GID", q.qpn, peer.to_text()),
            )
            .in_round(round));
        };
        verbs::connect_qp(q.ptr, c.port, c.gid_index, peer_qpn, &gid).map_err(|m| {
            protocol("connect_qp", &format!("QP {} to peer {}: {m}", q.qpn, peer.to_text())).in_round(round)
        })?;
        self.qps[i].record.set("peer_qpn", peer_qpn);
        Ok(())
    }

    // ------------------------------------------------------------------ rounds

    fn arena_mut(&mut self) -> &mut [u8] {
        &mut self.arena
    }

    fn local_input(&mut self, round: i64) -> u64 {
        let seed = content::round_seed(self.base_seed, self.epoch, round as u32);
        let (parents, payload) = (self.case.parents, self.case.payload);
        content::fill_input(self.arena_mut(), parents, payload, seed);
        seed
    }

    fn poison_destination(&mut self) -> Option<u64> {
        let g = fresh_u64();
        let (parents, payload) = (self.case.parents, self.case.payload);
        content::prepare_destination(self.arena_mut(), parents, payload, g);
        Some(g)
    }

    /// Test-build defects on the destination side, once bytes of parent 0 landed in round 1.
    fn spoil_landed(&mut self, first: bool, last: bool) {
        if self.round_no != 1 {
            return;
        }
        let start = content::region_offset(0, self.case.payload);
        let payload = self.case.payload;
        if first && self.defect("corrupt_byte") {
            self.arena[start] ^= 0xFF;
        }
        if last && self.defect("overwrite_guard") {
            self.arena[start + payload] ^= 0xFF;
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn parent_entry(
        &self,
        pid: usize,
        rail: usize,
        lane: usize,
        qpn: Option<u32>,
        requested: usize,
        completed: Option<u64>,
        slices: usize,
        status: &str,
    ) -> Json {
        Json::obj()
            .with("parent", pid)
            .with("rail", rail)
            .with("lane", lane)
            .with("qpn", qpn)
            .with("requested_bytes", requested)
            .with("completed_bytes", completed)
            .with("slices", slices)
            .with("status", status)
            .with("region_offset", content::region_offset(pid, self.case.payload))
            .with("byte_check", Json::Null)
            .with("guard_check", Json::Null)
            .with("error", Json::Null)
    }

    /// Destination side: byte and guard checks of one parent; true when this check failed it.
    fn check_parent(&self, entry: &mut Json, expected: &RoundInput, guard_seed: u64, op: &str, round: i64) -> bool {
        let pid = entry.get("parent").and_then(Json::as_int).unwrap_or(0) as usize;
        let (byte_check, mut guard_check, mut ok) = content::check_region(&self.arena, pid, expected, guard_seed);
        if self.defect("skip_guard_check") {
            // The defect: the guards are never compared, so no guard check is recorded.
            guard_check = Json::Null;
            ok = byte_check.get("ok") == Some(&Json::Bool(true));
        }
        entry.set("byte_check", byte_check);
        entry.set("guard_check", guard_check);
        if entry.get("status").and_then(Json::as_str) == Some("Failed") || ok {
            return false;
        }
        entry.set("status", "Failed");
        let mut err = EngineError::new("CheckFailed", op, "destination bytes or guards differ").in_round(round);
        err.parent = Some(pid);
        entry.set("error", err.to_json());
        true
    }

    fn new_public(&self) -> (u64, BTreeMap<usize, u64>) {
        (0, self.enabled.iter().map(|r| (*r, 0)).collect())
    }

    fn public_json(public: &(u64, BTreeMap<usize, u64>)) -> Json {
        let mut per = Json::obj();
        for (r, b) in &public.1 {
            per.set(&r.to_string(), *b);
        }
        Json::obj().with("bytes", public.0).with("per_rail", per)
    }

    fn native_snapshot(&self) -> Vec<[u64; 3]> {
        self.contexts.iter().map(|c| c.native).collect()
    }

    fn native_counters(&self, before: &[[u64; 3]]) -> Json {
        let mut per = Json::obj();
        let mut sums = [0u64; 3];
        for r in &self.enabled {
            let now = self.contexts[*r].native;
            let d: Vec<u64> = (0..3).map(|i| now[i] - before[*r][i]).collect();
            for i in 0..3 {
                sums[i] += d[i];
            }
            per.set(
                &r.to_string(),
                Json::obj().with("bytes", d[0]).with("wrs", d[1]).with("cqes", d[2]),
            );
        }
        Json::obj()
            .with("bytes", sums[0])
            .with("wrs", sums[1])
            .with("cqes", sums[2])
            .with("per_rail", per)
    }

    /// The provider's own per-context counters of every live context, or None without the hook.
    fn device_snapshot(&self) -> Option<DeviceSnapshot> {
        if !self.ctx_counters {
            return None;
        }
        self.contexts
            .iter()
            .filter(|c| c.live[3])
            .map(|c| verbs::ctx_counters(c.ptr).map(|v| (c.rail, v)))
            .collect()
    }

    /// What the provider moved through each rail's context since `before`: the round's `device`.
    fn device_counters(&self, before: &Option<DeviceSnapshot>) -> Option<Json> {
        let (Some(before), Some(now)) = (before, self.device_snapshot()) else {
            return None;
        };
        let mut out = Json::obj();
        for (rail, v) in &now {
            if let Some((_, b)) = before.iter().find(|(r, _)| r == rail) {
                let mut figures = Json::obj();
                for (k, name) in verbs::DEVICE_COUNTERS.iter().enumerate() {
                    figures.set(name, v[k] - b[k]);
                }
                out.set(&rail.to_string(), figures);
            }
        }
        Some(out)
    }

    /// Send-queue slots the provider says the QPs `qps` still hold; None without the hook.
    fn provider_outstanding(&self, qps: &[usize]) -> Option<u64> {
        if !self.qp_outstanding {
            return None;
        }
        qps.iter()
            .filter(|i| self.qps[**i].live)
            .map(|i| verbs::qp_outstanding(self.qps[*i].ptr))
            .sum()
    }

    /// A round's drain record, counted from this engine's own state: WRs of its records without a
    /// completion and their bytes (or the send-queue slots the provider says its QPs still hold,
    /// when larger), the grants it still holds.
    fn drain_state(&self, wrs: &[Json], qps: &[usize], grants: usize) -> Json {
        let pending: Vec<&Json> = wrs
            .iter()
            .filter(|w| w.get("completed_seq").is_some_and(Json::is_null))
            .collect();
        let debt_bytes: i128 = pending
            .iter()
            .filter_map(|w| w.get("bytes").and_then(Json::as_int))
            .sum();
        let slots = self.provider_outstanding(qps);
        let debt_wrs = (pending.len() as u64).max(slots.unwrap_or(0));
        let mut drain = Json::obj()
            .with("drained", debt_wrs == 0 && debt_bytes == 0 && grants == 0)
            .with("debt_wrs", debt_wrs)
            .with("debt_bytes", debt_bytes)
            .with("debt_grants", grants);
        if let Some(slots) = slots {
            drain.set("provider_outstanding_wrs", slots);
        }
        drain
    }

    /// The public API's free() of a finished batch: BatchBusy while one of its WRs has no
    /// completion (by this engine's records, or a send-queue slot the provider says a QP still
    /// holds), else Ok.
    fn free_batch(&self, wrs: &[Json], qps: &[usize]) -> &'static str {
        let pending = wrs.iter().any(|w| w.get("completed_seq").is_some_and(Json::is_null));
        if pending || self.provider_outstanding(qps).unwrap_or(0) > 0 {
            "BatchBusy"
        } else {
            "Ok"
        }
    }

    fn provider_now(&self) -> BTreeMap<&'static str, i64> {
        if self.provider {
            verbs::provider_counters()
        } else {
            verbs::PROVIDER_COUNTERS.iter().map(|k| (*k, 0)).collect()
        }
    }

    fn qp_usage(&self, i: usize, created: bool, reused: bool) -> Json {
        let q = &self.qps[i];
        Json::obj()
            .with("qpn", q.qpn)
            .with("rail", q.rail)
            .with("lane", q.lane)
            .with("operation", self.case.operation.as_str())
            .with("created", created)
            .with("reused", reused)
            .with("wrs_posted", 0)
            .with("cqes", 0)
            .with("cqes_error", 0)
            .with("bytes_posted", 0)
            .with("bytes_completed", 0)
            .with("max_inflight_wrs", 0)
            .with("max_outstanding_parents", 0)
    }

    #[allow(clippy::too_many_arguments)]
    fn record_round(
        &mut self,
        rnd: &Round,
        batches: Json,
        parents: Vec<Json>,
        wrs: Vec<Json>,
        usage: Vec<Json>,
        public: Json,
        drain: Json,
        progress: Json,
    ) -> Json {
        let now_p = self.provider_now();
        let finished = now();
        let mut provider = Json::obj();
        for (k, v) in &now_p {
            provider.set(k, v - rnd.provider_before.get(k).copied().unwrap_or(0));
        }
        let reused = usage
            .iter()
            .filter(|u| u.get("reused") == Some(&Json::Bool(true)))
            .count();
        let native = self.native_counters(&rnd.native_before);
        let rendezvous = self.rv().counters(rnd.no);
        let device = self.device_counters(&rnd.device_before);
        let mut record = Json::obj()
            .with("round", rnd.no)
            .with("epoch", self.epoch)
            .with("peer_epoch", self.rv.as_ref().and_then(|r| r.peer_epoch))
            .with("input_seed", rnd.seed)
            .with("seed_origin", rnd.origin)
            .with("guard_seed", rnd.guard_seed)
            .with("started_at", rnd.started)
            .with("finished_at", finished)
            .with("duration_s", round6(finished - rnd.started))
            .with("batches", batches)
            .with("parents", Json::Arr(parents))
            .with("wrs", wr_columns(&wrs))
            .with("qp_usage", Json::Arr(usage))
            .with("qps_created", rnd.created.len())
            .with("qps_reused", reused)
            .with("counters", Json::obj().with("public", public).with("native", native))
            .with("drain", drain)
            .with("progress", progress)
            .with("rendezvous", rendezvous)
            .with("provider", provider);
        if let Some(device) = device {
            record.set("device", device);
        }
        record.set("errors", Json::Arr(Vec::new()));
        if let Some(Json::Arr(rounds)) = self.doc.get_mut("rounds") {
            rounds.push(record.clone());
        }
        record
    }

    fn new_progress(&self) -> Json {
        Json::obj()
            .with("mode", if self.case.rdma_events { "events" } else { "polling" })
            .with("poll_calls", 0)
            .with("empty_polls", 0)
            .with("cqes_polled", 0)
            .with("cq_events", 0)
            .with("cq_arms", 0)
    }

    // ------------------------------------------------------------------ requester

    pub fn run_requester(&mut self) -> Result<(), EngineError> {
        self.open()?;
        self.checkpoint();
        let peer = self.case.peer_address.clone().unwrap_or_default();
        let (host, port) =
            parse_address(&peer, "peer_address").map_err(|e| EngineError::new("InvalidArgument", "connect", &e.0))?;
        let stream = wire::connect(&host, port, self.case.connect_s)?;
        self.rv = Some(Rendezvous::new(stream, self.epoch)?);
        let hello = Json::obj()
            .with("protocol", crate::case::PROTOCOL)
            .with("role", "requester")
            .with("registration_id", self.case.registration_id.as_str())
            .with("generation", self.case.generation)
            .with("target_registration_id", self.case.peer_registration_id.clone())
            .with("profile", profile_key(&self.case));
        self.rv().send("HELLO", hello)?;
        let t = self.case.connect_s;
        let welcome = self.rv().recv(t, &["WELCOME"])?;
        let peer_epoch = welcome
            .get("epoch")
            .and_then(Json::as_int)
            .and_then(|e| u64::try_from(e).ok());
        self.rv().peer_epoch = peer_epoch;
        self.doc.set("peer_epoch", peer_epoch);
        if let Some(expected) = &self.case.peer_registration_id {
            let got = welcome
                .get("registration_id")
                .and_then(Json::as_str)
                .unwrap_or_default();
            if got != expected {
                return Err(unavailable(
                    "open_segment",
                    &format!("source announced registration '{got}', expected '{expected}'"),
                ));
            }
        }
        for seg in welcome
            .get("segments")
            .and_then(Json::as_arr)
            .cloned()
            .unwrap_or_default()
        {
            if let Some(r) = seg.get("rail").and_then(Json::as_int) {
                self.segments.insert(r as usize, seg);
            }
        }
        let mut live: BTreeMap<(usize, usize), usize> = BTreeMap::new();
        for round in 1..=ROUNDS {
            self.requester_round(round, &mut live)?;
            self.checkpoint();
        }
        self.rv().send("BYE", Json::obj())?;
        let t = self.case.round_s;
        self.rv().recv(t, &["BYE"])?;
        self.rv().close();
        self.teardown(0);
        Ok(())
    }

    /// QPs per enabled rail and lane, created in round 1 and reused afterwards.
    fn ensure_qps(
        &mut self,
        round: i64,
        live: &mut BTreeMap<(usize, usize), usize>,
    ) -> Result<BTreeSet<u32>, EngineError> {
        let depth = if self.defect("exceed_sq_depth") {
            SEND_QUEUE_DEPTH + 1
        } else {
            SEND_QUEUE_DEPTH
        };
        let mut created = Vec::new();
        for rail in self.enabled.clone() {
            for lane in 0..self.case.lanes {
                if let std::collections::btree_map::Entry::Vacant(slot) = live.entry((rail, lane)) {
                    let i = self.new_qp(rail, lane, round, depth)?;
                    slot.insert(i);
                    created.push(i);
                }
            }
        }
        if !created.is_empty() {
            let offers: Vec<Json> = created.iter().map(|i| self.qp_offer(*i)).collect();
            self.rv().send(
                "CONNECT_QPS",
                Json::obj()
                    .with("round", round)
                    .with("retire", Json::Arr(Vec::new()))
                    .with("qps", Json::Arr(offers)),
            )?;
            let t = self.case.connect_s;
            let reply = self.rv().recv(t, &["QPS_ACCEPTED"])?;
            for i in &created {
                let qpn = self.qps[*i].qpn;
                let peer = reply.get("peers").and_then(|p| p.get(&qpn.to_string())).cloned();
                let Some(peer) = peer else {
                    return Err(protocol("connect_qp", &format!("the source accepted no QP for {qpn}")).in_round(round));
                };
                self.connect_qp(*i, &peer, round)?;
            }
        }
        Ok(created.iter().map(|i| self.qps[*i].qpn).collect())
    }

    fn requester_round(&mut self, round: i64, live: &mut BTreeMap<(usize, usize), usize>) -> Result<(), EngineError> {
        self.round_no = round;
        let mut rnd = Round {
            no: round,
            started: now(),
            provider_before: self.provider_now(),
            device_before: self.device_snapshot(),
            ..Round::default()
        };
        let existing: BTreeSet<u32> = live.values().map(|i| self.qps[*i].qpn).collect();
        rnd.created = self.ensure_qps(round, live)?;
        let r = self.enabled.len();
        let placement: Vec<(usize, usize)> = (0..self.case.parents)
            .map(|p| (self.enabled[p % r], (p / r) % self.case.lanes))
            .collect();
        let sizes = slice_plan(self.case.payload, self.case.block);
        let parents_msg: Vec<Json> = placement
            .iter()
            .enumerate()
            .map(|(p, (rail, lane))| {
                Json::obj()
                    .with("parent", p)
                    .with("rail", *rail)
                    .with("lane", *lane)
                    .with("bytes", self.case.payload)
            })
            .collect();
        let t = self.case.round_s;
        let ready;
        if self.is_read() {
            rnd.guard_seed = self.poison_destination();
            self.rv().send(
                "ROUND_BEGIN",
                Json::obj().with("round", round).with("parents", Json::Arr(parents_msg)),
            )?;
            ready = self.rv().recv(t, &["ROUND_READY"])?;
            rnd.seed = ready
                .get("input_seed")
                .and_then(Json::as_int)
                .and_then(|s| u64::try_from(s).ok())
                .ok_or_else(|| protocol("submit", "ROUND_READY without a 64-bit input_seed").in_round(round))?;
            rnd.origin = "peer";
        } else {
            rnd.seed = self.local_input(round);
            rnd.origin = "local";
            self.rv().send(
                "ROUND_BEGIN",
                Json::obj()
                    .with("round", round)
                    .with("parents", Json::Arr(parents_msg))
                    .with("input_seed", rnd.seed),
            )?;
            ready = self.rv().recv(t, &["ROUND_READY"])?;
        }
        // The grants the source issued for this round: held until ROUND_DRAINED takes them back.
        let mut held_grants = int_list(&ready, "grants");
        let received: Vec<usize> = held_grants.iter().copied().collect();
        let prepared = now();
        rnd.native_before = self.native_snapshot();
        let mut parents: Vec<Json> = placement
            .iter()
            .enumerate()
            .map(|(p, (rail, lane))| {
                self.parent_entry(
                    p,
                    *rail,
                    *lane,
                    Some(self.qps[live[&(*rail, *lane)]].qpn),
                    self.case.payload,
                    Some(0),
                    sizes.len(),
                    "Pending",
                )
            })
            .collect();
        let (wrs, usage, progress, public) =
            self.transfer(round, &mut parents, &sizes, &placement, live, &rnd.created, &existing)?;
        let transferred = now();
        let failed = parents
            .iter()
            .any(|p| p.get("status").and_then(Json::as_str) == Some("Failed"));
        let qp_list: Vec<usize> = live.values().copied().collect();
        let batch = Json::obj()
            .with("batch", round)
            .with("parents", (0..self.case.parents).collect::<Vec<usize>>())
            .with("state", if failed { "Failed" } else { "Completed" })
            .with("free", self.free_batch(&wrs, &qp_list));
        if self.is_read() {
            let expected = RoundInput::new(rnd.seed, self.case.parents, self.case.payload);
            for p in parents.iter_mut() {
                self.check_parent(p, &expected, rnd.guard_seed.unwrap_or(0), "wait", round);
            }
        }
        if parents
            .iter()
            .any(|p| p.get("status").and_then(Json::as_str) != Some("Completed"))
        {
            self.checks_failed = true;
        }
        let checked = now();
        // Every grant goes back once the batch is freed; no byte figure travels (the source counts
        // what its own devices moved).
        let returned: Vec<usize> = held_grants.iter().copied().collect();
        self.rv().send(
            "ROUND_DONE",
            Json::obj().with("round", round).with("released", returned.clone()),
        )?;
        let drained = self.rv().recv(t, &["ROUND_DRAINED"])?;
        for p in int_list(&drained, "released") {
            held_grants.remove(&p);
        }
        let mut drain = self.drain_state(&wrs, &qp_list, held_grants.len());
        drain.set("grants_received", received);
        drain.set("grants_returned", returned);
        let mut record = self.record_round(
            &rnd,
            Json::Arr(vec![batch]),
            parents,
            wrs,
            usage,
            public,
            drain,
            progress,
        );
        let finished = record.get("finished_at").and_then(Json::as_f64).unwrap_or(checked);
        record.set(
            "timing",
            Json::obj()
                .with("prepare_s", round6(prepared - rnd.started))
                .with("transfer_s", round6(transferred - prepared))
                .with("check_s", round6(checked - transferred))
                .with("drain_s", round6(finished - checked)),
        );
        if let Some(Json::Arr(rounds)) = self.doc.get_mut("rounds") {
            rounds.pop();
            rounds.push(record);
        }
        Ok(())
    }

    /// Post every slice of every parent, interleaved per QP within its send-queue depth, and reap
    /// every completion (polling, or through the completion channels).
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn transfer(
        &mut self,
        round: i64,
        parents: &mut [Json],
        sizes: &[usize],
        placement: &[(usize, usize)],
        live: &BTreeMap<(usize, usize), usize>,
        created: &BTreeSet<u32>,
        existing: &BTreeSet<u32>,
    ) -> Result<(Vec<Json>, Vec<Json>, Json, Json), EngineError> {
        let qp_list: Vec<usize> = live.values().copied().collect();
        let mut queues: BTreeMap<usize, VecDeque<(usize, usize)>> =
            qp_list.iter().map(|i| (*i, VecDeque::new())).collect();
        for s in 0..sizes.len() {
            for (p, key) in placement.iter().enumerate() {
                queues.get_mut(&live[key]).expect("queue").push_back((p, s));
            }
        }
        let mut usage: BTreeMap<usize, Json> = qp_list
            .iter()
            .map(|i| {
                let qpn = self.qps[*i].qpn;
                (*i, self.qp_usage(*i, created.contains(&qpn), existing.contains(&qpn)))
            })
            .collect();
        let by_qpn: HashMap<u32, usize> = qp_list.iter().map(|i| (self.qps[*i].qpn, *i)).collect();
        let mut flight: HashMap<usize, BTreeMap<usize, u32>> = qp_list.iter().map(|i| (*i, BTreeMap::new())).collect();
        let mut remaining = vec![sizes.len(); parents.len()];
        let mut failed = BTreeSet::new();
        let mut public = self.new_public();
        let mut progress = self.new_progress();
        let mut wrs: Vec<Json> = Vec::new();
        let mut wr_index: HashMap<u64, usize> = HashMap::new();
        let mut offsets = vec![0usize; sizes.len()];
        for i in 1..sizes.len() {
            offsets[i] = offsets[i - 1] + sizes[i - 1];
        }
        let total = parents.len() * sizes.len();
        let last = sizes.len() - 1;
        let (mut done, mut empty_run) = (0usize, 0u32);
        let deadline = Instant::now() + std::time::Duration::from_secs_f64(self.case.round_s);
        let cqs: Vec<(usize, *mut c_void)> = self.enabled.iter().map(|r| (*r, self.contexts[*r].cq)).collect();
        let channels: Vec<(*mut c_void, i32)> = if self.case.rdma_events {
            self.enabled.iter().filter_map(|r| self.contexts[*r].channel).collect()
        } else {
            Vec::new()
        };
        let mut counts = [0u64; 5]; // poll_calls, empty_polls, cqes_polled, cq_events, cq_arms
        let mut armed = false;
        if self.case.rdma_events {
            // Armed before the first post, so the first completion signals its channel.
            armed = self.wait_events(&cqs, &channels, &mut counts, deadline, false)?;
        }
        let read = self.is_read();
        let mut batch = Vec::new();
        while done < total {
            for i in &qp_list {
                let queue = queues.get_mut(i).expect("queue");
                while let Some(&(p, s)) = queue.front() {
                    let q = &self.qps[*i];
                    if q.outstanding >= q.max_send_wr {
                        break;
                    }
                    queue.pop_front();
                    let (rail, sq, qpn, lane) = (q.rail, q.sq, q.qpn, q.lane);
                    let c = &self.contexts[rail];
                    let mr = &c.mrs[0];
                    let seg = &self.segments[&rail];
                    let raddr = seg.get("data_addr").and_then(Json::as_int).unwrap_or(0) as u64;
                    let rkey = seg.get("data_rkey").and_then(Json::as_int).unwrap_or(0) as u32;
                    let local = content::region_offset(p, self.case.payload) + offsets[s];
                    self.next_wr_id += 1;
                    let wr_id = self.next_wr_id;
                    let ret = verbs::post(
                        sq,
                        wr_id,
                        read,
                        mr.addr + local as u64,
                        sizes[s] as u32,
                        mr.lkey,
                        raddr + local as u64,
                        rkey,
                    );
                    if ret != 0 {
                        let mut e = EngineError::new(
                            "Internal",
                            "submit",
                            &verbs::verr(verbs::POST_CALL, ret, &format!("QP {qpn} wr_id {wr_id}")),
                        )
                        .in_round(round);
                        e.parent = Some(p);
                        return Err(e);
                    }
                    let (ctx_h, cq_h) = (verbs::handle(c.ptr), verbs::handle(c.cq));
                    self.contexts[rail].native[1] += 1;
                    let q = &mut self.qps[*i];
                    q.outstanding += 1;
                    let inflight = q.outstanding;
                    wr_index.insert(wr_id, wrs.len());
                    wrs.push(
                        Json::obj()
                            .with("wr_id", wr_id)
                            .with("parent", p)
                            .with("slice", s)
                            .with("rail", rail)
                            .with("lane", lane)
                            .with("qpn", qpn)
                            .with("context", ctx_h)
                            .with("cq", cq_h)
                            .with("opcode", if read { "RDMA_READ" } else { "RDMA_WRITE" })
                            .with("bytes", sizes[s])
                            .with("local_offset", local)
                            .with("remote_offset", local)
                            .with("status", "PENDING")
                            .with("posted_seq", self.seq)
                            .with("completed_seq", Json::Null),
                    );
                    self.seq += 1;
                    let f = flight.get_mut(i).expect("flight");
                    *f.entry(p).or_insert(0) += 1;
                    let outstanding_parents = f.len();
                    let u = usage.get_mut(i).expect("usage");
                    bump(u, "wrs_posted", 1);
                    bump(u, "bytes_posted", sizes[s] as i128);
                    maxed(u, "max_inflight_wrs", i128::from(inflight));
                    maxed(u, "max_outstanding_parents", outstanding_parents as i128);
                }
            }
            let mut got = 0;
            for (rail, cq) in &cqs {
                counts[0] += 1;
                batch.clear();
                let n = verbs::poll(*cq, &mut batch)
                    .map_err(|m| EngineError::new("Internal", "wait", &m).in_round(round))?;
                self.contexts[*rail].native[2] += n as u64;
                for wc in &batch {
                    if wc.status == 0 {
                        self.contexts[*rail].native[0] += u64::from(wc.byte_len);
                    }
                }
                got += n;
                for wc in std::mem::take(&mut batch) {
                    let Some(&w) = wr_index.get(&wc.wr_id) else {
                        return Err(EngineError::new(
                            "Internal",
                            "wait",
                            &format!(
                                "completion of wr_id {} on QP {}: not a WR this round posted",
                                wc.wr_id, wc.qpn
                            ),
                        )
                        .in_round(round));
                    };
                    let Some(&i) = by_qpn.get(&wc.qpn) else {
                        return Err(EngineError::new(
                            "Internal",
                            "wait",
                            &format!("completion on unknown QP {}", wc.qpn),
                        )
                        .in_round(round));
                    };
                    self.qps[i].outstanding -= 1;
                    let rec = &mut wrs[w];
                    rec.set("status", verbs::status_name(wc.status));
                    rec.set("completed_seq", self.seq);
                    self.seq += 1;
                    let pid = rec.get("parent").and_then(Json::as_int).unwrap_or(0) as usize;
                    let slice = rec.get("slice").and_then(Json::as_int).unwrap_or(0) as usize;
                    let f = flight.get_mut(&i).expect("flight");
                    if let Some(c) = f.get_mut(&pid) {
                        *c -= 1;
                        if *c == 0 {
                            f.remove(&pid);
                        }
                    }
                    let u = usage.get_mut(&i).expect("usage");
                    bump(u, "cqes", 1);
                    if wc.status == 0 {
                        bump(u, "bytes_completed", i128::from(wc.byte_len));
                        bump(&mut parents[pid], "completed_bytes", i128::from(wc.byte_len));
                        if pid == 0 && read {
                            self.spoil_landed(slice == 0, slice == last);
                        }
                    } else {
                        bump(u, "cqes_error", 1);
                        failed.insert(pid);
                    }
                    remaining[pid] -= 1;
                    if remaining[pid] == 0 && !failed.contains(&pid) {
                        // The public API reports a parent's bytes once the whole parent completed.
                        parents[pid].set("status", "Completed");
                        let b = parents[pid].get("completed_bytes").and_then(Json::as_int).unwrap_or(0) as u64;
                        public.0 += b;
                        *public.1.entry(placement[pid].0).or_insert(0) += b;
                    }
                }
            }
            counts[2] += got as u64;
            done += got;
            if got > 0 {
                empty_run = 0;
                armed = false;
                continue;
            }
            counts[1] += 1;
            if Instant::now() > deadline {
                let mut e = EngineError::new(
                    "Timeout",
                    "wait",
                    &format!("{} of {total} WRs without completion", total - done),
                )
                .in_round(round);
                e.remote_effect = "Unknown";
                e.locally_drained = Some(false);
                e.wrs_posted = wrs.len() as u64;
                return Err(e);
            }
            if self.case.rdma_events {
                armed = self.wait_events(&cqs, &channels, &mut counts, deadline, armed)?;
            } else {
                empty_run += 1;
                if empty_run > SPIN_EMPTY_POLLS {
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
            }
        }
        if self.case.rdma_events && counts[4] > 0 && counts[3] == 0 {
            // The last completions were reaped right after arming: their event still signals the
            // armed channel; consume and acknowledge it so it is this round's.
            self.consume_events(&cqs, &channels, &mut counts, EVENT_GRACE_MS);
        }
        for pid in &failed {
            parents[*pid].set("status", "Failed");
        }
        for (k, name) in ["poll_calls", "empty_polls", "cqes_polled", "cq_events", "cq_arms"]
            .iter()
            .enumerate()
        {
            progress.set(name, counts[k]);
        }
        Ok((wrs, usage.into_values().collect(), progress, Self::public_json(&public)))
    }

    fn wait_events(
        &mut self,
        cqs: &[(usize, *mut c_void)],
        channels: &[(*mut c_void, i32)],
        counts: &mut [u64; 5],
        deadline: Instant,
        armed: bool,
    ) -> Result<bool, EngineError> {
        if !armed {
            for (_, cq) in cqs {
                verbs::req_notify(*cq).map_err(|m| EngineError::new("Internal", "wait", &m))?;
                counts[4] += 1;
            }
            return Ok(true);
        }
        let left = deadline.saturating_duration_since(Instant::now()).as_millis().min(1000) as i32;
        self.consume_events(cqs, channels, counts, left);
        Ok(false)
    }

    fn consume_events(
        &mut self,
        cqs: &[(usize, *mut c_void)],
        channels: &[(*mut c_void, i32)],
        counts: &mut [u64; 5],
        timeout_ms: i32,
    ) {
        let fds: Vec<i32> = channels.iter().map(|c| c.1).collect();
        let ready = verbs::wait_readable(&fds, timeout_ms);
        for (k, (ch, fd)) in channels.iter().enumerate() {
            if ready & (1 << k) == 0 {
                continue;
            }
            while verbs::wait_readable(&[*fd], 0) != 0 {
                match verbs::get_cq_event(*ch) {
                    Ok(cq) => {
                        counts[3] += 1;
                        if cqs.iter().any(|(_, c)| *c == cq) {
                            verbs::ack_cq_events(cq, 1);
                        }
                    }
                    Err(_) => break,
                }
            }
        }
    }

    // ------------------------------------------------------------------ source

    pub fn run_source(&mut self) -> Result<(), EngineError> {
        self.open()?;
        let service = self.case.service_address.clone().unwrap_or_default();
        let (host, port) = parse_address(&service, "service_address")
            .map_err(|e| EngineError::new("InvalidArgument", "accept", &e.0))?;
        let listener = TcpListener::bind((host.as_str(), port))
            .map_err(|e| unavailable("open_segment", &format!("cannot listen on {service}: {e}")))?;
        let bound = listener
            .local_addr()
            .map_err(|e| EngineError::new("Internal", "accept", &e.to_string()))?;
        let service = format_address(&host, bound.port());
        self.doc.set("service_address", service.as_str());
        self.checkpoint();
        let ready = Json::obj()
            .with("schema", "orbite.runner-ready")
            .with("version", 1)
            .with("protocol", crate::case::PROTOCOL)
            .with("pid", std::process::id())
            .with("role", "source")
            .with("generation", self.case.generation)
            .with("epoch", self.epoch)
            .with("registration_id", self.case.registration_id.as_str())
            .with("service_address", service.as_str());
        write_atomic(&self.out.join("ready.json"), &ready.to_text())
            .map_err(|e| EngineError::new("Internal", "accept", &format!("ready.json: {e}")))?;
        println!("orbite-runner: ready {service}");
        let stream = wire::accept(&listener, self.case.connect_s)?;
        drop(listener);
        self.rv = Some(Rendezvous::new(stream, self.epoch)?);
        self.accept_segment()?;
        let debt = self.serve()?;
        self.rv().close();
        self.teardown(debt);
        Ok(())
    }

    fn refuse(&mut self, error: &str, message: &str) -> EngineError {
        let _ = self.rv().send(
            "ERROR",
            Json::obj()
                .with("error", error)
                .with("operation", "open_segment")
                .with("message", message),
        );
        EngineError::new(error, "open_segment", message)
    }

    fn accept_segment(&mut self) -> Result<(), EngineError> {
        let t = self.case.connect_s;
        let hello = self.rv().recv(t, &["HELLO"])?;
        let peer_epoch = hello
            .get("epoch")
            .and_then(Json::as_int)
            .and_then(|e| u64::try_from(e).ok());
        self.rv().peer_epoch = peer_epoch;
        self.doc.set("peer_epoch", peer_epoch);
        if hello.get("protocol").and_then(Json::as_str) != Some(crate::case::PROTOCOL) {
            let got = hello.get("protocol").map(Json::to_text).unwrap_or_default();
            return Err(self.refuse("ProtocolError", &format!("peer protocol {got}")));
        }
        let mine = profile_key(&self.case);
        if hello.get("profile") != Some(&mine) {
            let got = hello.get("profile").map(Json::to_text).unwrap_or_default();
            return Err(self.refuse(
                "ProtocolError",
                &format!("peer profile {got} differs from {}", mine.to_text()),
            ));
        }
        if let Some(target) = hello.get("target_registration_id").and_then(Json::as_str) {
            if target != self.case.registration_id {
                let msg = format!(
                    "peer asked for registration '{target}', this engine is '{}'",
                    self.case.registration_id
                );
                return Err(self.refuse("Unavailable", &msg));
            }
        }
        if self.case.peer_registration_id.is_none() {
            self.doc.set(
                "peer_registration_id",
                hello.get("registration_id").cloned().unwrap_or(Json::Null),
            );
        }
        let segments: Vec<Json> = RAILS.iter().map(|r| self.segment(*r)).collect();
        let welcome = Json::obj()
            .with("registration_id", self.case.registration_id.as_str())
            .with("segments", Json::Arr(segments));
        self.rv().send("WELCOME", welcome)
    }

    /// Serve CONNECT_QPS / ROUND_BEGIN / ROUND_DONE until BYE; returns the grants still out.
    fn serve(&mut self) -> Result<u64, EngineError> {
        let mut by_peer: BTreeMap<(usize, usize), usize> = BTreeMap::new();
        let mut grants: BTreeSet<usize> = BTreeSet::new();
        let mut rnd = Round {
            no: 1,
            provider_before: self.provider_now(),
            device_before: self.device_snapshot(),
            ..Round::default()
        };
        let t = self.case.round_s;
        loop {
            let msg = self
                .rv()
                .recv(t, &["CONNECT_QPS", "ROUND_BEGIN", "ROUND_DONE", "BYE"])?;
            match msg.get("kind").and_then(Json::as_str).unwrap_or_default() {
                "CONNECT_QPS" => {
                    let mut peers = Json::obj();
                    for item in msg.get("qps").and_then(Json::as_arr).cloned().unwrap_or_default() {
                        let rail = item.get("rail").and_then(Json::as_int).unwrap_or(-1);
                        let lane = item.get("lane").and_then(Json::as_int).unwrap_or(-1);
                        let op = item.get("operation").and_then(Json::as_str).unwrap_or_default();
                        if !(0..2).contains(&rail) || lane < 0 || op != self.case.operation {
                            return Err(protocol(
                                "connect_qp",
                                &format!("QP request {} does not fit this engine", item.to_text()),
                            ));
                        }
                        let i = self.new_qp(rail as usize, lane as usize, rnd.no, SEND_QUEUE_DEPTH)?;
                        // To RTS before the answer: the requester may post at once.
                        self.connect_qp(i, &item, rnd.no)?;
                        by_peer.insert((rail as usize, lane as usize), i);
                        rnd.created.insert(self.qps[i].qpn);
                        let peer_qpn = item.get("qpn").map(Json::to_text).unwrap_or_default();
                        peers.set(&peer_qpn, self.qp_offer(i));
                    }
                    let r = msg.get("round").cloned().unwrap_or(Json::Null);
                    self.rv()
                        .send("QPS_ACCEPTED", Json::obj().with("round", r).with("peers", peers))?;
                }
                "ROUND_BEGIN" => {
                    let round = msg.get("round").and_then(Json::as_int).unwrap_or(-1) as i64;
                    if round != rnd.no {
                        return Err(protocol(
                            "submit",
                            &format!("round {round} after round {}", self.round_no),
                        ));
                    }
                    self.round_no = round;
                    rnd.started = now();
                    rnd.native_before = self.native_snapshot();
                    rnd.placement = msg
                        .get("parents")
                        .and_then(Json::as_arr)
                        .map(|a| {
                            a.iter()
                                .map(|p| {
                                    let f = |k| p.get(k).and_then(Json::as_int).unwrap_or(0) as usize;
                                    (f("parent"), f("rail"), f("lane"))
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    if self.is_read() {
                        rnd.seed = self.local_input(round);
                        rnd.origin = "local";
                    } else {
                        rnd.guard_seed = self.poison_destination();
                        rnd.seed = msg
                            .get("input_seed")
                            .and_then(Json::as_int)
                            .and_then(|s| u64::try_from(s).ok())
                            .ok_or_else(|| {
                                protocol("submit", "ROUND_BEGIN without a 64-bit input_seed").in_round(round)
                            })?;
                        rnd.origin = "peer";
                    }
                    grants = rnd.placement.iter().map(|p| p.0).collect();
                    rnd.issued = grants.iter().copied().collect();
                    self.rv().send(
                        "ROUND_READY",
                        Json::obj()
                            .with("round", round)
                            .with("input_seed", rnd.seed)
                            .with("grants", rnd.issued.clone()),
                    )?;
                }
                "ROUND_DONE" => {
                    let round = msg.get("round").and_then(Json::as_int).unwrap_or(-1) as i64;
                    if round != self.round_no {
                        return Err(protocol(
                            "drain",
                            &format!("ROUND_DONE for round {round} during round {}", self.round_no),
                        ));
                    }
                    self.source_finish_round(&msg, &rnd, &by_peer, &mut grants)?;
                    // Before the next ROUND_READY: nothing the provider moves is lost.
                    rnd = Round {
                        no: self.round_no + 1,
                        provider_before: self.provider_now(),
                        device_before: self.device_snapshot(),
                        ..Round::default()
                    };
                    self.checkpoint();
                }
                _ => {
                    self.rv().send("BYE", Json::obj())?;
                    return Ok(0);
                }
            }
        }
    }

    fn source_finish_round(
        &mut self,
        msg: &Json,
        rnd: &Round,
        by_peer: &BTreeMap<(usize, usize), usize>,
        grants: &mut BTreeSet<usize>,
    ) -> Result<(), EngineError> {
        let round = rnd.no;
        let expected = if self.is_read() {
            None
        } else {
            Some(RoundInput::new(rnd.seed, self.case.parents, self.case.payload))
        };
        if expected.is_some() {
            self.spoil_landed(true, true);
        }
        // One-sided operations leave no trace in this engine's verbs calls and the requester's word
        // is not this engine's to repeat: a parent's bytes are not known here (completed_bytes
        // null); what this side's devices served or received per rail is the provider's own
        // per-context count (the round's `device`), and the public counters are that.
        let mut parents = Vec::new();
        for (pid, rail, lane) in &rnd.placement {
            let qpn = by_peer.get(&(*rail, *lane)).map(|i| self.qps[*i].qpn);
            let mut entry = self.parent_entry(*pid, *rail, *lane, qpn, self.case.payload, None, 0, "Granted");
            if let Some(exp) = &expected {
                if self.check_parent(&mut entry, exp, rnd.guard_seed.unwrap_or(0), "drain", round) {
                    self.checks_failed = true;
                }
            }
            parents.push(entry);
        }
        let released: BTreeSet<usize> = int_list(msg, "released").intersection(grants).copied().collect();
        for p in &released {
            grants.remove(p);
        }
        for entry in parents.iter_mut() {
            let pid = entry.get("parent").and_then(Json::as_int).unwrap_or(0) as usize;
            if entry.get("status").and_then(Json::as_str) == Some("Granted") && released.contains(&pid) {
                entry.set("status", "Released");
            }
        }
        let mut public = self.new_public();
        let moved = if self.is_read() {
            "read_bytes_served"
        } else {
            "write_bytes_landed"
        };
        // Without the provider's per-context counters (rdma-core) this side counts nothing: its
        // public counters stay 0 and the round has no `device` (docs/runner-contract.md section 9).
        if let Some(device) = self.device_counters(&rnd.device_before) {
            for rail in self.enabled.clone() {
                let b = device
                    .get(&rail.to_string())
                    .and_then(|d| d.get(moved))
                    .and_then(Json::as_int)
                    .unwrap_or(0) as u64;
                public.0 += b;
                *public.1.entry(rail).or_insert(0) += b;
            }
        }
        let debt = grants.len();
        // This engine posts no WR: its WR debt is what the provider says its QPs still hold.
        let qp_list: Vec<usize> = by_peer.values().copied().collect();
        let mut drain = self.drain_state(&[], &qp_list, debt);
        let drained = drain.get("drained").cloned().unwrap_or(Json::Bool(false));
        drain.set("grants_issued", rnd.issued.clone());
        drain.set("grants_released", released.iter().copied().collect::<Vec<usize>>());
        self.rv().send(
            "ROUND_DRAINED",
            Json::obj()
                .with("round", round)
                .with("drained", drained)
                .with("debt_grants", debt)
                .with("released", released.iter().copied().collect::<Vec<usize>>()),
        )?;
        let usage: Vec<Json> = by_peer
            .values()
            .map(|i| {
                let created = rnd.created.contains(&self.qps[*i].qpn);
                self.qp_usage(*i, created, !created)
            })
            .collect();
        let progress = self.new_progress();
        self.record_round(
            rnd,
            Json::Arr(Vec::new()),
            parents,
            Vec::new(),
            usage,
            Self::public_json(&public),
            drain,
            progress,
        );
        Ok(())
    }

    // ------------------------------------------------------------------ end

    /// Destroy everything this engine holds and record what was released and what stayed.
    pub fn teardown(&mut self, debt_grants: u64) {
        if !self.doc.get("teardown").is_none_or(Json::is_null) {
            return;
        }
        let mut errors = Vec::new();
        let (mut qps, mut mrs, mut ctxs) = (0u64, 0u64, 0u64);
        let mut attempt = |table: &mut Table, kind: &str, p: *mut c_void| match verbs::destroy(table, kind, p) {
            Ok(()) => true,
            Err(m) => {
                errors.push(EngineError::new("Unquiesced", "close", &m).to_json());
                false
            }
        };
        for q in self.qps.iter_mut().filter(|q| q.live) {
            if attempt(&mut self.table, "qp", q.ptr) {
                q.live = false;
                q.record.set("destroyed_round", "teardown");
                q.record.set("state", "DESTROYED");
                qps += 1;
            }
        }
        for c in self.contexts.iter_mut() {
            for m in c.mrs.iter_mut().filter(|m| m.live) {
                if attempt(&mut self.table, "mr", m.ptr) {
                    m.live = false;
                    mrs += 1;
                }
            }
            if c.live[1] && attempt(&mut self.table, "cq", c.cq) {
                c.live[1] = false;
            }
            if let Some((ch, _)) = c.channel {
                if c.live[2] && attempt(&mut self.table, "channel", ch) {
                    c.live[2] = false;
                }
            }
            if c.live[0] && attempt(&mut self.table, "pd", c.pd) {
                c.live[0] = false;
            }
            if c.live[3] && attempt(&mut self.table, "ctx", c.ptr) {
                c.live[3] = false;
                ctxs += 1;
            }
        }
        let retained = self.table.live_count();
        let held = if self.provider {
            let h = verbs::provider_held();
            let sum: i64 = h.values().sum();
            if sum != retained as i64 {
                errors.push(
                    EngineError::new(
                        "Internal",
                        "close",
                        &format!("the resource table holds {retained} owner(s), the verbs provider {h:?}"),
                    )
                    .to_json(),
                );
            }
            let mut j = Json::obj();
            for (k, v) in h {
                j.set(k, v);
            }
            j
        } else {
            Json::Null
        };
        if retained > 0 {
            self.checks_failed = true;
        }
        let record = Json::obj()
            .with("drained", debt_grants == 0)
            .with("debt_wrs", 0)
            .with("debt_bytes", 0)
            .with("debt_grants", debt_grants)
            .with("qps_destroyed", qps)
            .with("mrs_deregistered", mrs)
            .with("contexts_closed", ctxs)
            .with("retained_owners", retained)
            .with("provider_held", held)
            .with("errors", Json::Arr(errors));
        self.doc.set("teardown", record);
    }

    /// After a failure: close the rendezvous and release what is still held.
    pub fn abort(&mut self) {
        if let Some(rv) = self.rv.as_mut() {
            rv.close();
        }
        self.teardown(0);
    }

    pub fn totals(&mut self) {
        self.render();
        let rounds = self
            .doc
            .get("rounds")
            .and_then(Json::as_arr)
            .cloned()
            .unwrap_or_default();
        let sum = |path: &[&str]| -> i128 {
            rounds
                .iter()
                .map(|r| {
                    path.iter()
                        .try_fold(r, |v, k| v.get(k))
                        .and_then(Json::as_int)
                        .unwrap_or(0)
                })
                .sum()
        };
        let persistent = self.contexts.iter().map(|c| c.mrs.len()).sum::<usize>();
        let mut provider = Json::obj();
        for k in verbs::PROVIDER_COUNTERS {
            provider.set(k, sum(&["provider", k]));
        }
        let totals = Json::obj()
            .with("rounds_completed", rounds.len())
            .with("wrs_posted", sum(&["counters", "native", "wrs"]))
            .with("cqes", sum(&["counters", "native", "cqes"]))
            .with("public_bytes", sum(&["counters", "public", "bytes"]))
            .with("native_bytes", sum(&["counters", "native", "bytes"]))
            .with("qps_created", self.qps.len())
            .with("persistent_mrs", persistent)
            .with("rendezvous_bytes_sent", sum(&["rendezvous", "bytes_sent"]))
            .with("rendezvous_bytes_received", sum(&["rendezvous", "bytes_received"]))
            .with("provider", provider);
        self.doc.set("totals", totals);
    }
}

fn bump(obj: &mut Json, key: &str, by: i128) {
    let v = obj.get(key).and_then(Json::as_int).unwrap_or(0);
    obj.set(key, v + by);
}

fn maxed(obj: &mut Json, key: &str, v: i128) {
    if obj.get(key).and_then(Json::as_int).unwrap_or(0) < v {
        obj.set(key, v);
    }
}

/// A separate engine asks for GID index 255 strictly; it must fail Unavailable and hold nothing.
fn strict_gid_request(root: &str, first: &RailInfo) -> Json {
    let mut table = Table::default();
    let mut result = "Ok";
    let mut error = Json::Null;
    match verbs::open_device(&mut table, &first.device) {
        Ok(ctx) => {
            if let Err(m) = sysfs::describe_rail(root, &first.device, first.port, 255) {
                result = "Unavailable";
                let mut e = unavailable("open_device", &m);
                e.expected = true;
                error = e.to_json();
            }
            let _ = verbs::destroy(&mut table, "ctx", ctx);
        }
        Err(m) => {
            result = "Unavailable";
            let mut e = unavailable("open_device", &m);
            e.expected = true;
            error = e.to_json();
        }
    }
    Json::obj()
        .with("device", first.device.as_str())
        .with("port", first.port)
        .with("gid_index", 255)
        .with("result", result)
        .with("error", error)
        .with("owners_acquired", table.acquired)
        .with("retained_owners", table.live_count())
}

//! The case file (docs/runner-contract.md section 2, schemas/runner-case.schema.json), validated
//! before anything is opened. Every broken rule is a `CaseError` naming the field, the value and
//! the rule (exit 2).

use crate::json::{self, Json};

pub const PROTOCOL: &str = "orbite-installed-host-v4";
/// Modes this runner implements; any other is a case error (exit 2, docs/runner-contract.md section 5).
pub const SUPPORTED_MODES: [&str; 2] = ["installed-host", "installed-rail-accounting"];
const OBSERVERS: [&str; 3] = ["accounting", "cq_fault", "uverbs_fault"];
/// Defects a test build (cargo feature `test-defects`) honours; the shipped build refuses any.
pub const DEFECTS: [&str; 4] = ["corrupt_byte", "overwrite_guard", "skip_guard_check", "exceed_sq_depth"];
const TOP_FIELDS: [&str; 20] = [
    "schema",
    "version",
    "protocol",
    "run_id",
    "role",
    "generation",
    "profile",
    "root",
    "rails",
    "discovery",
    "service_address",
    "peer_address",
    "registration_id",
    "peer_registration_id",
    "observers",
    "observer_log_dir",
    "seed",
    "timeouts",
    "defects",
    "verbs_library",
];
const MAX_PARENTS: i128 = 32;
const MAX_PAYLOAD: i128 = 32 << 20;
const MAX_LANES: i128 = 3;
// The gate's bound on payload WRs a round (the profile model's MAX_WRS_PER_ROUND, refused in the preflight),
// kept here as this runner's own.
const MAX_WRS_PER_ROUND: i128 = 32768;

#[derive(Debug)]
pub struct CaseError(pub String);

fn fail<T>(field: &str, value: Option<&Json>, rule: &str) -> Result<T, CaseError> {
    let shown = value.map_or("None".to_string(), Json::short);
    Err(CaseError(format!("case field {field} = {shown}: {rule}")))
}

#[derive(Clone, Debug)]
pub struct Rail {
    pub device: String,
    pub port: u32,
    pub gid_index: u32,
}

#[derive(Clone, Debug)]
pub struct Case {
    pub run_id: String,
    pub role: String,
    pub generation: u32,
    pub profile: Json,
    pub mode: String,
    pub operation: String,
    pub rdma_events: bool,
    pub parents: usize,
    pub payload: usize,
    pub block: usize,
    pub lanes: usize,
    pub mask: u32,
    pub root: String,
    pub rails: Option<Vec<Rail>>,
    pub discovery: Option<(Vec<String>, Vec<String>)>,
    pub service_address: Option<String>,
    pub peer_address: Option<String>,
    pub registration_id: String,
    pub peer_registration_id: Option<String>,
    pub seed: Option<u64>,
    pub connect_s: f64,
    pub round_s: f64,
    pub defects: Vec<String>,
    pub verbs_library: Option<(String, String)>,
}

fn int(obj: &Json, key: &str, path: &str, low: i128, high: i128) -> Result<i128, CaseError> {
    match obj.get(key) {
        None => fail(path, None, "is required"),
        Some(Json::Int(v)) => {
            if *v < low {
                fail(path, obj.get(key), &format!("must be >= {low}"))
            } else if *v > high {
                fail(path, obj.get(key), &format!("must be <= {high}"))
            } else {
                Ok(*v)
            }
        }
        Some(v) => fail(path, Some(v), "must be an integer"),
    }
}

fn string(obj: &Json, key: &str, path: &str, max_len: usize) -> Result<Option<String>, CaseError> {
    match obj.get(key) {
        None => Ok(None),
        Some(Json::Str(s)) if !s.is_empty() => {
            if s.chars().count() > max_len {
                fail(path, obj.get(key), &format!("must be at most {max_len} characters"))
            } else {
                Ok(Some(s.clone()))
            }
        }
        Some(v) => fail(path, Some(v), "must be a non-empty string"),
    }
}

fn required(obj: &Json, key: &str, path: &str, max_len: usize) -> Result<String, CaseError> {
    string(obj, key, path, max_len)?.map_or_else(|| fail(path, None, "is required"), Ok)
}

/// 'host:port' or '[v6]:port' -> (host, port)
pub fn parse_address(text: &str, path: &str) -> Result<(String, u16), CaseError> {
    let value = Json::Str(text.to_string());
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        match rest.split_once("]:") {
            Some(parts) => parts,
            None => return fail(path, Some(&value), "IPv6 addresses must be written '[addr]:port'"),
        }
    } else {
        match text.rsplit_once(':') {
            Some((h, _)) if h.contains(':') => {
                return fail(path, Some(&value), "IPv6 addresses must be written '[addr]:port'")
            }
            Some(parts) => parts,
            None => return fail(path, Some(&value), "must be 'host:port' (IPv6 as '[addr]:port')"),
        }
    };
    match port.parse::<u16>() {
        Ok(p) if !host.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => Ok((host.to_string(), p)),
        _ => fail(path, Some(&value), "must be 'host:port' with a port 0..65535"),
    }
}

pub fn format_address(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn name_list(raw: &Json, key: &str, allowed: &[&str]) -> Result<Vec<String>, CaseError> {
    let value = match raw.get(key) {
        None => return Ok(Vec::new()),
        Some(v) => v,
    };
    let items = match value.as_arr() {
        Some(a) => a,
        None => return fail(key, Some(value), "must be a list"),
    };
    let mut out: Vec<String> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        match item.as_str() {
            Some(name) if allowed.contains(&name) => {
                if out.iter().any(|n| n == name) {
                    return fail(key, Some(value), "must not repeat a name");
                }
                out.push(name.to_string());
            }
            _ => {
                return fail(
                    &format!("{key}[{i}]"),
                    Some(item),
                    &format!("must be one of {}", allowed.join(", ")),
                )
            }
        }
    }
    Ok(out)
}

pub fn load(path: &str) -> Result<Case, CaseError> {
    let text = std::fs::read(path).map_err(|e| CaseError(format!("case file '{path}': cannot be read ({e})")))?;
    let text = String::from_utf8(text).map_err(|_| CaseError(format!("case file '{path}': is not UTF-8")))?;
    let raw = json::parse(&text).map_err(|e| CaseError(format!("case file '{path}': is not valid JSON ({e})")))?;
    validate(&raw)
}

pub fn validate(raw: &Json) -> Result<Case, CaseError> {
    if !matches!(raw, Json::Obj(_)) {
        return fail("(top level)", Some(raw), "must be a JSON object");
    }
    let mut unknown: Vec<&str> = raw.keys().into_iter().filter(|k| !TOP_FIELDS.contains(k)).collect();
    unknown.sort_unstable();
    if let Some(k) = unknown.first() {
        return fail(
            k,
            raw.get(k),
            "is not a case field (see docs/runner-contract.md section 2)",
        );
    }
    if raw.get("schema").and_then(Json::as_str) != Some("orbite.runner-case") {
        return fail("schema", raw.get("schema"), "must be 'orbite.runner-case'");
    }
    if raw.get("version") != Some(&Json::Int(1)) {
        return fail("version", raw.get("version"), "must be 1");
    }
    if raw.get("protocol").and_then(Json::as_str) != Some(PROTOCOL) {
        return fail("protocol", raw.get("protocol"), &format!("must be '{PROTOCOL}'"));
    }
    let run_id = required(raw, "run_id", "run_id", usize::MAX)?;
    let role = match raw.get("role").and_then(Json::as_str) {
        Some(r @ ("source" | "requester")) => r.to_string(),
        _ => return fail("role", raw.get("role"), "must be 'source' or 'requester'"),
    };
    let generation = int(raw, "generation", "generation", 1, i128::from(u32::MAX))? as u32;
    let profile = raw.get("profile").cloned().unwrap_or(Json::Null);
    if !matches!(profile, Json::Obj(_)) {
        return fail("profile", Some(&profile), "must be an object (the validated profile)");
    }
    let mode = profile
        .get("mode")
        .and_then(Json::as_str)
        .unwrap_or_default()
        .to_string();
    if !SUPPORTED_MODES.contains(&mode.as_str()) {
        return fail(
            "profile.mode",
            profile.get("mode"),
            &format!("the reference runner supports {}", SUPPORTED_MODES.join(", ")),
        );
    }
    let operation = match profile.get("operation").and_then(Json::as_str) {
        Some(o @ ("read" | "write")) => o.to_string(),
        _ => {
            return fail(
                "profile.operation",
                profile.get("operation"),
                "must be 'read' or 'write'",
            )
        }
    };
    let rdma_events = match profile.get("rdma_events") {
        Some(Json::Bool(b)) => *b,
        v => return fail("profile.rdma_events", v, "must be a boolean"),
    };
    let parents = int(&profile, "parents", "profile.parents", 1, MAX_PARENTS)?;
    let payload = int(&profile, "payload", "profile.payload", 1, MAX_PAYLOAD)?;
    let block = int(&profile, "block", "profile.block", 1, i128::from(u32::MAX))?;
    let lanes = int(&profile, "num_lanes", "profile.num_lanes", 1, MAX_LANES)?;
    let mask = int(&profile, "mask", "profile.mask", 1, 3)?;
    let auto = match profile.get("discovery") {
        None => false,
        Some(Json::Str(s)) if s == "auto" => true,
        v => return fail("profile.discovery", v, "must be 'auto' when present"),
    };
    match profile.get("generations") {
        None | Some(Json::Int(1)) => {}
        v => return fail("profile.generations", v, &format!("must be 1 in mode {mode}")),
    }
    if generation != 1 {
        return fail(
            "generation",
            raw.get("generation"),
            "must be <= profile.generations (1)",
        );
    }
    let wrs = parents * ((payload + block - 1) / block);
    if wrs > MAX_WRS_PER_ROUND {
        return fail(
            "profile.block",
            profile.get("block"),
            &format!("gives {wrs} payload WRs per round; the reference runner allows at most {MAX_WRS_PER_ROUND}"),
        );
    }
    let root = match raw.get("root") {
        None => "/".to_string(),
        Some(Json::Str(s)) if s.starts_with('/') => s.clone(),
        v => return fail("root", v, "must be an absolute path"),
    };
    let (rails, discovery) = if auto {
        if raw.get("rails").is_some() {
            return fail(
                "rails",
                raw.get("rails"),
                "must be absent with profile.discovery 'auto' (no device pins)",
            );
        }
        (None, Some(validate_discovery(raw.get("discovery"))?))
    } else {
        if raw.get("discovery").is_some() {
            return fail(
                "discovery",
                raw.get("discovery"),
                "is only allowed with profile.discovery 'auto'",
            );
        }
        (Some(validate_rails(raw.get("rails"))?), None)
    };
    let (service_address, peer_address) = if role == "source" {
        let s = required(raw, "service_address", "service_address", usize::MAX)?;
        parse_address(&s, "service_address")?;
        (Some(s), None)
    } else {
        let p = required(raw, "peer_address", "peer_address", usize::MAX)?;
        if parse_address(&p, "peer_address")?.1 == 0 {
            return fail(
                "peer_address",
                raw.get("peer_address"),
                "must name the source's real port (not 0)",
            );
        }
        (None, Some(p))
    };
    let registration_id = required(raw, "registration_id", "registration_id", 128)?;
    let peer_registration_id = string(raw, "peer_registration_id", "peer_registration_id", 128)?;
    name_list(raw, "observers", &OBSERVERS)?;
    string(raw, "observer_log_dir", "observer_log_dir", usize::MAX)?;
    let seed = match raw.get("seed") {
        None | Some(Json::Null) => None,
        Some(_) => Some(int(raw, "seed", "seed", 0, i128::from(u64::MAX))? as u64),
    };
    let (connect_s, round_s) = validate_timeouts(raw.get("timeouts"))?;
    let defects = name_list(raw, "defects", &DEFECTS)?;
    if !defects.is_empty() && !cfg!(feature = "test-defects") {
        return fail(
            "defects",
            raw.get("defects"),
            "defect switches exist only in a test build of the reference runner (cargo feature test-defects)",
        );
    }
    let verbs_library = validate_verbs_library(raw.get("verbs_library"))?;
    Ok(Case {
        run_id,
        role,
        generation,
        mode,
        operation,
        rdma_events,
        parents: parents as usize,
        payload: payload as usize,
        block: block as usize,
        lanes: lanes as usize,
        mask: mask as u32,
        profile,
        root,
        rails,
        discovery,
        service_address,
        peer_address,
        registration_id,
        peer_registration_id,
        seed,
        connect_s,
        round_s,
        defects,
        verbs_library,
    })
}

fn validate_rails(rails: Option<&Json>) -> Result<Vec<Rail>, CaseError> {
    let items = match rails.and_then(Json::as_arr) {
        Some(a) if a.len() == 2 => a,
        _ => {
            return fail(
                "rails",
                rails,
                "must be a list of exactly 2 rails (index = rail number)",
            )
        }
    };
    let mut out = Vec::new();
    for (i, rail) in items.iter().enumerate() {
        let path = format!("rails[{i}]");
        if !matches!(rail, Json::Obj(_)) {
            return fail(&path, Some(rail), "must be an object with device, port, gid_index");
        }
        if let Some(k) = rail
            .keys()
            .into_iter()
            .find(|k| !["device", "port", "gid_index"].contains(k))
        {
            return fail(
                &format!("{path}.{k}"),
                rail.get(k),
                "is not a rail field (device, port, gid_index)",
            );
        }
        let device = required(rail, "device", &format!("{path}.device"), usize::MAX)?;
        if device.contains('/') || device == "." || device == ".." {
            return fail(
                &format!("{path}.device"),
                rail.get("device"),
                "must be a device name without '/'",
            );
        }
        out.push(Rail {
            device,
            port: int(rail, "port", &format!("{path}.port"), 1, 255)? as u32,
            gid_index: int(rail, "gid_index", &format!("{path}.gid_index"), 0, 255)? as u32,
        });
    }
    if out[0].device == out[1].device && out[0].port == out[1].port {
        return fail(
            "rails[1]",
            items.get(1),
            "must name a different RNIC port than rails[0]",
        );
    }
    Ok(out)
}

fn validate_discovery(disc: Option<&Json>) -> Result<(Vec<String>, Vec<String>), CaseError> {
    let disc = match disc {
        Some(d @ Json::Obj(_)) => d,
        v => return fail("discovery", v, "must be an object with whitelist and blacklist"),
    };
    if let Some(k) = disc
        .keys()
        .into_iter()
        .find(|k| !["whitelist", "blacklist"].contains(k))
    {
        return fail(
            &format!("discovery.{k}"),
            disc.get(k),
            "is not a discovery field (whitelist, blacklist)",
        );
    }
    let mut lists = Vec::new();
    for key in ["whitelist", "blacklist"] {
        let value = disc.get(key);
        let names: Option<Vec<String>> = value.and_then(Json::as_arr).and_then(|a| {
            a.iter()
                .map(|v| v.as_str().filter(|s| !s.is_empty()).map(str::to_string))
                .collect()
        });
        match names {
            Some(n) => lists.push(n),
            None => return fail(&format!("discovery.{key}"), value, "must be a list of device names"),
        }
    }
    let black = lists.pop().unwrap_or_default();
    let white = lists.pop().unwrap_or_default();
    Ok((white, black))
}

fn validate_timeouts(t: Option<&Json>) -> Result<(f64, f64), CaseError> {
    let (mut connect, mut round) = (30.0, 300.0);
    let t = match t {
        None => return Ok((connect, round)),
        Some(t @ Json::Obj(_)) => t,
        v => {
            return fail(
                "timeouts",
                v,
                "must be an object with connect_s, round_s and/or restart_s",
            )
        }
    };
    for key in t.keys() {
        let value = t.get(key);
        let secs = match value {
            Some(Json::Int(_) | Json::Float(_)) => value.and_then(Json::as_f64).unwrap_or(0.0),
            _ => 0.0,
        };
        if !["connect_s", "round_s", "restart_s"].contains(&key) {
            return fail(
                &format!("timeouts.{key}"),
                value,
                "is not a timeout (connect_s, round_s, restart_s)",
            );
        }
        if secs <= 0.0 || !secs.is_finite() {
            return fail(
                &format!("timeouts.{key}"),
                value,
                "must be a positive number of seconds",
            );
        }
        match key {
            "connect_s" => connect = secs,
            "round_s" => round = secs,
            _ => {}
        }
    }
    Ok((connect, round))
}

fn validate_verbs_library(spec: Option<&Json>) -> Result<Option<(String, String)>, CaseError> {
    let spec = match spec {
        None | Some(Json::Null) => return Ok(None),
        Some(s @ Json::Obj(_)) => s,
        v => return fail("verbs_library", v, "must be null or an object with path and sha256"),
    };
    if let Some(k) = spec.keys().into_iter().find(|k| !["path", "sha256"].contains(k)) {
        return fail(
            &format!("verbs_library.{k}"),
            spec.get(k),
            "is not a verbs_library field (path, sha256)",
        );
    }
    let path = match spec.get("path").and_then(Json::as_str) {
        Some(p) if p.starts_with('/') && !p.contains('\0') => p.to_string(),
        _ => return fail("verbs_library.path", spec.get("path"), "must be an absolute path"),
    };
    let sha = match spec.get("sha256").and_then(Json::as_str) {
        Some(s) if s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) => {
            s.to_string()
        }
        _ => {
            return fail(
                "verbs_library.sha256",
                spec.get("sha256"),
                "must be 64 lower-case hex digits (the library's sha256)",
            )
        }
    };
    Ok(Some((path, sha)))
}

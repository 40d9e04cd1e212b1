//! RNICs read from a host root (the real `/` or a fake host) and `discovery: auto`
//! (docs/runner-contract.md section 6). A missing file reads as None.

use crate::json::Json;
use std::fs;

const IB: &str = "sys/class/infiniband";
const ZERO_GID: &str = "0000:0000:0000:0000:0000:0000:0000:0000";

fn join(root: &str, rel: &str) -> String {
    format!("{}/{}", root.trim_end_matches('/'), rel)
}

pub fn read_text(root: &str, rel: &str) -> Option<String> {
    fs::read(join(root, rel))
        .ok()
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
}

fn list(root: &str, rel: &str) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(join(root, rel))
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

pub fn devices(root: &str) -> Vec<String> {
    list(root, IB)
}

fn ports(root: &str, device: &str) -> Vec<u32> {
    let mut p: Vec<u32> = list(root, &format!("{IB}/{device}/ports"))
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect();
    p.sort_unstable();
    p
}

fn port_state(root: &str, device: &str, port: u32) -> (Option<String>, Option<String>) {
    let state = read_text(root, &format!("{IB}/{device}/ports/{port}/state"))
        .map(|s| s.split_once(':').map_or(s.clone(), |(_, b)| b.trim().to_string()));
    (
        state,
        read_text(root, &format!("{IB}/{device}/ports/{port}/link_layer")),
    )
}

pub struct GidEntry {
    pub gid: String,
    pub gid_type: Option<String>,
    pub netdev: Option<String>,
}

fn gid_entry(root: &str, device: &str, port: u32, index: u32) -> Option<GidEntry> {
    let base = format!("{IB}/{device}/ports/{port}");
    let gid = read_text(root, &format!("{base}/gids/{index}"))?;
    if gid.is_empty() || gid == ZERO_GID {
        return None;
    }
    let nonempty = |s: Option<String>| s.filter(|v| !v.is_empty());
    Some(GidEntry {
        gid,
        gid_type: nonempty(read_text(root, &format!("{base}/gid_attrs/types/{index}"))),
        netdev: nonempty(read_text(root, &format!("{base}/gid_attrs/ndevs/{index}"))),
    })
}

fn numa(root: &str, device: &str) -> Option<i64> {
    read_text(root, &format!("{IB}/{device}/device/numa_node"))
        .and_then(|t| t.parse::<i64>().ok())
        .filter(|v| *v >= 0)
}

fn numa_nodes(root: &str) -> Vec<i64> {
    let mut n: Vec<i64> = list(root, "sys/devices/system/node")
        .iter()
        .filter_map(|n| n.strip_prefix("node").and_then(|d| d.parse().ok()))
        .collect();
    n.sort_unstable();
    n
}

fn ipv4_mapped(gid: &str) -> bool {
    gid.to_ascii_lowercase().starts_with("0000:0000:0000:0000:0000:ffff:")
}

/// What a rail is, for the ledger's `rails` (and the GID's text for the QP's AV).
#[derive(Clone)]
pub struct RailInfo {
    pub device: String,
    pub port: u32,
    pub gid_index: u32,
    pub gid: String,
    pub gid_type: Option<String>,
    pub netdev: Option<String>,
    pub numa_node: Option<i64>,
}

impl RailInfo {
    pub fn nic_id(&self) -> String {
        format!("{}:{}", self.device, self.port)
    }
}

/// Err(message) = Unavailable.
pub fn describe_rail(root: &str, device: &str, port: u32, gid_index: u32) -> Result<RailInfo, String> {
    if !devices(root).iter().any(|d| d == device) {
        return Err(format!("{device}: no such RDMA device under {root}"));
    }
    if !ports(root, device).contains(&port) {
        return Err(format!("{device} port {port}: no such port"));
    }
    let (state, _) = port_state(root, device, port);
    if state.as_deref() != Some("ACTIVE") {
        return Err(format!(
            "{device} port {port}: state {}, not ACTIVE",
            Json::from(state).short()
        ));
    }
    let entry = gid_entry(root, device, port, gid_index)
        .ok_or_else(|| format!("{device} port {port}: GID index {gid_index} is not populated"))?;
    Ok(RailInfo {
        device: device.to_string(),
        port,
        gid_index,
        gid: entry.gid,
        gid_type: entry.gid_type,
        netdev: entry.netdev,
        numa_node: numa(root, device),
    })
}

pub fn host_identity(root: &str) -> (Option<String>, Option<String>) {
    (
        read_text(root, "proc/sys/kernel/hostname"),
        read_text(root, "proc/sys/kernel/random/boot_id"),
    )
}

/// The discovery record (without strict_gid_request) and the candidates in rail order.
pub fn discover(root: &str, white: &[String], black: &[String]) -> (Json, Vec<RailInfo>) {
    let seen = devices(root);
    let mut candidates = Vec::new();
    let mut rows = Vec::new();
    let mut excluded = Vec::new();
    for device in &seen {
        let exclude = |reason: &str| Json::obj().with("device", device.as_str()).with("reason", reason);
        if !white.is_empty() {
            if !white.contains(device) {
                excluded.push(exclude("not in whitelist"));
                continue;
            }
        } else if black.contains(device) {
            excluded.push(exclude("blacklisted"));
            continue;
        }
        let port = ports(root, device).into_iter().find(|p| {
            let (s, l) = port_state(root, device, *p);
            s.as_deref() == Some("ACTIVE") && l.as_deref() == Some("Ethernet")
        });
        let Some(port) = port else {
            excluded.push(exclude("no ACTIVE Ethernet port"));
            continue;
        };
        let count = list(root, &format!("{IB}/{device}/ports/{port}/gids"))
            .iter()
            .filter(|n| n.parse::<u32>().is_ok())
            .count();
        let mut best: Option<(u8, u32, GidEntry)> = None;
        for index in 0..count as u32 {
            if let Some(e) = gid_entry(root, device, port, index) {
                if e.gid_type.as_deref() == Some("RoCE v2") {
                    let rank = if ipv4_mapped(&e.gid) { 0 } else { 1 };
                    if best.as_ref().is_none_or(|b| (rank, index) < (b.0, b.1)) {
                        best = Some((rank, index, e));
                    }
                }
            }
        }
        let Some((_, index, e)) = best else {
            excluded.push(exclude("no RoCE v2 GID"));
            continue;
        };
        let info = RailInfo {
            device: device.clone(),
            port,
            gid_index: index,
            gid: e.gid,
            gid_type: e.gid_type,
            netdev: e.netdev,
            numa_node: numa(root, device),
        };
        rows.push(
            Json::obj()
                .with("device", device.as_str())
                .with("port", port)
                .with("state", "ACTIVE")
                .with("link_layer", "Ethernet")
                .with("gid_index", index)
                .with("gid", info.gid.as_str())
                .with("gid_type", info.gid_type.clone())
                .with("netdev", info.netdev.clone())
                .with("numa_node", info.numa_node)
                .with("nic_id", info.nic_id()),
        );
        candidates.push(info);
    }
    let chosen: Vec<String> = candidates.iter().map(RailInfo::nic_id).collect();
    let mut tiers = Vec::new();
    for node in numa_nodes(root) {
        let local: Vec<String> = candidates
            .iter()
            .filter(|c| c.numa_node == Some(node))
            .map(RailInfo::nic_id)
            .collect();
        let remote: Vec<String> = candidates
            .iter()
            .filter(|c| c.numa_node != Some(node))
            .map(RailInfo::nic_id)
            .collect();
        let t: Vec<Json> = [local, remote]
            .into_iter()
            .filter(|t| !t.is_empty())
            .map(Json::from)
            .collect();
        tiers.push(Json::obj().with("numa_node", node).with("tiers", Json::Arr(t)));
    }
    let record = Json::obj()
        .with("mode", "auto")
        .with("whitelist", white.to_vec())
        .with("blacklist", black.to_vec())
        .with("devices_seen", seen)
        .with("candidates", Json::Arr(rows))
        .with("excluded", Json::Arr(excluded))
        .with("chosen_nic_ids", chosen)
        .with("memory_tiers", Json::Arr(tiers));
    (record, candidates)
}

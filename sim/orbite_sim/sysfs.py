# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Read RNICs from a host root (real ``/`` or a fake host) and do ``discovery: auto``.

Paths follow the kernel's layout (docs/runner-contract.md section 6). A missing or unreadable file
reads as None; callers decide whether that makes a NIC unusable.
"""

import ipaddress
import os
import re

from .errors import unavailable

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
IB_CLASS = "sys/class/infiniband"


def read_text(root, rel):
    try:
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def host_identity(root):
    return {
        "hostname": read_text(root, "proc/sys/kernel/hostname"),
        "boot_id": read_text(root, "proc/sys/kernel/random/boot_id"),
    }


def list_devices(root):
    try:
        return sorted(os.listdir(os.path.join(root, IB_CLASS)))
    except OSError:
        return []


def list_ports(root, device):
    try:
        names = os.listdir(os.path.join(root, IB_CLASS, device, "ports"))
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def port_state(root, device, port):
    """('ACTIVE', 'Ethernet') from '4: ACTIVE' / 'Ethernet'; None parts when unreadable."""
    state = read_text(root, f"{IB_CLASS}/{device}/ports/{port}/state")
    if state is not None and ":" in state:
        state = state.split(":", 1)[1].strip()
    layer = read_text(root, f"{IB_CLASS}/{device}/ports/{port}/link_layer")
    return state, layer


def gid_entry(root, device, port, index):
    """{'gid', 'gid_type', 'netdev'} of a populated GID slot, None for an unused/missing slot."""
    base = f"{IB_CLASS}/{device}/ports/{port}"
    gid = read_text(root, f"{base}/gids/{index}")
    if not gid or gid == ZERO_GID:
        return None
    return {
        "gid": gid,
        "gid_type": read_text(root, f"{base}/gid_attrs/types/{index}") or None,
        "netdev": read_text(root, f"{base}/gid_attrs/ndevs/{index}") or None,
    }


def gid_count(root, device, port):
    try:
        names = os.listdir(os.path.join(root, IB_CLASS, device, "ports", str(port), "gids"))
    except OSError:
        return 0
    return len([n for n in names if n.isdigit()])


def device_numa(root, device):
    text = read_text(root, f"{IB_CLASS}/{device}/device/numa_node")
    try:
        value = int(text)
    except (TypeError, ValueError):
        return None
    return value if value >= 0 else None


def numa_nodes(root):
    try:
        names = os.listdir(os.path.join(root, "sys/devices/system/node"))
    except OSError:
        return []
    return sorted(int(m.group(1)) for m in (re.fullmatch(r"node(\d+)", n) for n in names) if m)


def is_ipv4_mapped(gid):
    try:
        address = ipaddress.IPv6Address(gid)
    except ValueError:
        return False
    return address.ipv4_mapped is not None


def nic_id(device, port):
    return f"{device}:{port}"


def describe_rail(root, device, port, gid_index):
    """Rail facts for a pinned (device, port, gid_index); Unavailable when it cannot be opened."""
    if device not in list_devices(root):
        raise unavailable("open_device", f"{device}: no such RDMA device under {root}")
    if port not in list_ports(root, device):
        raise unavailable("open_device", f"{device} port {port}: no such port")
    state, layer = port_state(root, device, port)
    if state != "ACTIVE":
        raise unavailable("open_device", f"{device} port {port}: state {state!r}, not ACTIVE")
    entry = gid_entry(root, device, port, gid_index)
    if entry is None:
        raise unavailable("open_device", f"{device} port {port}: GID index {gid_index} is not populated")
    return {
        "device": device,
        "port": port,
        "gid_index": gid_index,
        "gid": entry["gid"],
        "gid_type": entry["gid_type"],
        "netdev": entry["netdev"],
        "numa_node": device_numa(root, device),
        "link_layer": layer,
        "nic_id": nic_id(device, port),
    }


def _pick_roce_v2(root, device, port):
    """Lowest RoCE v2 GID index, IPv4-mapped ones first."""
    found = []
    for index in range(gid_count(root, device, port)):
        entry = gid_entry(root, device, port, index)
        if entry and entry["gid_type"] == "RoCE v2":
            found.append((0 if is_ipv4_mapped(entry["gid"]) else 1, index, entry))
    if not found:
        return None
    return min(found, key=lambda item: (item[0], item[1]))[1:]


def discover(root, whitelist, blacklist):
    """The NIC choice of docs/runner-contract.md section 6 (without the strict GID request)."""
    seen = list_devices(root)
    candidates, excluded = [], []
    for device in seen:
        if whitelist:
            if device not in whitelist:
                excluded.append({"device": device, "reason": "not in whitelist"})
                continue
        elif device in blacklist:
            excluded.append({"device": device, "reason": "blacklisted"})
            continue
        port_found = None
        for port in list_ports(root, device):
            state, layer = port_state(root, device, port)
            if state == "ACTIVE" and layer == "Ethernet":
                port_found = port
                break
        if port_found is None:
            excluded.append({"device": device, "reason": "no ACTIVE Ethernet port"})
            continue
        picked = _pick_roce_v2(root, device, port_found)
        if picked is None:
            excluded.append({"device": device, "reason": "no RoCE v2 GID"})
            continue
        index, entry = picked
        candidates.append({
            "device": device,
            "port": port_found,
            "state": "ACTIVE",
            "link_layer": "Ethernet",
            "gid_index": index,
            "gid": entry["gid"],
            "gid_type": entry["gid_type"],
            "netdev": entry["netdev"],
            "numa_node": device_numa(root, device),
            "nic_id": nic_id(device, port_found),
        })
    chosen = [c["nic_id"] for c in candidates]
    tiers = []
    for node in numa_nodes(root):
        local = [c["nic_id"] for c in candidates if c["numa_node"] == node]
        remote = [c["nic_id"] for c in candidates if c["numa_node"] != node]
        tiers.append({"numa_node": node, "tiers": [t for t in (local, remote) if t]})
    return {
        "mode": "auto",
        "whitelist": list(whitelist),
        "blacklist": list(blacklist),
        "devices_seen": seen,
        "candidates": candidates,
        "excluded": excluded,
        "chosen_nic_ids": chosen,
        "memory_tiers": tiers,
    }

# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""What the engine's automatic discovery must choose, computed from an inventory alone.

Stdlib only, no engine code. The rules (docs/inventory.md, "Auto-discovery expectations") model the
engine's CPU platform probe, topology and context address selection:

- available RNICs: devices with at least one ACTIVE port whose GID table is not empty;
- filter: a non-empty whitelist keeps only the listed devices and the blacklist is then ignored;
  otherwise blacklisted devices are removed. Candidates keep name order; NIC IDs are positions;
- per candidate: its active Ethernet ports and its RoCE v2 GID candidates on those ports,
  IPv4-mapped first (then the rest), each group in GID index order; the preferred GID is the first;
- memory priority tiers per NUMA node ``cpu:<N>``: a candidate on node N is tier 0, every other
  candidate tier 2; a candidate whose NUMA node is unknown is tier 2 on every node;
- strict GID pin: a pinned index is available only when every candidate has a used GID entry with
  that index on each of its active Ethernet ports; otherwise the engine must answer Unavailable.
"""

from ansible_collections.orbite.qualification.plugins.module_utils._common.numbers import ascii_int
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError
from ansible_collections.orbite.qualification.plugins.module_utils._inventory.compare import check_inventory

ACTIVE = 4
TIER_SAME_NODE = 0
TIER_OTHER = 2


class DiscoveryExpectError(OrbiteError):
    """Bad arguments (inventory, lists, pin) for the expectations."""

    code = "discovery.invalid"


def expectations(inventory, whitelist=None, blacklist=None, strict_gid_index=None):
    """The expected discovery result for ``inventory`` (see the module docstring for the rules)."""
    try:
        check_inventory(inventory, "inventory")
    except Exception as exc:
        raise DiscoveryExpectError(str(exc)) from None
    whitelist = _names(whitelist, "whitelist")
    blacklist = _names(blacklist, "blacklist")
    pin = _pin(strict_gid_index)
    devices = inventory.get("devices") or {}

    available, unavailable = [], {}
    for name in sorted(devices):
        reason = _unavailable_reason(devices[name])
        if reason:
            unavailable[name] = reason
        else:
            available.append(name)

    if whitelist:
        candidates = [n for n in available if n in whitelist]
        applied = "whitelist"
    elif blacklist:
        candidates = [n for n in available if n not in blacklist]
        applied = "blacklist"
    else:
        candidates = list(available)
        applied = "none"

    rnics = {name: _rnic(devices[name]) for name in candidates}
    result = {
        "available": available,
        "unavailable": unavailable,
        "filter": {
            "applied": applied,
            "whitelist": whitelist,
            "blacklist": blacklist,
            "blacklist_ignored": bool(whitelist and blacklist),
            "whitelist_missing": [n for n in whitelist if n not in available],
        },
        "candidates": candidates,
        "nic_ids": {name: i for i, name in enumerate(candidates)},
        "rnics": rnics,
        "memory_tiers": _tiers(inventory, candidates, devices),
        "strict_gid_pin": None,
    }
    if pin is not None:
        result["strict_gid_pin"] = _strict_pin(pin, rnics, devices)
    return result


def _names(value, field):
    if value is None or value == "":
        return []
    if isinstance(value, str):  # AWX surveys hand lists over as comma-separated text
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise DiscoveryExpectError(f"{field} {value!r}: expected a list of device names")
    return list(value)


def _pin(value):
    if value is None or value == "":
        return None
    index = value if isinstance(value, int) and not isinstance(value, bool) else ascii_int(value)
    if index is None:
        raise DiscoveryExpectError(f"strict_gid_index {value!r}: expected an integer 0..65535")
    if isinstance(value, bool) or not 0 <= index <= 65535:
        raise DiscoveryExpectError(f"strict_gid_index {value!r}: expected an integer 0..65535")
    return index


def _state(port):
    state = port.get("state") or {}
    return state.get("num")


def _unavailable_reason(dev):
    ports = dev.get("ports") or {}
    if not ports:
        return "no ports"
    if not any(_state(p) == ACTIVE and (p.get("gid_tbl_len") or 0) > 0 for p in ports.values()):
        return "no ACTIVE port with a GID table"
    return None


def _active_ethernet(dev):
    ports = dev.get("ports") or {}
    return [num for num, p in ports.items() if _state(p) == ACTIVE and p.get("link_layer") == "Ethernet"]


def _rnic(dev):
    ports = _active_ethernet(dev)
    mapped, other = [], []
    for num in ports:
        for entry in dev["ports"][num].get("gids") or []:
            if entry.get("type") != "RoCE v2":
                continue
            item = {"port": num, "index": entry["index"], "gid": entry["gid"], "ipv4": entry.get("ipv4")}
            (mapped if entry.get("ipv4") else other).append(item)
    candidates = mapped + other
    return {
        "numa_node": dev.get("numa_node"),
        "active_ethernet_ports": ports,
        "roce_v2_candidates": candidates,
        "ipv4_roce_v2": len(mapped),
        "preferred_gid": candidates[0] if candidates else None,
    }


def _tiers(inventory, candidates, devices):
    nodes = sorted(((inventory.get("node") or {}).get("numa_nodes") or {}), key=int)
    tiers = {}
    for node in nodes:
        tiers[f"cpu:{node}"] = {
            name: TIER_SAME_NODE
            if devices[name].get("numa_node") is not None and str(devices[name]["numa_node"]) == node
            else TIER_OTHER
            for name in candidates
        }
    return tiers


def _strict_pin(index, rnics, devices):
    per_rnic = {}
    for name, rnic in rnics.items():
        ports = rnic["active_ethernet_ports"]
        per_rnic[name] = bool(ports) and all(
            any(e.get("index") == index for e in devices[name]["ports"][p].get("gids") or []) for p in ports
        )
    available = bool(per_rnic) and all(per_rnic.values())
    return {
        "index": index,
        "per_rnic": per_rnic,
        "available": available,
        "expected": "ok" if available else "Unavailable",
    }

# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Discovery rules (discovery: auto): the engine's choices against the independent inventory.

The expectation is computed from the inventory read around the runner and the lists the gate
gives the engine: a whitelist of exactly the locked RNICs and the same blacklist (roles/runner,
whitelist precedence), the locked RNICs read from the supervisor's journal; the strict pin is the
documented GID index 255. The lists the engine echoes in its ledger are checked, never used.
"""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._common.numbers import ascii_int
from ansible_collections.orbite.qualification.plugins.module_utils._inventory.compare import diff_inventories
from ansible_collections.orbite.qualification.plugins.module_utils._inventory.discovery import (
    DiscoveryExpectError,
    expectations,
)
from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import applies, rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import ROLES, each_ledger


@applies("`discovery: auto`")
def auto_discovery(profile, _workload):
    return profile.get("discovery") == "auto"


def _inventory(case, role, generation, when="before"):
    return case.inventories[(role, generation, when)]


def locked_rnics(case, role):
    """The RNICs the role's supervisor locked (its journal): the gate's whitelist and blacklist."""
    events = case.journals[role].data["events"]
    for event in events:
        if event.get("ev") == "supervisor_start" and isinstance(event.get("locks"), list):
            return list(event["locks"])
    return [e.get("rnic") for e in events if e.get("ev") == "lock_acquire"]


def _expected_discovery(case, role, generation):
    memo = ("discovery.expected", role, generation)
    if memo not in case.memo:
        locks = locked_rnics(case, role)
        case.memo[memo] = expectations(_inventory(case, role, generation).data, locks, locks, model.STRICT_GID_INDEX)
    return case.memo[memo]


def _wanted_nics(expected):
    """(device, port) of the NICs the inventory implies, in rail order."""
    wanted = []
    for device in expected["candidates"]:
        preferred = expected["rnics"][device]["preferred_gid"]
        if preferred:  # sysfs names ports by number: the inventory's key "1" is the ledger's port 1
            port = preferred["port"]
            wanted.append((device, ascii_int(port) if isinstance(port, str) and ascii_int(port) is not None else port))
    return wanted


def _nic_id(device, port):
    return f"{device}:{port}"


_NEEDS = ("ledgers", "inventories", "journals")


@rule("discovery.inventory_unchanged", "discovery",
      "each node's inventory is the same before and after the child",
      witness=("inventory",), needs=("ledgers", "inventories"), applies=auto_discovery)
def check_inventory_unchanged(case):
    problems = []
    for role in ROLES:
        for generation in case.generations():
            before, after = _inventory(case, role, generation), _inventory(case, role, generation, "after")
            changes = diff_inventories(before.data, after.data)
            if changes:
                problems.append((f"{role} g{generation}: the inventory changed across the child: "
                                 f"{[(c['path'], c['change']) for c in changes][:5]}", after.path))
    return problems


@rule("discovery.lists", "discovery",
      "the engine ran with the gate's lists: whitelist and blacklist both the locked RNICs",
      witness=("journal",), needs=("ledgers", "journals"), applies=auto_discovery)
def check_discovery_lists(case):
    problems = []
    for role, generation, ledger, path in each_ledger(case):
        locks = sorted(locked_rnics(case, role))
        lists = ledger["discovery"] or {}
        got = {name: lists.get(name) for name in ("whitelist", "blacklist")}
        if any(not isinstance(v, list) or sorted(v, key=str) != locks for v in got.values()):
            problems.append((f"{role} g{generation}: the engine's lists {got}, the gate gives both as the locked "
                             f"RNICs {locks}", f"{path}#discovery",
                             {"expected": {"whitelist": locks, "blacklist": locks}, "observed": got}))
    return problems


@rule("discovery.candidates", "discovery",
      "one active Ethernet port and one IPv4 RoCE v2 GID per locked RNIC",
      witness=("inventory", "journal"), needs=_NEEDS, applies=auto_discovery)
def check_inventory_candidates(case):
    problems = []
    for role, generation, _ledger, _path in each_ledger(case):
        try:
            expected = _expected_discovery(case, role, generation)
        except DiscoveryExpectError as error:
            problems.append((f"{role} g{generation}: {error}", _inventory(case, role, generation).path))
            continue
        for device in sorted(locked_rnics(case, role), key=str):
            rnic = expected["rnics"].get(device)
            if rnic is None or len(rnic["active_ethernet_ports"]) != 1 or rnic["ipv4_roce_v2"] != 1:
                problems.append((f"{role} g{generation} {device}: the inventory shows "
                                 f"{'no candidate' if rnic is None else rnic['active_ethernet_ports']} active Ethernet "
                                 f"port(s) and {0 if rnic is None else rnic['ipv4_roce_v2']} IPv4 RoCE v2 GID(s), "
                                 "expected exactly one of each", _inventory(case, role, generation).path))
    return problems


@rule("discovery.nics", "discovery",
      "the engine's NICs, rails and GID indexes are the ones the inventory implies",
      witness=("inventory", "journal"), needs=_NEEDS, applies=auto_discovery,
      after=("discovery.candidates",))
def check_discovery_nics(case):
    problems = []
    for role, generation, ledger, path in each_ledger(case):
        expected = _expected_discovery(case, role, generation)
        wanted = _wanted_nics(expected)
        chosen = (ledger["discovery"] or {}).get("chosen_nic_ids")
        if chosen != [_nic_id(d, p) for d, p in wanted]:
            problems.append((f"{role} g{generation}: the engine chose NICs {chosen}, the inventory implies "
                             f"{[_nic_id(d, p) for d, p in wanted]}", f"{path}#discovery.chosen_nic_ids"))
        for index, rail in enumerate(ledger["rails"]):
            device, port = wanted[index] if index < len(wanted) else (None, None)
            preferred = (expected["rnics"].get(device) or {}).get("preferred_gid") or {}
            got = (rail.get("device"), rail.get("port"), rail.get("nic_id"), rail.get("gid_index"))
            want = (device, port, _nic_id(device, port), preferred.get("index"))
            if got != want:
                problems.append((f"{role} g{generation} rail {rail['rail']}: device, port, NIC ID, GID index {got}; "
                                 f"the inventory implies {want} (rail i = the i-th chosen NIC)", f"{path}#rails"))
    return problems


def _gid_entry(inventory, device, port, index):
    ports = ((inventory.get("devices") or {}).get(device) or {}).get("ports") or {}
    for entry in (ports.get(str(port)) or {}).get("gids") or []:
        if entry.get("index") == index:
            return entry
    return None


_RAIL_FACTS = ("gid", "gid_type", "netdev", "numa_node")  # a rail's facts the inventory states


@rule("discovery.gids", "discovery",
      "each rail's GID, GID type, netdev and NUMA node are the inventory's entry at its device, port and GID index",
      witness=("inventory",), needs=("ledgers", "inventories"), applies=auto_discovery,
      after=("discovery.candidates", "discovery.nics"))
def check_discovery_gids(case):
    problems = []
    for role, generation, ledger, path in each_ledger(case):
        inventory = _inventory(case, role, generation).data
        for rail in ledger["rails"]:
            entry = _gid_entry(inventory, rail.get("device"), rail.get("port"), rail.get("gid_index"))
            device = (inventory.get("devices") or {}).get(rail.get("device")) or {}
            want = None if entry is None else (entry.get("gid"), entry.get("type"), entry.get("ndev"),
                                               device.get("numa_node"))
            got = (rail.get("gid"), rail.get("gid_type"), rail.get("netdev"), rail.get("numa_node"))
            if got != want:
                problems.append((f"{role} g{generation} rail {rail['rail']}: GID, type, netdev, NUMA node {got}; the "
                                 f"inventory's entry {rail.get('device')} port {rail.get('port')} GID index "
                                 f"{rail.get('gid_index')} says {want}", f"{path}#rails",
                                 {"expected": None if want is None else dict(zip(_RAIL_FACTS, want)),
                                  "observed": dict(zip(_RAIL_FACTS, got))}))
    return problems


@rule("discovery.tiers", "discovery",
      "the engine's memory tiers per NUMA node are the inventory's",
      witness=("inventory", "journal"), needs=_NEEDS, applies=auto_discovery,
      after=("discovery.candidates",))
def check_discovery_tiers(case):
    problems = []
    for role, generation, ledger, path in each_ledger(case):
        expected = _expected_discovery(case, role, generation)
        ports = dict(_wanted_nics(expected))
        reported = {f"cpu:{entry['numa_node']}": entry["tiers"] for entry in (ledger["discovery"] or {}).get(
            "memory_tiers", [])}
        for node, tiers in sorted(expected["memory_tiers"].items()):
            local = sorted(_nic_id(d, ports.get(d)) for d, tier in tiers.items() if tier == 0)
            got = reported.get(node)
            got_local = sorted(got[0]) if got and local else []
            got_all = sorted(n for tier in (got or []) for n in tier)
            want_all = sorted(_nic_id(d, ports.get(d)) for d in tiers)
            if got is None or got_local != local or got_all != want_all:
                problems.append((f"{role} g{generation} {node}: the engine's tiers {got}, the inventory implies "
                                 f"tier 0 {local} of {want_all}", f"{path}#discovery.memory_tiers"))
    return problems


@rule("discovery.strict_pin", "discovery",
      f"a strict GID {model.STRICT_GID_INDEX} pin on rail 0's NIC is Unavailable and leaves no owner retained",
      witness=("inventory", "journal", "profile"), needs=_NEEDS, applies=auto_discovery,
      after=("discovery.candidates",))
def check_strict_pin(case):
    problems = []
    for role, generation, ledger, path in each_ledger(case):
        expected = _expected_discovery(case, role, generation)
        pin = expected["strict_gid_pin"]
        wanted = _wanted_nics(expected)
        request = (ledger["discovery"] or {}).get("strict_gid_request") or {}
        got = (request.get("device"), request.get("port"), request.get("gid_index"), request.get("result"),
               request.get("retained_owners"))
        want = (*(wanted[0] if wanted else (None, None)), model.STRICT_GID_INDEX,
                "Ok" if pin and pin["available"] else "Unavailable", 0)
        if got != want:
            fields = ("device", "port", "gid_index", "result", "retained_owners")
            problems.append((f"{role} g{generation}: strict GID request (device, port, index, result, retained "
                             f"owners) {got}, expected {want}", f"{path}#discovery.strict_gid_request",
                             {"expected": dict(zip(fields, want)), "observed": dict(zip(fields, got))}))
    return problems


def _listed_by_libibverbs(entry):
    """(node GUID, node type number, uverbs node) of one device libibverbs enumerated (verbs.enumerated)."""
    kind = entry.get("node_type")
    return entry.get("node_guid"), kind.get("num") if isinstance(kind, dict) else None, entry.get("uverbs")


@rule("discovery.verbs", "discovery",
      "where rdma-core's libibverbs enumerated a node (the inventory's verbs record), it listed the inventory's "
      "devices: the same names and count, node GUIDs, node types and uverbs nodes; a failed enumeration fails",
      witness=("inventory",), needs=("ledgers", "inventories"), applies=auto_discovery)
def check_verbs_enumeration(case):
    # libibverbs' list is compared with the sysfs reader's devices here, not read from the module's
    # own verdict on it (its mismatches): two readers of the node, one judge.
    problems = []
    for (role, generation, when), record in sorted(case.inventories.items()):
        verbs = record.data.get("verbs") if isinstance(record.data.get("verbs"), dict) else {}
        where = f"{role} g{generation} inventory {when}"
        if verbs.get("status") == "failed":
            problems.append((f"{where}: the libibverbs enumeration failed: {verbs.get('reason')}",
                             f"{record.path}#verbs"))
        if verbs.get("status") != "checked":
            continue
        listed = [e for e in verbs.get("enumerated") or [] if isinstance(e, dict)]
        devices = record.data.get("devices") or {}
        names = [str(e.get("name")) for e in listed]
        differences = []
        if len(listed) != len(devices):
            differences.append(f"{len(listed)} devices listed, {len(devices)} in the inventory")
        for name in sorted(set(names) ^ set(devices)):
            differences.append(f"{name} {'not in the inventory' if name in names else 'not listed by libibverbs'}")
        for entry in listed:
            dev = devices.get(entry.get("name"))
            if isinstance(dev, dict):
                want = (dev.get("node_guid"), (dev.get("node_type") or {}).get("num"), dev.get("uverbs"))
                if _listed_by_libibverbs(entry) != want:
                    differences.append(f"{entry.get('name')}: node GUID, node type, uverbs "
                                       f"{_listed_by_libibverbs(entry)}, the inventory's {want}")
        if differences:
            problems.append((f"{where}: libibverbs enumerated {sorted(names)}: " + "; ".join(differences[:5]),
                             f"{record.path}#verbs.enumerated"))
    return problems

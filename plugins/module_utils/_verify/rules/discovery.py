# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Discovery rules (discovery: auto): the engine's choices against the independent inventory."""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._inventory.compare import diff_inventories
from ansible_collections.orbite.qualification.plugins.module_utils._inventory.discovery import (
    DiscoveryExpectError,
    expectations,
)
from ansible_collections.orbite.qualification.plugins.module_utils._verify.registry import applies, rule
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules._walk import ROLES, each_ledger


@applies("`discovery: auto`")
def auto_discovery(profile, _workload):
    return profile.get("discovery") == "auto"


def _inventory(case, role, generation, when="before"):
    return case.inventories[(role, generation, when)]


def _expected_discovery(case, role, generation):
    ledger = case.ledger(role, generation)
    lists = ledger["discovery"] or {}
    return expectations(_inventory(case, role, generation).data, lists.get("whitelist"), lists.get("blacklist"),
                        (lists.get("strict_gid_request") or {}).get("gid_index", 255))


def _port_of(ledger, device):
    for rail in ledger["rails"]:
        if rail["device"] == device:
            return rail["port"]
    return "?"


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


@rule("discovery.candidates", "discovery",
      "one active Ethernet port and one IPv4 RoCE v2 GID per locked RNIC",
      witness=("inventory", "runner"), needs=("ledgers", "inventories"), applies=auto_discovery)
def check_inventory_candidates(case):
    problems = []
    for role, generation, ledger, _path in each_ledger(case):
        try:
            expected = _expected_discovery(case, role, generation)
        except DiscoveryExpectError as error:
            problems.append((f"{role} g{generation}: {error}", _inventory(case, role, generation).path))
            continue
        for device in sorted(rail["device"] for rail in ledger["rails"]):
            rnic = expected["rnics"].get(device)
            if rnic is None or len(rnic["active_ethernet_ports"]) != 1 or rnic["ipv4_roce_v2"] != 1:
                problems.append((f"{role} g{generation} {device}: the inventory shows "
                                 f"{'no candidate' if rnic is None else rnic['active_ethernet_ports']} active Ethernet "
                                 f"port(s) and {0 if rnic is None else rnic['ipv4_roce_v2']} IPv4 RoCE v2 GID(s), "
                                 "expected exactly one of each", _inventory(case, role, generation).path))
    return problems


@rule("discovery.nics", "discovery",
      "the engine's NIC IDs and GIDs are the ones the inventory implies",
      witness=("inventory", "runner"), needs=("ledgers", "inventories"), applies=auto_discovery,
      after=("discovery.candidates",))
def check_discovery_nics(case):
    problems = []
    for role, generation, ledger, path in each_ledger(case):
        expected = _expected_discovery(case, role, generation)
        wanted = [f"{d}:{expected['rnics'][d]['preferred_gid']['port']}" for d in expected["candidates"]
                  if expected["rnics"][d]["preferred_gid"]]
        chosen = (ledger["discovery"] or {}).get("chosen_nic_ids")
        if chosen != wanted:
            problems.append((f"{role} g{generation}: the engine chose NICs {chosen}, the inventory implies {wanted}",
                             f"{path}#discovery.chosen_nic_ids"))
        for rail in ledger["rails"]:
            preferred = (expected["rnics"].get(rail["device"]) or {}).get("preferred_gid") or {}
            if rail.get("gid_index") != preferred.get("index"):
                problems.append((f"{role} g{generation} rail {rail['rail']}: GID index {rail.get('gid_index')}, the "
                                 f"inventory's preferred RoCE v2 GID is {preferred.get('index')}", f"{path}#rails"))
    return problems


@rule("discovery.tiers", "discovery",
      "the engine's memory tiers per NUMA node are the inventory's",
      witness=("inventory", "runner"), needs=("ledgers", "inventories"), applies=auto_discovery,
      after=("discovery.candidates",))
def check_discovery_tiers(case):
    problems = []
    for role, generation, ledger, path in each_ledger(case):
        expected = _expected_discovery(case, role, generation)["memory_tiers"]
        reported = {f"cpu:{entry['numa_node']}": entry["tiers"] for entry in (ledger["discovery"] or {}).get(
            "memory_tiers", [])}
        for node, tiers in sorted(expected.items()):
            local = sorted(f"{d}:{p}" for d, tier in tiers.items() if tier == 0
                           for p in [_port_of(ledger, d)])
            got = reported.get(node)
            got_local = sorted(got[0]) if got and local else []
            got_all = sorted(n for tier in (got or []) for n in tier)
            want_all = sorted(f"{d}:{_port_of(ledger, d)}" for d in tiers)
            if got is None or got_local != local or got_all != want_all:
                problems.append((f"{role} g{generation} {node}: the engine's tiers {got}, the inventory implies "
                                 f"tier 0 {local} of {want_all}", f"{path}#discovery.memory_tiers"))
    return problems


@rule("discovery.strict_pin", "discovery",
      "a strict GID 255 pin is Unavailable and leaves no owner retained",
      witness=("inventory", "runner"), needs=("ledgers", "inventories"), applies=auto_discovery,
      after=("discovery.candidates",))
def check_strict_pin(case):
    problems = []
    for role, generation, ledger, path in each_ledger(case):
        expected = _expected_discovery(case, role, generation)["strict_gid_pin"]
        request = (ledger["discovery"] or {}).get("strict_gid_request") or {}
        want = expected["expected"] if expected else "Unavailable"
        if request.get("result") != want or request.get("retained_owners") != 0:
            problems.append((f"{role} g{generation}: strict GID {request.get('gid_index')} request gave "
                             f"{request.get('result')!r} with {request.get('retained_owners')!r} retained owner(s); "
                             f"expected {want!r} with 0", f"{path}#discovery.strict_gid_request"))
    return problems

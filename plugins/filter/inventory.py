# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Filters over RDMA discovery inventories (controller side).

- ``before | orbite.qualification.inventory_diff(after, ignore=[...])``: every difference by path
  (empty list when equal);
- ``inventory | orbite.qualification.discovery_expectations(whitelist=[...], blacklist=[...],
  strict_gid_index=255)``: what the engine's automatic discovery must choose;
- ``gid | orbite.qualification.gid_to_ip`` and ``ip | orbite.qualification.ip_to_gid``: GID text
  <-> IP address with netaddr (IPv4-mapped GIDs give the IPv4 address).

The rules are in docs/inventory.md.
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.orbite.qualification.plugins.module_utils._inventory.discovery import (
    DiscoveryExpectError,
    expectations,
)
from ansible_collections.orbite.qualification.plugins.module_utils._inventory.compare import (
    InventoryCompareError,
    diff_inventories,
)

try:
    import netaddr
except ImportError:  # pragma: no cover - netaddr is in meta/ee-requirements.txt
    netaddr = None


def inventory_diff(before, after, ignore=None):
    try:
        return diff_inventories(before, after, ignore=ignore)
    except InventoryCompareError as exc:
        raise AnsibleFilterError(f"inventory_diff: {exc}") from None


def discovery_expectations(inventory, whitelist=None, blacklist=None, strict_gid_index=None):
    try:
        return expectations(inventory, whitelist=whitelist, blacklist=blacklist, strict_gid_index=strict_gid_index)
    except DiscoveryExpectError as exc:
        raise AnsibleFilterError(f"discovery_expectations: {exc}") from None


def _netaddr():
    if netaddr is None:
        raise AnsibleFilterError("the netaddr Python library is required on the controller (pip install netaddr)")
    return netaddr


def gid_to_ip(gid):
    """'0000:...:ffff:c633:640a' -> '198.51.100.10'; other GIDs -> compressed IPv6 text."""
    lib = _netaddr()
    text = str(gid)
    groups = text.split(":")
    if len(groups) != 8 or not all(len(g) == 4 for g in groups):
        raise AnsibleFilterError(f"gid_to_ip: {gid!r} is not a GID (8 groups of 4 hex digits)")
    try:
        ip = lib.IPAddress(text, 6)
    except (lib.AddrFormatError, ValueError):
        raise AnsibleFilterError(f"gid_to_ip: {gid!r} is not a GID (8 groups of 4 hex digits)") from None
    return str(ip.ipv4()) if ip.is_ipv4_mapped() else str(ip)


def ip_to_gid(address):
    """'198.51.100.10' -> '0000:0000:0000:0000:0000:ffff:c633:640a' (sysfs GID text)."""
    lib = _netaddr()
    try:
        ip = lib.IPAddress(str(address))
    except (lib.AddrFormatError, ValueError):
        raise AnsibleFilterError(f"ip_to_gid: {address!r} is not an IPv4 or IPv6 address") from None
    if ip.version == 4:
        ip = ip.ipv6(ipv4_compatible=False)
    value = int(ip)
    return ":".join(f"{(value >> shift) & 0xFFFF:04x}" for shift in range(112, -1, -16))


class FilterModule:
    def filters(self):
        return {
            "inventory_diff": inventory_diff,
            "discovery_expectations": discovery_expectations,
            "gid_to_ip": gid_to_ip,
            "ip_to_gid": ip_to_gid,
        }

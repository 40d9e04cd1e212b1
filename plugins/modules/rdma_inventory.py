#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

DOCUMENTATION = r"""
---
module: rdma_inventory
short_description: Record a read-only sysfs inventory of a node's RDMA devices, ports, GIDs and netdevs
version_added: 0.1.0
description:
  - Reads, relative to O(root), C(sys/class/infiniband/*) (device, PCI, NUMA, ports, GID tables),
    C(sys/class/net/*), C(sys/devices/system/node/node*/cpulist), the hostname and the boot ID, and
    returns them as one inventory (schema C(orbite.rdma-inventory), version 1, see C(docs/inventory.md)).
  - Never opens a file of O(root) for writing. Garbage in a file becomes an entry of
    RV(inventory.errors) naming the field path, the file, the value and the rule; only a missing
    O(root) fails the task.
  - The tree under O(root) is input, not trusted. A file or directory whose real path leaves O(root)
    is not read, only regular files are read (never a FIFO or a device), at most 64 KiB each, and a
    cpulist may only name CPUs below 8192; each refusal is an entry of RV(inventory.errors).
  - Unused GID slots (all-zero GID, or gid_attrs reads failing with EINVAL) are counted in
    C(gids_unused), not listed.
  - Shares no code with the OrbiTE engine; the gate records it before and after every child.
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.platform_linux
  - orbite.qualification._root
options:
  save_to:
    description:
      - Also write the inventory as JSON (sorted keys) to this path on the node, atomically, mode 0600
        (it names the host, its addresses and its devices); keep its directory private too (0700).
      - Refused inside C(/sys), C(/proc) or the same directories under O(root), and when the path is
        a FIFO, a device, a socket or a directory.
      - In check mode nothing is written; RV(save_to.changed) tells whether it would be.
    type: path
  verbs:
    description:
      - Cross-check the inventory with rdma-core's own libibverbs (C(libibverbs.so.1) through ctypes,
        in a child process). The device names, node GUIDs, node types, uverbs nodes and the count it
        enumerates must equal the inventory's; each difference is an entry of C(inventory.verbs.mismatches)
        with a code (C(verbs.device_unlisted), C(verbs.node_guid), ...).
      - For an O(root) other than V(/), libibverbs reads C(<root>/sys) (its C(SYSFS_PATH)); the
        character devices are always the node's C(/dev/infiniband).
      - What libibverbs cannot do without a kernel driver (open a context, query ports and GIDs) is
        listed in C(inventory.verbs.limits); with a context and pyverbs, port state, link layer and
        GID types are compared too.
      - Reported as skipped (with the reason) when libibverbs cannot be loaded or lists no RDMA
        subsystem on a node without devices.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    details:
      - Reads as usual; with O(save_to) nothing is written and RV(save_to.changed) says whether it would be.
  diff_mode:
    support: none
seealso:
  - plugin: orbite.qualification.inventory_diff
    plugin_type: filter
    description: Lists every difference between the inventories taken before and after a child.
  - plugin: orbite.qualification.discovery_expectations
    plugin_type: filter
    description: What the engine's automatic discovery must choose, from an inventory.
  - module: orbite.qualification.node_identity
    description: Only the node's identity.
"""

EXAMPLES = r"""
- name: Inventory before the child, saved next to the receipts
  orbite.qualification.rdma_inventory:
    save_to: /var/tmp/orbite/inventory-before.json
  register: before

- name: Inventory of a fake host of the simulated lab
  orbite.qualification.rdma_inventory:
    root: /tmp/sim-lab/sim-a
  register: sim_inventory

- name: Inventory checked by rdma-core's libibverbs
  orbite.qualification.rdma_inventory:
    verbs: true
  register: checked
"""

RETURN = r"""
inventory:
  description: The inventory (C(docs/inventory.md) has every field and its sysfs source).
  returned: success
  type: dict
  contains:
    schema:
      description: Always C(orbite.rdma-inventory).
      type: str
      sample: orbite.rdma-inventory
    version:
      description: Schema version, 1.
      type: int
      sample: 1
    node:
      description: Hostname, boot ID, kernel release, machine-id, NUMA nodes with their CPU lists.
      type: dict
      sample:
        hostname: sim-a
        boot_id: 0b5e1d00-0000-4000-8000-000a11ce0000
        osrelease: 6.1.0-orbite-sim
        machine_id: 0000000000000000000000005eed0000
        numa_nodes: {"0": {"cpulist": "0-3"}, "1": {"cpulist": "4-7"}}
    devices:
      description: RDMA devices by name, each with PCI, NUMA, netdevs, uverbs node and ports (GID tables).
      type: dict
      sample:
        mlx5_0:
          node_type: {num: 1, name: CA}
          node_guid: 0c42:a103:0000:0010
          fw_ver: 16.35.2000
          pci: {bdf: "0000:3b:00.0", vendor: "0x15b3", device: "0x1017"}
          numa_node: 0
          netdevs: [ens1f0]
          uverbs: uverbs0
          ports:
            "1":
              state: {num: 4, name: ACTIVE}
              link_layer: Ethernet
              gid_tbl_len: 256
              gids_unused: 252
              gids:
                - {index: 3, gid: "0000:0000:0000:0000:0000:ffff:c633:640a", type: RoCE v2, ndev: ens1f0,
                   ipv4: 198.51.100.10, ipv6_kind: ipv4-mapped}
    netdevs:
      description: Network interfaces by name (operstate, MAC, MTU, PCI function, RDMA devices).
      type: dict
      sample:
        ens1f0: {operstate: up, mac: "0c:42:a1:00:00:10", mtu: 1500, ifindex: 4, type: 1,
                 pci_bdf: "0000:3b:00.0", rdma_devices: [mlx5_0]}
    errors:
      description: One entry per unreadable or malformed file (path, file, value, error).
      type: list
      elements: dict
      sample: []
    verbs:
      description: >-
        The libibverbs cross-check (status not_requested, skipped, failed or checked; reason; what
        libibverbs enumerated; coded mismatches; limits).
      type: dict
      sample: {status: checked, reason: null, library: libibverbs.so.1, sysfs: /sys, devices: 1, comparisons: 4,
               enumerated: [{name: mlx5_0, uverbs: uverbs0, node_guid: "0c42:a103:0000:0010",
                             node_type: {num: 1, name: CA}, opened: false,
                             open_error: "ENXIO (No such device or address)"}],
               mismatches: [],
               limits: [{device: mlx5_0, step: ibv_open_device, error: "ENXIO (No such device or address)",
                         not_compared: [ports, gids], why: "no kernel driver serves the character device"}],
               warnings: []}
save_to:
  description: What happened to O(save_to); null when it is not set.
  returned: success
  type: dict
  contains:
    path:
      description: The path.
      type: str
      sample: /var/tmp/orbite/inventory-before.json
    changed:
      description: Whether the file's content changed (or would, in check mode).
      type: bool
      sample: true
    written:
      description: Whether the file was written (never in check mode).
      type: bool
      sample: true
code:
  description: Stable failure code (a missing O(root), a refused O(save_to), ...).
  returned: failure
  type: str
  sample: inventory.error
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._inventory.sysfs import (
    InventoryError,
    read_inventory,
    render_inventory,
    save_inventory,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "default": "/"},
            "save_to": {"type": "path"},
            "verbs": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    root = module.params["root"]
    save_to = module.params["save_to"]
    try:
        inventory = read_inventory(root, verbs=module.params["verbs"])
        saved = None
        if save_to:
            changed = save_inventory(render_inventory(inventory), save_to, root=root, dry_run=module.check_mode)
            saved = {"path": save_to, "changed": changed, "written": changed and not module.check_mode}
    except (InventoryError, OSError) as error:
        fail_from(module, error, prefix="rdma_inventory")
    module.exit_json(changed=bool(saved and saved["changed"]), inventory=inventory, save_to=saved)


if __name__ == "__main__":
    main()

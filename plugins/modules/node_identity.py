#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

DOCUMENTATION = r"""
---
module: node_identity
short_description: Report a node's hostname, boot ID, kernel release and machine-id
version_added: 0.1.0
description:
  - Reads C(proc/sys/kernel/hostname), C(proc/sys/kernel/random/boot_id),
    C(proc/sys/kernel/osrelease) and, when present, C(etc/machine-id) relative to O(root).
  - The qualification gate requires source and requester to differ in both hostname and boot ID;
    the lock supervisor rechecks the same values inside its RNIC locks.
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.read_only
  - orbite.qualification._attributes.platform_linux
  - orbite.qualification._root
seealso:
  - module: orbite.qualification.node_supervisor
    description: Rechecks the hostname and boot ID inside the RNIC locks.
  - module: orbite.qualification.rdma_inventory
    description: Records the same identity with the node's RDMA devices.
"""

EXAMPLES = r"""
- name: Read the node identity
  orbite.qualification.node_identity:
  register: node

- name: Read a fake host's identity
  orbite.qualification.node_identity:
    root: /tmp/sim-lab/hosts/sim-a
"""

RETURN = r"""
identity:
  description: The node identity.
  returned: success
  type: dict
  contains:
    hostname:
      description: Host name.
      type: str
      sample: sim-a
    boot_id:
      description: Boot ID (lower-case UUID), new at every boot.
      type: str
      sample: 0b5e1d00-0000-4000-8000-000a11ce0000
    kernel_release:
      description: Kernel release (C(uname -r)).
      type: str
      sample: 6.1.0-orbite-sim
    machine_id:
      description: The machine-id, or null when C(etc/machine-id) is absent.
      type: str
      sample: 0000000000000000000000005eed0000
    root:
      description: The root the values were read from.
      type: str
      sample: /
  sample:
    hostname: rnic-a
    boot_id: 4f0c7d3e-5a61-4d7b-9a55-0d1f6f2b9e10
    kernel_release: 6.1.0-27-amd64
    machine_id: 8b1a9953c4611296a827abf8c47804d7
    root: /
code:
  description: Stable failure code when a file cannot be read or holds garbage.
  returned: failure
  type: str
  sample: identity.error
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._node.identity import (
    IdentityError,
    read_identity,
)


def main():
    module = AnsibleModule(argument_spec={"root": {"type": "path", "default": "/"}}, supports_check_mode=True)
    try:
        identity = read_identity(module.params["root"])
    except IdentityError as error:
        fail_from(module, error, prefix="node identity")
    module.exit_json(changed=False, identity=identity)


if __name__ == "__main__":
    main()

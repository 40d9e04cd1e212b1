#!/usr/bin/python
# Copyright: OrbiTE qualification contributors
# Apache License 2.0 (see galaxy.yml)

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
  - Read-only; check mode is fully supported.
author:
  - OrbiTE qualification team
options:
  root:
    description:
      - The host root to read from. V(/) on a real node; a fake host's directory in the simulated lab.
    type: path
    default: /
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
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
    boot_id:
      description: Boot ID (lower-case UUID), new at every boot.
      type: str
    kernel_release:
      description: Kernel release (C(uname -r)).
      type: str
    machine_id:
      description: The machine-id, or null when C(etc/machine-id) is absent.
      type: str
    root:
      description: The root the values were read from.
      type: str
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

#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

DOCUMENTATION = r"""
---
module: sim_native
short_description: Build the simulated lab's loopback verbs provider and observers, and pin them
version_added: 0.2.0
description:
  - With O(state=present), builds the loopback verbs provider (a stand-in C(libibverbs.so.1)) and the
    three native observers from the collection's C(observers/) sources into O(out_dir)
    (C(make -C <collection_dir>/observers OUT=<out_dir> provider all); make rebuilds only what
    changed, and nothing is written into the collection), then writes C(<out_dir>/manifest.json)
    with the path and sha256 of each, rehashed every time.
  - The gate deploys these files to the nodes and pins the simulated runner's verbs library and
    preloaded observers to these hashes (C(docs/provider.md), C(docs/sim-lab.md)).
  - With O(state=absent), removes O(out_dir) if its manifest says this module made it.
  - Needs C(make), a C compiler and the rdma-core headers (Debian C(libibverbs-dev), Fedora
    C(rdma-core-devel)) on the controller; without them it fails naming what is missing.
  - Runs on the controller.
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.platform_linux
options:
  collection_dir:
    description: The collection's root directory (the one holding C(observers/)); may be read-only.
    type: path
    required: true
  out_dir:
    description: Absolute path of the build directory (the lab's C(<sim_lab_dir>/native)).
    type: path
    required: true
  state:
    description: Whether the build should exist.
    type: str
    choices: [present, absent]
    default: present
  make:
    description: The make program.
    type: str
    default: make
  cc:
    description: The C compiler.
    type: str
    default: gcc
attributes:
  check_mode:
    support: partial
    details:
      - Check mode builds nothing; it reports the manifest already there, or a change when there is none.
  diff_mode:
    support: none
seealso:
  - module: orbite.qualification.sim_host
    description: The fake hosts the provider reads its devices from.
  - module: orbite.qualification.runner
    description: Launches runners with the pinned verbs library and observers.
"""

EXAMPLES = r"""
- name: Build the loopback verbs provider and the observers of the lab
  orbite.qualification.sim_native:
    collection_dir: "{{ (role_path ~ '/../..') | realpath }}"
    out_dir: "{{ sim_lab_dir }}/native"
  register: native
"""

RETURN = r"""
manifest:
  description: The manifest written to C(<out_dir>/manifest.json) (null in check mode when there is none yet).
  returned: O(state=present)
  type: dict
  sample:
    schema: orbite.sim-native
    version: 1
    verbs_library: {path: /home/me/.cache/orbite/sim-lab/native/provider/libibverbs.so.1,
                    sha256: 9c0e6f0b0a3d2f1e4c5b6a79880716253443526170809a0b1c2d3e4f5a6b7c8d}
    observers:
      accounting: {path: /home/me/.cache/orbite/sim-lab/native/liborbite_accounting.so,
                   sha256: 2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae}
manifest_path:
  description: Where the manifest is.
  returned: O(state=present)
  type: str
  sample: /home/me/.cache/orbite/sim-lab/native/manifest.json
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._sim.native import (
    MANIFEST,
    SimNativeError,
    build_native,
    read_manifest,
    remove_native,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "collection_dir": {"type": "path", "required": True},
            "out_dir": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "make": {"type": "str", "default": "make"},
            "cc": {"type": "str", "default": "gcc"},
        },
        supports_check_mode=True,
    )
    params = module.params
    manifest_path = os.path.join(params["out_dir"], MANIFEST)
    try:
        if params["state"] == "absent":
            module.exit_json(changed=remove_native(params["out_dir"], check_mode=module.check_mode))
        if module.check_mode:
            manifest = read_manifest(manifest_path)
            module.exit_json(changed=manifest is None, manifest=manifest, manifest_path=manifest_path)
        changed, manifest = build_native(params["collection_dir"], params["out_dir"], params["make"], params["cc"])
    except SimNativeError as error:
        fail_from(module, error, prefix="sim_native")
    module.exit_json(changed=changed, manifest=manifest, manifest_path=manifest_path)


if __name__ == "__main__":
    main()

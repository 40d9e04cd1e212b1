#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

DOCUMENTATION = r"""
---
module: installation_check
short_description: Check an OrbiTE installation manifest on the controller, or a deployed binary on a node
version_added: 0.1.0
description:
  - O(scope=controller) validates the manifest (schema, protocol, dirty rejected unless
    O(allow_dirty), commit equal to O(expected_commit) when given), re-hashes every artifact file
    pinned beside it (archive, fixture modules, consumer manifest, lockfile, binary, observers)
    when O(verify_files), requires the observers in O(require_observers), and, when O(binary) is
    given, checks that this binary is the pinned one (the gate's C(orbite_installation) /
    C(orbite_binary) pair) and that C(BINARY --protocol) prints the protocol.
  - O(scope=node) checks a deployed O(binary) and deployed O(observers) against the manifest's
    hashes, that the binary's native libraries resolve (and, with O(pin_native_libraries), have the
    pinned hashes), and that C(BINARY --protocol) prints C(orbite-installed-host-v4).
  - Fails naming every mismatch precisely (field, path, expected, found). Changes nothing.
  - One of O(manifest) and O(manifest_data) is required.
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.read_only
  - orbite.qualification._attributes.platform_linux
options:
  manifest:
    description: Path of the manifest on the host the module runs on. Mutually exclusive with O(manifest_data).
    type: path
  manifest_data:
    description:
      - The manifest's content (for a node, which has no copy of the file), as returned in
        RV(manifest) by the controller-side check. It is validated against the manifest schema
        (C(orbite.installation-manifest) version 1, C(docs/build.md)) like a file would be.
      - Mutually exclusive with O(manifest).
    type: dict
  scope:
    description: Which side's checks to run.
    type: str
    choices: [controller, node]
    default: controller
  allow_dirty:
    description: Accept a manifest built from a dirty checkout (local diagnosis only).
    type: bool
    default: false
  expected_commit:
    description: The commit the manifest must pin (controller scope).
    type: str
  verify_files:
    description: Re-hash the artifact files beside the manifest (controller scope; needs O(manifest)).
    type: bool
    default: true
  binary:
    description:
      - Controller scope, optional, the binary the gate was given; it must be the pinned one.
      - Node scope, required, the deployed binary.
    type: path
  observers:
    description:
      - Node scope; the deployed observer libraries, by tool name. Each given one must match the
        manifest's sha256 for that tool.
    type: dict
    default: {}
    suboptions:
      accounting:
        description: Path of the deployed C(liborbite_accounting.so).
        type: path
      cq_fault:
        description: Path of the deployed C(liborbite_cq_fault.so).
        type: path
      uverbs_fault:
        description: Path of the deployed C(liborbite_uverbs_fault.so).
        type: path
      inflight_fault:
        description: Path of the deployed C(liborbite_inflight_fault.so).
        type: path
  require_observers:
    description: Observers the mode needs; each must be built (and, on a node, deployed and matching).
    type: list
    elements: str
    choices: [accounting, cq_fault, uverbs_fault, inflight_fault]
    default: []
  pin_native_libraries:
    description: On a node, also require the resolved native libraries to have the pinned sha256.
    type: bool
    default: true
  probe_protocol:
    description: Run C(BINARY --protocol) and require the protocol string.
    type: bool
    default: true
notes:
  - C(--protocol) only proves that the binary starts; see C(docs/build.md) for what each check proves.
seealso:
  - module: orbite.qualification.build_installed
    description: Builds the artifact and writes the manifest this module checks.
"""

EXAMPLES = r"""
- name: Refuse a mismatched installation/binary pair before contacting any node
  orbite.qualification.installation_check:
    manifest: "{{ orbite_installation }}"
    binary: "{{ orbite_binary }}"
    expected_commit: "{{ orbite_expected_commit | default(omit) }}"
    allow_dirty: "{{ orbite_allow_dirty | default(false) | bool }}"
    require_observers: [accounting]
  delegate_to: localhost
  run_once: true
  register: installation

- name: Check the deployed binary and observer on each node
  orbite.qualification.installation_check:
    scope: node
    manifest_data: "{{ installation.manifest }}"
    binary: /opt/orbite/bin/orbite-rdma-host
    observers:
      accounting: /opt/orbite/lib/liborbite_accounting.so
    require_observers: [accounting]
"""

RETURN = r"""
manifest:
  description: The validated manifest (C(docs/build.md) describes every field).
  returned: success
  type: dict
  sample:
    schema: orbite.installation-manifest
    version: 1
    protocol: orbite-installed-host-v4
    package: {name: orbite, version: 0.4.0}
    commit: 3f2c9a1e5b7d4c6f8a0b1c2d3e4f5a6b7c8d9e0f
    dirty: false
    dirty_paths: []
    toolchain: rustc 1.95.0 (59807616e 2026-04-14)
    toolchain_name: stable
    features: [rdma]
    fixture: tests/hardware/rdma_host
    binary:
      path: installed/bin/orbite-rdma-host
      sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
    observers: {accounting: {path: observers/liborbite_accounting.so,
                             sha256: 2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae},
                cq_fault: null, uverbs_fault: null, inflight_fault: null}
    observers_absent_reason: null
checked:
  description: Names of the checks that ran.
  returned: always
  type: list
  elements: str
  sample: [schema, protocol, dirty, commit, observers.accounting, artifact files, binary, binary --protocol]
mismatches:
  description: Every difference found, each with C(field), C(path), C(expected) and C(found).
  returned: always
  type: list
  elements: dict
  sample:
    - field: binary.sha256
      path: /opt/orbite/bin/orbite-rdma-host
      expected: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
      found: 60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752
code:
  description: Stable failure code (C(installation.mismatch) when the installation differs from its manifest).
  returned: failure
  type: str
  sample: installation.mismatch
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._build.manifest import (
    OBSERVER_TOOLS,
    InstallationError,
    check_controller,
    check_node,
    load_manifest,
    validate_manifest,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "manifest": {"type": "path"},
            "manifest_data": {"type": "dict"},
            "scope": {"type": "str", "choices": ["controller", "node"], "default": "controller"},
            "allow_dirty": {"type": "bool", "default": False},
            "expected_commit": {"type": "str"},
            "verify_files": {"type": "bool", "default": True},
            "binary": {"type": "path"},
            "observers": {"type": "dict", "default": {}, "options": {t: {"type": "path"} for t in OBSERVER_TOOLS}},
            "require_observers": {"type": "list", "elements": "str", "choices": list(OBSERVER_TOOLS), "default": []},
            "pin_native_libraries": {"type": "bool", "default": True},
            "probe_protocol": {"type": "bool", "default": True},
        },
        mutually_exclusive=[("manifest", "manifest_data")],
        required_one_of=[("manifest", "manifest_data")],
        required_if=[("scope", "node", ("binary",))],
        supports_check_mode=True,
    )
    p = module.params
    try:
        if p["manifest"]:
            manifest, manifest_dir = load_manifest(p["manifest"]), os.path.dirname(os.path.abspath(p["manifest"]))
        else:
            manifest, manifest_dir = p["manifest_data"], None
            validate_manifest(manifest, origin="(manifest_data)")
        if p["scope"] == "controller":
            mismatches, checked = check_controller(
                manifest,
                manifest_dir,
                allow_dirty=p["allow_dirty"],
                expected_commit=p["expected_commit"],
                verify_files=p["verify_files"] and manifest_dir is not None,
                binary=p["binary"],
                require_observers=p["require_observers"],
                probe=p["probe_protocol"],
            )
        else:
            mismatches, checked = check_node(
                manifest,
                p["binary"],
                # Suboptions fill every tool in; only the given ones are deployed.
                observers={tool: path for tool, path in (p["observers"] or {}).items() if path is not None},
                require_observers=p["require_observers"],
                pin_native_libraries=p["pin_native_libraries"],
                probe=p["probe_protocol"],
            )
    except InstallationError as error:
        fail_from(module, error, checked=[], mismatches=[])
    if mismatches:
        mismatch = OrbiteError(
            f"installation does not match its manifest ({len(mismatches)} mismatch(es)): "
            + "; ".join(str(m) for m in mismatches),
            code="installation.mismatch",
        )
        fail_from(
            module,
            mismatch,
            checked=checked,
            mismatches=[m.as_dict() for m in mismatches],
        )
    module.exit_json(changed=False, manifest=manifest, checked=checked, mismatches=[])


if __name__ == "__main__":
    main()

#!/usr/bin/python
# Copyright: OrbiTE qualification team
# Apache License 2.0 (see galaxy.yml)

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
author:
  - OrbiTE qualification team
options:
  manifest:
    description: Path of the manifest on the host the module runs on. Mutually exclusive with O(manifest_data).
    type: path
  manifest_data:
    description: The manifest's content (for a node, which has no copy of the file).
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
    description: Deployed observer libraries by tool name (C(accounting), C(cq_fault), C(uverbs_fault)).
    type: dict
    default: {}
  require_observers:
    description: Observers the mode needs; each must be built (and, on a node, deployed and matching).
    type: list
    elements: str
    default: []
  pin_native_libraries:
    description: On a node, also require the resolved native libraries to have the pinned sha256.
    type: bool
    default: true
  probe_protocol:
    description: Run C(BINARY --protocol) and require the protocol string.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
notes:
  - C(--protocol) only proves that the binary starts; see C(docs/build.md) for what each check proves.
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
  description: The validated manifest.
  returned: success
  type: dict
checked:
  description: Names of the checks that ran.
  returned: always
  type: list
  elements: str
mismatches:
  description: Every difference found, each with C(field), C(path), C(expected) and C(found).
  returned: always
  type: list
  elements: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._build.manifest import (
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
            "observers": {"type": "dict", "default": {}},
            "require_observers": {"type": "list", "elements": "str", "default": []},
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
                observers=p["observers"],
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

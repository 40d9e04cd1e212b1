#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

DOCUMENTATION = r"""
---
module: build_installed
short_description: Build the OrbiTE installed-host artifact from a clean checkout and pin it in a manifest
version_added: 0.1.0
description:
  - Runs on the controller. Refuses a dirty or uncommitted checkout (listing the offending paths),
    packages the engine crate with C(cargo +TOOLCHAIN package), extracts the C(.crate), copies the
    packaged fixture into an independent consumer outside the checkout, resolves the engine offline
    from the extracted package with locked versions, runs C(cargo fmt --check) and
    C(cargo clippy -- -D warnings) on the consumer, builds it and installs the binary into
    C(OUTPUT/installed/bin/).
  - Builds the collection's native observers (C(make -C OBSERVERS_DIR OUT=OUTPUT/observers)) when
    the rdma-core headers are present; otherwise records them as absent with the reason.
  - Writes C(OUTPUT/manifest.json) (schema C(orbite.installation-manifest) version 1) pinning the
    commit, dirty flag, toolchain, features and the sha256 of the archive, fixture modules,
    lockfile, binary, observers and the binary's native libraries. See C(docs/build.md).
  - Idempotent. When the inputs (commit, dirty files, toolchain, features, fixture, observer
    sources) are unchanged and every pinned file still matches the manifest, nothing is rebuilt.
    The cargo target directory stays under O(output), so rebuilds are incremental.
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.platform_linux
options:
  source:
    description: The engine crate's checkout (a directory holding its C(Cargo.toml), inside a git work tree).
    type: path
    required: true
  toolchain:
    description:
      - The rustup toolchain, used as C(cargo +TOOLCHAIN); a toolchain that is not installed is an error naming it.
    type: str
    default: stable
  output:
    description: Absolute output directory; it must be outside the checkout. Created when missing.
    type: path
    required: true
  features:
    description: Engine features the consumer enables (C(default-features = false)).
    type: list
    elements: str
    default: [rdma]
  fixture:
    description: Path of the installed-host fixture inside the package; it holds C(Cargo.toml.in) and C(Cargo.lock).
    type: str
    default: tests/hardware/rdma_host
  allow_dirty:
    description:
      - Build from a dirty checkout, for local diagnosis only. The manifest then has C(dirty) set to true
        and lists the paths; the controller check rejects it unless it is also allowed there.
    type: bool
    default: false
  observers_dir:
    description:
      - The collection's C(observers/) directory (with its Makefile). When omitted, the observers
        are recorded as absent.
    type: path
attributes:
  check_mode:
    support: full
    details:
      - Checks the checkout and the toolchain, and reports whether a build is due and its steps (RV(plan)).
  diff_mode:
    support: none
requirements:
  - C(git), C(rustup)-managed C(cargo) with C(rustfmt) and C(clippy), and C(ldd) on the controller.
  - C(make), a C compiler and the rdma-core headers to build the native observers (optional).
notes:
  - No network access is used (C(--offline --locked)).
seealso:
  - module: orbite.qualification.installation_check
    description: Checks the manifest on the controller and the deployed binary on each node.
"""

EXAMPLES = r"""
- name: Build with the stable toolchain
  orbite.qualification.build_installed:
    source: /srv/orbite
    toolchain: stable
    output: /var/tmp/orbite-installed/stable
    observers_dir: "{{ playbook_dir }}/../observers"
  register: build

- name: Build from a dirty checkout (local diagnosis only, marked in the manifest)
  orbite.qualification.build_installed:
    source: /srv/orbite
    output: /var/tmp/orbite-installed/diag
    allow_dirty: true
"""

RETURN = r"""
manifest_path:
  description: Path of the manifest (written, or unchanged when nothing was due).
  returned: always
  type: str
  sample: /var/tmp/orbite-installed/stable/manifest.json
manifest:
  description:
    - The manifest's content (not returned in check mode when a build is due).
    - RV(orbite.qualification.installation_check#module:manifest) shows a full one.
  returned: when a build ran or the output was up to date
  type: dict
  sample:
    schema: orbite.installation-manifest
    version: 1
    protocol: orbite-installed-host-v4
    commit: 3f2c9a1e5b7d4c6f8a0b1c2d3e4f5a6b7c8d9e0f
    dirty: false
    toolchain_name: stable
    features: [rdma]
commit:
  description: The checkout's HEAD commit.
  returned: always
  type: str
  sample: 3f2c9a1e5b7d4c6f8a0b1c2d3e4f5a6b7c8d9e0f
dirty_paths:
  description: Uncommitted paths, as C(git status --porcelain) entries (only non-empty with O(allow_dirty)).
  returned: always
  type: list
  elements: str
  sample: [" M src/lib.rs", "?? notes.txt"]
rebuild_reason:
  description: Why a build was due, or null when the output was up to date.
  returned: always
  type: str
  sample: inputs changed (commit, dirty files, toolchain, features, fixture or observers)
observers_absent_reason:
  description: Why the observers are not built, or null when they are.
  returned: always
  type: str
  sample: "infiniband/verbs.h not found (rdma-core headers: Debian libibverbs-dev)"
plan:
  description: The steps a build would run.
  returned: check mode, when a build is due
  type: list
  elements: str
  sample:
    - cargo +stable package --offline --locked (/srv/orbite)
    - extract the .crate into /var/tmp/orbite-installed/stable/package
    - copy the fixture tests/hardware/rdma_host into /var/tmp/orbite-installed/stable/consumer
    - cargo fmt --check, cargo clippy -D warnings, cargo build --release (offline, locked)
    - install the binary into /var/tmp/orbite-installed/stable/installed/bin
    - make -C /srv/collection/observers OUT=/var/tmp/orbite-installed/stable/observers
    - write /var/tmp/orbite-installed/stable/manifest.json
steps:
  description: Each build step with its duration in seconds (C(name), C(seconds)).
  returned: always
  type: list
  elements: dict
  sample: [{name: metadata, seconds: 0.412}, {name: package, seconds: 3.871}, {name: build, seconds: 41.205}]
code:
  description: Stable failure code of the build (C(installation.error)) or of the manifest check.
  returned: failure
  type: str
  sample: installation.error
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._build.artifact import (
    BuildRequest,
    build,
)
from ansible_collections.orbite.qualification.plugins.module_utils._build.manifest import (
    InstallationError,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "source": {"type": "path", "required": True},
            "toolchain": {"type": "str", "default": "stable"},
            "output": {"type": "path", "required": True},
            "features": {"type": "list", "elements": "str", "default": ["rdma"]},
            "fixture": {"type": "str", "default": "tests/hardware/rdma_host"},
            "allow_dirty": {"type": "bool", "default": False},
            "observers_dir": {"type": "path"},
        },
        supports_check_mode=True,
    )
    try:
        request = BuildRequest(**module.params)
        result = build(request, check_mode=module.check_mode)
    except InstallationError as error:
        fail_from(module, error)
    module.exit_json(**result)


if __name__ == "__main__":
    main()

#!/usr/bin/python
# Copyright: OrbiTE qualification team
# Apache License 2.0 (see galaxy.yml)

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
  - OrbiTE qualification team
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
    details: Checks the checkout and the toolchain, and reports whether a build is due and its steps.
  diff_mode:
    support: none
notes:
  - Needs C(git), C(rustup)-managed C(cargo) with C(rustfmt) and C(clippy), and C(ldd). No network
    access is used (C(--offline --locked)).
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
manifest:
  description: The manifest's content (not returned in check mode when a build is due).
  returned: when a build ran or the output was up to date
  type: dict
commit:
  description: The checkout's HEAD commit.
  returned: always
  type: str
dirty_paths:
  description: Uncommitted paths, as C(git status --porcelain) entries (only non-empty with O(allow_dirty)).
  returned: always
  type: list
  elements: str
rebuild_reason:
  description: Why a build was due, or null when the output was up to date.
  returned: always
  type: str
observers_absent_reason:
  description: Why the observers are not built, or null when they are.
  returned: always
  type: str
plan:
  description: The steps a build would run.
  returned: check mode, when a build is due
  type: list
  elements: str
steps:
  description: Each build step with its duration in seconds (C(name), C(seconds)).
  returned: always
  type: list
  elements: dict
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

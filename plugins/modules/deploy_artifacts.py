#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

DOCUMENTATION = r"""
---
module: deploy_artifacts
short_description: Place the run's pinned executables on a node in one call, each checked against its pin
version_added: 0.2.0
description:
  - The collection's action plugin reads each O(files[].src) on the controller and sends its bytes with the
    task (one round trip for every file, meant for the run's small executables - the simulated runner's
    zipapp, the lab's loopback verbs provider, the observers); on the node each file is written atomically to
    O(files[].dest) (mode 0600, missing directories 0700), unless the regular file there already has the
    pinned sha256, and then hashed where it lies.
  - A file whose sha256 on the node is not its O(files[].sha256) (the run plan's pin) fails the task naming
    it, both hashes and its source, so a build that is not the run's never runs; the runner module and the
    node's supervisor check the bytes they load again.
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.platform_linux
options:
  files:
    description: The files to place.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: What the file is (C(runner), C(verbs_library), an observer's tool name), for messages.
        type: str
        required: true
      src:
        description: The file on the controller (read by the action plugin, at most 64 MiB).
        type: path
        required: true
      dest:
        description: Absolute path on the node.
        type: path
        required: true
      sha256:
        description: The sha256 the run's plan pins for it (64 lower-case hex digits).
        type: str
        required: true
      content:
        description: The file's bytes, base64 (set by the action plugin from O(files[].src); not logged).
        type: str
attributes:
  check_mode:
    support: full
    details:
      - Says which files would be written (RV(files[].changed)); writes nothing.
  diff_mode:
    support: none
seealso:
  - module: orbite.qualification.runner
    description: Runs the deployed runner with the deployed libraries, checking their hashes again.
"""

EXAMPLES = r"""
- name: Deploy the simulated runner and the verbs provider once per run
  orbite.qualification.deploy_artifacts:
    files:
      - {name: runner, src: "{{ orbite_artifacts.runner.path }}", dest: /var/tmp/orbite/ra-1/orbite-sim-runner.pyz,
         sha256: "{{ orbite_artifacts.runner.sha256 }}"}
      - {name: verbs_library, src: "{{ orbite_artifacts.verbs_library.path }}",
         dest: /var/tmp/orbite/ra-1/native/libibverbs.so.1, sha256: "{{ orbite_artifacts.verbs_library.sha256 }}"}
"""

RETURN = r"""
files:
  description: Per file C(name), C(dest), C(sha256) (as found on the node) and C(changed) (written by this task).
  returned: success
  type: list
  elements: dict
  contains:
    name:
      description: The file's name in the plan (C(runner), C(verbs_library), an observer's tool).
      type: str
    dest:
      description: Where it is on the node.
      type: str
    sha256:
      description: The SHA-256 of the bytes on the node (the plan's pin).
      type: str
    changed:
      description: Whether this task wrote it (false when the node already held those bytes).
      type: bool
  sample: [{name: runner, dest: /var/tmp/orbite/ra-1/orbite-sim-runner.pyz, changed: true,
            sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08}]
code:
  description: >-
    Stable failure code (C(deploy.mismatch), C(deploy.invalid), C(deploy.unpinned) (a file with neither
    O(files[].src) nor O(files[].sha256): the run pins none), C(os.<error>)).
  returned: failure
  type: str
  sample: deploy.mismatch
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._node_steps.deploy_artifacts import SPEC, run


def main():
    run(AnsibleModule(supports_check_mode=True, **SPEC))


if __name__ == "__main__":
    main()

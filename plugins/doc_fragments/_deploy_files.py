# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Private to this collection: the files a node step places, deploy_artifacts' O(files) (FILES) and
node_supervisor's O(deploy) (DEPLOY): one entry's suboptions, under each module's option name."""

_ENTRY = r"""
    type: list
    elements: dict
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
        description: The file's bytes, base64 (set by the action plugin from the entry's C(src); not logged).
        type: str
"""


class ModuleDocFragment:
    FILES = "options:\n  files:" + _ENTRY
    DEPLOY = "options:\n  deploy:" + _ENTRY

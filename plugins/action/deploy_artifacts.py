# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Action plugin for orbite.qualification.deploy_artifacts: the files' bytes travel with the module call
(plugin_utils/_file_contents.py), one node step (plugin_utils/_node_step.py) for every file."""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._node_steps import deploy_artifacts as job
from ansible_collections.orbite.qualification.plugins.plugin_utils._file_contents import with_contents
from ansible_collections.orbite.qualification.plugins.plugin_utils._node_step import NodeStepAction


class ActionModule(NodeStepAction):
    JOB = job

    def prepare(self, args):
        files, failure = with_contents(args.get("files"), "files")
        return dict(args, files=files), failure

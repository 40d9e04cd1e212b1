# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Action plugin for orbite.qualification.node_supervisor: the module's job in one lean Python on the node; a start's
``deploy`` files travel with it (plugin_utils/_file_contents.py)."""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._node_steps import node_supervisor as job
from ansible_collections.orbite.qualification.plugins.plugin_utils._file_contents import with_contents
from ansible_collections.orbite.qualification.plugins.plugin_utils._node_step import NodeStepAction


class ActionModule(NodeStepAction):
    JOB = job

    def prepare(self, args):
        if args.get("deploy") is None:
            return args, None
        files, failure = with_contents(args["deploy"], "deploy")
        return dict(args, deploy=files), failure

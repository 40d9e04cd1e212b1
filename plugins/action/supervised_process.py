# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Action plugin for orbite.qualification.supervised_process: the module's job (launch, wait for or signal a
supervised child) in one lean Python on the node (plugin_utils/_node_step.py), not an AnsiballZ module: the restart
flow calls it in every generation."""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._node_steps import supervised_process as job
from ansible_collections.orbite.qualification.plugins.plugin_utils._node_step import NodeStepAction


class ActionModule(NodeStepAction):
    JOB = job

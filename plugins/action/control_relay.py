# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Action plugin for orbite.qualification.control_relay: the module's job (start, await or stop the control relay)
in one lean Python on the node (plugin_utils/_node_step.py), not an AnsiballZ module: the restart flow calls it in
every generation."""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._node_steps import control_relay as job
from ansible_collections.orbite.qualification.plugins.plugin_utils._node_step import NodeStepAction


class ActionModule(NodeStepAction):
    JOB = job

# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Action plugin for orbite.qualification.runner: its job on the node (a lean node step), and its progress line.

With ``poll`` (``state: finished``, or ``state: started`` making the first wait) the module returns where
the runner is after each short wait (``progress_line``); the role repeats the call with until/retries, and
this prints one line per call, so a stuck round is visible within seconds (the default callback shows only
"RETRYING" then).
"""

from __future__ import annotations

from ansible.utils.display import Display
from ansible_collections.orbite.qualification.plugins.module_utils._node_steps import runner as job
from ansible_collections.orbite.qualification.plugins.plugin_utils._node_step import NodeStepAction

display = Display()


class ActionModule(NodeStepAction):
    JOB = job
    _supports_async = True  # as a module (plugin_utils/_node_step.py)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        line = result.get("progress_line")
        if isinstance(line, str) and line:
            host = (task_vars or {}).get("inventory_hostname", "")
            display.display(f"[{host}] {line}")
        return result

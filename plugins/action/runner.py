# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Action plugin for orbite.qualification.runner: its job on the node (a lean node step), and the polled wait.

With ``poll`` (``state: finished``, or ``state: started`` making the first wait) the module returns where the
runner is after each short wait (``progress_line``, ``finished`` false while it runs). This plugin calls the wait
again itself until the runner exited or a call failed, printing each call's line: one task result, ok or failed
once, with a progress line every ``poll`` seconds, and no until/retries whose every retry a callback (AWX's
included) shows as ``FAILED - RETRYING``.
"""

from __future__ import annotations

from ansible.utils.display import Display
from ansible.utils.vars import merge_hash
from ansible_collections.orbite.qualification.plugins.module_utils._node_steps import runner as job
from ansible_collections.orbite.qualification.plugins.plugin_utils._node_step import NodeStepAction

display = Display()
# What the next polled wait of the same runner takes from the task's arguments (its child ID from the result).
WAIT_ARGS = ("supervisor_run_dir", "output_dir", "timeout", "poll", "label")
# What each polled wait returns anew.
POLLED = ("finished", "progress", "progress_line", "child", "ledger")


class ActionModule(NodeStepAction):
    JOB = job
    _supports_async = True  # as a module (plugin_utils/_node_step.py)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        host = (task_vars or {}).get("inventory_hostname", "")
        self._show(host, result)
        if not self._still_running(result):
            return result
        args = {name: self._task.args[name] for name in WAIT_ARGS if name in self._task.args}
        args.update(state="finished", child_id=result["child"]["child_id"])
        # The start's own facts (its case file, output, stripped environment) stay; each wait's replace the rest.
        start = {key: value for key, value in result.items() if key not in POLLED}
        while self._still_running(result):
            step = self.run_step(task_vars, args)
            self._show(host, step)
            result = merge_hash(start, step)
        # The task's own call: its arguments, and changed when it started the runner.
        result["changed"] = start.get("changed", False) or result.get("changed", False)
        if "invocation" in start:
            result["invocation"] = start["invocation"]
        return result

    def _still_running(self, result):
        """Whether the call was a polled wait that returned with the runner still running."""
        return (bool(self._task.args.get("poll")) and not result.get("failed") and not self._task.check_mode
                and result.get("finished") is False and isinstance(result.get("child"), dict))

    @staticmethod
    def _show(host, result):
        line = result.get("progress_line")
        if isinstance(line, str) and line:
            display.display(f"[{host}] {line}")

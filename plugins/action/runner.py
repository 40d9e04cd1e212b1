# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Action plugin for orbite.qualification.runner: runs the module, and prints its progress line.

With ``poll`` (``state: finished``, or ``state: started`` making the first wait) the module returns where
the runner is after each short wait (``progress_line``); the role repeats the call with until/retries, and
this prints one line per call, so a stuck round is visible within seconds (the default callback shows only
"RETRYING" then).
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible.utils.vars import merge_hash

display = Display()


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # not used since Ansible 2.5
        # As the normal action plugin runs a module (async included); then the progress line.
        wrap_async = self._task.async_val and not self._connection.has_native_async
        result = merge_hash(result, self._execute_module(task_vars=task_vars, wrap_async=wrap_async))
        if not wrap_async:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        line = result.get("progress_line")
        if isinstance(line, str) and line:
            host = (task_vars or {}).get("inventory_hostname", "")
            display.display(f"[{host}] {line}")
        return result

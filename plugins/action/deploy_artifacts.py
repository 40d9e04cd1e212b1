# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Action plugin for orbite.qualification.deploy_artifacts: the files' bytes travel with the module call.

Each ``files[].src`` is read here, on the controller (a regular file, at most 64 MiB), and handed to the
module as base64 (``content``, never logged), so every file of the run's deployment costs one module call
on the node instead of a stat, a transfer and a copy per file, and a hash per file after.
"""

from __future__ import annotations

import base64

from ansible.plugins.action import ActionBase
from ansible.utils.vars import merge_hash
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import read_regular_bytes

LIMIT = 64 << 20


class ActionModule(ActionBase):
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # not used since Ansible 2.5
        files = self._task.args.get("files")
        if not isinstance(files, list):
            result.update(failed=True, code="deploy.invalid", msg=f"files={files!r}: must be a list of files")
            return result
        sent = []
        for index, item in enumerate(files):
            src = item.get("src") if isinstance(item, dict) else None
            try:
                data = read_regular_bytes(src, LIMIT)
            except (OSError, OrbiteError, TypeError) as error:
                result.update(failed=True, code="deploy.invalid",
                              msg=f"files[{index}].src={src!r}: cannot be read on the controller ({error})")
                return result
            sent.append(dict(item, content=base64.b64encode(data).decode("ascii")))
        args = dict(self._task.args, files=sent)
        result = merge_hash(result, self._execute_module(module_name="orbite.qualification.deploy_artifacts",
                                                         module_args=args, task_vars=task_vars))
        self._remove_tmp_path(self._connection._shell.tmpdir)
        return result

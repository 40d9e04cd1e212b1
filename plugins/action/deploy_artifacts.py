# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Action plugin for orbite.qualification.deploy_artifacts: the files' bytes travel with the module call.

Each ``files[].src`` is read here, on the controller (a regular file, at most 64 MiB), and handed to the
module as base64 (``content``, never logged), so every file of the run's deployment costs one node step
(plugin_utils/_node_step.py) instead of a stat, a transfer and a copy per file, and a hash per file after.
"""

from __future__ import annotations

import base64

from ansible.utils.vars import merge_hash
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import read_regular_bytes
from ansible_collections.orbite.qualification.plugins.module_utils._node_steps import deploy_artifacts as job
from ansible_collections.orbite.qualification.plugins.plugin_utils._node_step import NodeStepAction

LIMIT = 64 << 20


class ActionModule(NodeStepAction):
    JOB = job

    def run(self, tmp=None, task_vars=None):
        result = super(NodeStepAction, self).run(tmp, task_vars)  # ActionBase's checks; the step is below
        del tmp  # not used since Ansible 2.5
        files = self._task.args.get("files")
        if not isinstance(files, list):
            result.update(failed=True, code="deploy.invalid", msg=f"files={files!r}: must be a list of files")
            return result
        sent = []
        for index, item in enumerate(files):
            src = item.get("src") if isinstance(item, dict) else None
            if isinstance(item, dict) and src is None and item.get("sha256") is None:
                # The role's list names each file the case needs; null where the run's artifacts pin none.
                result.update(failed=True, code="deploy.unpinned",
                              msg=f"files[{index}] ({item.get('name')}): the run's artifacts pin no such file "
                                  "(src and sha256 null); the simulated lab's native build has the verbs provider "
                                  "and every observer")
                return result
            try:
                data = read_regular_bytes(src, LIMIT)
            except (OSError, OrbiteError, TypeError) as error:
                result.update(failed=True, code="deploy.invalid",
                              msg=f"files[{index}].src={src!r}: cannot be read on the controller ({error})")
                return result
            sent.append(dict(item, content=base64.b64encode(data).decode("ascii")))
        args = dict(self._task.args, files=sent)
        return merge_hash(result, self.run_step(task_vars, args))

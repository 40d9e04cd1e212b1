# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Action plugin for orbite.qualification.result_check: the verifier runs in the task's worker on the controller.

No module transfer and no new Python: the verifier is CPU-bound and reads only the controller's run directory,
so the worker Ansible forks for this task is as good a process as a module's, and its end frees what the
verification held. The job is module_utils/_controller/result_check.py, shared with the module's main().
"""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._controller import result_check as job
from ansible_collections.orbite.qualification.plugins.plugin_utils._in_process import InProcessAction


class ActionModule(InProcessAction):
    JOB = job

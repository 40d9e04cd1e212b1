# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Action plugin for orbite.qualification.run_plan: the module's job in the task's worker on the controller."""

from __future__ import annotations

from ansible_collections.orbite.qualification.plugins.module_utils._controller import run_plan as job
from ansible_collections.orbite.qualification.plugins.plugin_utils._in_process import InProcessAction


class ActionModule(InProcessAction):
    JOB = job

# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The deploy_artifacts module's job on the node: write each pinned file and check its hash
(plugins/modules/deploy_artifacts.py; the action plugin sends the bytes)."""

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._run.deploy import (
    DeployError,
    DeployMismatch,
    deploy,
)

SPEC = {
    "argument_spec": {
        "files": {"type": "list", "elements": "dict", "required": True, "options": {
            "name": {"type": "str", "required": True},
            "src": {"type": "path", "required": True},
            "dest": {"type": "path", "required": True},
            "sha256": {"type": "str", "required": True},
            "content": {"type": "str", "no_log": True},
        }},
    },
}


def run(module):
    try:
        placed = deploy(module.params["files"], check_mode=module.check_mode)
    except DeployMismatch as error:  # the files in place so far go back with it (details: placed)
        fail_from(module, error, changed=True)
    except (DeployError, OSError) as error:
        fail_from(module, error, prefix="the run's executables could not be deployed")
    module.exit_json(changed=any(f["changed"] for f in placed), files=placed)

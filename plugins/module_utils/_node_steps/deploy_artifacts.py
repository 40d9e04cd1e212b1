# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The deploy_artifacts module's job on the node: write each pinned file and check its hash
(plugins/modules/deploy_artifacts.py; the action plugin sends the bytes). node_supervisor's start deploys with it
too (its ``deploy`` option: the case's files, then the supervisor, in one node step)."""

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._run.deploy import (
    DeployError,
    DeployMismatch,
    deploy,
)

# One file to place: the options of deploy_artifacts' files and of node_supervisor's deploy.
FILE_OPTIONS = {
    "name": {"type": "str", "required": True},
    "src": {"type": "path", "required": True},
    "dest": {"type": "path", "required": True},
    "sha256": {"type": "str", "required": True},
    "content": {"type": "str", "no_log": True},
}

SPEC = {
    "argument_spec": {
        "files": {"type": "list", "elements": "dict", "required": True, "options": FILE_OPTIONS},
    },
}


def deploy_files(module, files, option="files"):
    """The placed files ({name, dest, sha256, changed} each), or the module failed naming what is not the run's."""
    try:
        return deploy(files, check_mode=module.check_mode, option=option)
    except DeployMismatch as error:  # the files in place so far go back with it (details: placed)
        fail_from(module, error, changed=True)
    except (DeployError, OSError) as error:
        fail_from(module, error, prefix="the run's executables could not be deployed")
    return None  # not reached: fail_from exits


def run(module):
    placed = deploy_files(module, module.params["files"])
    module.exit_json(changed=any(f["changed"] for f in placed), files=placed)

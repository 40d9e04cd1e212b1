# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The runner module's job: launch an engine runner under the node's supervisor, or wait for it
(plugins/modules/runner.py)."""

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._run.launch import (
    RunnerError,
    finish,
    start,
    wait_restart_point,
)

_STARTED_REQUIRES = ("runner_argv", "role", "run_id", "profile", "registration_id")

SPEC = {
    "argument_spec": {
        "state": {"type": "str", "choices": ["started", "finished", "restart_point"], "default": "started"},
        "supervisor_run_dir": {"type": "path", "required": True},
        "runner_argv": {"type": "list", "elements": "str"},
        "runner_sha256": {"type": "str"},
        "output_dir": {"type": "path", "required": True},
        "role": {"type": "str", "choices": ["source", "requester"]},
        "run_id": {"type": "str"},
        "generation": {"type": "int", "default": 1},
        "profile": {"type": "dict"},
        "root": {"type": "path", "default": "/"},
        "rails": {"type": "list", "elements": "dict", "options": {
            "device": {"type": "str", "required": True},
            "port": {"type": "int", "required": True},
            "gid_index": {"type": "int", "required": True},
        }},
        "discovery": {"type": "dict", "options": {
            "whitelist": {"type": "list", "elements": "str", "default": []},
            "blacklist": {"type": "list", "elements": "str", "default": []},
        }},
        "service_address": {"type": "str"},
        "peer_address": {"type": "str"},
        "registration_id": {"type": "str"},
        "peer_registration_id": {"type": "str"},
        "observers": {"type": "list", "elements": "str", "default": []},
        "verbs_library": {"type": "dict", "options": {
            "path": {"type": "path", "required": True},
            "sha256": {"type": "str", "required": True},
        }},
        "ld_preload": {"type": "list", "elements": "dict", "default": [], "options": {
            "path": {"type": "path", "required": True},
            "sha256": {"type": "str", "required": True},
        }},
        "env": {"type": "dict", "default": {}},
        "defects": {"type": "list", "elements": "str", "default": []},
        "ready_timeout": {"type": "float", "default": 60},
        "child_id": {"type": "str"},
        "pid": {"type": "int"},
        "timeout": {"type": "float", "default": 600},
        "poll": {"type": "float"},
        "label": {"type": "str"},
    },
    "required_if": [("state", "started", _STARTED_REQUIRES), ("state", "finished", ("child_id",)),
                    ("state", "restart_point", ("child_id", "pid"))],
}


def run(module):
    params = module.params
    try:
        if params["state"] == "started":
            result = start(params, check_mode=module.check_mode)
        elif module.check_mode:
            result = {"changed": False}
        elif params["state"] == "restart_point":
            result = wait_restart_point(params)
        else:
            result = finish(params)
    except RunnerError as error:
        fail_from(module, error)
    except (OSError, OrbiteError) as error:
        fail_from(module, error, prefix=f"runner {params['state']}")
    module.exit_json(**result)

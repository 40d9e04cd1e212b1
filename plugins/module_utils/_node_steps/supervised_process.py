# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The supervised_process module's job: launch, wait for or signal a child of the node's lock supervisor
(plugins/modules/supervised_process.py)."""

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import fail_from, quote
from ansible_collections.orbite.qualification.plugins.module_utils._node.client import (
    SupervisorClient,
    SupervisorError,
    SupervisorInputError,
    SupervisorRequestError,
    default_run_dir,
)

# Options each action needs; required_if is keyed on the option name "action", never on its value.
_NEEDS = {"launch": ("argv",), "wait": ("child_id",), "signal": ("child_id", "pid", "start_time")}

SPEC = {
    "argument_spec": {
        "action": {"type": "str", "choices": ["launch", "wait", "signal"], "required": True},
        "run_id": {"type": "str"},
        "run_dir": {"type": "path"},
        "root": {"type": "path", "default": "/"},
        "argv": {"type": "list", "elements": "str"},
        "env": {"type": "dict", "default": {}},
        "cwd": {"type": "path"},
        "ld_preload": {"type": "list", "elements": "dict", "default": [], "options": {
            "path": {"type": "path", "required": True},
            "sha256": {"type": "str", "required": True},
        }},
        "exe_sha256": {"type": "str"},
        "argv_pins": {"type": "dict"},
        "env_pins": {"type": "dict"},
        "record_json": {"type": "list", "elements": "int"},
        "stdout_path": {"type": "path"},
        "stderr_path": {"type": "path"},
        "child_id": {"type": "str"},
        "pid": {"type": "int"},
        "start_time": {"type": "int"},
        "signal": {"type": "str", "default": "SIGKILL"},
        "reap": {"type": "bool", "default": True},
        "timeout": {"type": "float", "default": 30},
    },
    "required_one_of": [("run_id", "run_dir")],
    "required_if": [("action", value, needs) for value, needs in _NEEDS.items()],
}


def _argv_pins(pins):
    """argv_pins as the client takes them: YAML keys are text ("1"), the client's are argv indexes."""
    if not pins:
        return None
    out = {}
    for key, sha in pins.items():
        text = str(key)
        if not (text.isascii() and text.isdigit() and len(text) <= 4):
            raise SupervisorInputError(f"argv_pins key {quote(key)}: must be an argv index (0, 1, 2, ...)")
        out[int(text)] = sha
    return out


def run(module):
    p = module.params
    action = p["action"]
    try:
        client = SupervisorClient(p["run_dir"] or default_run_dir(p["root"], p["run_id"]))
        if action == "wait":
            child = client.wait(p["child_id"], p["timeout"])
            timed_out = child.pop("timed_out")
            module.exit_json(changed=False, child=child, timed_out=timed_out)
        if module.check_mode:
            client.status()  # the supervisor must at least be there
            module.exit_json(changed=True, skipped_reason="check mode")
        if action == "launch":
            env = {str(k): str(v) for k, v in p["env"].items()}
            child = client.launch(p["argv"], env=env, cwd=p["cwd"], ld_preload=p["ld_preload"],
                                  stdout_path=p["stdout_path"], stderr_path=p["stderr_path"],
                                  exe_sha256=p["exe_sha256"], argv_pins=_argv_pins(p["argv_pins"]),
                                  env_pins=p["env_pins"], record_json=p["record_json"])
            stripped, pinned = child.pop("env_stripped"), child.pop("pinned")
            module.exit_json(changed=True, child=child, env_stripped=stripped, pinned=pinned)
        child = client.signal(p["child_id"], p["pid"], p["start_time"], p["signal"], reap=p["reap"],
                              timeout=p["timeout"])
        module.exit_json(changed=True, child=child)
    except SupervisorRequestError as exc:
        fail_from(module, exc, prefix=f"supervisor refused {action}", error=exc.code, child=exc.response.get("child"))
    except SupervisorError as exc:
        fail_from(module, exc, prefix=action, error=type(exc).__name__)

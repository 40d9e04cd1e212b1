# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The control_relay module's job: start, await or stop the control relay of installed-interruption on the source
node (plugins/modules/control_relay.py; the relay itself: module_utils/_run/relay.py)."""

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._node.client import SupervisorClient
from ansible_collections.orbite.qualification.plugins.module_utils._run import relay

SPEC = {
    "argument_spec": {
        "state": {"type": "str", "choices": ["started", "holding", "stopped"], "required": True},
        "state_dir": {"type": "path", "required": True},
        "listen": {"type": "str"},
        "upstream": {"type": "str"},
        "run_id": {"type": "str"},
        "hold_after_round": {"type": "int", "default": 3},
        "lease": {"type": "float", "default": 3600},
        "defects": {"type": "list", "elements": "str", "choices": ["leak_grant"], "default": []},
        "held": {"type": "int"},
        "timeout": {"type": "float", "default": 300},
        "python": {"type": "path"},
        "supervisor_run_dir": {"type": "path"},
    },
    "required_if": [("state", "started", ("listen", "upstream", "run_id")), ("state", "holding", ("held",))],
}


def run(module):
    params = module.params
    try:
        result = _state(module, params)
    except (relay.RelayError, OrbiteError, OSError, ValueError) as exc:
        fail_from(module, exc, prefix=f"control_relay {params['state']}", state_dir=params["state_dir"])
    module.exit_json(**result)


def _state(module, params):
    state, state_dir = params["state"], params["state_dir"]
    if state == "started":
        watch = None
        if params["supervisor_run_dir"]:
            record = SupervisorClient(params["supervisor_run_dir"]).lease()
            if not record:
                raise relay.RelayError(f"supervisor_run_dir = {params['supervisor_run_dir']!r}: no live supervisor")
            watch = {"pid": record.get("pid"), "start_time": record.get("start_time")}
        cfg = relay.check_config({"listen": params["listen"], "upstream": params["upstream"], "state_dir": state_dir,
                                  "hold_after_round": params["hold_after_round"], "lease_s": params["lease"],
                                  "defects": params["defects"], "run_id": params["run_id"], "watch": watch})
        if module.check_mode:
            return {"changed": True}
        ready = relay.start_relay(cfg, python=params["python"], timeout=params["timeout"])
        return {"changed": True, "ready": ready}
    if state == "holding":
        if params["held"] < 0:
            raise relay.RelayError(f"held = {params['held']}: must be >= 0")
        return {"changed": False, "status": relay.wait_held(state_dir, params["held"], params["timeout"])}
    done = relay.stop_relay(state_dir, timeout=params["timeout"], check_mode=module.check_mode)
    return dict(done, changed=done["was_running"])

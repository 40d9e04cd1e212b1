# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The run_plan module's job: write a run's plan and, when asked, its first verdict (plugins/modules/run_plan.py)."""

import os

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._run.plan import (
    RunPlanError,
    case_ids,
    cast_names,
    write_plan,
)
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run

SPEC = {
    "argument_spec": {
        "run_dir": {"type": "path", "required": True},
        "run_id": {"type": "str", "required": True},
        "cases": {"type": "list", "elements": "dict", "required": True, "options": {
            "id": {"type": "str", "required": True},
            "profile": {"type": "dict", "required": True},
            "workload": {"type": "dict"},
            "defects": {"type": "list", "elements": "str"},
            "leave_out": {"type": "list", "elements": "str"},
        }},
        "allow_dirty": {"type": "bool", "default": False},
        "runner_kind": {"type": "str", "choices": ["sim", "native"], "default": "sim"},
        "defects": {"type": "raw", "default": []},
        "timeouts": {"type": "dict", "default": {}},
        "rails": {"type": "dict"},
        "service_addresses": {"type": "dict"},
        "case_hosts": {"type": "dict"},
        "schedule": {"type": "dict"},
        "artifacts": {"type": "dict", "options": {
            "runner": {"type": "dict", "required": True, "options": {
                "kind": {"type": "str", "required": True, "choices": ["sim", "native"]},
                "path": {"type": "path", "required": True},
                "sha256": {"type": "str", "required": True},
            }},
            "verbs_library": {"type": "dict", "options": {
                "path": {"type": "path", "required": True},
                "sha256": {"type": "str", "required": True},
            }},
            "observers": {"type": "dict", "default": {}},
        }},
        "verdict": {"type": "bool", "default": False},
        "origin": {"type": "dict", "options": {
            "run_id": {"type": "str", "required": True},
            "run_dir": {"type": "path", "required": True},
            "cases": {"type": "list", "elements": "str", "required": True},
        }},
    },
}


def run(module):
    params = module.params
    try:
        # Named as the play names it (roles/preflight passes orbite_runner_defects), before any node is touched.
        defects = cast_names("defects (orbite_runner_defects)", params["defects"])
        changed = write_plan(params["run_dir"], params["run_id"], params["cases"], check_mode=module.check_mode,
                             allow_dirty=params["allow_dirty"], runner_kind=params["runner_kind"],
                             defects=defects, artifacts=params["artifacts"], origin=params["origin"],
                             timeouts=params["timeouts"], rails=params["rails"],
                             service_addresses=params["service_addresses"], case_hosts=params["case_hosts"],
                             schedule=params["schedule"])
    except RunPlanError as error:
        fail_from(module, error)
    except OSError as error:
        fail_from(module, error, prefix=f"run_dir={params['run_dir']}: cannot be written")
    verdict = None
    if params["verdict"] and not module.check_mode:
        first = verify_run(params["run_dir"], cases=[], partial=True)
        if first.get("write_error"):
            module.warn(f"the run's first verdict (INCOMPLETE) could not be written: {first['write_error']}")
        else:
            verdict = os.path.join(params["run_dir"], "verdict.json")
    module.exit_json(changed=changed, verdict=verdict, run_json=os.path.join(params["run_dir"], "run.json"),
                     cases={case["id"]: case_ids(params["run_id"], case["id"]) for case in params["cases"]})

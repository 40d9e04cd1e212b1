# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The fleet_plan module's job: plan a fleet's pairs and waves, write each named pair's run plan and the
fleet plan (plugins/modules/fleet_plan.py)."""


from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._fleet import run as fleet_run
from ansible_collections.orbite.qualification.plugins.module_utils._fleet.plan import plan_fleet
from ansible_collections.orbite.qualification.plugins.module_utils._run.plan import RunPlanError, write_plan


SPEC = {
    "argument_spec": {
        "hosts": {"type": "list", "elements": "str", "required": True},
        "fleet_hosts": {"type": "list", "elements": "str"},
        "pairing": {"type": "str", "choices": ["all", "ring", "list"], "default": "ring"},
        "pairs": {"type": "list", "elements": "raw"},
        "fleet_id": {"type": "str", "required": True},
        "fleet_dir": {"type": "path", "required": True},
        "slice": {"type": "str"},
        "cases": {"type": "list", "elements": "str", "required": True},
        "runs": {"type": "dict", "default": {}},
        "runner_kind": {"type": "str", "choices": ["sim", "native"], "default": "sim"},
        "allow_dirty": {"type": "bool", "default": False},
        "defects": {"type": "list", "elements": "str", "default": []},
        "timeouts": {"type": "dict", "default": {}},
        "rails": {"type": "dict"},
        "service_addresses": {"type": "dict"},
    },
}


def run(module):
    params = module.params
    pair = None  # the pair whose run.json is being written, named in a failure
    try:
        plan = plan_fleet(params["hosts"], params["pairing"], params["pairs"], params["fleet_hosts"],
                          fleet_id=params["fleet_id"])
        fleet_run.attach_runs(plan, params["fleet_dir"])
        for pair in [] if module.check_mode else [p for p in plan["pairs"] if p["id"] in params["runs"]]:
            given = params["runs"][pair["id"]] or {}
            write_plan(pair["run_dir"], pair["run_id"], given.get("cases") or [], allow_dirty=params["allow_dirty"],
                       runner_kind=params["runner_kind"], defects=params["defects"],
                       artifacts=given.get("artifacts") or None, timeouts=params["timeouts"],
                       rails=params["rails"], service_addresses=params["service_addresses"],
                       case_hosts=given.get("case_hosts") or None, schedule=given.get("schedule"))
        pair = None
        out, doc = fleet_run.start(params["fleet_dir"], plan, params["cases"], params["slice"] or None,
                                   check_mode=module.check_mode)
    except RunPlanError as error:
        fail_from(module, error, prefix=f"runs[{pair['id']}] (run_dir={pair['run_dir']})" if pair else "")
    except OrbiteError as error:
        fail_from(module, error)
    except OSError as error:
        fail_from(module, error, prefix=f"runs[{pair['id']}]: run_dir={pair['run_dir']} cannot be written" if pair
                  else f"writing the fleet plan under {params['fleet_dir']}")
    module.exit_json(changed=not module.check_mode, output_dir=out, pairs=doc["pairs"], waves=doc["waves"],
                     slots=doc["slots"], elsewhere=doc["elsewhere"], max_degree=doc["max_degree"])

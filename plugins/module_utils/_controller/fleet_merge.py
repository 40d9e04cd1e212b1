# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The fleet_merge module's job: merge a sliced fleet job's verdicts into one (plugins/modules/fleet_merge.py)."""

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._fleet import run as fleet_run
from ansible_collections.orbite.qualification.plugins.module_utils._fleet.plan import plan_fleet


SPEC = {
    "argument_spec": {
        "fleet_dir": {"type": "path", "required": True},
        "fleet_id": {"type": "str", "required": True},
        "fleet_hosts": {"type": "list", "elements": "str", "required": True},
        "pairing": {"type": "str", "choices": ["all", "ring", "list"], "default": "ring"},
        "pairs": {"type": "list", "elements": "raw"},
        "expected_slices": {"type": "int", "required": True},
        "cases": {"type": "list", "elements": "str"},
    },
}


def run(module):
    params = module.params
    try:
        expected = plan_fleet(params["fleet_hosts"], params["pairing"], params["pairs"], fleet_id=params["fleet_id"])
        result, paths = fleet_run.merge(params["fleet_dir"], params["fleet_id"], expected["pairs"],
                                        params["expected_slices"], cases=params["cases"],
                                        write=not module.check_mode)
    except OrbiteError as error:
        fail_from(module, error)
    except OSError as error:
        fail_from(module, error, prefix=f"writing the merged fleet verdict under {params['fleet_dir']}")
    module.exit_json(changed=not module.check_mode, reports=paths,
                     **{key: result[key] for key in ("verdict", "complete", "counts", "failed_codes", "rows",
                                                     "slices", "findings")})

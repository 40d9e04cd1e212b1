# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The fleet_verdict module's job: verify a fleet's pairs, write its verdict (plugins/modules/fleet_verdict.py)."""

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._fleet import run as fleet_run


SPEC = {"argument_spec": {"output_dir": {"type": "path", "required": True}}}


def run(module):
    try:
        result, paths = fleet_run.verify(module.params["output_dir"], write=not module.check_mode)
    except OrbiteError as error:
        fail_from(module, error)
    except OSError as error:
        fail_from(module, error, prefix=f"writing the fleet verdict under {module.params['output_dir']}")
    module.exit_json(changed=not module.check_mode, reports=paths,
                     **{key: result[key] for key in ("verdict", "complete", "counts", "failed_codes", "rows",
                                                     "pairs", "findings")})

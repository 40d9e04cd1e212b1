# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The run_origin module's job: what a rerun of an earlier run plans (plugins/modules/run_origin.py)."""

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._run.plan import rerun_origin
from ansible_collections.orbite.qualification.plugins.module_utils._verify.history import resolve_run

SPEC = {
    "argument_spec": {
        "run": {"type": "str", "required": True},
        "runs_dir": {"type": "path"},
    },
}


def run(module):
    try:
        found = rerun_origin(resolve_run(module.params["run"], module.params["runs_dir"], "run"))
    except OrbiteError as error:
        fail_from(module, error)
    found["variants"] = [{"id": case, "changes": {}} for case in found["origin"]["cases"]]
    module.exit_json(changed=False, **found)

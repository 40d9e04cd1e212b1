# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The sim_runner_package module's job: the simulated runner's zipapp for a run, and the defect switches it takes.

The defect table is asked of the zipapp made here, in a Python process of its own (the simulated runner's
code never runs inside the controller's process), so the switches checked are those of the very file the run
deploys and pins (plugins/modules/sim_runner_package.py).
"""

import json
import subprocess
import sys

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, fail_from, quote
from ansible_collections.orbite.qualification.plugins.module_utils._run.package import runner_zipapp

SPEC = {
    "argument_spec": {
        "src": {"type": "path", "required": True},
        "zipapp": {"type": "path", "required": True},
        "defect_table": {"type": "bool", "default": False},
    },
}

TABLE_TIMEOUT = 60  # seconds: the runner prints a constant table and exits


class DefectTableError(OrbiteError):
    code = "sim_runner_package.defect_table"


def defect_table(zipapp_path):
    """{mode: [switch, ...]} as ``python <zipapp> --defect-table`` prints it."""
    try:
        ran = subprocess.run([sys.executable, zipapp_path, "--defect-table"], capture_output=True, text=True,
                             timeout=TABLE_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise DefectTableError(f"zipapp={zipapp_path}: the defect table could not be asked of it ({error})") from None
    try:
        table = json.loads(ran.stdout) if ran.returncode == 0 else None
    except ValueError:
        table = None
    if not isinstance(table, dict):
        raise DefectTableError(f"zipapp={zipapp_path}: --defect-table exited {ran.returncode} without a table "
                               f"(stdout {quote(ran.stdout)}, stderr {quote(ran.stderr[-2000:])})")
    return table


def run(module):
    params = module.params
    try:
        digest, made = runner_zipapp(params["src"], params["zipapp"], check_mode=module.check_mode)
        # In check mode a zipapp not made yet cannot be asked.
        asked = params["defect_table"] and not (module.check_mode and made)
        table = defect_table(params["zipapp"]) if asked else None
    except OSError as error:
        fail_from(module, error, prefix=f"zipapp={params['zipapp']}: the zipapp of src={params['src']} cannot be made")
    except OrbiteError as error:
        fail_from(module, error)
    module.exit_json(changed=made, zipapp=params["zipapp"], sha256=digest, defect_table=table)

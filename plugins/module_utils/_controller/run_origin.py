# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The run_origin module's job: what a rerun of an earlier run plans (plugins/modules/run_origin.py).

An earlier run whose verdict is not final (INCOMPLETE: the controller was killed, or the run never verified) is
verified first, so the cases whose receipts were fetched before the kill count for what they are: a rerun plans
the cases that did not pass, never a case that passed but was left unverified.
"""

import json
import os

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import read_regular_bytes
from ansible_collections.orbite.qualification.plugins.module_utils._run.plan import VERDICT_READ_LIMIT, rerun_origin
from ansible_collections.orbite.qualification.plugins.module_utils._verify.history import resolve_run
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run

SPEC = {
    "argument_spec": {
        "run": {"type": "str", "required": True},
        "runs_dir": {"type": "path"},
    },
}


def _final_verdict(run_dir):
    """The run's verdict.json when it is the final word (complete), else None (INCOMPLETE, missing, unreadable:
    rerun_origin names what is wrong with a file it cannot read)."""
    try:
        verdict = json.loads(read_regular_bytes(os.path.join(run_dir, "verdict.json"), VERDICT_READ_LIMIT))
    except (OSError, ValueError, RecursionError, OrbiteError):
        return None
    return verdict if isinstance(verdict, dict) and verdict.get("complete") is True else None


def origin_of(run_dir, write=True):
    """rerun_origin of ``run_dir``, after verifying it when its verdict is not final (writing that verdict there
    unless ``write`` is False: check mode). ``verified`` says whether it was verified now."""
    final = _final_verdict(run_dir)
    if final is None and os.path.isfile(os.path.join(run_dir, "run.json")):
        return dict(rerun_origin(run_dir, verdict=verify_run(run_dir, write=write)), verified=True)
    return dict(rerun_origin(run_dir, verdict=final), verified=False)


def run(module):
    try:
        found = origin_of(resolve_run(module.params["run"], module.params["runs_dir"], "run"),
                          write=not module.check_mode)
    except OrbiteError as error:
        fail_from(module, error)
    found["variants"] = [{"id": case, "changes": {}} for case in found["origin"]["cases"]]
    module.exit_json(changed=found["verified"] and not module.check_mode, **found)

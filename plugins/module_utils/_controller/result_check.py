# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The result_check module's job: verify a run's receipts and write its verdict (plugins/modules/result_check.py).

Like the rest of the verifier, this imports nothing of a runner, a node or the lab.
"""

import os

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._verify.reports import report_paths
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import (
    VerdictWriteError,
    verify_run,
)

SPEC = {
    "argument_spec": {
        "run_dir": {"type": "path", "required": True},
        "output_dir": {"type": "path"},
        "cases": {"type": "list", "elements": "str"},
        "partial": {"type": "bool", "default": False},
        "index_dir": {"type": "path"},
    },
}


def _summary(result, output_dir, index_dir=None):
    return {
        "origin": result.get("origin"),
        "index": os.path.join(index_dir, "index.json") if index_dir and not result.get("index_error") else None,
        "index_error": result.get("index_error", ""),
        "verdict": result["verdict"],
        "complete": result["complete"],
        "diagnostic_only": result["diagnostic_only"],
        "counts": result["counts"],
        "failed_codes": result["failed_codes"],
        "reports": report_paths(output_dir),
        "cases": [{"case": c["case"], "verdict": c["verdict"],
                   "failed": [f["code"] for f in c["findings"] if f["status"] == "FAIL"]} for c in result["cases"]],
    }


def run(module):
    run_dir = module.params["run_dir"]
    if not os.path.isdir(run_dir):
        fail_from(
            module,
            OrbiteError(
                f"run_dir={run_dir!r}: is not a directory (it must hold run.json and cases/)", code="run_dir.missing"
            ),
        )
    output_dir = module.params["output_dir"] or run_dir
    index_dir = module.params["index_dir"]
    parent = os.path.dirname(os.path.normpath(run_dir))
    if index_dir is None and os.path.basename(parent) == "runs":
        index_dir = parent
    try:
        result = verify_run(run_dir, output_dir=output_dir, write=not module.check_mode,
                            cases=module.params["cases"], partial=module.params["partial"], index_dir=index_dir)
    except VerdictWriteError as error:
        # The verdict computed goes back with the failure, so the role can still publish it.
        fail_from(module, error, changed=True, **_summary(error.verdict, output_dir))
    if result.get("write_error"):  # a partial verdict: the final verification writes, or fails, later
        module.warn(f"the partial verdict could not be written: {result['write_error']}")
    if result.get("index_error"):
        module.warn(result["index_error"])
    module.exit_json(changed=not module.check_mode, **_summary(result, output_dir, None if module.check_mode
                                                               else index_dir))

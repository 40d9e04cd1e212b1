# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The node's end of a lean node step (plugins/plugin_utils/_node_step.py): one request in, one result out.

The controller has validated the arguments already (as AnsibleModule would, with the module's own SPEC); this
runs the named job with them and writes one JSON line to stdout: ``{"result": ..., "warnings": [...]}``. The
controller adds what AnsibleModule adds (invocation, no_log masking), where the no_log values are known.
"""

import importlib
import json
import sys

from ansible_collections.orbite.qualification.plugins.module_utils._common.job import JobModule, run_job

# The jobs a lean step may name (modules of this package), and nothing else.
JOBS = ("control_relay", "deploy_artifacts", "fetch_receipts", "node_supervisor", "runner", "supervised_process")


def respond(request_line):
    """The response (a dict) to one request line: ``{"job", "params", "check_mode"}`` as JSON."""
    try:
        request = json.loads(request_line)
        name, params, check_mode = request["job"], request["params"], request["check_mode"]
    except (ValueError, KeyError, TypeError) as error:
        return {"result": {"failed": True, "code": "node_step.request", "msg": f"the node step's request is not "
                           f"one JSON object with job, params and check_mode: {error}"}, "warnings": []}
    if name not in JOBS or not isinstance(params, dict):
        return {"result": {"failed": True, "code": "node_step.request",
                           "msg": f"job={name!r}: not a node step job (one of {', '.join(JOBS)}) with its params"},
                "warnings": []}
    module = JobModule(params, check_mode)
    job = importlib.import_module(f"{__package__}.{name}")
    return {"result": run_job(f"orbite.qualification.{name}", job, module), "warnings": module.warnings}


def main(request_line):
    # One line, flushed; nothing else of the job's reaches stdout (its children are the supervisor's).
    sys.stdout.write(json.dumps(respond(request_line), default=str) + "\n")
    sys.stdout.flush()

# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The fetch_receipts module's job on the node: stop the case's control relay and supervisor, pack its receipts into
one archive (plugins/modules/fetch_receipts.py; the action plugin fetches and unpacks it)."""

import os

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._node.client import (
    JOURNAL_NAME,
    SupervisorError,
    default_run_dir,
    stop_failure,
    stop_supervisor,
)
from ansible_collections.orbite.qualification.plugins.module_utils._run import relay
from ansible_collections.orbite.qualification.plugins.module_utils._run.receipts import (
    ReceiptsError,
    archive_path_for,
    pack,
    select,
)

JOURNAL = "journal.jsonl"  # the supervisor's journal's name among the receipts
PATTERNS = ["ledger.json", "observer-*.bin", "observer-*.jsonl", "inventory-*.json", "case.json", "ready.json",
            "runner.stdout", "runner.stderr"]

SPEC = {
    "argument_spec": {
        "src": {"type": "path", "required": True},
        "dest": {"type": "path", "required": True},
        "patterns": {"type": "list", "elements": "str", "default": PATTERNS},
        "files": {"type": "dict", "default": {}},
        "supervisor": {"type": "dict", "options": {
            "run_id": {"type": "str", "required": True},
            "run_dir": {"type": "path"},
            "root": {"type": "path", "default": "/"},
            "stop_timeout": {"type": "float", "default": 30},
        }},
        "relay_state_dir": {"type": "path"},
    },
}


def run(module):
    p = module.params
    files = {str(k): str(v) for k, v in p["files"].items()}
    result, stop_error = {"changed": False}, None
    if p["relay_state_dir"] is not None:
        # First, while the supervisor it watches still runs: stopped by request, the relay journals its stop.
        result["relay"] = _stop_relay(p["relay_state_dir"], module)
    if p["supervisor"] is not None:
        result["stopped"], stop_error = _stop(p["supervisor"], module.check_mode)
        result["stop_failed"] = stop_error is not None
        result["changed"] = result["stopped"].get("changed", False)
        if JOURNAL in files:
            module.fail_json(msg=f"files.{JOURNAL}: with supervisor, that name is the supervisor's journal's",
                             code="receipts.invalid", **result)
        if result["stopped"].get("journal"):
            files[JOURNAL] = result["stopped"]["journal"]
    try:
        if module.check_mode:
            members = [{"name": name, "path": path} for name, path in select(p["src"], p["patterns"])]
            module.exit_json(members=members, left_out=[], **result)
        archive = archive_path_for(p["src"])
        members, left_out = pack(p["src"], p["patterns"], files, archive)
    except (ReceiptsError, OSError) as error:
        unpacked = f"src={p['src']}: the receipts could not be packed"
        if stop_error is not None:  # the stop's failure comes first: its locks may still be held
            fail_from(module, stop_error, prefix=f"the supervisor did not stop ({unpacked}: {error})", **result)
        fail_from(module, error, prefix=unpacked, **result)
    result.update(members=members, left_out=left_out, archive=archive if members else None)
    if stop_error is not None:
        # Failed with the archive named: the action plugin still fetches it.
        fail_from(module, stop_error, prefix="the supervisor did not stop (the receipts were packed all the same)",
                  **result)
    module.exit_json(**result)


def _stop_relay(state_dir, module):
    """The control relay's stop; a relay that cannot be ended is a warning, never the task's failure: the supervisor's
    stop must still run, and the verdict fails the case on the relay's journal (no stop record)."""
    try:
        return relay.stop_relay(state_dir, check_mode=module.check_mode)
    except (relay.RelayError, OSError, ValueError) as error:
        module.warn(f"relay_state_dir={state_dir}: the control relay did not stop: {error}")
        return {"error": str(error)}


def _stop(options, check_mode):
    """The supervisor's stop (force: this is the case's end) and its error, if any; the result names the journal
    whenever the run directory is known, so that a failed stop's journal is fetched too."""
    run_dir = None
    try:
        run_dir = options["run_dir"] or default_run_dir(options["root"], options["run_id"])
        return stop_supervisor(run_dir, force=True, timeout=options["stop_timeout"], check_mode=check_mode), None
    except (SupervisorError, OSError) as error:  # named, never a traceback: the receipts are packed still
        where = {"run_dir": run_dir, "journal": os.path.join(run_dir, JOURNAL_NAME)} if run_dir else {}
        return dict(stop_failure(error), **where), error

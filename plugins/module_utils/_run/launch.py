# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Start an engine runner as a child of the node's lock supervisor, and wait for it.

One job: turn the gate's view of a case (role, generation, profile, rails, addresses) into the
runner contract's case file (docs/runner-contract.md), launch the runner through the supervisor
with the mode's environment, and report the receipts' paths. The source is "started" only once it
has written ``ready.json`` (an explicit readiness barrier, watched together with the child's life).
Stdlib only, Python >= 3.9.
"""

from __future__ import annotations

import json
import os
import time

from ansible_collections.orbite.qualification.plugins.module_utils._common.files import atomic_write_json
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError
from ansible_collections.orbite.qualification.plugins.module_utils._build.manifest import sha256_file
from ansible_collections.orbite.qualification.plugins.module_utils._node.client import (
    SupervisorClient,
    SupervisorError,
)

PROTOCOL = "orbite-installed-host-v4"
CASE_SCHEMA = ("orbite.runner-case", 1)
READY_NAME = "ready.json"
LEDGER_NAME = "ledger.json"
CASE_NAME = "case.json"
ROLES = ("source", "requester")
# Would turn an injected destroy EIO into success (DESIGN §7): never handed to a runner.
FORBIDDEN_ENV = ("RDMAV_ALLOW_DISASSOC_DESTROY", "LD_PRELOAD")
READY_POLL_S = 0.02


class RunnerError(OrbiteError):
    """A runner could not be started or did not behave; ``code`` is stable."""

    code = "runner.error"

    def __init__(self, code, msg, **details):
        super().__init__(msg)
        self.code = code
        self.details = details


def check_preload(libraries):
    """Every LD_PRELOAD library must exist and match its pinned sha256 before it is loaded."""
    paths = []
    for index, entry in enumerate(libraries or []):
        field = f"ld_preload[{index}]"
        if not isinstance(entry, dict) or not entry.get("path") or not entry.get("sha256"):
            raise RunnerError("bad_input", f"{field}={entry!r}: needs path and sha256 (only hash-pinned libraries)")
        path = entry["path"]
        if not os.path.isabs(path) or not os.path.isfile(path):
            raise RunnerError("bad_input", f"{field}.path={path!r}: must be an existing absolute file")
        found = sha256_file(path)
        if found != entry["sha256"]:
            raise RunnerError("hash_mismatch", f"{field}.path={path}: sha256 {found} does not match the pinned "
                                               f"{entry['sha256']}", path=path)
        paths.append(path)
    return paths


def build_case(params):
    """The case file of the runner contract, from the module's parameters."""
    role = params["role"]
    case = {
        "schema": CASE_SCHEMA[0], "version": CASE_SCHEMA[1], "protocol": PROTOCOL,
        "run_id": params["run_id"], "role": role, "generation": params["generation"],
        "profile": params["profile"], "root": params["root"],
        "registration_id": params["registration_id"],
        "observers": list(params.get("observers") or []),
    }
    if params["profile"].get("discovery") == "auto":
        case["discovery"] = params.get("discovery") or {"whitelist": [], "blacklist": []}
    else:
        if not params.get("rails"):
            raise RunnerError("bad_input", "rails=[]: required unless the profile asks for discovery: auto")
        case["rails"] = params["rails"]
    if role == "source":
        if not params.get("service_address"):
            raise RunnerError("bad_input", "service_address: required for the source")
        case["service_address"] = params["service_address"]
    else:
        if not params.get("peer_address"):
            raise RunnerError("bad_input", "peer_address: required for the requester (the source's ready address)")
        case["peer_address"] = params["peer_address"]
    for optional in ("peer_registration_id", "seed", "timeouts"):
        if params.get(optional) is not None:
            case[optional] = params[optional]
    if params.get("defects"):
        case["defects"] = list(params["defects"])
    return case


def _write_private_json(path, data):
    atomic_write_json(path, data, mode=0o600)


def prepare_output(output_dir):
    """A fresh private output directory: receipts of an earlier attempt must never be mistaken for ours."""
    if os.path.exists(os.path.join(output_dir, LEDGER_NAME)) or os.path.exists(os.path.join(output_dir, READY_NAME)):
        raise RunnerError("output_not_empty", f"output_dir={output_dir}: already holds receipts of another run; "
                                              "use a new directory per role and generation")
    os.makedirs(output_dir, mode=0o700, exist_ok=True)
    os.chmod(output_dir, 0o700)


def start(params, check_mode=False):
    """Write the case file, launch the runner under the supervisor; for the source, wait until ready."""
    case = build_case(params)
    preload = check_preload(params.get("ld_preload"))
    output_dir = params["output_dir"]
    env = {k: v for k, v in (params.get("env") or {}).items() if k not in FORBIDDEN_ENV}
    if check_mode:
        return {"changed": True, "case": case, "ld_preload": preload}
    prepare_output(output_dir)
    case_path = os.path.join(output_dir, CASE_NAME)
    _write_private_json(case_path, case)
    if preload and case["observers"]:
        # The native observers write their log where the contract says.
        env["ORBITE_OBSERVER_LOG"] = os.path.join(output_dir, f"observer-{case['observers'][0]}.jsonl")
    client = SupervisorClient(params["supervisor_run_dir"])
    argv = [*params["runner_argv"], "--case", case_path, "--output", output_dir]
    try:
        child = client.launch(argv, env=env, cwd=output_dir, ld_preload=preload,
                              stdout_path=os.path.join(output_dir, "runner.stdout"),
                              stderr_path=os.path.join(output_dir, "runner.stderr"))
    except SupervisorError as error:
        raise RunnerError("launch_failed",
                          f"the supervisor refused to launch the {case['role']} runner: {error}") from None
    result = {"changed": True, "case_path": case_path, "output_dir": output_dir, "child": child,
              "ledger": os.path.join(output_dir, LEDGER_NAME), "ready": None}
    if case["role"] == "source":
        result["ready"] = wait_ready(client, child, output_dir, params["ready_timeout"])
    return result


def wait_ready(client, child, output_dir, timeout):
    """Return ready.json once the source wrote it; fail at once if the source exits first."""
    ready_path = os.path.join(output_dir, READY_NAME)
    deadline = time.monotonic() + timeout
    while True:
        if os.path.exists(ready_path):
            with open(ready_path, encoding="utf-8") as handle:
                ready = json.load(handle)
            if ready.get("pid") != child["pid"]:
                raise RunnerError("ready_mismatch", f"{ready_path}: written by pid {ready.get('pid')}, "
                                                    f"the supervised source is pid {child['pid']}")
            return ready
        state = client.wait(child["child_id"], timeout=0)
        if not state["timed_out"]:
            raise RunnerError("exited_before_ready",
                              f"the source runner exited before it was ready (exit code {state.get('exit_code')}, "
                              f"signal {state.get('exit_signal_name')}); see {output_dir}/runner.stderr", child=state)
        if time.monotonic() > deadline:
            raise RunnerError("ready_timeout", f"the source runner was not ready within {timeout} s "
                                               f"(no {ready_path}); it is still running as pid {child['pid']}")
        time.sleep(READY_POLL_S)


def finish(params):
    """Wait for a runner child to exit, renewing the supervisor's lease meanwhile; return its status."""
    client = SupervisorClient(params["supervisor_run_dir"])
    deadline = time.monotonic() + params["timeout"]
    try:
        lease = float(client.status().get("lease_s") or 60)
        while True:
            # Wait in slices of a third of the lease, renewing between them: a controller that is
            # alive keeps its locks; one that died lets the lease expire and the supervisor clean up.
            remaining = deadline - time.monotonic()
            state = client.wait(params["child_id"], timeout=max(0.0, min(remaining, lease / 3)))
            if not state["timed_out"] or remaining <= 0:
                break
            client.renew()
    except SupervisorError as error:
        raise RunnerError("wait_failed", f"waiting for child {params['child_id']} failed: {error}") from None
    if state["timed_out"]:
        raise RunnerError("timeout", f"runner child {params['child_id']} (pid {state.get('pid')}) still runs after "
                                     f"{params['timeout']} s", child=state)
    ledger = os.path.join(params["output_dir"], LEDGER_NAME) if params.get("output_dir") else None
    return {"changed": False, "child": state, "ledger": ledger}

# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The node_supervisor module's job: start, query, renew or stop the node's lock supervisor
(plugins/modules/node_supervisor.py)."""

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._node.client import (
    SupervisorAlreadyRunning,
    SupervisorClient,
    SupervisorError,
    SupervisorInputError,
    SupervisorNotRunning,
    SupervisorRequestError,
    SupervisorStartError,
    check_start_args,
    default_lock_dir,
    default_run_dir,
    start_supervisor,
    stop_failure,
    stop_supervisor,
)
from ansible_collections.orbite.qualification.plugins.module_utils._node_steps.deploy_artifacts import (
    FILE_OPTIONS,
    deploy_files,
)


SPEC = {
    "argument_spec": {
        "state": {"type": "str", "choices": ["started", "stopped", "status", "renewed"], "default": "started"},
        "run_id": {"type": "str", "required": True},
        "locks": {"type": "list", "elements": "str"},
        "root": {"type": "path", "default": "/"},
        "lock_dir": {"type": "path"},
        "run_dir": {"type": "path"},
        "hostname": {"type": "str"},
        "boot_id": {"type": "str"},
        "controller": {"type": "str", "default": "ansible"},
        "lease": {"type": "float", "default": 600},
        "lock_timeout": {"type": "float", "default": 30},
        "force": {"type": "bool", "default": False},
        "stop_timeout": {"type": "float", "default": 30},
        # started: the case's executables, placed before the supervisor (deploy_artifacts' files).
        "deploy": {"type": "list", "elements": "dict", "options": FILE_OPTIONS},
    },
    "required_if": [("state", "started", ("locks",))],
}


def _started(module, client, p, lock_dir):
    if module.check_mode:
        if not client.alive():
            return True, None
        status = client.status()
    else:
        try:
            start_supervisor(client.run_dir, p["run_id"], p["locks"], lock_dir, root=p["root"],
                             hostname=p["hostname"], boot_id=p["boot_id"], controller=p["controller"],
                             lease=p["lease"], lock_timeout=p["lock_timeout"])
        except SupervisorAlreadyRunning as exc:  # started earlier, or by a concurrent start
            status = exc.status
        else:
            return True, client.status()
    held = sorted(lk["rnic"] for lk in status.get("locks") or [])
    if held != sorted(p["locks"]) or status.get("run_id") != p["run_id"]:
        running = OrbiteError(
            f"a supervisor for run {status.get('run_id')} already runs in {client.run_dir} holding {held}, "
            f"not {sorted(p['locks'])}; stop it first",
            code="supervisor.already_running",
        )
        fail_from(module, running, error="supervisor.already_running", supervisor=status, run_dir=client.run_dir,
                  journal=client.journal_path, running=True)
    return False, status


def run(module):
    p = module.params
    result = {"changed": False}
    try:
        run_dir = p["run_dir"] or default_run_dir(p["root"], p["run_id"])
        lock_dir = p["lock_dir"] or default_lock_dir(p["root"])
        client = SupervisorClient(run_dir)
        result.update(run_dir=run_dir, journal=client.journal_path)
        state = p["state"]
        if p["deploy"] is not None and state != "started":
            raise SupervisorInputError(f"deploy: only with state=started, not state={state}")
        if state == "started":
            check_start_args(p["run_id"], p["locks"], p["lease"], p["lock_timeout"])
            # Copying needs no lock, and a short lease must not run out meanwhile: the files come first.
            deployed = deploy_files(module, p["deploy"], option="deploy") if p["deploy"] is not None else None
            changed, status = _started(module, client, p, lock_dir)
            result.update(changed=changed or any(f["changed"] for f in deployed or []), running=status is not None)
            if deployed is not None:
                result["deployed"] = deployed
            if status is not None:
                result["supervisor"] = status
        elif state in ("status", "renewed"):
            try:
                status = client.status()
            except SupervisorNotRunning as exc:
                result.update(running=False)
                if state == "renewed":
                    fail_from(module, exc, prefix="cannot renew the lease", error="supervisor.not_running", **result)
                module.exit_json(**result)
            if state == "renewed" and not module.check_mode:
                client.renew(p["lease"])
                status = client.status()
            result.update(changed=state == "renewed", running=True, supervisor=status)
        else:
            result.update(stop_supervisor(run_dir, force=p["force"], timeout=p["stop_timeout"],
                                          check_mode=module.check_mode))
    except SupervisorStartError as exc:
        details = {k: v for k, v in exc.details.items() if k in ("owner", "rnic", "mismatch")}
        result.update(details, error=exc.code, running=False)
        fail_from(module, exc, prefix="supervisor did not start", **result)
    except SupervisorRequestError as exc:
        result.update(stop_failure(exc))
        fail_from(module, exc, prefix="supervisor refused", **result)
    except SupervisorError as exc:
        result.update(stop_failure(exc))
        fail_from(module, exc, **result)
    module.exit_json(**result)

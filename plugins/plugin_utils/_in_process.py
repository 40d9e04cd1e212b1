# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Run a controller-side module's job in the task's worker process: no AnsiballZ, no new Python.

Private to the collection. A controller-side module (result_check, run_plan, profile_info, ...) keeps its
DOCUMENTATION and its own ``main()``; its argument spec and its job live in
``module_utils/_controller/<module>.py`` as ``SPEC`` (the keyword arguments of ``AnsibleModule`` but
``supports_check_mode``) and ``run(module)``. The module's ``main()`` calls ``run`` with an AnsibleModule;
the action plugin of the same name subclasses :class:`InProcessAction`, which validates the task's
arguments with ansible's ``ArgumentSpecValidator`` (the validator AnsibleModule uses, so a bad argument
fails with the module's own message naming the field and the value) and calls ``run`` with an
:class:`InProcessModule`: the part of AnsibleModule those jobs use (``params``, ``check_mode``,
``warn``, ``exit_json``, ``fail_json``).

Each action plugin imports its job (and so its module_utils) at the top: Ansible's strategy (linear, free)
loads a task's action plugin class in the controller's main process before it forks the task's worker, so
an import there is paid once per playbook and inherited by every worker (the verifier's ~0.2 s serves run_plan's first
verdict and result_check alike), where an import in ``run()`` would be paid again by each task's worker.
"""

from __future__ import annotations

import json

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.parameters import remove_values
from ansible.module_utils.errors import UnsupportedError
from ansible.plugins.action import ActionBase
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import fail_from


class _Returned(Exception):
    """exit_json or fail_json was called: the job is over (AnsibleModule exits the process there)."""

    def __init__(self, result):
        super().__init__()
        self.result = result


class InProcessModule:
    """What a controller job needs of AnsibleModule, in the worker: the same calls, the same result."""

    def __init__(self, params, check_mode, no_log_values=()):
        self.params = params
        self.check_mode = check_mode
        self._no_log_values = set(no_log_values)
        self._warnings = []

    def warn(self, warning):
        self._warnings.append(str(warning))

    def exit_json(self, **result):
        # As AnsibleModule._return_formatted: the arguments it ran with, its warnings, no_log values masked
        # (bools and None kept); and JSON types only, as a module's result reaches the controller.
        result.setdefault("invocation", {"module_args": self.params})
        if self._warnings:
            result["warnings"] = list(self._warnings)
        preserved = {key: value for key, value in result.items() if value is None or isinstance(value, bool)}
        result = remove_values(result, self._no_log_values)
        result.update(preserved)
        raise _Returned(json.loads(json.dumps(result)))

    def fail_json(self, msg, **result):
        result.update(failed=True, msg=str(msg))
        self.exit_json(**result)


def validate(name, spec, args):
    """(params, no_log values, the module's message or None) for ``args`` checked against ``spec``.

    As AnsibleModule: the params are the arguments updated with what the validator made of them (defaults,
    conversions), also when it refused them (the result's invocation shows them so).
    """
    checked = ArgumentSpecValidator(**spec).validate(args)
    params = dict(args, **checked.validated_parameters)
    if not checked.error_messages:
        return params, checked._no_log_values, None
    message = checked.errors.msg
    if isinstance(checked.errors[0], UnsupportedError):
        message = f"Unsupported parameters for ({name}) module: {message}"
    return params, checked._no_log_values, message


def _outcome(call, *args):
    """What ``call`` handed to exit_json or fail_json (each ends the job by raising _Returned)."""
    try:
        call(*args)
    except _Returned as returned:
        return returned.result
    return None


def _run(name, job, module):
    params, no_log, message = validate(name, job.SPEC, module.params)
    module.params = params
    module._no_log_values.update(no_log)
    if message is not None:
        module.fail_json(msg=message)
    job.run(module)
    # A job always ends with exit_json or fail_json, as a module does.
    module.fail_json(msg=f"{name}: the job returned no result", code="controller.no_result")


def run_job(name, job, args, check_mode):
    """The result of ``job`` (a module of module_utils/_controller: SPEC, run) on ``args``, as its module returns it.

    Any error the job did not turn into a failure itself is the task's failure with a code, never a traceback
    (with the job's warnings so far, and its no_log values masked).
    """
    # The arguments as the module reads them: JSON types, a copy the job may change.
    module = InProcessModule(json.loads(json.dumps(args, default=str)), check_mode)
    try:
        return _outcome(_run, name, job, module)
    except Exception as error:  # pylint: disable=broad-except  # the one error root of every in-process job
        return _outcome(fail_from, module, error)


class InProcessAction(ActionBase):
    """Action plugin of a controller-side module: its job, in this worker. Subclasses set ``JOB``."""

    JOB = None  # the module's job: module_utils/_controller/<module>.py, holding SPEC and run(module)
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # not used since Ansible 2.5
        result.update(run_job(self._task.action, self.JOB, self._task.args, bool(self._task.check_mode)))
        return result

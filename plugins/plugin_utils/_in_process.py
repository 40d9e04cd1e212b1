# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Run a controller-side module's job in the task's worker process: no AnsiballZ, no new Python.

Private to the collection. A controller-side module (result_check, run_plan, profile_info, ...) keeps its
DOCUMENTATION and its own ``main()``; its argument spec and its job live in
``module_utils/_controller/<module>.py`` as ``SPEC`` (the keyword arguments of ``AnsibleModule`` but
``supports_check_mode``) and ``run(module)``. The module's ``main()`` calls ``run`` with an AnsibleModule;
the action plugin of the same name subclasses :class:`InProcessAction`, which validates the task's
arguments with ansible's ``ArgumentSpecValidator`` (the validator AnsibleModule uses, so a bad argument
fails with the module's own message naming the field and the value) and calls ``run`` with a ``JobModule``
(module_utils/_common/job.py: the part of AnsibleModule those jobs use, shared with the node steps of
plugin_utils/_node_step.py, which use :func:`validate` and :func:`finish` here too).

Each action plugin imports its job (and so its module_utils) at the top: Ansible's strategy (linear, free)
loads a task's action plugin class in the controller's main process before it forks the task's worker, so
an import there is paid once per playbook and inherited by every worker (the verifier's import serves run_plan's
first verdict and result_check alike), where an import in ``run()`` would be paid again by each task's worker.
"""

from __future__ import annotations

import json

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.parameters import remove_values
from ansible.module_utils.errors import UnsupportedError
from ansible.plugins.action import ActionBase
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError
from ansible_collections.orbite.qualification.plugins.module_utils._common.job import JobModule, failure
from ansible_collections.orbite.qualification.plugins.module_utils._common.job import run_job as job_outcome


class NotJsonData(OrbiteError):
    """Task arguments or a job's result that cannot be made JSON (nested past the interpreter's recursion limit,
    a cycle): the task's coded failure, never a RecursionError out of the action plugin."""

    code = "job.not_json"


def as_json(value, what):
    """``value`` as a module reads it: JSON types (anything else as its str()), a copy; NotJsonData otherwise."""
    try:
        return json.loads(json.dumps(value, default=str))
    except (RecursionError, ValueError, TypeError) as error:
        raise NotJsonData(f"{what}: cannot be read as JSON data ({type(error).__name__}: {error}); rule: "
                          "plain data nested less deep than the interpreter's recursion limit") from None


def read_args(name, spec, args):
    """validate() of the task's arguments as the module reads them (JSON types, a copy the job may change), or a
    coded failure result when they cannot be read at all: (params, no_log values, message, failure or None)."""
    try:
        return (*validate(name, spec, as_json(args, f"the arguments of {name}")), None)
    except Exception as error:  # pylint: disable=broad-except  # the error root: deep, cyclic, unvalidatable
        return {}, (), None, failure(JobModule({}, False), error)


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


def finish(result, params, warnings, no_log_values):
    """A job's result as AnsibleModule._return_formatted makes it: the arguments it ran with (invocation), its
    warnings, no_log values masked (bools and None kept); and JSON types only, as a module's result reaches the
    controller."""
    result = dict(result)
    result.setdefault("invocation", {"module_args": params})
    if warnings:
        result["warnings"] = list(warnings)
    preserved = {key: value for key, value in result.items() if value is None or isinstance(value, bool)}
    try:
        result = remove_values(result, set(no_log_values))
        result.update(preserved)
        return as_json(result, "the job's result")
    except Exception as error:  # pylint: disable=broad-except  # the error root, as for the arguments
        return finish(failure(JobModule({}, False), error), {}, warnings, ())


def run_job(name, job, args, check_mode):
    """The result of ``job`` (a module of module_utils/_controller: SPEC, run) on ``args``, as its module returns it.

    A bad argument fails with the module's message and the job never runs; any error the job did not turn into
    a failure itself is the task's failure with a code, never a traceback (with the job's warnings so far, and
    its no_log values masked).
    """
    params, no_log, message, failed = read_args(name, job.SPEC, args)
    if failed is not None:
        return finish(failed, params, [], no_log)
    module = JobModule(params, check_mode)
    result = {"failed": True, "msg": message} if message is not None else job_outcome(name, job, module)
    return finish(result, params, module.warnings, no_log)


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

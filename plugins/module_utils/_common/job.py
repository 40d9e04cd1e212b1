# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""A module's job run without AnsibleModule: the part of it the jobs use, and the one place their outcome is taken.

A job is a module of ``module_utils/_controller`` or ``module_utils/_node_steps``: ``SPEC`` (AnsibleModule's
keyword arguments but ``supports_check_mode``) and ``run(module)``, which ends with ``module.exit_json`` or
``module.fail_json`` as a module does. The module's ``main()`` runs it under AnsibleModule. The action plugins
run it with a :class:`JobModule` (arguments already validated on the controller): in the task's worker for a
controller step (plugins/plugin_utils/_in_process.py), in one lean Python on the node for a node step
(plugins/plugin_utils/_node_step.py, through ``_node_steps/entry.py``). Stdlib only: this runs on nodes.
"""

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import fail_from


class JobReturned(BaseException):
    """exit_json or fail_json was called: the job is over (AnsibleModule exits the process there, with SystemExit:
    like it, this passes through a job's own ``except Exception``)."""

    def __init__(self, result):
        super().__init__()
        self.result = result


class JobModule:
    """What a job needs of AnsibleModule (``params``, ``check_mode``, ``warn``, ``exit_json``, ``fail_json``).

    The result is the job's own: the caller adds what AnsibleModule adds (the invocation, the warnings, no_log
    values masked), where the validated arguments are known.
    """

    def __init__(self, params, check_mode):
        self.params = params
        self.check_mode = bool(check_mode)
        self.warnings = []

    def warn(self, warning):
        self.warnings.append(str(warning))

    def exit_json(self, **result):
        raise JobReturned(result)

    def fail_json(self, msg, **result):
        result.update(failed=True, msg=str(msg))
        raise JobReturned(result)


def _outcome(call, *args):
    try:
        call(*args)
    except JobReturned as returned:
        return returned.result
    return None


def _run(name, job, module):
    job.run(module)
    # A job always ends with exit_json or fail_json, as a module does.
    module.fail_json(msg=f"{name}: the job returned no result", code="job.no_result")


def failure(module, error):
    """The job's failure result for ``error``, as fail_from (the one error root) makes it."""
    return _outcome(fail_from, module, error)


def run_job(name, job, module):
    """What ``job`` handed to exit_json or fail_json, run with ``module`` (a :class:`JobModule`).

    Any error the job did not turn into a failure itself is a coded failure, never a traceback (fail_from: the
    collection's one error root).
    """
    try:
        return _outcome(_run, name, job, module)
    except Exception as error:  # pylint: disable=broad-except  # the one error root of every job run this way
        return failure(module, error)

# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The collection's one grammar of failure codes, and the registry of every code a module, action, node step,
job or the lock supervisor fails with (the verifier's codes are its own registry, _verify/registry.py).

A code is ``<domain>.<word>``: lower-case ASCII letters and underscores, one dot (``runner.bad_input``,
``supervisor.lock_timeout``). Tests, docs and operators match on it; the message beside it names the field,
the value and the rule. ``tests/unit/plugins/module_utils/_common/test_codes.py`` reads every code written in
plugins/ and fails on one that is neither here nor in the verifier's registry, or that breaks the grammar.

Two families are made at run time from an exception's class, by ``errors.fail_from`` only: ``os.<OSError
subclass>`` (``os.PermissionError``) and ``error.<class>`` (an error no code was given to, never on purpose).
"""

import re

CODE_RE = re.compile(r"[a-z][a-z_]*\.[a-z][a-z_]*", re.ASCII)
GENERATED_RE = re.compile(r"(?:os|error)\.[A-Z][A-Za-z]*", re.ASCII)

CODES = {
    # The error root's default, and the run-time families' owner (errors.fail_from).
    "orbite.error": "an error raised without a code of its own",
    # Controller side: plans, packages, builds, installations.
    "run_plan.invalid": "the run plan's input breaks a rule (profile, cases, rerun, output directory)",
    "run_plan.nothing_to_rerun": "a rerun whose earlier run has no failed case",
    "run_dir.missing": "result_check's run directory is not a directory",
    "profile.invalid": "a profile field breaks the profile model's rule",
    "fleet.plan": "fleet pairing input breaks a rule",
    "fleet.verdict": "a fleet's pair verdicts cannot be merged",
    "verifier.registry": "a rule registration the verifier's registry refuses (a programming error)",
    "history.invalid": "the verdict history index cannot be read or written",
    "installation.error": "an installation manifest cannot be read or breaks its schema",
    "installation.mismatch": "an installed file differs from the manifest's pin",
    "zipapp.src": "the simulated runner's package source is missing or not a package",
    "sim_runner_package.defect_table": "the simulated runner's defect table is inconsistent",
    "discovery.invalid": "an expectation of discovery: auto breaks a rule",
    "inventory.error": "an RNIC inventory cannot be read",
    "inventory.read_refused": "an inventory path is not a regular sysfs file or escapes the root",
    "inventory.compare": "two inventories cannot be compared",
    # Files and names shared by every side.
    "file.not_regular": "an input path is a FIFO, device, socket, directory or link",
    "file.too_large": "an input file is longer than its reader's bound",
    "file.not_private": "a private directory is a link, not a directory, or another user's",
    "name.invalid": "a run, case, registration or RNIC name breaks the name grammar",
    # Node steps and the in-process jobs of the action plugins.
    "node_step.request": "a node step's request is not one the entry understands",
    "node_step.transport": "a node step's payload did not reach the node or its answer did not come back",
    "node_step.no_result": "a node step ended without a result",
    "job.no_result": "an in-process job returned no result",
    "job.not_json": "a job's arguments or result are not JSON of bounded depth (nested past the recursion limit)",
    "deploy.invalid": "a deploy list breaks a rule",
    "deploy.unpinned": "a deploy entry names a file the run's artifacts do not pin",
    "deploy.mismatch": "a deployed file does not hash to its pin",
    "receipts.invalid": "fetch_receipts' arguments break a rule",
    "receipts.unwritten": "a fetched receipt could not be written on the controller",
    "identity.error": "the node's identity (hostname, boot ID, machine ID) cannot be read",
    "pin.error": "a pinned file cannot be opened or copied for its check",
    "pin.mismatch": "a pinned file does not hash to its pin",
    "lock.error": "an RNIC lock or its directory breaks a rule",
    "schedule.invalid": "the case schedule's input breaks a rule (orbite_case_schedule, a host's orbite_rails)",
    # The simulated lab.
    "sim.lab": "the simulated lab's arguments or state break a rule",
    "sim.fake_sysfs": "a fake host root cannot be written",
    "sim.namespace": "a fake host's namespaces cannot be made or entered",
    "sim.native": "the lab's native tools (provider, observers) cannot be built",
    # The runner module (plugins/module_utils/_run/launch.py).
    "runner.error": "a runner could not be started or did not behave",
    "runner.bad_input": "a runner argument breaks a rule (names, pins, rails, addresses, observer format)",
    "runner.hash_mismatch": "the runner, an observer or the verbs library is not its pin",
    "runner.output_not_empty": "the role's output directory holds another run's receipts",
    "runner.launch_failed": "the supervisor refused to launch the runner",
    "runner.exited_before_ready": "the source runner exited before it wrote ready.json",
    "runner.ready_invalid": "ready.json is not a small JSON object",
    "runner.ready_mismatch": "ready.json was written by another process",
    "runner.ready_timeout": "the source runner was not ready in time",
    "runner.exited_before_restart_point": "the runner exited before its restart point",
    "runner.restart_point_mismatch": "the restart point was written by another process",
    "runner.timeout": "the runner still ran, or wrote no restart point, when its wait ended",
    "runner.wait_failed": "waiting for the runner failed",
    # The lock supervisor (its control protocol's answers and its start failures, plugins/module_utils/_node).
    "supervisor.error": "the supervisor failed without saying why",
    "supervisor.request": "a control request breaks a rule",
    "supervisor.bad_request": "a control request or the supervisor's configuration breaks a rule",
    "supervisor.forbidden": "a control connection from another user",
    "supervisor.busy": "too many idle control connections; the oldest was closed",
    "supervisor.unknown_child": "a request names no child of this supervisor",
    "supervisor.signal_refused": "a signal to a child whose pid or start time differs from the record",
    "supervisor.not_reaped": "a signalled child still ran when the wait ended",
    "supervisor.launch_failed": "the child could not be executed",
    "supervisor.hash_mismatch": "a pinned executable, argument file or preload does not hash to its pin",
    "supervisor.pin_failed": "a pinned file cannot be sealed or is not the JSON object it must be",
    "supervisor.children_running": "stop without force while children run",
    "supervisor.supervisor_stopped": "a pending wait when the supervisor stopped",
    "supervisor.journal_error": "the journal could not record an event (a full disk)",
    "supervisor.os_error": "the supervisor's run directory, lease or program could not be written",
    "supervisor.already_running": "a supervisor of another run or other locks holds the run directory",
    "supervisor.not_running": "no supervisor answers on the run directory",
    "supervisor.lock_timeout": "an RNIC lock stayed held past the lock timeout",
    "supervisor.lock_error": "an RNIC lock could not be taken",
    "supervisor.identity_error": "the node's identity could not be read at start",
    "supervisor.identity_mismatch": "the node's identity changed between the check and the locks",
    "supervisor.socket_error": "the control socket could not be bound",
    "supervisor.start_busy": "another start on the run directory did not finish in time",
    "supervisor.start_timeout": "the supervisor did not report ready in time",
    "supervisor.start_crashed": "the supervisor exited without a ready message",
    "supervisor.unresponsive": "a supervisor holds the run directory but does not answer",
    "supervisor.ready_mismatch": "the ready message names another run or other locks",
    "supervisor.internal": "the supervisor crashed; it released its locks and reaped its children",
}


def is_code(code) -> bool:
    """True for a code of the grammar (the run-time families included)."""
    return isinstance(code, str) and bool(CODE_RE.fullmatch(code) or GENERATED_RE.fullmatch(code))

#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

DOCUMENTATION = r"""
---
module: node_supervisor
short_description: Start, renew, query or stop the per-node RNIC lock supervisor
version_added: 0.1.0
description:
  - V(started) starts a detached supervisor process that takes one C(flock) per RNIC in O(lock_dir),
    rechecks hostname and boot ID inside the locks, and then owns the run's child processes. It keeps
    running after the module returns (its program is copied into the private run directory).
    Fails naming the current owner when a lock stays held for O(lock_timeout) seconds, or naming
    the field when the identity changed; nothing is left held then.
  - V(renewed) extends the lease. A supervisor whose lease runs out kills and reaps its children,
    releases its locks and exits.
  - V(status) reports the running supervisor (locks, lease, children).
  - V(stopped) refuses while children run unless O(force) (then kills and reaps them), releases the
    locks, closes the journal and returns its path. Stopping a supervisor that is not running is
    not an error (it is what an C(always:) section needs). A supervisor that does not answer within
    O(stop_timeout) (hung, SIGSTOPped) is identified by pid and start time from its lease record
    and ended with SIGTERM, then SIGKILL after 5 s; the journal and RV(summary) (C(reason=escalated),
    C(escalation)) say so.
  - One start per run directory at a time (concurrent starts are serialised); a V(started) that
    finds a supervisor already running with other locks fails C(supervisor.already_running), and one that
    finds a hung supervisor whose lease ran out ends it (pid and start time checked) and takes over.
  - See C(docs/supervisor.md) for the lifecycle, the lock file format and the journal schema.
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.platform_linux
  - orbite.qualification._root
  - orbite.qualification._supervisor
options:
  state:
    description: What to do with the supervisor.
    type: str
    choices: [started, stopped, status, renewed]
    default: started
  run_id:
    description:
      - The qualification run this supervisor serves. It names the run directory
        C(<root>/run/orbite/supervisors/<run_id>) and is written into every lock file.
      - 1 to 64 ASCII letters, digits, C(.), C(_) or C(-), starting with a letter or digit.
    required: true
  locks:
    description: RNIC names (as under C(/sys/class/infiniband)) to lock; required for V(started).
    type: list
    elements: str
  lock_dir:
    description:
      - Directory of the lock files; created with mode 0700 when missing, refused when it exists
        with group or other access or another owner. Defaults to C(<root>/run/orbite/locks).
    type: path
  hostname:
    description: Expected hostname, rechecked inside the locks. Defaults to the value read at start.
    type: str
  boot_id:
    description: Expected boot ID, rechecked inside the locks. Defaults to the value read at start.
    type: str
  controller:
    description: Name of the controller running the play, written into the lock files.
    type: str
    default: ansible
  lease:
    description:
      - Lease in seconds (for V(started) and V(renewed)); strings are cast.
      - A supervisor whose lease runs out kills and reaps its children, releases its locks and exits,
        so a controller that dies never leaves an RNIC locked.
    type: float
    default: 600
  lock_timeout:
    description: Seconds to wait for each busy RNIC lock before failing.
    type: float
    default: 30
  force:
    description: With V(stopped), kill and reap running children instead of refusing.
    type: bool
    default: false
  stop_timeout:
    description:
      - With V(stopped), seconds to wait for the supervisor's answer before ending it (SIGTERM, then
        SIGKILL after 5 s).
    type: float
    default: 30
  deploy:
    description:
      - With V(started), files to place on the node first, before the supervisor starts (as
        M(orbite.qualification.deploy_artifacts) places its O(orbite.qualification.deploy_artifacts#module:files)),
        so a case's deploy and its supervisor start are one node step. The collection's action plugin reads each
        O(deploy[].src) on the controller and sends its bytes with the task; on the node each is written atomically
        (mode 0600, missing directories 0700) unless the regular file there already has the pinned sha256, and
        then hashed where it lies. A file whose sha256 is not its pin fails the task naming it (C(deploy.mismatch))
        and no supervisor starts.
      - Refused with any other O(state).
    type: list
    elements: dict
    suboptions:
      name:
        description: What the file is (C(runner), C(verbs_library), an observer's tool name), for messages.
        type: str
        required: true
      src:
        description: The file on the controller (read by the action plugin, at most 64 MiB).
        type: path
        required: true
      dest:
        description: Absolute path on the node.
        type: path
        required: true
      sha256:
        description: The sha256 the run's plan pins for it (64 lower-case hex digits).
        type: str
        required: true
      content:
        description: The file's bytes, base64 (set by the action plugin from O(deploy[].src); not logged).
        type: str
attributes:
  check_mode:
    support: partial
    details:
      - V(started), V(renewed) and V(stopped) report what they would do without doing it; V(status) runs as usual.
  diff_mode:
    support: none
seealso:
  - module: orbite.qualification.supervised_process
    description: Launch, wait for or signal the supervisor's children.
  - module: orbite.qualification.runner
    description: Launch an engine runner as a child of the supervisor.
  - module: orbite.qualification.node_identity
    description: The identity the supervisor rechecks inside its locks.
"""

EXAMPLES = r"""
- name: Take the node's RNIC locks for this run
  orbite.qualification.node_supervisor:
    state: started
    run_id: "{{ run_id }}"
    locks: [mlx5_0, mlx5_1]
    hostname: "{{ node.identity.hostname }}"
    boot_id: "{{ node.identity.boot_id }}"
    lease: 900
  register: supervisor

- name: Deploy the runner checked against its pin, then take the locks, in one step
  orbite.qualification.node_supervisor:
    state: started
    run_id: "{{ run_id }}"
    locks: [mlx5_0, mlx5_1]
    deploy:
      - {name: runner, src: "{{ orbite_artifacts.runner.path }}", dest: /var/tmp/orbite/ra-1/orbite-sim-runner.pyz,
         sha256: "{{ orbite_artifacts.runner.sha256 }}"}

- name: Release the locks (also after a failure)
  orbite.qualification.node_supervisor:
    state: stopped
    run_id: "{{ run_id }}"
    force: true
"""

RETURN = r"""
supervisor:
  description: Status of the supervisor (V(started), V(status), V(renewed)).
  returned: when a supervisor runs
  type: dict
  contains:
    pid:
      description: Supervisor process id.
      type: int
      sample: 8655
    locks:
      description: Held locks, each with C(rnic), C(path) and C(owner) (the lock file record).
      type: list
      elements: dict
      sample:
        - rnic: mlx5_0
          path: /run/orbite/locks/mlx5_0.lock
          owner: {schema: orbite.rnic-lock, version: 1, rnic: mlx5_0, state: held, run_id: ra-1-read-polling,
                  controller: ctl, pid: 8655, hostname: rnic-a, boot_id: 4f0c7d3e-5a61-4d7b-9a55-0d1f6f2b9e10,
                  acquired_at: "2026-11-30T20:20:10.935208Z"}
    children:
      description: Child records (C(child_id), C(pid), C(start_time), C(running), exit status).
      type: list
      elements: dict
      sample: []
    lease_remaining_s:
      description: Seconds until the lease runs out.
      type: float
      sample: 599.961
  sample:
    run_id: ra-1-read-polling
    controller: ctl
    pid: 8655
    protocol: 1
    started_at: "2026-11-30T20:20:10.927531Z"
    identity: {root: /, hostname: rnic-a, boot_id: 4f0c7d3e-5a61-4d7b-9a55-0d1f6f2b9e10,
               kernel_release: 6.1.0-27-amd64, machine_id: 8b1a9953c4611296a827abf8c47804d7}
    locks: [{rnic: mlx5_0, path: /run/orbite/locks/mlx5_0.lock, owner: {run_id: ra-1-read-polling, state: held}},
            {rnic: mlx5_1, path: /run/orbite/locks/mlx5_1.lock, owner: {run_id: ra-1-read-polling, state: held}}]
    lease_s: 600.0
    lease_remaining_s: 599.961
    children: []
    journal: /run/orbite/supervisors/ra-1-read-polling/journal.jsonl
    socket: /run/orbite/supervisors/ra-1-read-polling/control.sock
deployed:
  description:
    - With O(deploy), per file C(name), C(dest), C(sha256) (as found on the node) and C(changed) (written by
      this task), as M(orbite.qualification.deploy_artifacts) returns its
      RV(orbite.qualification.deploy_artifacts#module:files).
  returned: when O(deploy) was given and every file is in place
  type: list
  elements: dict
  sample: [{name: runner, dest: /var/tmp/orbite/ra-1/orbite-sim-runner.pyz, changed: false,
            sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08}]
running:
  description: Whether a supervisor runs after the task.
  returned: always
  type: bool
  sample: true
journal:
  description: Path of the supervisor journal on the node.
  returned: always
  type: str
  sample: /run/orbite/supervisors/ra-1-read-polling/journal.jsonl
journal_exists:
  description: V(stopped) when no supervisor ran; whether a journal of an earlier supervisor is there.
  returned: when O(state=stopped) and no supervisor was running
  type: bool
  sample: true
run_dir:
  description: The run directory.
  returned: always
  type: str
  sample: /run/orbite/supervisors/ra-1-read-polling
summary:
  description:
    - V(stopped) only; C(locks_released), C(released), C(children_killed), C(children), C(reason).
    - When the supervisor did not answer, C(reason) is C(escalated) and C(escalation) lists the
      signals sent (C(SIGTERM), C(SIGKILL)).
  returned: when a running supervisor was stopped
  type: dict
  sample:
    reason: stop
    force: false
    children_killed: []
    children: [{child_id: c1, pid: 8656, start_time: 76326, argv: [/bin/sleep, "0.2"], running: false,
                exit_code: 0, exit_signal: null, exit_signal_name: null, started_at: "2026-11-30T20:20:10.972771Z"}]
    locks_released: true
    released: [{rnic: mlx5_1, path: /run/orbite/locks/mlx5_1.lock}, {rnic: mlx5_0, path: /run/orbite/locks/mlx5_0.lock}]
    journal: /run/orbite/supervisors/ra-1-read-polling/journal.jsonl
error:
  description: Stable failure code (C(supervisor.lock_timeout), C(supervisor.identity_mismatch),
    C(supervisor.children_running), C(supervisor.already_running), C(supervisor.unresponsive),
    C(supervisor.journal_error), ...).
  returned: failure
  type: str
  sample: supervisor.lock_timeout
owner:
  description: The lock file record of the current holder when C(error) is C(supervisor.lock_timeout).
  returned: failure
  type: dict
  sample: {schema: orbite.rnic-lock, version: 1, rnic: mlx5_0, state: held, run_id: ra-0-read-polling,
           controller: other-ctl, pid: 4242, hostname: rnic-a, boot_id: 4f0c7d3e-5a61-4d7b-9a55-0d1f6f2b9e10,
           acquired_at: "2026-11-30T19:02:41.118230Z"}
code:
  description:
    - Stable failure code; the supervisor's own code (as in RV(error)) when it refused, else C(supervisor.error);
      C(deploy.mismatch), C(deploy.invalid) or C(deploy.unpinned) when a file of O(deploy) is not the run's.
  returned: failure
  type: str
  sample: supervisor.lock_timeout
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._node_steps.node_supervisor import SPEC, run


def main():
    run(AnsibleModule(supports_check_mode=True, **SPEC))


if __name__ == "__main__":
    main()

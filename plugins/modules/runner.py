#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

DOCUMENTATION = r"""
---
module: runner
short_description: Launch an OrbiTE engine runner under the node's lock supervisor, or wait for it
version_added: 0.1.0
description:
  - O(state=started) writes the runner contract's case file (C(docs/runner-contract.md)) into a
    fresh private O(output_dir), checks every observer library and the O(verbs_library) against
    their pinned sha256, and launches the runner as a child of the node's supervisor with those
    libraries in C(LD_PRELOAD) (only when the mode needs them) and without
    C(RDMAV_ALLOW_DISASSOC_DESTROY). The supervisor runs the runner from a copy pinned to
    O(runner_sha256) and journals the case file it was given.
  - For the source, O(state=started) returns only once the runner wrote C(ready.json) (it listens on
    its service address), so the requester can be started next (an explicit readiness barrier). It
    fails at once if the source exits first.
  - O(state=started) with O(poll) also makes the first wait of O(state=finished) with O(poll) in the same call,
    once the runner is launched (and, for the source, ready), and returns what that wait returns as well
    (RV(finished), RV(progress), RV(progress_line)). Two steps in one call, because the requester's start is
    always followed at once by that wait; one round trip less per generation (issue 20).
  - O(state=finished) waits for the child to exit (up to O(timeout)), renewing the supervisor's
    lease meanwhile, and returns its exit status. With O(poll) it waits at most O(poll) seconds and
    returns RV(finished) and the runner's progress receipt (C(progress.json), C(docs/reports.md)); the
    collection's action plugin then calls that wait again itself until the runner exited or a call failed,
    printing RV(progress_line) at each call (a stuck round shows within seconds); the task returns once, with
    RV(finished) true, and needs no C(until)/C(retries), whose every retry a callback shows as C(FAILED - RETRYING).
  - O(state=restart_point) (installed-restart, C(docs/restart.md)) waits until the runner O(pid) wrote
    C(restart-point.json) in O(output_dir) (its generation's rounds done and drained), renewing the lease
    meanwhile; it fails at once if the runner exits first. Only then may the fault role be killed.
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.platform_linux
  - orbite.qualification._root
options:
  state:
    description: Launch the runner, wait for a launched one to finish, or wait for its restart point.
    type: str
    choices: [started, finished, restart_point]
    default: started
  supervisor_run_dir:
    description:
      - The private run directory of the node's supervisor
        (RV(orbite.qualification.node_supervisor#module:run_dir)).
    type: path
    required: true
  runner_argv:
    description:
      - The runner's command as a list, e.g. the installed binary, or C(python3) and the simulated
        runner's script; C(--case) and C(--output) are appended. Never a shell string.
      - Required with O(state=started).
    type: list
    elements: str
  runner_sha256:
    description:
      - The pinned sha256 of the runner, the last element of O(runner_argv) (the installed binary,
        from the installation manifest, or the simulated runner's zipapp that the interpreter runs).
        When given, the supervisor hands it over only as a copy it made while checking that hash, so
        a runner swapped after the check never runs.
    type: str
  output_dir:
    description: Directory on the node for the case file and receipts; it must not hold receipts already.
    type: path
    required: true
  role:
    description: The runner's role. Required with O(state=started).
    type: str
    choices: [source, requester]
  run_id:
    description:
      - The run's ID, echoed into the ledger. Required with O(state=started).
      - Like every name (RNIC, registration, observer), 1 to 64 ASCII letters, digits, C(.), C(_) or
        C(-), starting with a letter or digit; anything else (a trailing newline, a look-alike
        letter) is refused with C(runner.bad_input).
    type: str
  generation:
    description: Process generation (1 for single-generation modes).
    type: int
    default: 1
  profile:
    description:
      - The validated profile (RV(orbite.qualification.profile_info#module:profile)), written into the
        case file as it is; its fields are listed in C(docs/profiles.md).
      - Required with O(state=started).
    type: dict
  rails:
    description:
      - The node's two rails in rail order (index 0 is rail 0; bit I(i) of the profile's C(mask) enables rail I(i)).
      - Required unless the profile has C(discovery=auto); ignored with it (O(discovery) is used instead).
    type: list
    elements: dict
    suboptions:
      device:
        description: RDMA device name, as under C(/sys/class/infiniband).
        type: str
        required: true
      port:
        description: Port number on the device (1 or more).
        type: int
        required: true
      gid_index:
        description: Index of the RoCE v2 GID to use in the port's GID table (0..255).
        type: int
        required: true
  discovery:
    description:
      - Device filter for the engine's automatic discovery, with C(discovery=auto) in the profile.
        Defaults to empty lists.
    type: dict
    suboptions:
      whitelist:
        description:
          - Device names discovery may choose.
          - When not empty it takes precedence (a device in both lists is kept).
        type: list
        elements: str
        default: []
      blacklist:
        description: Device names discovery must not choose.
        type: list
        elements: str
        default: []
  service_address:
    description: The source's rendezvous address C(host:port) (port 0 lets it choose). Required for the source.
    type: str
  peer_address:
    description: The requester's peer, the source's ready address. Required for the requester.
    type: str
  registration_id:
    description: The engine's registration ID (kept across generations). Required with O(state=started).
    type: str
  peer_registration_id:
    description: The registration ID the requester expects from the source.
    type: str
  observers:
    description:
      - The observers the mode loads into this runner (C(accounting), C(cq_fault), C(uverbs_fault), C(inflight_fault)),
        written into the case file; the libraries themselves are O(ld_preload), for either runner kind.
    type: list
    elements: str
    default: []
  verbs_library:
    description:
      - The verbs library the runner loads, written into the case file as C(verbs_library); in the
        simulated lab, its loopback verbs provider. Its sha256 is checked here, and by the runner on
        the bytes it loads. Omitted, the runner uses the system's C(libibverbs.so.1).
    type: dict
    suboptions:
      path:
        description: Absolute path of the library on the node.
        type: path
        required: true
      sha256:
        description: The library's pinned sha256, lower-case hex.
        type: str
        required: true
  ld_preload:
    description:
      - Native observer libraries to load by C(LD_PRELOAD), in load order. A library whose sha256
        differs from its pin is refused. Only where the mode needs them, for either runner kind; the
        simulated runner runs on the loopback verbs provider, so the real observers see its verbs calls.
      - The supervisor hashes each library again while copying it into a sealed anonymous file,
        and preloads that copy (C(/proc/self/fd/N)), so the bytes loaded are the bytes checked.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of the library on the node (an existing regular file).
        type: path
        required: true
      sha256:
        description: The library's pinned sha256 (from the installation manifest), lower-case hex.
        type: str
        required: true
  env:
    description:
      - Extra environment for the runner, variable name to value.
      - The supervisor keeps only an allowlist (C(ORBITE_*), C(LC_*), C(PATH), C(HOME), C(LANG),
        C(LANGUAGE), C(TZ), C(TMPDIR), C(TERM), C(USER), C(LOGNAME), C(RUST_LOG), C(RUST_BACKTRACE));
        every C(LD_*) and C(RDMAV_*) variable (C(LD_PRELOAD), C(LD_AUDIT), C(LD_LIBRARY_PATH),
        C(RDMAV_ALLOW_DISASSOC_DESTROY), ...) and anything else is dropped, and listed in
        RV(env_stripped) and the supervisor journal.
      - With O(ld_preload) and O(observers), the observers log to C(observer-<tool>.bin) in O(output_dir) in
        binary records; C(ORBITE_OBSERVER_LOG_FORMAT=json) here makes it JSON lines in C(observer-<tool>.jsonl)
        instead (debugging; the verifier reads both).
    type: dict
    default: {}
  defects:
    description: Simulated runner only, for red checks of the verifier; never set by the gate playbooks' defaults.
    type: list
    elements: str
    default: []
  ready_timeout:
    description: Seconds the source may take to become ready.
    type: float
    default: 60
  child_id:
    description: The supervisor's child ID of the runner (C(child_id) of RV(child)), with O(state=finished) or
      O(state=restart_point).
    type: str
  pid:
    description: The runner's pid (C(pid) of RV(child)), with O(state=restart_point); the restart point must be its.
    type: int
  timeout:
    description:
      - Seconds to wait for the runner to exit (O(state=finished)) or reach its restart point
        (O(state=restart_point)).
      - With O(poll), the longest the runner may run, counted from the supervisor's record of its start.
    type: float
    default: 600
  poll:
    description:
      - With O(state=finished), wait at most this many seconds, then return RV(finished) (false while
        the runner still runs) and its progress. Unset, wait until the runner exits or O(timeout).
      - With O(state=started), that first wait right after the launch (O(timeout) and O(label) as for it).
      - Under a supervisor lease shorter than 30 s the call waits up to O(timeout) instead (the pause
        before the next call could outlast the lease).
    type: float
  label:
    description: What RV(progress_line) names the runner by (the case ID).
    type: str
attributes:
  check_mode:
    support: partial
    details:
      - With O(state=started) check mode validates the input and returns the case file without launching.
      - With O(state=finished) check mode does nothing.
  diff_mode:
    support: none
seealso:
  - module: orbite.qualification.node_supervisor
    description: Start the supervisor the runner runs under, and stop it afterwards.
  - module: orbite.qualification.supervised_process
    description: The generic launch, wait and signal of supervised children.
  - module: orbite.qualification.profile_info
    description: Validate the profile passed in O(profile).
"""

EXAMPLES = r"""
- name: Start the source runner and wait until it listens
  orbite.qualification.runner:
    supervisor_run_dir: /run/orbite/supervisors/ra-1-read-polling
    runner_argv: ["/usr/bin/python3", "/opt/orbite/orbite-sim-runner.pyz"]
    runner_sha256: "{{ orbite_artifacts.runner.sha256 }}"
    verbs_library: {path: /opt/orbite/native/libibverbs.so.1, sha256: "{{ orbite_artifacts.verbs_library.sha256 }}"}
    output_dir: /var/tmp/orbite/run-1/read-polling/source/g1
    role: source
    run_id: run-1
    profile: "{{ orbite_profile_normalized }}"
    rails: "{{ orbite_rails }}"
    service_address: 127.0.0.11:0
    registration_id: reg-source
  register: source_runner

- name: Wait for it to finish
  orbite.qualification.runner:
    state: finished
    supervisor_run_dir: /run/orbite/supervisors/ra-1-read-polling
    output_dir: /var/tmp/orbite/run-1/read-polling/source/g1
    child_id: "{{ source_runner.child.child_id }}"
    timeout: 300
"""

RETURN = r"""
child:
  description:
    - The supervisor's record of the runner child (see RV(orbite.qualification.supervised_process#module:child)).
  returned: when launched or waited for
  type: dict
  sample:
    child_id: c1
    pid: 8656
    start_time: 76326
    argv: [/usr/bin/python3, /opt/orbite/orbite-sim-runner.pyz,
           --case, /var/tmp/orbite/ra-1/read-polling/source/g1/case.json,
           --output, /var/tmp/orbite/ra-1/read-polling/source/g1]
    running: false
    exit_code: 0
    exit_signal: null
    exit_signal_name: null
    started_at: "2026-11-30T20:20:10.972771Z"
case:
  description: The case file that would be written (check mode).
  returned: check mode with O(state=started)
  type: dict
  sample: {schema: orbite.runner-case, version: 1, protocol: orbite-installed-host-v4, run_id: ra-1, role: source,
           generation: 1, profile: {mode: installed-rail-accounting, operation: read}, root: /,
           registration_id: ra-1-read-polling-source, observers: [],
           rails: [{device: mlx5_0, port: 1, gid_index: 3}, {device: mlx5_1, port: 1, gid_index: 3}],
           service_address: "192.0.2.10:7471"}
ld_preload:
  description: The checked library paths that would be preloaded (check mode).
  returned: check mode with O(state=started)
  type: list
  elements: str
  sample: [/opt/orbite/lib/liborbite_accounting.so]
case_path:
  description: Path of the case file on the node.
  returned: O(state=started), not in check mode
  type: str
  sample: /var/tmp/orbite/ra-1/read-polling/source/g1/case.json
output_dir:
  description: The runner's output directory on the node.
  returned: O(state=started), not in check mode
  type: str
  sample: /var/tmp/orbite/ra-1/read-polling/source/g1
ready:
  description: The source's C(ready.json) (bound service address, epoch, pid); null for the requester.
  returned: O(state=started), not in check mode
  type: dict
  sample: {schema: orbite.runner-ready, version: 1, protocol: orbite-installed-host-v4, pid: 8656, role: source,
           generation: 1, epoch: 8781239018231, registration_id: ra-1-read-polling-source,
           service_address: "127.0.0.11:40123"}
restart_point:
  description: The runner's C(restart-point.json) (pid, role, generation, epoch), with O(state=restart_point).
  returned: O(state=restart_point)
  type: dict
  sample: {schema: orbite.runner-restart-point, version: 1, protocol: orbite-installed-host-v4, pid: 8656,
           role: source, generation: 1, epoch: 8781239018231, survivor: false, rounds: 3}
env_stripped:
  description: Names of O(env) variables the supervisor dropped (not on its allowlist).
  returned: O(state=started), not in check mode
  type: list
  elements: str
  sample: [LD_LIBRARY_PATH, RDMAV_ALLOW_DISASSOC_DESTROY]
ledger:
  description: Path where the runner writes its ledger.
  returned: success, not in check mode
  type: str
  sample: /var/tmp/orbite/ra-1/read-polling/source/g1/ledger.json
finished:
  description:
    - With O(poll), whether the runner exited (false while it still runs, from the module; the action plugin
      returns once it is true, or failed).
  returned: O(poll) given
  type: bool
  sample: false
progress:
  description:
    - The runner's progress receipt C(progress.json) (role, generation, round, rounds, phase, WRs done, posted
      and in all in the round), or null when it wrote none (yet).
  returned: O(poll) given
  type: dict
  sample: {schema: orbite.runner-progress, version: 1, pid: 8656, role: requester, generation: 1, round: 2,
           rounds: 3, phase: transfer, wrs_done: 43, wrs_posted: 51, wrs_total: 64, updated_at: 1796090473.5}
progress_line:
  description: The progress as one line.
  returned: O(poll) given
  type: str
  sample: case read-polling requester g1 round 2/3, 51 posted, 43 completed of 64 WRs (12.4 s)
code:
  description: Stable failure code (C(runner.bad_input), C(runner.hash_mismatch) (a runner, observer or verbs
    library that is not its pin), C(runner.output_not_empty), C(runner.launch_failed), C(runner.exited_before_ready),
    C(runner.ready_invalid), C(runner.ready_mismatch), C(runner.ready_timeout), C(runner.exited_before_restart_point),
    C(runner.restart_point_mismatch), C(runner.timeout), ...).
  returned: failure
  type: str
  sample: runner.hash_mismatch
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._node_steps.runner import SPEC, run


def main():
    run(AnsibleModule(supports_check_mode=True, **SPEC))


if __name__ == "__main__":
    main()

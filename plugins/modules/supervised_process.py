#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

DOCUMENTATION = r"""
---
module: supervised_process
short_description: Launch, wait for or signal a child of the per-node lock supervisor
version_added: 0.1.0
description:
  - Talks to the supervisor started by M(orbite.qualification.node_supervisor) over its private
    control socket. The child is the supervisor's, so it stays under the RNIC locks, is journaled,
    and is killed and reaped when the lease runs out or the supervisor is stopped with force.
  - V(launch) starts O(argv) (a list, never run through a shell) with the allowed part of O(env) as
    its environment (every C(LD_*) and C(RDMAV_*) variable and anything else off the supervisor's
    allowlist is removed, and the result and the journal say so) and C(LD_PRELOAD) naming hash-checked
    copies of the O(ld_preload) libraries.
  - V(wait) waits up to O(timeout) seconds for the child to exit.
  - V(signal) sends O(signal) to the one child named by O(child_id), O(pid) and O(start_time); a
    mismatch (for example a reused pid) is refused. With O(reap) it waits for the exit status.
  - One of O(run_id) and O(run_dir) is required.
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.platform_linux
  - orbite.qualification._root
  - orbite.qualification._supervisor
options:
  action:
    description:
      - What to do.
      - V(launch) requires O(argv); V(wait) requires O(child_id); V(signal) requires O(child_id),
        O(pid) and O(start_time).
    type: str
    choices: [launch, wait, signal]
    required: true
  argv:
    description: V(launch) only; the command as a list; C(argv[0]) must be an absolute path of an executable.
    type: list
    elements: str
  exe_sha256:
    description:
      - V(launch) only; the pinned sha256 of C(argv[0]). The supervisor then runs C(argv[0]) only
        from a copy it made while checking that hash (a mismatch fails with C(supervisor.hash_mismatch)).
    type: str
  argv_pins:
    description:
      - V(launch) only; files named by O(argv) entries that the child reads (a zipapp run by an
        interpreter, its case file), as argv index (decimal text) to the pinned sha256, or null.
      - The supervisor copies each one into a sealed anonymous file while hashing it and passes the
        copy's C(/proc/self/fd/N) in place of the entry, so what the child reads is what was hashed;
        a sha256 is checked (C(supervisor.hash_mismatch) otherwise), null only records the hash in the journal
        (C(child_start) C(pinned)). Index C(0) is C(argv[0]), exec'd from its copy (as O(exe_sha256)).
      - Keys and values as in docs/supervisor.md (launch request).
    type: dict
  record_json:
    description:
      - V(launch) only; argv indexes pinned by O(argv_pins) whose file is a small JSON object (at most
        256 KiB, such as the runner's case file). The journal's C(child_start) records it whole, so what
        the child was told is on record. A file that is not a JSON object fails the launch (C(supervisor.pin_failed)).
    type: list
    elements: int
  env_pins:
    description:
      - V(launch) only; files named by O(env) values that the child reads (a library it loads by
        path), as variable name to the pinned sha256, or null; pinned as O(argv_pins), the value
        becomes the copy's C(/proc/self/fd/N). The variable must be kept by the allowlist.
      - Keys and values as in docs/supervisor.md (launch request).
    type: dict
  env:
    description:
      - V(launch) only; the child's whole environment, variable name to value (nothing is inherited).
      - Values are passed as strings.
      - Only an allowlist is kept (C(ORBITE_*), C(LC_*), C(PATH), C(HOME), C(LANG), C(LANGUAGE),
        C(TZ), C(TMPDIR), C(TERM), C(USER), C(LOGNAME), C(RUST_LOG), C(RUST_BACKTRACE)); the other
        names are dropped and returned in RV(env_stripped).
    type: dict
    default: {}
  cwd:
    description: V(launch) only; working directory (absolute, existing).
    type: path
  ld_preload:
    description:
      - V(launch) only; libraries for C(LD_PRELOAD), in load order, each pinned to its sha256.
      - The supervisor copies each one into a sealed anonymous file while hashing it, refuses a
        mismatch (C(supervisor.hash_mismatch)), and preloads the copy, so the bytes loaded are the bytes checked.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of an existing regular file (not a symlink; no spaces or colons).
        type: path
        required: true
      sha256:
        description: The library's sha256, 64 lower-case hex digits.
        type: str
        required: true
  stdout_path:
    description: V(launch) only; file receiving the child's standard output (created 0600, truncated).
    type: path
  stderr_path:
    description: V(launch) only; file receiving the child's standard error (created 0600, truncated).
    type: path
  child_id:
    description: V(wait) and V(signal); the supervisor's child id (C(c1), C(c2), ...).
    type: str
  pid:
    description: V(signal) only; the child's pid as returned by V(launch).
    type: int
  start_time:
    description: V(signal) only; the child's start time (clock ticks since boot) as returned by V(launch).
    type: int
  signal:
    description: V(signal) only; signal name or number.
    type: str
    default: SIGKILL
  reap:
    description: V(signal) only; wait for the child to exit and return its exit status.
    type: bool
    default: true
  timeout:
    description: Seconds to wait (V(wait), and V(signal) with O(reap)).
    type: float
    default: 30
attributes:
  check_mode:
    support: partial
    details:
      - V(wait) runs in check mode (it changes nothing); V(launch) and V(signal) only check that the
        supervisor answers.
  diff_mode:
    support: none
seealso:
  - module: orbite.qualification.node_supervisor
    description: Start and stop the supervisor whose children this module handles.
  - module: orbite.qualification.runner
    description: Launch an engine runner (case file, pinned observers, readiness) through the supervisor.
"""

EXAMPLES = r"""
- name: Start the source runner under the supervisor
  orbite.qualification.supervised_process:
    action: launch
    run_id: "{{ run_id }}"
    argv: [/opt/orbite/bin/orbite-rdma-host, --role, source]
    env:
      PATH: /usr/bin:/bin
    stdout_path: /var/tmp/orbite/source.out
  register: source

- name: Kill exactly that child and reap it
  orbite.qualification.supervised_process:
    action: signal
    run_id: "{{ run_id }}"
    child_id: "{{ source.child.child_id }}"
    pid: "{{ source.child.pid }}"
    start_time: "{{ source.child.start_time }}"
    signal: SIGKILL
"""

RETURN = r"""
child:
  description: The supervisor's record of the child.
  returned: success, except in check mode for launch and signal
  type: dict
  contains:
    child_id:
      description: Child id, unique within the supervisor.
      type: str
      sample: c1
    pid:
      description: Process id.
      type: int
      sample: 8656
    start_time:
      description: Start time in clock ticks since boot (from C(/proc/<pid>/stat)).
      type: int
      sample: 76326
    argv:
      description: The command the child runs.
      type: list
      elements: str
      sample: [/opt/orbite/bin/orbite-rdma-host, --role, source]
    running:
      description: Whether the child still runs.
      type: bool
      sample: false
    exit_code:
      description: Exit code, or null (still running or killed by a signal).
      type: int
      sample: 0
    exit_signal:
      description: Number of the signal that ended it, or null.
      type: int
      sample: 9
    exit_signal_name:
      description: Name of the signal that ended it, or null.
      type: str
      sample: SIGKILL
    started_at:
      description: When the supervisor started the child (UTC, ISO 8601).
      type: str
      sample: "2026-11-30T20:20:10.972771Z"
timed_out:
  description: V(wait) only; true when the child still ran at the timeout.
  returned: action is wait
  type: bool
  sample: false
env_stripped:
  description: V(launch) only; environment keys removed from O(env) (not on the supervisor's allowlist).
  returned: action is launch
  type: list
  elements: str
  sample: [RDMAV_ALLOW_DISASSOC_DESTROY]
error:
  description: Stable failure code from the supervisor (C(supervisor.signal_refused), C(supervisor.unknown_child), ...).
  returned: failure
  type: str
  sample: unknown_child
pinned:
  description:
    - V(launch) only; every file pinned for the child, in the order of the journal's C(child_start)
      C(pinned) (C(argv[0]), argv entries, env values, preloads).
  returned: action is launch
  type: list
  elements: dict
  contains:
    what:
      description: Which entry the file was given as (C(argv[0]), C(argv[3]), C(env[ORBITE_X]), C(ld_preload[0])).
      type: str
      sample: argv[1]
    path:
      description: The path it was read from.
      type: str
      sample: /var/tmp/orbite/r1/orbite-sim-runner.pyz
    sha256:
      description: The sha256 of the bytes the child got.
      type: str
      sample: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
    size:
      description: Its size in bytes.
      type: int
      sample: 182734
    copy:
      description: C(memfd) (a sealed anonymous file) or C(private-copy) (an unlinked private file).
      type: str
      sample: memfd
    loaded_as:
      description: The name the child got for it (C(/proc/self/fd/N)).
      type: str
      sample: /proc/self/fd/5
    json:
      description: The file's JSON object, for the entries of O(record_json) only.
      type: dict
      sample: {"schema": "orbite.runner-case", "version": 1, "role": "source"}
skipped_reason:
  description: V(launch) and V(signal) in check mode; why nothing was done.
  returned: check mode, action is launch or signal
  type: str
  sample: check mode
code:
  description:
    - Stable failure code; the supervisor's own code (as in RV(error)) when it refused, else C(supervisor.error).
  returned: failure
  type: str
  sample: unknown_child
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._node_steps.supervised_process import SPEC, run


def main():
    run(AnsibleModule(supports_check_mode=True, **SPEC))


if __name__ == "__main__":
    main()

#!/usr/bin/python
# Copyright: OrbiTE qualification contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
module: supervised_process
short_description: Launch, wait for or signal a child of the per-node lock supervisor
version_added: 0.1.0
description:
  - Talks to the supervisor started by M(orbite.qualification.node_supervisor) over its private
    control socket. The child is the supervisor's, so it stays under the RNIC locks, is journaled,
    and is killed and reaped when the lease runs out or the supervisor is stopped with force.
  - V(launch) starts O(argv) (a list, never run through a shell) with exactly O(env) as its
    environment (C(RDMAV_ALLOW_DISASSOC_DESTROY) is always removed and the journal says so) and
    C(LD_PRELOAD) built from O(ld_preload) (absolute paths of existing regular files).
  - V(wait) waits up to O(timeout) seconds for the child to exit.
  - V(signal) sends O(signal) to the one child named by O(child_id), O(pid) and O(start_time); a
    mismatch (for example a reused pid) is refused. With O(reap) it waits for the exit status.
author:
  - OrbiTE qualification team
options:
  action:
    description: What to do.
    type: str
    choices: [launch, wait, signal]
    required: true
  run_id:
    description: The run whose supervisor to use (locates C(<root>/run/orbite/supervisors/<run_id>)).
    type: str
  run_dir:
    description: The supervisor's run directory; overrides O(run_id) and O(root).
    type: path
  root:
    description: The host root used with O(run_id).
    type: path
    default: /
  argv:
    description: V(launch) only; the command as a list; C(argv[0]) must be an absolute path of an executable.
    type: list
    elements: str
  env:
    description: V(launch) only; the child's whole environment (nothing is inherited).
    type: dict
    default: {}
  cwd:
    description: V(launch) only; working directory (absolute, existing).
    type: path
  ld_preload:
    description: V(launch) only; libraries for C(LD_PRELOAD), absolute paths of existing regular files.
    type: list
    elements: path
    default: []
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
    details: V(wait) runs in check mode (it changes nothing); V(launch) and V(signal) are skipped.
  diff_mode:
    support: none
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
    pid:
      description: Process id.
      type: int
    start_time:
      description: Start time in clock ticks since boot (from C(/proc/<pid>/stat)).
      type: int
    running:
      description: Whether the child still runs.
      type: bool
    exit_code:
      description: Exit code, or null (still running or killed by a signal).
      type: int
    exit_signal:
      description: Number of the signal that ended it, or null.
      type: int
timed_out:
  description: V(wait) only; true when the child still ran at the timeout.
  returned: action is wait
  type: bool
env_stripped:
  description: V(launch) only; environment keys removed from O(env).
  returned: action is launch
  type: list
  elements: str
error:
  description: Stable failure code from the supervisor (C(signal_refused), C(unknown_child), ...).
  returned: failure
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._node.client import (
    SupervisorClient,
    SupervisorError,
    SupervisorRequestError,
    default_run_dir,
)

_NEEDS = {"launch": ("argv",), "wait": ("child_id",), "signal": ("child_id", "pid", "start_time")}


def main():
    module = AnsibleModule(
        argument_spec={
            "action": {"type": "str", "choices": ["launch", "wait", "signal"], "required": True},
            "run_id": {"type": "str"},
            "run_dir": {"type": "path"},
            "root": {"type": "path", "default": "/"},
            "argv": {"type": "list", "elements": "str"},
            "env": {"type": "dict", "default": {}},
            "cwd": {"type": "path"},
            "ld_preload": {"type": "list", "elements": "path", "default": []},
            "stdout_path": {"type": "path"},
            "stderr_path": {"type": "path"},
            "child_id": {"type": "str"},
            "pid": {"type": "int"},
            "start_time": {"type": "int"},
            "signal": {"type": "str", "default": "SIGKILL"},
            "reap": {"type": "bool", "default": True},
            "timeout": {"type": "float", "default": 30},
        },
        required_one_of=[("run_id", "run_dir")],
        required_if=[(action, action, needs) for action, needs in _NEEDS.items()],
        supports_check_mode=True,
    )
    p = module.params
    action = p["action"]
    try:
        client = SupervisorClient(p["run_dir"] or default_run_dir(p["root"], p["run_id"]))
        if action == "wait":
            child = client.wait(p["child_id"], p["timeout"])
            timed_out = child.pop("timed_out")
            module.exit_json(changed=False, child=child, timed_out=timed_out)
        if module.check_mode:
            client.status()  # the supervisor must at least be there
            module.exit_json(changed=True, skipped_reason="check mode")
        if action == "launch":
            env = {str(k): str(v) for k, v in p["env"].items()}
            child = client.launch(p["argv"], env=env, cwd=p["cwd"], ld_preload=p["ld_preload"],
                                  stdout_path=p["stdout_path"], stderr_path=p["stderr_path"])
            stripped = child.pop("env_stripped")
            module.exit_json(changed=True, child=child, env_stripped=stripped)
        child = client.signal(p["child_id"], p["pid"], p["start_time"], p["signal"], reap=p["reap"],
                              timeout=p["timeout"])
        module.exit_json(changed=True, child=child)
    except SupervisorRequestError as exc:
        fail_from(module, exc, prefix=f"supervisor refused {action}", error=exc.code, child=exc.response.get("child"))
    except SupervisorError as exc:
        fail_from(module, exc, prefix=action, error=type(exc).__name__)


if __name__ == "__main__":
    main()

#!/usr/bin/python
# Copyright: OrbiTE qualification contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
module: runner
short_description: Launch an OrbiTE engine runner under the node's lock supervisor, or wait for it
version_added: 0.1.0
description:
  - O(state=started) writes the runner contract's case file (C(docs/runner-contract.md)) into a
    fresh private O(output_dir), checks every observer library against its pinned sha256, and
    launches the runner as a child of the node's supervisor with those libraries in C(LD_PRELOAD)
    (only when the mode needs them) and without C(RDMAV_ALLOW_DISASSOC_DESTROY).
  - For the source, O(state=started) returns only once the runner wrote C(ready.json) (it listens on
    its service address), so the requester can be started next (an explicit readiness barrier). It
    fails at once if the source exits first.
  - O(state=finished) waits for the child to exit (up to O(timeout)) and returns its exit status.
author:
  - OrbiTE qualification team
options:
  state:
    description: Launch the runner, or wait for a launched one to finish.
    type: str
    choices: [started, finished]
    default: started
  supervisor_run_dir:
    description:
      - The private run directory of the node's supervisor
        (returned by P(orbite.qualification.node_supervisor#module)).
    type: path
    required: true
  runner_argv:
    description:
      - The runner's command as a list, e.g. the installed binary, or C(python3) and the simulated
        runner's script; C(--case) and C(--output) are appended. Never a shell string.
      - Required with O(state=started).
    type: list
    elements: str
  output_dir:
    description: Directory on the node for the case file and receipts; it must not hold receipts already.
    type: path
    required: true
  role:
    description: The runner's role. Required with O(state=started).
    type: str
    choices: [source, requester]
  run_id:
    description: The run's ID, echoed into the ledger. Required with O(state=started).
    type: str
  generation:
    description: Process generation (1 for single-generation modes).
    type: int
    default: 1
  profile:
    description:
      - The validated profile (from P(orbite.qualification.profile_info#module)).
      - Required with O(state=started).
    type: dict
  root:
    description:
      - The host root the runner reads C(/sys) and C(/proc) from (a fake host's directory in the simulated lab).
    type: path
    default: /
  rails:
    description: The node's two rails (device, port, gid_index); required unless the profile has C(discovery=auto).
    type: list
    elements: dict
  discovery:
    description: C(whitelist) and C(blacklist) of device names, with C(discovery=auto).
    type: dict
  service_address:
    description: The source's rendezvous address C(host:port) (port 0 lets it choose).
    type: str
  peer_address:
    description: The requester's peer, the source's ready address.
    type: str
  registration_id:
    description: The engine's registration ID (kept across generations). Required with O(state=started).
    type: str
  peer_registration_id:
    description: The registration ID the requester expects from the source.
    type: str
  observers:
    description:
      - The observers the mode loads into this runner (C(accounting), C(cq_fault), C(uverbs_fault)),
        written into the case file. The simulated runner models them in-process.
    type: list
    elements: str
    default: []
  ld_preload:
    description:
      - Native observer libraries to load by C(LD_PRELOAD), each C(path) and C(sha256); a library
        whose hash differs is refused. Only for a native runner and only where the mode needs them.
    type: list
    elements: dict
    default: []
  env:
    description: Extra environment for the runner (C(LD_PRELOAD) and C(RDMAV_ALLOW_DISASSOC_DESTROY) are dropped).
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
    description: The supervisor's child ID of the runner, with O(state=finished).
    type: str
  timeout:
    description: Seconds to wait for the runner to exit, with O(state=finished).
    type: float
    default: 600
attributes:
  check_mode:
    support: partial
    details: With O(state=started) check mode validates the input and returns the case file without launching.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Start the source runner and wait until it listens
  orbite.qualification.runner:
    supervisor_run_dir: "{{ node_supervisor_run_dir }}"
    runner_argv: ["/usr/bin/python3", "/opt/orbite/sim/orbite_sim_runner.py"]
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
    supervisor_run_dir: "{{ node_supervisor_run_dir }}"
    output_dir: /var/tmp/orbite/run-1/read-polling/source/g1
    child_id: "{{ source_runner.child.child_id }}"
    timeout: 300
"""

RETURN = r"""
child:
  description: The supervisor's record of the runner child (child_id, pid, start_time, exit_code, exit_signal).
  returned: when launched or waited for
  type: dict
case:
  description: The case file that would be written (check mode).
  returned: check mode
  type: dict
case_path:
  description: Path of the case file on the node.
  returned: state=started
  type: str
ready:
  description: The source's C(ready.json) (bound service address, data address, epoch, pid).
  returned: state=started and role=source
  type: dict
ledger:
  description: Path where the runner writes its ledger.
  returned: success
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._run.launch import RunnerError, finish, start

_STARTED_REQUIRES = ("runner_argv", "role", "run_id", "profile", "registration_id")


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["started", "finished"], "default": "started"},
            "supervisor_run_dir": {"type": "path", "required": True},
            "runner_argv": {"type": "list", "elements": "str"},
            "output_dir": {"type": "path", "required": True},
            "role": {"type": "str", "choices": ["source", "requester"]},
            "run_id": {"type": "str"},
            "generation": {"type": "int", "default": 1},
            "profile": {"type": "dict"},
            "root": {"type": "path", "default": "/"},
            "rails": {"type": "list", "elements": "dict"},
            "discovery": {"type": "dict"},
            "service_address": {"type": "str"},
            "peer_address": {"type": "str"},
            "registration_id": {"type": "str"},
            "peer_registration_id": {"type": "str"},
            "observers": {"type": "list", "elements": "str", "default": []},
            "ld_preload": {"type": "list", "elements": "dict", "default": []},
            "env": {"type": "dict", "default": {}},
            "defects": {"type": "list", "elements": "str", "default": []},
            "ready_timeout": {"type": "float", "default": 60},
            "child_id": {"type": "str"},
            "timeout": {"type": "float", "default": 600},
        },
        required_if=[("state", "started", _STARTED_REQUIRES), ("state", "finished", ("child_id",))],
        supports_check_mode=True,
    )
    params = module.params
    try:
        if params["state"] == "started":
            result = start(params, check_mode=module.check_mode)
        elif module.check_mode:
            result = {"changed": False}
        else:
            result = finish(params)
    except RunnerError as error:
        fail_from(module, error)
    except OSError as error:
        fail_from(module, error, prefix=f"runner {params['state']}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()

#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

DOCUMENTATION = r"""
---
module: control_relay
short_description: Start, await or stop the control relay of installed-interruption on the source node
version_added: 0.1.0
description:
  - The control relay (docs/interruption.md) sits on the rendezvous between the requester and the
    source runner. It forwards the descriptor exchange and the handshake both ways, and holds the
    source's READY (its grant) of every round after O(hold_after_round), sent once the source has
    bound its memory window and posted its completion receive. Payload never passes it.
  - V(started) installs the relay program (one stdlib-only file) and its configuration in the private
    O(state_dir) (mode 0700, files 0600) and starts it detached, listening on O(listen), forwarding to
    O(upstream). It ends by itself when O(lease) seconds have passed, so a controller that died never
    leaves it running.
  - V(holding) waits until the relay holds at least O(held) grants (the held state the controller waits
    for before a kill, never a timer); it fails at once when no relay runs.
  - V(stopped) stops the relay over its control socket and makes sure it is gone (SIGKILL, pid and start
    time checked, if it did not end within O(timeout)); nothing to do when none runs. Run it in an
    C(always) section.
  - The relay journals every frame it forwarded or held in C(relay.jsonl) in O(state_dir), the
    verifier's witness of the held grants.
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.platform_linux
options:
  state:
    description: What to do.
    type: str
    choices: [started, holding, stopped]
    required: true
  state_dir:
    description: The relay's private directory (absolute; created 0700), for its program, configuration, control
      socket, ready record and journal.
    type: path
    required: true
  listen:
    description: V(started) only; the address the requester connects to, C(host:port) (IPv6 as C([addr]:port));
      port 0 picks a free one (RV(ready) says which).
    type: str
  upstream:
    description: V(started) only; the source runner's service address, C(host:port) with a real port.
    type: str
  run_id:
    description: V(started) only; the run the relay serves (journaled).
    type: str
  hold_after_round:
    description: V(started) only; READY of a round after this one is held (the rounds each generation runs).
    type: int
    default: 3
  lease:
    description: V(started) only; seconds after which the relay ends by itself.
    type: float
    default: 3600
  defects:
    description:
      - V(started) only; defect switches of the relay, for the verifier's red checks only (a run with one is
        diagnostic and never passes). V(leak_grant) forwards the grant it should hold.
    type: list
    elements: str
    choices: [leak_grant]
    default: []
  held:
    description: V(holding) only; how many grants the relay must hold (one per nonfinal generation so far).
    type: int
  timeout:
    description: Seconds to wait (V(started) until it listens, V(holding), V(stopped) before the kill).
    type: float
    default: 300
  python:
    description: V(started) only; the interpreter that runs the relay (default the one running this module).
    type: path
  supervisor_run_dir:
    description:
      - V(started) only; the run directory of the node's lock supervisor. The relay then ends as soon as that
        supervisor is gone (its lease ran out or it was stopped), whatever O(lease) says.
    type: path
attributes:
  check_mode:
    support: full
    details: V(started) and V(stopped) only report what they would do; V(holding) reads the relay's status.
  diff_mode:
    support: none
seealso:
  - module: orbite.qualification.runner
    description: Start the runners whose rendezvous the relay carries.
"""

EXAMPLES = r"""
- name: Start the relay in front of the source runner
  orbite.qualification.control_relay:
    state: started
    state_dir: /var/tmp/orbite/run-1/case-1/relay
    listen: 192.0.2.10:0
    upstream: 192.0.2.10:18515
    run_id: run-1
  register: relay

- name: Wait until the relay holds this generation's grant
  orbite.qualification.control_relay:
    state: holding
    state_dir: /var/tmp/orbite/run-1/case-1/relay
    held: 1
    timeout: 300

- name: Stop the relay (always)
  orbite.qualification.control_relay:
    state: stopped
    state_dir: /var/tmp/orbite/run-1/case-1/relay
"""

RETURN = r"""
ready:
  description: V(started) the relay's ready record.
  returned: state is started, not in check mode
  type: dict
  contains:
    pid:
      description: The relay's pid.
      type: int
      sample: 4242
    start_time:
      description: Its start time in clock ticks since boot.
      type: int
      sample: 76326
    address:
      description: The address it listens on (the requester's peer address).
      type: str
      sample: 192.0.2.10:40113
    upstream:
      description: The source's service address it forwards to.
      type: str
      sample: 192.0.2.10:18515
status:
  description: V(holding) the relay's counts.
  returned: state is holding
  type: dict
  contains:
    held:
      description: Grants held so far.
      type: int
      sample: 1
    forwarded:
      description: Frames forwarded so far.
      type: int
      sample: 37
    leaked:
      description: Grants forwarded that should have been held (the leak_grant switch).
      type: int
      sample: 0
    connections:
      description: Requester connections accepted.
      type: int
      sample: 1
stopped:
  description: V(stopped) whether the relay is gone now.
  returned: state is stopped
  type: bool
  sample: true
was_running:
  description: V(stopped) whether a relay ran when the module was called.
  returned: state is stopped
  type: bool
  sample: true
killed:
  description: V(stopped) whether it had to be killed (it did not end on stop within O(timeout)).
  returned: state is stopped
  type: bool
  sample: false
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._node_steps.control_relay import SPEC, run


def main():
    run(AnsibleModule(supports_check_mode=True, **SPEC))


if __name__ == "__main__":
    main()

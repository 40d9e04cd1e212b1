#!/usr/bin/python
# Copyright: OrbiTE qualification contributors
# Apache License 2.0 (see galaxy.yml)

DOCUMENTATION = r"""
---
module: profile_info
short_description: Validate an OrbiTE qualification profile and derive its expected workload
version_added: 0.1.0
description:
  - Parses a qualification profile (a mapping, JSON or YAML text, or a file on the controller),
    applies the gate-wide bounds and the rules of its mode, and returns the normalized profile with
    the workload the gate must observe (slices, payload WRs and bytes per round, per rail and lane,
    backing per peer, rounds, generations, QP bound, observers).
  - Fails listing B(every) broken rule, each naming the field, the value and the rule.
  - Runs on the controller and changes nothing; check mode is fully supported.
  - Survey values arrive as strings; integers and booleans given as strings are cast.
author:
  - OrbiTE qualification team
options:
  profile:
    description:
      - The profile as a mapping, or as JSON/YAML text.
      - Mutually exclusive with O(path).
    type: raw
  path:
    description:
      - Path of a JSON or YAML profile file on the host the module runs on (the controller).
      - Mutually exclusive with O(profile).
    type: path
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
notes:
  - The bounds, mode rules and derivation are documented in C(docs/profiles.md).
"""

EXAMPLES = r"""
- name: Validate the frozen rail-accounting profile
  orbite.qualification.profile_info:
    profile:
      source: sim-a
      requester: sim-b
      source_kind: cpu
      requester_kind: cpu
      transport: rdma
      mode: installed-rail-accounting
      operation: read
      rdma_events: false
      parents: 16
      payload: 4194305
      block: 1048576
      num_lanes: 1
      mask: 3
  delegate_to: localhost
  register: rail

- name: Validate a profile file
  orbite.qualification.profile_info:
    path: profiles/installed_host.json
  delegate_to: localhost
"""

RETURN = r"""
profile:
  description: The normalized profile (integers and booleans cast, mode defaults applied).
  returned: success
  type: dict
workload:
  description: The expected workload derived from the profile.
  returned: success
  type: dict
  contains:
    wrs_per_round:
      description: Payload work requests per round (one per slice).
      type: int
    bytes_per_round:
      description: Payload bytes per round.
      type: int
    slices_per_parent:
      description: Slices per parent, C(max(1, payload // block)).
      type: int
    backing_per_peer:
      description: Bytes of backing per peer, C(parents x (payload + 2 x guard)).
      type: int
    qp_bound_per_peer_operation:
      description: The QP bound, C(rails x lanes), per peer and operation.
      type: int
    observers:
      description: Native observers the mode loads, with the role whose runner loads them.
      type: list
      elements: dict
violations:
  description: Every broken rule, with C(code), C(field), C(value), C(rule) and C(message).
  returned: failure
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._profile.model import (
    ProfileError,
    load_and_derive,
)


def main():
    module = AnsibleModule(
        argument_spec={"profile": {"type": "raw"}, "path": {"type": "path"}},
        mutually_exclusive=[("profile", "path")],
        required_one_of=[("profile", "path")],
        supports_check_mode=True,
    )
    try:
        profile, workload = load_and_derive(profile=module.params["profile"], path=module.params["path"])
    except ProfileError as error:
        fail_from(
            module,
            error,
            prefix=f"invalid qualification profile: {len(error.violations)} violation(s)",
            violations=[v.as_dict() for v in error.violations],
        )
    module.exit_json(changed=False, profile=profile, workload=workload)


if __name__ == "__main__":
    main()

#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

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
  - Runs on the controller and changes nothing.
  - Survey values arrive as strings; integers and booleans given as strings are cast.
  - The profile is input and is loaded within bounds, each broken one a coded violation - at most
    64 KiB of text, from a regular file only (C(profile.size), C(profile.file)); YAML without aliases
    or merge keys (C(profile.yaml_alias)); no key twice in one mapping (C(profile.duplicate_key));
    nesting at most 32 levels (C(profile.nesting)). The C(source) and C(requester) fields are host
    names of the collection's grammar (C(source.hostname)). Values shown in messages are cut.
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.read_only
  - orbite.qualification._attributes.platform_posix
  - orbite.qualification._attributes.controller_action
options:
  profile:
    description:
      - The profile as a mapping, or as JSON/YAML text.
      - Mutually exclusive with O(path); one of the two is required.
    type: raw
  path:
    description:
      - Path of a JSON or YAML profile file on the host the module runs on (the controller).
      - Mutually exclusive with O(profile); one of the two is required.
    type: path
  cases:
    description:
      - Several profiles in one call (a gate run's cases), each validated and derived as O(profile) or O(path)
        alone would be, after its O(cases[].changes) override the loaded fields. RV(cases) returns them in order.
      - Every case is checked; a failure lists the violations of B(every) broken case, each naming its case.
      - Mutually exclusive with O(profile) and O(path).
    type: list
    elements: dict
    version_added: 0.2.0
    suboptions:
      id:
        description: The case's ID, named in its violations.
        type: str
      profile:
        description: The case's profile as a mapping or JSON/YAML text (exactly one of this and O(cases[].path)).
        type: raw
      path:
        description: The case's profile file on the controller (exactly one of this and O(cases[].profile)).
        type: path
      changes:
        description: Profile fields (docs/profiles.md) overriding the loaded profile's (host overrides, the changes).
        type: dict
        default: {}
      reverse_hosts:
        description:
          - Swap the case's C(source) and C(requester) after its changes (the seed's rail accounting with the hosts
            reversed, in the same run).
        type: bool
        default: false
notes:
  - The bounds, mode rules and derivation are documented in C(docs/profiles.md).
seealso:
  - module: orbite.qualification.run_plan
    description: Writes the run's plan from the validated profile and workload.
  - module: orbite.qualification.result_check
    description: Verifies the receipts against the derived workload.
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

- name: Validate two cases of two shipped profiles in one call
  orbite.qualification.profile_info:
    cases:
      - {id: ra-write-events, path: profiles/rail_accounting.json, changes: {operation: write, rdma_events: true}}
      - {id: rs-source-g2, path: profiles/restart_source.json, changes: {fault_role: source, generations: 2}}
  delegate_to: localhost
  register: planned  # planned.cases[0].workload.wrs_per_round
"""

RETURN = r"""
profile:
  description: The normalized profile (integers and booleans cast, mode defaults applied).
  returned: success
  type: dict
  sample:
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
    generations: 1
workload:
  description: The expected workload derived from the profile (C(docs/profiles.md) lists every field).
  returned: success
  type: dict
  contains:
    wrs_per_round:
      description: Payload work requests per round (one per slice).
      type: int
      sample: 64
    bytes_per_round:
      description: Payload bytes per round.
      type: int
      sample: 67108880
    slices_per_parent:
      description: Slices per parent, C(max(1, payload // block)).
      type: int
      sample: 4
    backing_per_peer:
      description: Bytes of backing per peer, C(parents x (payload + 2 x guard)).
      type: int
      sample: 67239952
    qp_bound_per_peer_operation:
      description: The QP bound, C(rails x lanes), per peer and operation.
      type: int
      sample: 2
    qps_per_context_operation:
      description: The QP bound per context (rail) and operation, C(num_lanes).
      type: int
      sample: 1
    placement:
      description: Each parent's rail and lane (docs/runner-contract.md section 4), in parent order.
      type: list
      elements: dict
      sample: [{parent: 0, rail: 0, lane: 0}, {parent: 1, rail: 1, lane: 0}]
    region_offsets:
      description: Each parent's payload offset in a data MR, C(p x region_stride + guard), in parent order.
      type: list
      elements: int
      sample: [4096, 4206593]
    observers:
      description: Native observers the mode loads, with the role whose runner loads them.
      type: list
      elements: dict
      sample: [{tool: accounting, role: requester}]
  sample:
    protocol: orbite-installed-host-v4
    mode: installed-rail-accounting
    operation: read
    progress: polling
    slices_per_parent: 4
    slice_sizes: [{bytes: 1048576, count: 3}, {bytes: 1048577, count: 1}]
    wrs_per_round: 64
    bytes_per_round: 67108880
    rails: [0, 1]
    per_rail: {"0": {parents: 8, wrs: 32, bytes: 33554440}, "1": {parents: 8, wrs: 32, bytes: 33554440}}
    per_lane:
      - {rail: 0, lane: 0, parents: 8, wrs: 32, bytes: 33554440}
      - {rail: 1, lane: 0, parents: 8, wrs: 32, bytes: 33554440}
    placement: [{parent: 0, rail: 0, lane: 0}, {parent: 1, rail: 1, lane: 0}]
    guard_bytes: 4096
    region_stride: 4202497
    region_offsets: [4096, 4206593]
    backing_per_peer: 67239952
    rounds_per_generation: 3
    generations: 1
    total_rounds: 3
    qps_per_context_operation: 1
    qp_bound_per_peer_operation: 2
    send_queue_depth: 8
    persistent_mr_contexts: 2
    observers: [{tool: accounting, role: requester}]
    discovery: null
    min_outstanding_parents_per_rail_qp: 2
cases:
  description: With O(cases), each case's normalized profile and workload (as RV(profile) and RV(workload)), in order.
  returned: success, with O(cases)
  type: list
  elements: dict
  sample: [{profile: {mode: installed-rail-accounting, operation: write}, workload: {wrs_per_round: 64}}]
violations:
  description:
    - Every broken rule, with C(code), C(field), C(value), C(rule) and C(message); with O(cases), also C(case),
      the broken case's O(cases[].id) (or its position from 1).
  returned: failure
  type: list
  elements: dict
  sample:
    - code: parents.range
      field: parents
      value: 0
      rule: must be between 1 and 32 (gate bound)
      message: "parents = 0: must be between 1 and 32 (gate bound) [parents.range]"
code:
  description: Stable failure code; C(profile.invalid) when rules are broken (RV(violations) lists them).
  returned: failure
  type: str
  sample: profile.invalid
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._controller.profile_info import SPEC, run


def main():
    run(AnsibleModule(supports_check_mode=True, **SPEC))


if __name__ == "__main__":
    main()

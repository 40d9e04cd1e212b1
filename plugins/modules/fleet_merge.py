#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

DOCUMENTATION = r"""
---
module: fleet_merge
short_description: Merge the fleet verdicts of AWX job slices into one fleet verdict
version_added: 0.2.0
description:
  - Reads the fleet verdict of every slice under C(<fleet_dir>/slices/) and writes one fleet verdict,
    C(<fleet_dir>/fleet-verdict.json) and C(.md), with one row per pair of the whole fleet and case
    (C(docs/fleet.md)).
  - The merge is told what to expect, never takes it from the slices. The expected pairs are planned
    again from O(fleet_hosts), O(pairing) and O(pairs), as each slice planned them, and O(expected_slices)
    is the job's slice count.
  - Fails closed. A slice missing (never ran, or killed before writing), a slice that did not finish
    or a pair no slice ran makes the merge C(INCOMPLETE), never C(PASS); slices that contradict each
    other (a pair run twice, a pair that is not the fleet's, another fleet's verdict) make it C(FAIL).
  - The module does not fail on a verdict that is not C(PASS); the playbook does.
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.platform_posix
  - orbite.qualification._attributes.controller_action
options:
  fleet_dir:
    description: The fleet run's directory (absolute), holding C(slices/<slice>/fleet-verdict.json).
    type: path
    required: true
  fleet_id:
    description: The fleet run's ID, which every slice's verdict must name.
    type: str
    required: true
  fleet_hosts:
    description: Every host of the fleet (all slices together).
    type: list
    elements: str
    required: true
  pairing:
    description: The pairing the slices ran (C(all), C(ring) or C(list)).
    type: str
    choices: [all, ring, list]
    default: ring
  pairs:
    description: With O(pairing=list), the explicit pairs.
    type: list
    elements: raw
  expected_slices:
    description: How many slices the job had (AWX's job slice count).
    type: int
    required: true
  cases:
    description: The planned case IDs; defaults to those the slices' verdicts planned.
    type: list
    elements: str
attributes:
  check_mode:
    support: full
    details:
      - In check mode the merged verdict is computed and returned, and no file is written.
  diff_mode:
    support: none
seealso:
  - module: orbite.qualification.fleet_verdict
    description: Writes each slice's fleet verdict.
"""

EXAMPLES = r"""
- name: Merge the slices of an AWX sliced fleet job
  orbite.qualification.fleet_merge:
    fleet_dir: /var/lib/orbite/runs/fleet-wf42
    fleet_id: fleet-wf42
    fleet_hosts: [rnic-a, rnic-b, rnic-c, rnic-d]
    pairing: list
    pairs: [[rnic-a, rnic-c], [rnic-b, rnic-d]]
    expected_slices: 2
  delegate_to: localhost
  register: merged
"""

RETURN = r"""
verdict:
  description: C(PASS), C(FAIL) or C(INCOMPLETE).
  returned: success
  type: str
  sample: INCOMPLETE
complete:
  description: Whether every expected slice left a complete verdict and every expected pair ran.
  returned: success
  type: bool
  sample: false
counts:
  description: Rows (pair x case) in all, passed, failed and incomplete.
  returned: success
  type: dict
  sample: {rows: 4, passed: 2, failed: 0, incomplete: 2}
failed_codes:
  description: Every failed rule code of any row, and the merge's own failure codes.
  returned: success
  type: list
  elements: str
  sample: []
rows:
  description: One per expected pair and case (pair, source, requester, case, verdict, failed_codes, slice).
  returned: success
  type: list
  elements: dict
  sample: [{pair: p1, source: rnic-a, requester: rnic-c, case: read-polling, verdict: PASS, failed_codes: [],
            slice: job-43}]
slices:
  description: The slices found under C(slices/).
  returned: success
  type: list
  elements: str
  sample: [job-43]
findings:
  description: Why the verdict is not PASS (C(fleet.slice_missing), C(fleet.slice_incomplete), ...).
  returned: success
  type: list
  elements: dict
  sample: [{code: fleet.slice_missing, message: "1 of 2 slice(s) left a fleet verdict"}]
reports:
  description: Paths of the merged verdict's JSON and Markdown (empty in check mode).
  returned: success
  type: dict
  sample: {json: /var/lib/orbite/runs/fleet-wf42/fleet-verdict.json}
code:
  description: Stable failure code (C(fleet.plan) for bad expectations).
  returned: failure
  type: str
  sample: fleet.plan
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._controller.fleet_merge import SPEC, run


def main():
    run(AnsibleModule(supports_check_mode=True, **SPEC))


if __name__ == "__main__":
    main()

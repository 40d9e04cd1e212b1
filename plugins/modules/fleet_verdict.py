#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

DOCUMENTATION = r"""
---
module: fleet_verdict
short_description: Verify every pair of a fleet run and write the fleet verdict
version_added: 0.2.0
description:
  - Reads the fleet plan C(fleet.json) that orbite.qualification.fleet_plan wrote in O(output_dir),
    verifies each pair's run directory with the verifier (which writes that pair's own C(verdict.*),
    as the gate does for one pair), and writes C(fleet-verdict.json) and C(fleet-verdict.md) with one
    row per pair and case (C(docs/fleet.md)).
  - Fails closed. C(PASS) only when every planned pair has a complete verdict and every planned case of
    every pair passed; C(FAIL) when any failed; else C(INCOMPLETE) (a pair without a run directory or
    verdict, a case its run did not plan). A pair's run directory without C(run.json) has no verdict.
  - The module does not fail on a verdict that is not C(PASS); the playbook does.
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.platform_posix
  - orbite.qualification._attributes.controller_action
options:
  output_dir:
    description: The directory holding C(fleet.json) (the fleet run's, or one AWX slice's C(slices/<slice>)).
    type: path
    required: true
attributes:
  check_mode:
    support: full
    details:
      - In check mode the verdict is computed and returned, and no file is written.
  diff_mode:
    support: none
seealso:
  - module: orbite.qualification.fleet_plan
    description: Writes the fleet plan this module verifies.
  - module: orbite.qualification.result_check
    description: The verifier of one run directory (one pair), which this module runs on every pair.
"""

EXAMPLES = r"""
- name: Verify the fleet
  orbite.qualification.fleet_verdict:
    output_dir: /var/lib/orbite/runs/fleet-20261201T0500
  delegate_to: localhost
  register: fleet_verdict
"""

RETURN = r"""
verdict:
  description: C(PASS), C(FAIL) or C(INCOMPLETE).
  returned: success
  type: str
  sample: PASS
complete:
  description: Whether every planned pair has a complete verdict.
  returned: success
  type: bool
  sample: true
counts:
  description: Rows (pair x case) in all, passed, failed and incomplete.
  returned: success
  type: dict
  sample: {rows: 4, passed: 4, failed: 0, incomplete: 0}
failed_codes:
  description: Every failed rule code of any row, and the fleet's own failure codes.
  returned: success
  type: list
  elements: str
  sample: []
rows:
  description: One per pair and planned case (pair, source, requester, case, verdict, failed_codes).
  returned: success
  type: list
  elements: dict
  sample: [{pair: p1, source: sim-a, requester: sim-b, case: read-polling, verdict: PASS, failed_codes: []}]
pairs:
  description: Each pair's run verdict, run ID and run directory.
  returned: success
  type: list
  elements: dict
  sample: [{id: p1, source: sim-a, requester: sim-b, verdict: PASS, complete: true, run_id: fleet-1-p1,
            run_dir: /runs/fleet-1/fleet-1-p1}]
findings:
  description: Why the verdict is not PASS (codes C(fleet.pair_incomplete), C(fleet.pair_failed), ...).
  returned: success
  type: list
  elements: dict
  sample: []
reports:
  description: Paths of the fleet verdict's JSON and Markdown (empty in check mode).
  returned: success
  type: dict
  sample: {json: /runs/fleet-1/fleet-verdict.json, markdown: /runs/fleet-1/fleet-verdict.md}
code:
  description: Stable failure code (C(fleet.plan) for a missing or bad C(fleet.json)).
  returned: failure
  type: str
  sample: fleet.plan
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._controller.fleet_verdict import SPEC, run


def main():
    run(AnsibleModule(supports_check_mode=True, **SPEC))


if __name__ == "__main__":
    main()

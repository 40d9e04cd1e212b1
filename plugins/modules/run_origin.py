#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

DOCUMENTATION = r"""
---
module: run_origin
short_description: Read which cases of an earlier run did not pass, to plan a rerun of them
version_added: 0.1.0
description:
  - Reads the plan (C(run.json)) and the verdict (C(verdict.json)) of an earlier run and returns the
    planned cases that did not pass there (C(FAIL), or not verified), each with the profile it ran with,
    for the preflight to plan a new run of exactly those cases (C(-e orbite_rerun_from=<run>),
    C(docs/reports.md)).
  - An earlier run whose verdict is not final (C(INCOMPLETE), as when its controller was killed, or never verified) is
    verified first and its verdict written into its run directory, so a case whose receipts were fetched before
    the kill counts as what it is (a passed case is not run again).
  - Fails with C(run_plan.nothing_to_rerun) when every planned case passed.
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.platform_posix
  - orbite.qualification._attributes.controller_action
options:
  run:
    description: The earlier run, as its run directory (absolute path) or its run ID under O(runs_dir).
    type: str
    required: true
  runs_dir:
    description: The runs directory (C(<orbite_work_dir>/runs)) in which a run ID is looked up.
    type: path
attributes:
  check_mode:
    support: full
    details:
      - An earlier run that is not final is verified without writing its verdict.
  diff_mode:
    support: none
seealso:
  - module: orbite.qualification.run_plan
    description: Writes the rerun's plan, naming this origin.
"""

EXAMPLES = r"""
- name: Read the cases to run again
  orbite.qualification.run_origin:
    run: ra-20261201T0100
    runs_dir: /var/lib/orbite/runs
  register: origin
"""

RETURN = r"""
origin:
  description: What the rerun's C(run.json) names as its origin (the run's ID and directory, the cases run again).
  returned: success
  type: dict
  sample: {run_id: ra-20261201T0100, run_dir: /var/lib/orbite/runs/ra-20261201T0100, cases: [write-events]}
profiles:
  description: The profile each case to run again ran with, by case ID (from the earlier C(run.json)).
  returned: success
  type: dict
  sample: {write-events: {mode: installed-rail-accounting, operation: write, rdma_events: true}}
hosts:
  description: The source and requester each case ran on, by case ID.
  returned: success
  type: dict
  sample: {write-events: {source: sim-a, requester: sim-b}}
variants:
  description: The cases as the preflight's case variants (C(id), no changes).
  returned: success
  type: list
  elements: dict
  sample: [{id: write-events, changes: {}}]
verified:
  description: Whether the earlier run was verified now (its verdict was not final).
  returned: success
  type: bool
  sample: true
verdict:
  description: The earlier run's verdict (as verified now when RV(verified)), or null when it has none.
  returned: success
  type: str
  sample: FAIL
code:
  description: Stable failure code (C(run_plan.invalid), C(run_plan.nothing_to_rerun), C(history.invalid),
    C(verdict.unwritable) (the earlier run's verdict could not be written)).
  returned: failure
  type: str
  sample: run_plan.nothing_to_rerun
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._controller.run_origin import SPEC, run


def main():
    run(AnsibleModule(supports_check_mode=True, **SPEC))


if __name__ == "__main__":
    main()

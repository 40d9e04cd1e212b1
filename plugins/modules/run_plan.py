#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

DOCUMENTATION = r"""
---
module: run_plan
short_description: Lay out a qualification run directory (run.json and each case.json)
version_added: 0.1.0
description:
  - Writes C(run.json) and C(cases/<id>/case.json) for every planned case, atomically, on the
    host it runs on (the controller). The verifier reads exactly this plan.
  - Refuses a directory that already holds another run's plan, so receipts of two runs never mix.
  - Private by default, since what a run directory holds names hosts, devices and addresses. Every
    directory it creates (O(run_dir) and its missing parents, C(cases/) and each case's) is 0700,
    C(run.json) and C(case.json) are 0600. An O(run_dir) that already exists keeps its mode.
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.platform_posix
options:
  run_dir:
    description: The run directory.
    type: path
    required: true
  run_id:
    description: The run's ID.
    type: str
    required: true
  cases:
    description: The planned cases, in run order.
    type: list
    elements: dict
    required: true
    suboptions:
      id:
        description:
          - The case ID, unique in the run; it names C(cases/<id>/).
          - 1 to 64 ASCII letters, digits, C(.), C(_) or C(-), starting with a letter or digit.
        type: str
        required: true
      profile:
        description: The case's validated profile (RV(orbite.qualification.profile_info#module:profile)).
        type: dict
        required: true
      workload:
        description:
          - The workload derived from the profile (RV(orbite.qualification.profile_info#module:workload)).
          - Accepted and not written; the verifier derives the workload from the profile itself.
        type: dict
  allow_dirty:
    description: The run uses a dirty build's manifest (diagnosis only; the verdict says so).
    type: bool
    default: false
  runner_kind:
    description: C(sim) (the simulated runner) or C(native) (the installed binary).
    type: str
    choices: [sim, native]
    default: sim
  defects:
    description: Simulated runner defect switches in force (red checks only).
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    details:
      - Reports whether the plan would be written, writing nothing.
  diff_mode:
    support: none
seealso:
  - module: orbite.qualification.profile_info
    description: Validates each case's profile and derives its workload.
  - module: orbite.qualification.result_check
    description: Verifies the run against this plan.
"""

EXAMPLES = r"""
- name: Write the run's plan
  orbite.qualification.run_plan:
    run_dir: /var/tmp/orbite-runs/ra-1
    run_id: ra-1
    cases: "{{ orbite_cases }}"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
run_json:
  description: Path of C(run.json).
  returned: success
  type: str
  sample: /var/tmp/orbite-runs/ra-1/run.json
code:
  description: Stable failure code (C(run_plan.invalid) for bad cases or another run's directory).
  returned: failure
  type: str
  sample: run_plan.invalid
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._run.plan import RunPlanError, write_plan


def main():
    module = AnsibleModule(
        argument_spec={
            "run_dir": {"type": "path", "required": True},
            "run_id": {"type": "str", "required": True},
            "cases": {"type": "list", "elements": "dict", "required": True, "options": {
                "id": {"type": "str", "required": True},
                "profile": {"type": "dict", "required": True},
                "workload": {"type": "dict"},
            }},
            "allow_dirty": {"type": "bool", "default": False},
            "runner_kind": {"type": "str", "choices": ["sim", "native"], "default": "sim"},
            "defects": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        changed = write_plan(params["run_dir"], params["run_id"], params["cases"], check_mode=module.check_mode,
                             allow_dirty=params["allow_dirty"], runner_kind=params["runner_kind"],
                             defects=params["defects"])
    except RunPlanError as error:
        fail_from(module, error)
    except OSError as error:
        fail_from(module, error, prefix=f"run_dir={params['run_dir']}: cannot be written")
    module.exit_json(changed=changed, run_json=os.path.join(params["run_dir"], "run.json"))


if __name__ == "__main__":
    main()

#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

DOCUMENTATION = r"""
---
module: sim_runner_package
short_description: Package the simulated runner into a run directory (one zipapp file) and hash it for the plan
version_added: 0.2.0
description:
  - Makes O(zipapp), the zipapp of the simulated runner's tree O(src) (its C(.py) files, no C(__pycache__)), once.
    If O(zipapp) exists it is hashed as it is, never made again, so the file the run deploys and pins is the one
    hashed. A new zipapp is written atomically, mode 0600, in a directory made 0700 when missing.
  - With O(defect_table=true) it also asks that zipapp which defect switches each mode takes
    (C(python <zipapp> --defect-table), C(docs/runner-contract.md)), in a process of its own, so a case's own
    switches are checked against the table of the very file deployed.
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.platform_posix
  - orbite.qualification._attributes.controller_action
options:
  src:
    description: The simulated runner's tree (the collection's C(sim/) directory, holding C(__main__.py)).
    type: path
    required: true
  zipapp:
    description: The zipapp file to make (the gate's C(<run_dir>/orbite-sim-runner.pyz)).
    type: path
    required: true
  defect_table:
    description: Also return the defect switches each mode takes, as the zipapp itself prints them.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    details:
      - Writes nothing; returns the sha256 the zipapp would have. A zipapp not made yet is not asked for its
        defect table (RV(defect_table) is null).
  diff_mode:
    support: none
seealso:
  - module: orbite.qualification.run_plan
    description: Writes the plan that pins this zipapp (its path and sha256).
"""

EXAMPLES = r"""
- name: Package the simulated runner into the run directory
  orbite.qualification.sim_runner_package:
    src: /usr/share/ansible/collections/ansible_collections/orbite/qualification/sim
    zipapp: /var/lib/orbite/runs/ra-1/orbite-sim-runner.pyz
    defect_table: true
  register: zipapp
"""

RETURN = r"""
zipapp:
  description: The zipapp's path (O(zipapp)).
  returned: success
  type: str
  sample: /var/lib/orbite/runs/ra-1/orbite-sim-runner.pyz
sha256:
  description: The sha256 of the zipapp's bytes (of what it would be, in check mode).
  returned: success
  type: str
  sample: 4d21a55c18e2b06e5d0c1f1a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e
defect_table:
  description: The defect switches each mode takes (mode -> list of switch names), or null when not asked.
  returned: success
  type: dict
  sample: {installed-host: [corrupt_byte, stale_input]}
code:
  description:
    - Stable failure code; C(sim_runner_package.defect_table) when the zipapp printed no table, an C(os.*) code
      when the zipapp cannot be made or read, C(zipapp.src) when O(src) holds no C(__main__.py).
  returned: failure
  type: str
  sample: sim_runner_package.defect_table
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._controller.sim_runner_package import SPEC, run


def main():
    run(AnsibleModule(supports_check_mode=True, **SPEC))


if __name__ == "__main__":
    main()

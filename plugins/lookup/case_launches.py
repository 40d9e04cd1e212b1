# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Lookup: this host's launch of each of its cases, read from the run plan once per run."""

DOCUMENTATION = r"""
name: case_launches
author: OrbiTE qualification team (@orbite-qualification)
version_added: 0.2.0
short_description: This host's launch of each of its cases, from the run plan
description:
  - Reads C(<run dir>/cases/<case id>/case.json) (written by M(orbite.qualification.run_plan)) of each case this host
    takes part in and returns one mapping of case ID to this host's launch, as the
    P(orbite.qualification.node_launch#filter) filter gives it for one case.
  - This host's role in a case is the source where its slot names this host as the source, else the requester.
  - Fails with C(run_plan.invalid), naming the slot, the file and the rule, when a plan cannot be read or gives
    the role to another host (the case schedule and the run plan disagree).
  - The runner role's C(prepare) entry point reads it once per run (or fleet wave), so no case pays a task for it.
options:
  _terms:
    description: The controller's run directory.
    type: list
    elements: path
    required: true
  slots:
    description: This host's case of each slot of the schedule (C(id), C(source)), null where it has none.
    type: list
    elements: raw
    required: true
  host:
    description: This host's inventory name.
    type: str
    required: true
  node_run_dir:
    description: The node's directory of the run (its work directory and the run ID).
    type: path
    required: true
  python:
    description: The node's Python, which runs the simulated runner's zipapp.
    type: path
    required: true
seealso:
  - plugin: orbite.qualification.node_launch
    plugin_type: filter
    description: One case's launch.
"""

EXAMPLES = r"""
- name: Read this host's launches
  ansible.builtin.set_fact:
    launches: >-
      {{ lookup('orbite.qualification.case_launches', run_dir, slots=lane_cases, host=inventory_hostname,
                node_run_dir='/var/tmp/orbite/run-1', python='/usr/bin/python3') }}
"""

RETURN = r"""
_raw:
  description: One mapping of case ID to this host's launch (see the node_launch filter's return value).
  type: list
  elements: dict
  sample: [{"ra-read-polling": {"host": "sim-a", "supervisor_run_id": "run-1-ra-read-polling", "flow": "single"}}]
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError
from ansible_collections.orbite.qualification.plugins.module_utils._run.plan import case_launches


class LookupModule(LookupBase):
    # The options are read as given (keywords), each checked by case_launches naming it.
    def run(self, terms, variables=None, slots=None, host=None, node_run_dir=None, python=None, **unknown):
        if unknown:
            raise AnsibleLookupError(f"case_launches: {sorted(unknown)[0]}: is not an option (the options are "
                                     "slots, host, node_run_dir, python)")
        if not terms or len(terms) != 1:
            raise AnsibleLookupError(f"case_launches: terms={terms!r}: must be the one run directory")
        try:
            return [case_launches(str(terms[0]), slots, host, node_run_dir, python)]
        except OrbiteError as error:
            raise AnsibleLookupError(f"{error.code}: {error}") from None

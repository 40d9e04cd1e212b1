#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

DOCUMENTATION = r"""
---
module: fleet_plan
short_description: Plan a fleet run, its host pairs and their waves, and write the fleet plan
version_added: 0.2.0
description:
  - From the RNIC hosts of a group and a pairing (C(all) ordered pairs, a C(ring), or an explicit
    C(list) of [source, requester]), plans the pairs and the waves, in which no host is in two pairs,
    so that the pairs of one wave run concurrently (C(docs/fleet.md)).
  - The waves are only a schedule; two cases on one RNIC are kept apart by the node's RNIC locks.
  - Each pair is an ordinary run directory C(<fleet_dir>/<fleet_id>-p<k>) (its C(run.json) and
    verdict are the gate's). Writes C(fleet.json) and an C(INCOMPLETE) fleet verdict before any host
    is touched, into O(fleet_dir) or, for an AWX slice, C(<fleet_dir>/slices/<slice>).
  - Bad input (an unknown host, a host paired with itself, a duplicate pair, fewer than two hosts)
    fails naming the field, the value and the rule, with code C(fleet.plan).
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.platform_posix
  - orbite.qualification._attributes.controller_action
options:
  hosts:
    description: The hosts this job runs on (the fleet group as this job, or this AWX slice, sees it).
    type: list
    elements: str
    required: true
  fleet_hosts:
    description:
      - Every host of the fleet, when this job is one AWX slice of it; pairs are planned over these
        and only those with both hosts in O(hosts) run here. Defaults to O(hosts).
    type: list
    elements: str
  pairing:
    description: C(all) ordered pairs, a C(ring) (each host to the next), or the explicit O(pairs).
    type: str
    choices: [all, ring, list]
    default: ring
  pairs:
    description: With O(pairing=list), the pairs as [source, requester], C(source:requester) or a mapping.
    type: list
    elements: raw
  fleet_id:
    description: The fleet run's ID (a name); pair k runs as C(<fleet_id>-p<k>).
    type: str
    required: true
  fleet_dir:
    description: The fleet run's directory (absolute) on the controller.
    type: path
    required: true
  slice:
    description: This AWX slice's name (a name, for example C(job-<awx_job_id>)); empty for the whole fleet.
    type: str
  cases:
    description: The planned case IDs, run on every pair.
    type: list
    elements: str
    required: true
  runs:
    description:
      - By pair ID, the run each pair runs (C(cases), the case entries with the pair's hosts, as
        M(orbite.qualification.run_plan) takes them, and C(artifacts), the run's pinned executables). With it,
        the same call writes each named pair's C(run.json) (and its C(cases/<id>/case.json)) before the fleet
        plan, in one call for every pair instead of one M(orbite.qualification.run_plan) call each. A pair whose
        run the preflight wrote is left out. Not in check mode (docs/fleet.md).
      - A pair's C(case_hosts) (each case's lane hosts, as M(orbite.qualification.run_plan)'s
        O(orbite.qualification.run_plan#module:case_hosts)) and C(schedule) (its case schedule, written beside
        C(run.json) as C(schedule.json)) come from the C(fleet_schedule) filter (docs/fleet.md "Lanes in a fleet").
    type: dict
    default: {}
  runner_kind:
    description: With O(runs), the runner kind every pair's C(run.json) names.
    type: str
    choices: [sim, native]
    default: sim
  allow_dirty:
    description: With O(runs), whether each C(run.json) allows a dirty installation (as in run_plan).
    type: bool
    default: false
  defects:
    description: With O(runs), the runner's defect switches every pair's C(run.json) records (red checks only).
    type: list
    elements: str
    default: []
  timeouts:
    description:
      - With O(runs), the runner role's seconds as the play gives them (a mapping of play variable to seconds),
        each pair's C(case.json) C(launch.seconds) (as M(orbite.qualification.run_plan)'s
        O(orbite.qualification.run_plan#module:timeouts)).
    type: dict
    default: {}
  rails:
    description:
      - With O(runs), the C(orbite_rails) of each fleet host, a mapping of host name to rails, giving each
        pair's locks and rails arguments (as M(orbite.qualification.run_plan)'s
        O(orbite.qualification.run_plan#module:rails)); with lanes, of each lane host (its lane's rails).
    type: dict
  service_addresses:
    description:
      - With O(runs), the C(orbite_service_address) of each fleet host, a mapping of host name to
        C(host:port) (as M(orbite.qualification.run_plan)'s
        O(orbite.qualification.run_plan#module:service_addresses)); with lanes, of each lane host (port + lane).
    type: dict
attributes:
  check_mode:
    support: full
    details:
      - In check mode the plan is returned and nothing is written.
  diff_mode:
    support: none
seealso:
  - module: orbite.qualification.fleet_verdict
    description: Verifies every pair and writes the fleet verdict.
  - module: orbite.qualification.fleet_merge
    description: Merges the fleet verdicts of AWX slices.
"""

EXAMPLES = r"""
- name: Plan every ordered pair of the lab's hosts
  orbite.qualification.fleet_plan:
    hosts: "{{ groups['lab'] }}"
    pairing: all
    fleet_id: fleet-20261201T0500
    fleet_dir: /var/lib/orbite/runs/fleet-20261201T0500
    cases: [read-polling, write-events]
  delegate_to: localhost
  register: fleet
"""

RETURN = r"""
pairs:
  description: The pairs that run in this job, each with its ID, hosts, run ID and run directory.
  returned: success
  type: list
  elements: dict
  sample: [{id: p1, source: sim-a, requester: sim-b, run_id: fleet-1-p1, run_dir: /runs/fleet-1/fleet-1-p1}]
waves:
  description: The pair IDs of each wave, in order; the pairs of one wave share no host.
  returned: success
  type: list
  elements: list
  sample: [[p1, p3], [p2, p4]]
slots:
  description: Per wave, what each busy host does (pair, role, the pair's source host, run ID and directory).
  returned: success
  type: list
  elements: dict
  sample: [{sim-a: {pair: p1, role: source, source: sim-a, run_id: fleet-1-p1, run_dir: /runs/fleet-1/fleet-1-p1}}]
elsewhere:
  description: The fleet's pairs that do not run in this job (another AWX slice has one of their hosts).
  returned: success
  type: list
  elements: dict
  sample: []
max_degree:
  description: The largest number of planned pairs one host is in.
  returned: success
  type: int
  sample: 2
output_dir:
  description: Where C(fleet.json) and the fleet verdict are written.
  returned: success
  type: str
  sample: /var/lib/orbite/runs/fleet-1
code:
  description: Stable failure code (C(fleet.plan), C(name.invalid)).
  returned: failure
  type: str
  sample: fleet.plan
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._controller.fleet_plan import SPEC, run


def main():
    run(AnsibleModule(supports_check_mode=True, **SPEC))


if __name__ == "__main__":
    main()

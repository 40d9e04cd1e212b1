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
  - The plan binds the run's identity; C(run.json) names the cases, each one's profile and hosts, the
    runner kind, the defect switches and the O(artifacts), and each C(case.json) its supervisors' run
    ID (C(<run_id>-<case id>)) and each role's registration ID (C(<run_id>-<case id>-<role>)), which
    the gate hands to the nodes. See docs/verifier.md.
  - Each C(case.json) also holds C(launch), what each role launches, computed once here (IDs, the runner's and
    the control relay's defect switches, the runner and verbs library pins, the deploy list and, per
    generation, the observers and their environment). The runner role reads it as it is (docs/supervisor.md).
  - Private by default, since what a run directory holds names hosts, devices and addresses. Every
    directory it creates (O(run_dir) and its missing parents, C(cases/) and each case's) is 0700,
    C(run.json) and C(case.json) are 0600. An O(run_dir) that already exists keeps its mode.
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.platform_posix
  - orbite.qualification._attributes.controller_action
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
      defects:
        description:
          - This case's own defect switches (red checks only), on top of O(defects).
          - Recorded in C(run.json) C(case_defects) and the case's C(case.json); the case and the run are
            diagnostic (C(run.diagnostic)).
        type: list
        elements: str
      leave_out:
        description:
          - Observers this case's deploy and preload left out (a diagnostic red check of the mode's observer).
          - Recorded in C(run.json) C(case_left_out); the case and the run are diagnostic (C(run.diagnostic)).
        type: list
        elements: str
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
    description:
      - Simulated runner defect switches in force (red checks only).
      - A run with any is diagnostic; its verdict is never PASS (C(run.diagnostic)).
      - A list, or one string of names separated by commas (an AWX survey sends extra vars as strings); anything
        else fails naming O(defects) before any node is touched.
      - Each case's C(case.json) C(launch) gives each role its runner switches and the control relay's own.
    type: raw
    default: []
  timeouts:
    description:
      - The runner role's seconds as the play gives them, a mapping of variable name to value (C(orbite_lease),
        C(orbite_lock_timeout), C(orbite_runner_ready_timeout), C(orbite_runner_timeout), C(orbite_runner_poll));
        null or empty text for one not given.
      - Each must be a number, or text of one (an AWX survey sends C("60")), in the range the supervisor and the
        runner module take; anything else fails naming the variable, its value and the range, before any node is
        touched.
      - Written cast into each case's launch plan (C(case.json) C(launch.seconds)), the runner role's default
        for one not given, with the control relay's lease computed from them; the runner role reads them there.
    type: dict
    default: {}
  rails:
    description:
      - The C(orbite_rails) host var of each inventory host a case runs on (its profile's C(source) and
        C(requester)), a mapping of host name to rails (each C(device), C(port), C(gid_index)).
      - Each case role's locks and rails arguments in C(case.json) C(launch) come from its host's entry (with
        C(discovery=auto) no pins, a whitelist and a blacklist of exactly the locked RNICs). A case host
        missing here, or rails without a device name, fail naming the host. Not given, those entries are null.
    type: dict
  service_addresses:
    description:
      - The C(orbite_service_address) host var (C(host:port)) of each inventory host a case runs on, a mapping
        of host name to address; the source role's C(service_address) in C(case.json) C(launch).
      - A case host missing here, or an address that is not C(host:port), fail naming the host. Not given,
        the entries are null.
    type: dict
  case_hosts:
    description:
      - The inventory host each case role runs on, a mapping of case ID to C(source) and C(requester) host names,
        the case schedule's lane hosts (a host's lane i > 0 is the alias C(<host>~lane<i>)), whose entries in
        O(rails) and O(service_addresses) that case's launch plan takes.
      - Not given, or a case not named, each role runs on its profile's host.
    type: dict
  schedule:
    description:
      - The run's case schedule (the C(case_schedule) filter's), written beside C(run.json) as C(schedule.json), so
        the run directory says which case ran on which lane's RNICs.
      - Its keys are the filter's (C(mode), C(lanes), C(lane_hosts), C(slots), C(critical_path), C(total); see
        docs/qualification.md "Concurrent cases"). Not given, no C(schedule.json) is written.
    type: dict
  artifacts:
    description:
      - The executables the run uses, each with the sha256 the nodes must run (recorded in C(run.json)).
      - The verifier holds every runner, verbs library and observer the supervisors journaled as
        exec'd or preloaded against these (C(identity.artifacts)), and the verdict names them. A run
        without them cannot pass.
    type: dict
    suboptions:
      runner:
        description: The runner (the simulated runner's zipapp, or the installed binary).
        type: dict
        required: true
        suboptions:
          kind:
            description: C(sim) or C(native); must be O(runner_kind).
            type: str
            required: true
            choices: [sim, native]
          path:
            description: Its absolute path on the controller (informational; the hash is what binds).
            type: path
            required: true
          sha256:
            description: Its sha256, 64 lowercase hex digits.
            type: str
            required: true
      verbs_library:
        description: The verbs library the runner loads (the loopback provider), or null when none is pinned.
        type: dict
        suboptions:
          path:
            description: Its absolute path on the controller.
            type: path
            required: true
          sha256:
            description: Its sha256, 64 lowercase hex digits.
            type: str
            required: true
      observers:
        description:
          - The observer libraries the nodes preload, by tool name (C(accounting), C(cq_fault),
            C(uverbs_fault), C(inflight_fault)), each a mapping of C(path) (absolute) and C(sha256) and nothing else.
        type: dict
        default: {}
  verdict:
    description:
      - Also write the run's first verdict (C(verdict.json), C(.xml), C(.md), C(.html)) as the verifier
        writes a partial one, before any node is touched (C(INCOMPLETE), every planned case not verified
        yet). A controller killed before the final verification (M(orbite.qualification.result_check))
        leaves this, never C(PASS); the final verification replaces it.
      - A verdict that cannot be written (a full disk) is a warning; the final verification writes or fails.
    type: bool
    default: false
  origin:
    description:
      - A rerun's origin (RV(orbite.qualification.run_origin#module:origin)), written into C(run.json) so the
        verdict names the run whose failed cases this run repeats. Its C(cases) must be exactly the planned cases.
    type: dict
    suboptions:
      run_id:
        description: The earlier run's ID.
        type: str
        required: true
      run_dir:
        description: The earlier run's directory (absolute).
        type: path
        required: true
      cases:
        description: The cases that did not pass there, the ones planned here.
        type: list
        elements: str
        required: true
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
verdict:
  description: Path of the first verdict written (O(verdict)), else null.
  returned: success
  type: str
  sample: /var/tmp/orbite-runs/ra-1/verdict.json
cases:
  description: The IDs the gate gives each case's processes, by case ID (as written to C(case.json)).
  returned: success
  type: dict
  sample:
    rail-accounting:
      supervisor_run_id: ra-1-rail-accounting
      registrations: {source: ra-1-rail-accounting-source, requester: ra-1-rail-accounting-requester}
code:
  description: Stable failure code (C(run_plan.invalid) for bad cases, artifacts or another run's directory).
  returned: failure
  type: str
  sample: run_plan.invalid
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._controller.run_plan import SPEC, run


def main():
    run(AnsibleModule(supports_check_mode=True, **SPEC))


if __name__ == "__main__":
    main()

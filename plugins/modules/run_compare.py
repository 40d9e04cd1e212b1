#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

DOCUMENTATION = r"""
---
module: run_compare
short_description: Compare the verdicts of two qualification runs
version_added: 0.1.0
description:
  - Reads C(verdict.json) of two verified runs and lists the codes newly failing in O(b), newly passing,
    still failing, failing in O(a) but not checked in O(b) (skipped or not planned), and the headline
    figures of each case (ledger totals, WRs in flight per rail and lane, observer counts) that moved.
    See C(docs/reports.md).
  - Read only; it writes nothing unless O(output) is given.
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.platform_posix
options:
  a:
    description: The earlier run, as its run directory (absolute path) or its run ID under O(runs_dir).
    type: str
    required: true
  b:
    description: The later run, as its run directory (absolute path) or its run ID under O(runs_dir).
    type: str
    required: true
  runs_dir:
    description: The runs directory (C(<orbite_work_dir>/runs)) in which run IDs are looked up.
    type: path
  output:
    description: Where to write the comparison as JSON (atomically); not written in check mode.
    type: path
attributes:
  check_mode:
    support: full
    details:
      - The comparison is computed and returned; O(output) is not written.
  diff_mode:
    support: none
seealso:
  - module: orbite.qualification.result_check
    description: Writes the verdicts (and the runs index) compared here.
"""

EXAMPLES = r"""
- name: Compare yesterday's run with today's
  orbite.qualification.run_compare:
    a: ra-20261130T0100
    b: ra-20261201T0100
    runs_dir: /var/lib/orbite/runs
  register: compared
"""

RETURN = r"""
a:
  description: The earlier run (C(run_id), C(run_dir), C(verdict), C(defects), C(failed_codes), C(origin)).
  returned: success
  type: dict
  sample: {run_id: ra-1, run_dir: /var/lib/orbite/runs/ra-1, verdict: PASS, defects: [], failed_codes: [],
           origin: null}
b:
  description: The later run, as O(a).
  returned: success
  type: dict
  sample: {run_id: ra-2, run_dir: /var/lib/orbite/runs/ra-2, verdict: FAIL, defects: [exceed_sq_depth],
           failed_codes: [run.diagnostic, qps.sq_depth], origin: null}
newly_failing:
  description: Codes failing in O(b) and not in O(a), by case (C(run) for the run's own codes).
  returned: success
  type: list
  elements: dict
  sample: [{case: read-polling, code: qps.sq_depth}, {case: run, code: run.diagnostic}]
newly_passing:
  description: Codes failing in O(a) that pass in O(b).
  returned: success
  type: list
  elements: dict
  sample: []
still_failing:
  description: Codes failing in both.
  returned: success
  type: list
  elements: dict
  sample: []
no_longer_checked:
  description: Codes failing in O(a) that O(b) skipped or did not check (a case not planned there).
  returned: success
  type: list
  elements: dict
  sample: []
moved:
  description: Headline figures of a case that differ (C(case), C(figure), C(a), C(b)); null where one run has none.
  returned: success
  type: list
  elements: dict
  sample: [{case: read-polling, figure: requester.g1.rail0.lane0.max_inflight_wrs, a: 8, b: 9}]
cases_only_in_a:
  description: Cases planned in O(a) only.
  returned: success
  type: list
  elements: str
  sample: []
cases_only_in_b:
  description: Cases planned in O(b) only.
  returned: success
  type: list
  elements: str
  sample: []
lines:
  description: The comparison in a few lines of text, for a playbook's output.
  returned: success
  type: list
  elements: str
  sample: ["A ra-1 PASS -> B ra-2 FAIL", "newly failing: read-polling:qps.sq_depth, run:run.diagnostic"]
code:
  description: Stable failure code (C(history.invalid) for a run that cannot be found or read).
  returned: failure
  type: str
  sample: history.invalid
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import atomic_write_json
from ansible_collections.orbite.qualification.plugins.module_utils._verify.history import (
    compare_lines,
    compare_runs,
    resolve_run,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "a": {"type": "str", "required": True},
            "b": {"type": "str", "required": True},
            "runs_dir": {"type": "path"},
            "output": {"type": "path"},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        result = compare_runs(resolve_run(params["a"], params["runs_dir"], "a"),
                              resolve_run(params["b"], params["runs_dir"], "b"))
        if params["output"] and not module.check_mode:
            atomic_write_json(params["output"], result, mode=0o600)
    except OrbiteError as error:
        fail_from(module, error)
    except OSError as error:
        fail_from(module, error, prefix="run_compare")
    result.pop("schema")
    result.pop("version")
    module.exit_json(changed=bool(params["output"]) and not module.check_mode, lines=compare_lines(result), **result)


if __name__ == "__main__":
    main()

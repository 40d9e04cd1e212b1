#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

DOCUMENTATION = r"""
---
module: result_check
short_description: Verify every receipt of a qualification run and write the verdict
version_added: 0.1.0
description:
  - Reads every case the plan C(run.json) of a run directory names (layout in C(docs/verifier.md)),
    checks the runner ledgers, observer logs and other receipts against the profile's derived
    workload with one stable code per rule, and writes the verdict as JSON, JUnit XML, Markdown and one
    self-contained HTML page with plots drawn from the receipts (C(docs/reports.md)).
  - Fails closed. The verdict is C(PASS) only when the run finished and every planned case passed;
    a run not finished is C(INCOMPLETE), never C(PASS); a missing or invalid C(run.json) is the
    FAIL C(run.plan). The planned cases come from C(run.json), never from the directories found.
  - The verdict is rewritten when verification starts and after every case, so an interrupted run
    still leaves the verdict so far, and no older verdict outlives a new one.
  - Receipts are read as regular files inside the run directory only, size- and depth-capped.
    Shares no code with any runner. A missing, unsafe, truncated or malformed receipt is a coded FAIL.
  - The module does not fail on a FAIL or INCOMPLETE verdict; the
    P(orbite.qualification.result_check#role) role does. It fails (code C(verdict.unwritable)) when
    the full verdict cannot be written (a full disk), after removing every older verdict file and
    writing a short form in its place if that fits (never C(PASS)). With O(partial=true) it only
    warns, since the final verification writes (or fails) later.
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.platform_posix
  - orbite.qualification._attributes.controller_action
options:
  run_dir:
    description: The run directory holding C(run.json) and C(cases/<case>/...).
    type: path
    required: true
  output_dir:
    description: Where to write C(verdict.json), C(verdict.xml) and C(verdict.md); defaults to O(run_dir).
    type: path
  cases:
    description:
      - Verify only these planned cases (those run so far); the other planned cases are not verified
        and make the verdict C(INCOMPLETE).
      - Every case given must be in the C(cases) list of C(run.json), else the verdict fails with C(run.plan).
      - Defaults to every planned case. A planned case without a directory is the FAIL C(case.missing).
    type: list
    elements: str
  partial:
    description:
      - The run is still going; the verdict says C(complete=false) and is C(INCOMPLETE) at best.
      - The gate's first verdict is one with no case verified, written by M(orbite.qualification.run_plan)
        (O(orbite.qualification.run_plan#module:verdict=true)) before any node is touched.
    type: bool
    default: false
  index_dir:
    description:
      - The runs directory whose history (C(index.json) and C(index.html), C(docs/reports.md)) gets this run's
        entry once the verdict is written, under a lock so concurrent runs never lose an entry.
      - Defaults to the parent of O(run_dir) when that is named C(runs) (the gate's C(<orbite_work_dir>/runs));
        otherwise no index is kept unless given.
    type: path
attributes:
  check_mode:
    support: full
    details:
      - In check mode the verdict is computed and returned but no file is written.
  diff_mode:
    support: none
seealso:
  - module: orbite.qualification.run_plan
    description: Writes the plan (C(run.json), each C(case.json)) this module verifies against.
  - module: orbite.qualification.runner
    description: Runs the engine runners whose receipts this module reads.
"""

EXAMPLES = r"""
- name: Verify the run and write the verdict
  orbite.qualification.result_check:
    run_dir: /var/tmp/orbite-runs/ra-20261129T1200
  delegate_to: localhost
  register: verdict
"""

RETURN = r"""
verdict:
  description:
    - C(PASS) when the run finished and every planned case passed every rule that applies to it;
      C(INCOMPLETE) when nothing failed but not every planned case was verified; else C(FAIL).
    - Also returned when the module fails with C(verdict.unwritable) (the verdict computed, not written).
  returned: always
  type: str
  sample: PASS
complete:
  description: False for a partial verdict (O(partial=true)) or while a planned case is not verified.
  returned: always
  type: bool
  sample: true
diagnostic_only:
  description: True when the run was made with a dirty build (C(allow_dirty)); such a PASS qualifies nothing.
  returned: always
  type: bool
  sample: false
counts:
  description: Rule findings passed, failed and skipped, and planned cases in all, passed, failed and not verified.
  returned: always
  type: dict
  sample: {pass: 112, fail: 0, skip: 6, cases: 2, cases_passed: 2, cases_failed: 0, cases_incomplete: 0}
failed_codes:
  description: The codes of the rules that failed, in order of first failure.
  returned: always
  type: list
  elements: str
  sample: []
reports:
  description: Paths of the JSON, JUnit XML, Markdown and HTML verdicts (not written in check mode).
  returned: always
  type: dict
  contains:
    json:
      description: Path of C(verdict.json).
      type: str
      sample: /var/tmp/orbite-runs/ra-1/verdict.json
    junit:
      description: Path of C(verdict.xml).
      type: str
      sample: /var/tmp/orbite-runs/ra-1/verdict.xml
    markdown:
      description: Path of C(verdict.md).
      type: str
      sample: /var/tmp/orbite-runs/ra-1/verdict.md
    html:
      description: Path of C(verdict.html).
      type: str
      sample: /var/tmp/orbite-runs/ra-1/verdict.html
origin:
  description: The run this one reruns the failed cases of (C(run_id), C(run_dir), C(cases)), or null.
  returned: always
  type: dict
  sample: {run_id: ra-20261201T0100, run_dir: /var/lib/orbite/runs/ra-20261201T0100, cases: [write-events]}
index:
  description: Path of the runs index updated (C(index.json)), or null when none is kept.
  returned: always
  type: str
  sample: /var/lib/orbite/runs/index.json
index_error:
  description: Why the runs index could not be updated (the verdict itself was written), else empty.
  returned: always
  type: str
  sample: ""
cases:
  description: Per planned case its verdict (C(PASS), C(FAIL) or C(INCOMPLETE)) and the codes that failed.
  returned: always
  type: list
  elements: dict
  sample:
    - {case: read-polling, verdict: PASS, failed: []}
    - {case: write-events, verdict: INCOMPLETE, failed: []}
code:
  description:
    - Stable failure code; C(run_dir.missing) when O(run_dir) is not a directory, C(verdict.unwritable)
      when no verdict file could be written (a full disk, a read-only directory).
  returned: failure
  type: str
  sample: verdict.unwritable
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._controller.result_check import SPEC, run


def main():
    run(AnsibleModule(supports_check_mode=True, **SPEC))


if __name__ == "__main__":
    main()

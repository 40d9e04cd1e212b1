#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

DOCUMENTATION = r"""
---
module: fetch_receipts
short_description: Fetch a node's receipts of one case in one archive, optionally stopping its relay and supervisor
version_added: 0.2.0
description:
  - With O(supervisor), first stops the node's lock supervisor of the case, as
    M(orbite.qualification.node_supervisor) does with O(orbite.qualification.node_supervisor#module:state=stopped)
    and O(orbite.qualification.node_supervisor#module:force=true) (children killed and reaped, locks released,
    journal closed), then packs its closed journal as C(journal.jsonl). Two jobs in one call, because they always
    go together at the end of a case and in this order (the journal is complete only once the supervisor
    stopped); one round trip per node and case instead of two (issue 20). A stop that fails still packs and
    fetches what is there, then fails the task (RV(stop_failed)), so that an C(always) section gets both the
    receipts and the failure.
  - With O(relay_state_dir), first of all stops the case's control relay (installed-interruption), as
    M(orbite.qualification.control_relay) does with O(orbite.qualification.control_relay#module:state=stopped),
    while the supervisor it watches still runs, so that the relay ends by request and journals its stop. A relay that
    cannot be ended is a warning (RV(relay)), not the task's failure; the supervisor's stop still runs, and the
    verifier fails the case on the relay's journal.
  - On the node, packs the receipts under O(src) whose file names match O(patterns) (regular files only;
    never a symbolic link, a hidden name or a file under a linked directory) and the named O(files) that
    exist (the supervisor's and the relay's journals) into one tar beside O(src)
    (C(<src>.receipts.tar)), listing each member's size and sha256.
  - The collection's action plugin then fetches that one archive and, on the controller, writes each
    member into O(dest) under its path relative to O(src) (a named file under its name), byte for byte;
    a member whose size or sha256 is not the node's is refused, never written. Files are 0600 in 0700
    directories, written atomically; O(dest) is then made private throughout (C(chmod -R u=rwX,go=)),
    and is not created when there is nothing to fetch.
  - A member that cannot be written (a full disk) is named in RV(errors) and the task fails; the others
    still land, and the verifier codes what is missing (C(receipt.*)). Nothing is capped; an oversize
    receipt travels as it is and the verifier refuses it (C(receipt.oversize)).
  - One round trip per node and case instead of a find, one fetch per file and the fixes of modes.
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.platform_linux
options:
  src:
    description: The node's receipt directory (the role's directory of the case); absent means no receipts.
    type: path
    required: true
  dest:
    description: The controller's directory for this node's receipts of the case (absolute).
    type: path
    required: true
  patterns:
    description: Shell patterns a receipt's file name matches (C(fnmatch)), searched recursively under O(src).
    type: list
    elements: str
    default: [ledger.json, observer-*.bin, observer-*.jsonl, inventory-*.json, case.json, ready.json,
              runner.stdout, runner.stderr]
  files:
    description:
      - Single files to fetch too when they exist, by the plain file name they get in O(dest)
        (e.g. C(relay.jsonl) for the control relay's journal). A missing one is left out (RV(left_out)).
      - With O(supervisor), the name C(journal.jsonl) is the supervisor's journal's.
    type: dict
    default: {}
  supervisor:
    description:
      - The node's lock supervisor to stop before packing (see the description); omitted, none is stopped.
    type: dict
    suboptions:
      run_id:
        description:
          - The run the supervisor serves; it names its run directory (as in M(orbite.qualification.node_supervisor)).
        type: str
        required: true
      run_dir:
        description: The supervisor's run directory. Defaults to C(<root>/run/orbite/supervisors/<run_id>).
        type: path
      root:
        description: Host root (a fake host's directory in the simulated lab).
        type: path
        default: /
      stop_timeout:
        description: Seconds to wait for the supervisor's answer before ending it (SIGTERM, then SIGKILL after 5 s).
        type: float
        default: 30
  relay_state_dir:
    description:
      - The state directory of the case's control relay (as in M(orbite.qualification.control_relay)), to stop it
        before the supervisor (see the description); 10 s after its stop request it is killed (SIGKILL). Omitted,
        no relay is stopped.
    type: path
attributes:
  check_mode:
    support: full
    details:
      - Lists what would be fetched (RV(members)); nothing is written on either side, no relay or supervisor is
        stopped.
  diff_mode:
    support: none
seealso:
  - module: orbite.qualification.result_check
    description: Verifies the receipts fetched into the run directory.
"""

EXAMPLES = r"""
- name: Fetch the receipts and the supervisor journal into the run directory
  orbite.qualification.fetch_receipts:
    src: /var/tmp/orbite/ra-1/read-polling/source
    dest: /home/ops/.cache/orbite/runs/ra-1/cases/read-polling/source
    files:
      journal.jsonl: /run/orbite/supervisors/ra-1-read-polling/journal.jsonl
  ignore_errors: true  # what did not arrive is the verifier's coded FAIL

- name: Stop the supervisor of the case, then fetch the receipts and its journal
  orbite.qualification.fetch_receipts:
    src: /var/tmp/orbite/ra-1/read-polling/source
    dest: /home/ops/.cache/orbite/runs/ra-1/cases/read-polling/source
    supervisor:
      run_id: ra-1-read-polling
  register: fetched
  ignore_errors: true

- name: Stop the case's control relay, then its supervisor, then fetch the receipts and both journals
  orbite.qualification.fetch_receipts:
    src: /var/tmp/orbite/in-1/source-g2-read-polling/source
    dest: /home/ops/.cache/orbite/runs/in-1/cases/source-g2-read-polling/source
    files:
      relay.jsonl: /var/tmp/orbite/in-1/source-g2-read-polling/relay/relay.jsonl
    relay_state_dir: /var/tmp/orbite/in-1/source-g2-read-polling/relay
    supervisor:
      run_id: in-1-source-g2-read-polling
  register: fetched
  failed_when: fetched.stop_failed | default(true)

- name: Stop here when the supervisor did not stop
  ansible.builtin.fail:
    msg: "{{ fetched.msg }}"
  when: fetched.stop_failed | default(true)
"""

RETURN = r"""
members:
  description: What the node packed, each C(name) (relative to O(dest)), C(size) and C(sha256).
  returned: always
  type: list
  elements: dict
  sample: [{name: g1/ledger.json, size: 2210, sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08}]
left_out:
  description:
    - Named O(files) left out, each C(name), C(path) and C(why) (C(missing), or not a regular file).
    - Not called C(skipped), which Ansible reads as the task's own status (a skipped task evaluates no
      C(failed_when)).
  returned: always
  type: list
  elements: dict
  sample: [{name: relay.jsonl, path: /var/tmp/orbite/ra-1/read-polling/relay/relay.jsonl, why: missing}]
archive:
  description: The archive on the node (the action plugin removes it once fetched); null when there was nothing to pack.
  returned: success, not in check mode
  type: str
  sample: /var/tmp/orbite/ra-1/read-polling/source.receipts.tar
fetched:
  description: The members written into O(dest) (by the action plugin).
  returned: success
  type: list
  elements: str
  sample: [g1/ledger.json, g1/observer-accounting.bin, journal.jsonl]
errors:
  description: By member name, why it was not written (by the action plugin); the task fails when not empty.
  returned: failure
  type: dict
  sample: {g1/observer-accounting.bin: "[Errno 28] No space left on device"}
stopped:
  description:
    - With O(supervisor), the stop's result as M(orbite.qualification.node_supervisor) returns it (C(running),
      C(journal), C(run_dir), C(summary) when one was stopped, C(journal_exists) when none ran, C(error) when
      the stop failed).
  returned: with O(supervisor)
  type: dict
  sample: {running: false, journal: /run/orbite/supervisors/ra-1-read-polling/journal.jsonl,
           run_dir: /run/orbite/supervisors/ra-1-read-polling, summary: {reason: stop, locks_released: true}}
relay:
  description:
    - With O(relay_state_dir), the stop's result as M(orbite.qualification.control_relay) returns it (C(was_running),
      C(stopped), C(killed), C(pid)), or C(error) when the relay could not be ended (also a warning).
  returned: with O(relay_state_dir)
  type: dict
  sample: {was_running: true, stopped: true, killed: false, pid: 41872}
stop_failed:
  description: With O(supervisor), whether the stop failed (then the task fails with its message and code).
  returned: with O(supervisor)
  type: bool
  sample: false
code:
  description:
    - Stable failure code (C(receipts.invalid), C(receipts.unwritten), or C(os.<error>) on the node); with
      RV(stop_failed), the supervisor's (as M(orbite.qualification.node_supervisor) returns it).
  returned: failure
  type: str
  sample: receipts.unwritten
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._node_steps.fetch_receipts import SPEC, run


def main():
    run(AnsibleModule(supports_check_mode=True, **SPEC))


if __name__ == "__main__":
    main()

#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

DOCUMENTATION = r"""
---
module: fetch_receipts
short_description: Fetch a node's receipts of one case to the controller in one archive
version_added: 0.2.0
description:
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
        (e.g. C(journal.jsonl) for the supervisor's journal). A missing one is skipped (RV(skipped)).
    type: dict
    default: {}
attributes:
  check_mode:
    support: full
    details:
      - Lists what would be fetched (RV(members)); nothing is written on either side.
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
"""

RETURN = r"""
members:
  description: What the node packed, each C(name) (relative to O(dest)), C(size) and C(sha256).
  returned: always
  type: list
  elements: dict
  sample: [{name: g1/ledger.json, size: 2210, sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08}]
skipped:
  description: Named O(files) left out, each C(name), C(path) and C(why) (C(missing), or not a regular file).
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
code:
  description: Stable failure code (C(receipts.invalid), C(receipts.unwritten), or C(os.<error>) on the node).
  returned: failure
  type: str
  sample: receipts.unwritten
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._run.receipts import (
    ReceiptsError,
    archive_path_for,
    pack,
    select,
)

PATTERNS = ["ledger.json", "observer-*.bin", "observer-*.jsonl", "inventory-*.json", "case.json", "ready.json",
            "runner.stdout", "runner.stderr"]


def main():
    module = AnsibleModule(
        argument_spec={
            "src": {"type": "path", "required": True},
            "dest": {"type": "path", "required": True},
            "patterns": {"type": "list", "elements": "str", "default": PATTERNS},
            "files": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    p = module.params
    files = {str(k): str(v) for k, v in p["files"].items()}
    try:
        if module.check_mode:
            members = [{"name": name, "path": path} for name, path in select(p["src"], p["patterns"])]
            module.exit_json(changed=False, members=members, skipped=[])
        archive = archive_path_for(p["src"])
        members, skipped = pack(p["src"], p["patterns"], files, archive)
    except (ReceiptsError, OSError) as error:
        fail_from(module, error, prefix=f"src={p['src']}: the receipts could not be packed")
    module.exit_json(changed=False, members=members, skipped=skipped, archive=archive if members else None)


if __name__ == "__main__":
    main()

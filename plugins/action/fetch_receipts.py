# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Action plugin for orbite.qualification.fetch_receipts: pack on the node (a lean node step), one fetch, unpack here.

The module packs the node's receipts into one tar and lists each member's size and sha256; this
fetches that one file over the task's connection, writes the members into ``dest`` on the controller
(module_utils/_run/receipts.py: checked against the node's listing, atomic, private) and removes the
archive from the node. One module call and one transfer per node and case, whatever the file count.
A module that failed but names its archive (its supervisor did not stop, the receipts were packed all the
same) still has it fetched: the task keeps the module's failure.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile

from ansible.utils.display import Display
from ansible_collections.orbite.qualification.plugins.module_utils._node_steps import fetch_receipts as job
from ansible_collections.orbite.qualification.plugins.module_utils._run.receipts import unpack
from ansible_collections.orbite.qualification.plugins.plugin_utils._node_step import NodeStepAction

display = Display()


class ActionModule(NodeStepAction):
    JOB = job

    def prepare(self, args):
        dest = args.get("dest")
        if not isinstance(dest, str) or not os.path.isabs(dest):
            return None, {"failed": True, "code": "receipts.invalid",
                          "msg": f"dest={dest!r}: must be an absolute path on the controller"}
        return args, None

    def after(self, result):
        packed = dict(result)  # the module's own result, before the fetch adds to it
        archive, dest = packed.get("archive"), self._task.args["dest"]
        if self._task.check_mode or not archive:
            return result
        local = tempfile.mkdtemp(prefix="orbite-receipts-")
        try:
            local_archive = os.path.join(local, "receipts.tar")
            self._connection.fetch_file(archive, local_archive)
            written, errors = unpack(local_archive, packed.get("members") or [], dest)
        except Exception as error:  # a transfer or archive error is the task's failure, named
            written, errors = [], {archive: f"could not be fetched or read: {error}"}
        finally:
            shutil.rmtree(local, ignore_errors=True)
            # The receipts stay on the node; their archive does not.
            self._low_level_execute_command(f"rm -f -- {shlex.quote(archive)}")
        result.update(fetched=written, changed=bool(written) or bool(packed.get("changed")))
        if errors:
            unwritten = (f"{len(errors)} receipt(s) of {len(packed.get('members') or [])} not written into {dest}: "
                         + "; ".join(f"{name}: {why}" for name, why in sorted(errors.items())))
            # Shown also when the task's failed_when lets the play go on (the runner role's: the verifier codes the
            # missing receipts), so the operator sees it where it happened.
            display.warning(f"{self._task.get_name()}: {unwritten}")
            # A supervisor that did not stop stays the failure named first (its locks may still be held).
            result.update(errors=errors, msg=f"{result['msg']}; {unwritten}" if packed.get("failed") else unwritten,
                          failed=True, code=result.get("code") if packed.get("failed") else "receipts.unwritten")
        return result

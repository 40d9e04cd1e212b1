# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The bytes of the files a node step places (deploy_artifacts' ``files``, node_supervisor's ``deploy``).

Private to the collection. Each ``src`` is read here, on the controller (a regular file, at most 64 MiB), and
handed to the job as base64 (``content``, never logged), so every file of the run's deployment travels with one
node step instead of a stat, a transfer and a copy per file, and a hash per file after.
"""

from __future__ import annotations

import base64

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import read_regular_bytes

LIMIT = 64 << 20


def with_contents(files, option):
    """(``files`` each with its ``content``, None), or (None, the failed result naming the file of ``option``)."""
    if not isinstance(files, list):
        return None, {"failed": True, "code": "deploy.invalid", "msg": f"{option}={files!r}: must be a list of files"}
    sent = []
    for index, item in enumerate(files):
        src = item.get("src") if isinstance(item, dict) else None
        if isinstance(item, dict) and src is None and item.get("sha256") is None:
            # The role's list names each file the case needs; null where the run's artifacts pin none.
            return None, {"failed": True, "code": "deploy.unpinned",
                          "msg": f"{option}[{index}] ({item.get('name')}): the run's artifacts pin no such file "
                                 "(src and sha256 null); the simulated lab's native build has the verbs provider "
                                 "and every observer"}
        try:
            data = read_regular_bytes(src, LIMIT)
        except (OSError, OrbiteError, TypeError) as error:
            return None, {"failed": True, "code": "deploy.invalid",
                          "msg": f"{option}[{index}].src={src!r}: cannot be read on the controller ({error})"}
        sent.append(dict(item, content=base64.b64encode(data).decode("ascii")))
    return sent, None

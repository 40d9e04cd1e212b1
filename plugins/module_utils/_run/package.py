# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The simulated runner as the gate deploys it: one zipapp of sim/ (its .py files), hashed for the plan.

Packaging only: nothing of sim/ is imported or run here.
"""

import hashlib
import io
import os
import zipapp

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, quote
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import (
    atomic_write_bytes,
    makedirs_private,
    sha256_file,
)

ZIPAPP_MODE = 0o600


def _sources(path):
    return "__pycache__" not in path.parts and path.suffix == ".py"


def runner_zipapp(source, target, check_mode=False):
    """(sha256, made) of the zipapp ``target`` of the tree ``source``, made once: an existing ``target`` is
    hashed as it is (the run deploys and pins that very file). A new one is written atomically, mode 0600, in
    a directory made private (0700) when missing; in check mode nothing is written and the sha256 is that of
    the bytes it would be."""
    if os.path.lexists(target):
        return sha256_file(target), False
    if not os.path.isfile(os.path.join(source, "__main__.py")):
        raise OrbiteError(f"src={quote(source)}: is not the simulated runner's tree (a directory holding __main__.py)",
                          code="zipapp.src")
    buffer = io.BytesIO()
    zipapp.create_archive(source, buffer, filter=_sources)
    data = buffer.getvalue()
    if not check_mode:
        makedirs_private(os.path.dirname(os.path.abspath(target)))
        atomic_write_bytes(target, data, mode=ZIPAPP_MODE)
    return hashlib.sha256(data).hexdigest(), True

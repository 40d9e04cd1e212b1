# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The simulated runner as the gate deploys it: one zipapp of sim/ (its .py files), hashed for the plan.

Packaging only: nothing of sim/ is imported or run here (its sources are compiled, not run). Beside each ``x.py``
the archive holds ``x.pyc`` (where zipimport looks first): an interpreter never writes bytecode into a zip, so
without it every start of each runner of each case compiles the whole engine again. The bytecode is *checked-hash*
(PEP 552): an interpreter uses a ``.pyc`` only when its magic number is its own and the hash of the ``.py`` beside
it in the archive matches, else it compiles that source as before, so a node with another Python runs the same
archive. Both are in the file the plan pins by sha256. Marshalled in format 2, which has no back-references, so the
bytes do not depend on what else the packaging process holds (check mode predicts the sha256; the module and its
action plugin make the same file). Deflated: about the size of the sources alone stored.
"""

import hashlib
import io
import os
import zipapp
import zipfile

from ansible_collections.orbite.qualification.plugins.module_utils._common.bytecode import checked_pyc
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, quote
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import (
    atomic_write_bytes,
    makedirs_private,
    sha256_file,
)

ZIPAPP_MODE = 0o600


def _sources(path):
    return "__pycache__" not in path.parts and path.suffix == ".py"


def with_bytecode(archive):
    """The zipapp ``archive`` (bytes) with each ``.py`` member's checked-hash bytecode added beside it."""
    out = io.BytesIO(archive)
    with zipfile.ZipFile(out, "a") as zipped:
        for info in list(zipped.infolist()):
            if not info.filename.endswith(".py"):
                continue
            source = zipped.read(info.filename)
            # The name a traceback shows: the module's path inside the archive.
            code = compile(source, info.filename, "exec", dont_inherit=True)
            zipped.writestr(zipfile.ZipInfo(info.filename[:-3] + ".pyc", info.date_time), checked_pyc(source, code),
                            compress_type=zipfile.ZIP_DEFLATED)
    return out.getvalue()


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
    zipapp.create_archive(source, buffer, filter=_sources, compressed=True)
    data = with_bytecode(buffer.getvalue())
    if not check_mode:
        makedirs_private(os.path.dirname(os.path.abspath(target)))
        atomic_write_bytes(target, data, mode=ZIPAPP_MODE)
    return hashlib.sha256(data).hexdigest(), True

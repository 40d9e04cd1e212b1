# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Place the run's pinned executables on a node in one call, each checked against its pin once written.

Runs on the node (stdlib only, Python >= 3.9). Each file's bytes arrive with the task (the
collection's action plugin reads them on the controller); each is written atomically (0600, in 0700
directories made as needed) unless the node already holds exactly the pinned bytes there, and then
hashed as it lies on the node: a file whose sha256 is not the plan's is refused by name, so a build
that is not the run's never runs (the runner module and the supervisor check the bytes they load again).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import stat

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, quote
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import (
    atomic_write_bytes,
    makedirs_private,
    sha256_file,
)

_SHA256 = re.compile(r"[0-9a-f]{64}")


class DeployError(OrbiteError):
    code = "deploy.invalid"


class DeployMismatch(OrbiteError):
    code = "deploy.mismatch"


def _current(dest):
    """The sha256 of the regular file at ``dest``, else None (absent, or anything but a regular file)."""
    try:
        if not stat.S_ISREG(os.lstat(dest).st_mode):
            return None
    except FileNotFoundError:
        return None
    return sha256_file(dest)


def deploy(files, check_mode=False, option="files"):
    """Write every {name, dest, sha256, content (base64)}; returns one {name, dest, sha256, changed} per file.

    ``option`` is the module option that holds ``files``, as the messages name each file (``files[0].dest``).

    Raises DeployError for bad input and DeployMismatch, naming every file, when a written file's
    sha256 is not its pin (``details["placed"]``: the ones that match, in place).
    """
    seen, placed, mismatches = set(), [], []
    for index, item in enumerate(files):
        name, dest, pin = item.get("name"), item.get("dest"), item.get("sha256")
        where = f"{option}[{index}]"
        if not isinstance(dest, str) or not os.path.isabs(dest) or dest in seen:
            raise DeployError(f"{where}.dest={quote(dest)}: must be an absolute path, once per task")
        if not isinstance(pin, str) or not _SHA256.fullmatch(pin):
            raise DeployError(f"{where}.sha256={quote(pin)}: must be 64 lower-case hex digits (the plan's pin)")
        seen.add(dest)
        try:
            data = base64.b64decode(item.get("content") or "", validate=True)
        except (binascii.Error, ValueError):
            raise DeployError(f"{where}.content: is not base64 (the action plugin reads it from src)") from None
        if _current(dest) == pin:
            placed.append({"name": name, "dest": dest, "sha256": pin, "changed": False})
            continue
        if not check_mode:
            makedirs_private(os.path.dirname(dest))
            atomic_write_bytes(dest, data, mode=0o600)
            found = sha256_file(dest)
            if found != pin:
                origin = f" ({item['src']})" if item.get("src") else ""
                mismatches.append(f"{name} {dest} has sha256 {found}, the run's plan pins {pin}{origin}")
                continue
        placed.append({"name": name, "dest": dest, "sha256": pin, "changed": True})
    if mismatches:
        raise DeployMismatch("; ".join(mismatches) + ": a build that is not the run's never runs", placed=placed)
    return placed

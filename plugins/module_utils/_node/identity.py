# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Read a node's identity (hostname, boot ID, kernel release, machine-id) relative to a root.

Node-side, stdlib only, Python >= 3.9. The paths follow the fake host root contract: a fake host
is a directory holding ``proc/sys/kernel/hostname``, ``proc/sys/kernel/random/boot_id``,
``proc/sys/kernel/osrelease`` and optionally ``etc/machine-id``; the real host is ``root="/"``.

This file is also copied verbatim into the supervisor's private run directory, so it must not
import anything outside the standard library.
"""

from __future__ import annotations

import os
import re
from typing import Dict, Optional

from ansible_collections.orbite.qualification.plugins.module_utils._common import names
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError

HOSTNAME_PATH = "proc/sys/kernel/hostname"
BOOT_ID_PATH = "proc/sys/kernel/random/boot_id"
OSRELEASE_PATH = "proc/sys/kernel/osrelease"
MACHINE_ID_PATH = "etc/machine-id"

_BOOT_ID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_MACHINE_ID_RE = re.compile(r"^[0-9a-f]{32}$")
# RFC 1123 labels; the kernel accepts more, but a node we qualify must have a sane name.


class IdentityError(OrbiteError):
    """A node identity file is missing, unreadable or malformed."""

    code = "identity.error"


def _read(root: str, rel: str, optional: bool = False) -> Optional[str]:
    path = os.path.join(root, rel)
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except FileNotFoundError:
        if optional:
            return None
        raise IdentityError(f"identity file {path} is missing (root {root})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise IdentityError(f"identity file {path} cannot be read: {exc}") from None


def read_identity(root: str = "/") -> Dict[str, Optional[str]]:
    """Return {hostname, boot_id, kernel_release, machine_id, root}; raise IdentityError if bad."""
    if not isinstance(root, str) or not root.startswith("/"):
        raise IdentityError(f"root {root!r}: must be an absolute path")
    if not os.path.isdir(root):
        raise IdentityError(f"root {root}: is not a directory")
    hostname = _read(root, HOSTNAME_PATH)
    boot_id = _read(root, BOOT_ID_PATH)
    osrelease = _read(root, OSRELEASE_PATH)
    machine_id = _read(root, MACHINE_ID_PATH, optional=True)
    if not names.is_hostname(hostname):
        raise IdentityError(
            f"hostname {names.quote(hostname)} in {os.path.join(root, HOSTNAME_PATH)}: must be {names.HOSTNAME_RULE}"
        )
    boot_id = (boot_id or "").lower()
    if not _BOOT_ID_RE.match(boot_id):
        raise IdentityError(
            f"boot_id {boot_id!r} in {os.path.join(root, BOOT_ID_PATH)}: must be a UUID (8-4-4-4-12 hex digits)"
        )
    if not osrelease:
        raise IdentityError(f"kernel release in {os.path.join(root, OSRELEASE_PATH)} is empty")
    if machine_id is not None:
        machine_id = machine_id.lower()
        if not _MACHINE_ID_RE.match(machine_id):
            raise IdentityError(
                f"machine_id {machine_id!r} in {os.path.join(root, MACHINE_ID_PATH)}: must be 32 hex digits"
            )
    return {
        "root": root,
        "hostname": hostname,
        "boot_id": boot_id,
        "kernel_release": osrelease,
        "machine_id": machine_id,
    }


def identity_mismatches(expected: Dict[str, Optional[str]], observed: Dict[str, Optional[str]]) -> Dict:
    """Return {field: {expected, observed}} for hostname/boot_id fields that differ (None = not checked)."""
    out = {}
    for field in ("hostname", "boot_id"):
        want = expected.get(field)
        if want is None:
            continue
        got = observed.get(field)
        if field == "boot_id":
            want = want.lower()
        if want != got:
            out[field] = {"expected": want, "observed": got}
    return out

# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The lean node steps' payload, kept between playbook runs in the controller user's private cache.

Private to the collection. Building the payload (plugin_utils/_node_step.py: an ``ast`` walk of the jobs and what
they import, their bytecode, a deflated zip) costs every ansible-playbook time in the controller's main process
for the same bytes each time (bench/bench_gate.py prints the build and the cache's load). Here it is built once
and kept as ``<dir>/node-steps-<sha256>.zip`` with a manifest naming every source file it was made of and that
file's sha256 (the files of the payload and the code that builds it). It is used only when each of those files
still has its recorded sha256 and the zip still has its own; else it is built again and replaces the kept one.

What the cache holds runs on the lab's nodes, so it is used only from a directory that is the user's own and
private (0700, owned by the effective user: the lock directories' rule, _node/locks.open_private_dir), opened once
without following a link and checked on that descriptor; every file is read and written through it (a swap of the
path after the check changes nothing) without following links. Anything else (a directory shared or another
user's, a torn or tampered file, a manifest that does not pin the code that builds the payload, a disk that
cannot be written) means the payload is built in memory as without a cache, and never an error.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re

from ansible_collections.orbite.qualification.plugins.module_utils._common.files import (
    atomic_write_bytes,
    atomic_write_json,
    makedirs_private,
    read_regular_bytes,
    sha256_file,
)
from ansible_collections.orbite.qualification.plugins.module_utils._node.locks import LockDirError, open_private_dir

MANIFEST = "node-steps.json"
LIMIT = 64 << 20
SCHEMA = "orbite.node-step-payload"
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _digests(paths):
    """{path: sha256 of its bytes} of ``paths`` (str); None when one cannot be read."""
    try:
        return {path: sha256_file(path) for path in paths}
    except Exception:  # pylint: disable=broad-except  # gone, unreadable: the kept payload is not this one
        return None


def _kept(dir_fd, builders):
    """The kept payload's bytes if every source it was made of is unchanged and the zip is intact, else None.

    Both files are read through ``dir_fd``, the directory that was checked, never by its path again. A manifest
    must pin the code that builds the payload (so never no file at all): one that pins less is not the cache's.
    """
    try:
        manifest = json.loads(read_regular_bytes(MANIFEST, LIMIT, dir_fd=dir_fd, follow_symlinks=False))
        files, digest = manifest["files"], manifest["payload_sha256"]
        if manifest.get("schema") != SCHEMA or manifest.get("magic") != importlib.util.MAGIC_NUMBER.hex():
            return None
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):  # it names the zip: no other path
            return None
        if not isinstance(files, dict) or not files or not set(map(str, builders)) <= set(files):
            return None
        if _digests(list(files)) != files:
            return None
        payload = read_regular_bytes(f"node-steps-{digest}.zip", LIMIT, dir_fd=dir_fd, follow_symlinks=False)
    except Exception:  # pylint: disable=broad-except  # none kept, torn, another layout: built again
        return None
    return payload if hashlib.sha256(payload).hexdigest() == digest else None


def _keep(dir_fd, payload, sources):
    """Write the payload and then its manifest (each atomically, 0600, into ``dir_fd``); remove payloads kept
    before."""
    digest = hashlib.sha256(payload).hexdigest()
    name = f"node-steps-{digest}.zip"
    atomic_write_bytes(name, payload, dir_fd=dir_fd)
    atomic_write_json(MANIFEST, {
        "schema": SCHEMA, "magic": importlib.util.MAGIC_NUMBER.hex(), "payload_sha256": digest, "files": sources},
        dir_fd=dir_fd)
    for entry in os.listdir(dir_fd):
        if entry.startswith("node-steps-") and entry.endswith(".zip") and entry != name:
            try:
                os.unlink(entry, dir_fd=dir_fd)
            except OSError:
                pass


def _private_dir(directory):
    """An open descriptor of ``directory`` (made when missing) checked private, or None when there is none."""
    if not directory:
        return None
    try:
        makedirs_private(directory)
        return open_private_dir(directory, "the node steps' payload cache")  # the lock directories' rule
    except (OSError, LockDirError):
        return None


def cached_payload(directory, build, builders):
    """The payload: the one kept in ``directory`` when it is still what ``build()`` would make, else ``build()``'s.

    ``build()`` returns (payload bytes, the source files it read); ``builders`` are the files of the code that
    builds it (a change there makes another payload of the same sources). ``directory`` None: no cache.
    """
    dir_fd = _private_dir(directory)
    try:
        return _cached(dir_fd, build, builders)
    finally:
        if dir_fd is not None:
            os.close(dir_fd)


def _cached(dir_fd, build, builders):
    if dir_fd is not None:
        kept = _kept(dir_fd, builders)
        if kept is not None:
            return kept
    payload, sources = build()
    digests = _digests(sorted({*map(str, sources), *map(str, builders)}))
    if dir_fd is not None and digests is not None:
        try:
            _keep(dir_fd, payload, digests)
        except OSError:
            pass  # a full or read-only disk: the next playbook builds it again
    return payload

# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""A node's receipts of one case in one archive: packed on the node, unpacked on the controller.

``pack`` runs on the node (stdlib only, Python >= 3.9): the files under the role's receipt directory
whose names match the patterns, chosen as ``ansible.builtin.find`` chose them before (regular files
only, never a symbolic link, a hidden name or anything under a linked directory), and the named single
files (the supervisor's and the relay's journals) when they exist, go into one uncompressed tar with
each member's size and sha256 listed. Nothing is capped here: an oversize receipt travels as it is
and the verifier refuses it by its own rule (``receipt.oversize``), as it did when each file was
fetched alone.

``unpack`` runs on the controller: each member must be a regular file the node listed, named
inside the destination, with the listed size and sha256; it is written atomically (0600, in 0700
directories). A member that cannot be written (a full disk) is named and the others still land:
the verifier codes what is missing. The destination tree is then made private (as ``chmod -R
u=rwX,go=``), node-failure records the role wrote before included.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import posixpath
import stat
import tarfile

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, quote
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import (
    atomic_write_bytes,
    atomic_writer,
    makedirs_private,
)

ARCHIVE_SUFFIX = ".receipts.tar"


class ReceiptsError(OrbiteError):
    code = "receipts.invalid"


class _Hashing:
    """A file object that hashes what tarfile reads from it."""

    def __init__(self, handle):
        self.handle = handle
        self.digest = hashlib.sha256()

    def read(self, size=-1):
        data = self.handle.read(size)
        self.digest.update(data)
        return data


def _safe_name(name):
    """A member name: relative, POSIX, no empty, '.' or '..' part."""
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def select(src, patterns):
    """(relative name, path) of every receipt under ``src`` in walk order; [] when ``src`` is not a directory."""
    chosen = []
    if not os.path.isdir(src) or os.path.islink(src):
        return chosen
    for root, dirs, files in os.walk(src, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            if name.startswith(".") or not any(fnmatch.fnmatch(name, p) for p in patterns):
                continue
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            if stat.S_ISREG(mode):
                chosen.append((os.path.relpath(path, src).replace(os.sep, "/"), path))
    return chosen


def _add(archive, name, path):
    """Add one regular file (never through a symbolic link) to the tar; its listing entry."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ReceiptsError(f"{path}: is not a regular file")
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = st.st_size, 0o600, int(st.st_mtime)
        hashing = _Hashing(handle)
        archive.addfile(info, hashing)
    return {"name": name, "size": info.size, "sha256": hashing.digest.hexdigest()}


def pack(src, patterns, files, archive_path):
    """Write the tar of ``src``'s receipts and the named ``files`` ({member name: path}) to ``archive_path``.

    Returns (listing, skipped): one {name, size, sha256} per member; a named file that does not exist is
    left out (a supervisor that never started has no journal), one that is not a regular file too, and
    both are said in ``skipped``. With nothing to pack no archive is written.
    """
    for name in files:
        if not _safe_name(name) or "/" in name:
            raise ReceiptsError(f"files: member name {quote(name)} must be a plain file name")
    members, skipped = [], []
    chosen = select(src, patterns)
    taken = {name for name, _path in chosen}
    for name, path in sorted(files.items()):
        if name in taken:
            raise ReceiptsError(f"files: {quote(name)} is also a receipt under {src}")
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            skipped.append({"name": name, "path": path, "why": "missing"})
            continue
        if not stat.S_ISREG(mode):
            skipped.append({"name": name, "path": path, "why": "not a regular file"})
            continue
        chosen.append((name, path))
    if not chosen:
        return members, skipped
    makedirs_private(os.path.dirname(os.path.abspath(archive_path)))
    with atomic_writer(archive_path) as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, path in chosen:
            members.append(_add(archive, name, path))
    return members, skipped


def _private_tree(top):
    """chmod -R u=rwX,go= of ``top``, symbolic links left alone."""
    for root, _dirs, files in os.walk(top, followlinks=False):
        os.chmod(root, 0o700)
        for name in files:
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode):
                os.chmod(path, 0o600 | (0o100 if mode & 0o111 else 0))


def unpack(archive_path, listing, dest):
    """Write the members of the archive the node listed into ``dest``; (written names, errors by name)."""
    expected = {m["name"]: m for m in listing}
    written, errors = [], {}
    dest = os.path.abspath(dest)
    with tarfile.open(archive_path, mode="r:") as archive:
        for info in archive:
            name = info.name
            want = expected.get(name)
            if want is None or not _safe_name(name) or not info.isreg():
                errors[name] = "not a receipt the node listed as a regular file"
                continue
            data = archive.extractfile(info).read()
            if len(data) != want["size"] or hashlib.sha256(data).hexdigest() != want["sha256"]:
                errors[name] = (f"arrived as {len(data)} bytes with another sha256 than the node's "
                                f"({want['size']} bytes, sha256 {want['sha256']})")
                continue
            path = os.path.join(dest, *name.split("/"))
            try:
                makedirs_private(os.path.dirname(path))
                atomic_write_bytes(path, data, mode=0o600)
            except OSError as error:
                errors[name] = str(error)
                continue
            written.append(name)
    for name in expected:
        if name not in written and name not in errors:
            errors[name] = "listed by the node, absent from the archive"
    if os.path.isdir(dest):
        try:
            _private_tree(dest)
        except OSError as error:
            errors[dest] = f"cannot be made private: {error}"
    return written, errors


def archive_path_for(src):
    """Where the node keeps the archive of ``src``: beside it, in the case's private directory."""
    return posixpath.normpath(src) + ARCHIVE_SUFFIX

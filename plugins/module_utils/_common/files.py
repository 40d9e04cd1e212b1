# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The collection's one atomic writer: write a temporary file beside the target, fsync, rename."""

import contextlib
import hashlib
import json
import os
import stat
import tempfile
from typing import Any, BinaryIO, Iterator

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError


@contextlib.contextmanager
def atomic_writer(path: str, mode: int = 0o600, dir_fd=None) -> Iterator[BinaryIO]:
    """A binary file to write that replaces ``path`` when the block ends, so a reader sees the old or the
    new file, never a part (for content written as a stream, e.g. an archive); an exception leaves
    ``path`` as it was. The file and its directory are fsynced, so the new content survives a crash.
    With ``dir_fd`` (an open directory), ``path`` is a name in that directory, never resolved again."""
    if dir_fd is None:
        fd, temporary = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(os.path.abspath(path)))
    else:
        fd, temporary = _temporary_in(dir_fd)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(temporary, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(temporary, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    if dir_fd is not None:
        os.fsync(dir_fd)
        return
    dir_fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _temporary_in(dir_fd):
    """(fd, name) of a new file (0600) in the open directory ``dir_fd``, as tempfile.mkstemp makes one by path."""
    for _attempt in range(tempfile.TMP_MAX):
        name = ".tmp-" + os.urandom(6).hex()
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(name, flags, 0o600, dir_fd=dir_fd), name
        except FileExistsError:
            continue
    raise FileExistsError("no temporary name left in the directory")


def atomic_write_bytes(path: str, data: bytes, mode: int = 0o600, dir_fd=None) -> None:
    """Replace ``path`` with ``data`` so a reader sees the old or the new file, never a part."""
    with atomic_writer(path, mode, dir_fd) as handle:
        handle.write(data)


def makedirs_private(path: str) -> None:
    """Create ``path`` and every missing parent with mode 0700 (os.makedirs gives the leaf only its
    mode); a directory that exists keeps its mode (private_dir also makes the leaf private)."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        return
    makedirs_private(os.path.dirname(path))
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
        return  # made meanwhile by someone else: it keeps its mode
    os.chmod(path, 0o700)  # a umask may have taken bits of ours


class NotPrivateDir(OrbiteError):
    """A directory that must be private is a link, not a directory, or another user's."""

    code = "file.not_private"


def private_dir(path: str, what: str = "directory") -> str:
    """The collection's one maker of a private directory: ``path`` and its missing parents created 0700, then
    ``path`` itself opened without following a link, checked to be a directory of the effective user and made
    0700 through that descriptor (an existing directory of ours is tightened, never trusted by its path alone).
    Returns the absolute path; NotPrivateDir names ``what``, the path and the rule otherwise."""
    path = os.path.abspath(path)
    makedirs_private(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise NotPrivateDir(f"{what} {path}: {exc.strerror or exc}; rule: a real directory (not a link) of uid "
                            f"{os.geteuid()}") from None
    try:
        owner = os.fstat(fd).st_uid
        if owner != os.geteuid():
            raise NotPrivateDir(f"{what} {path}: is owned by uid {owner}; rule: a directory of uid {os.geteuid()}")
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return path


def atomic_write_text(path: str, text: str, mode: int = 0o600, dir_fd=None) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode, dir_fd)


def atomic_write_json(path: str, data: Any, mode: int = 0o600, indent: int = 2, dir_fd=None) -> None:
    """JSON with sorted keys and a final newline, written atomically."""
    atomic_write_text(path, json.dumps(data, indent=indent, sort_keys=True) + "\n", mode, dir_fd)


class NotRegularFile(OrbiteError):
    """A path that is a FIFO, device, socket, directory (or, unfollowed, a symbolic link): never read."""

    code = "file.not_regular"


class FileTooLarge(OrbiteError):
    """A regular file longer than the reader's limit."""

    code = "file.too_large"


_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symbolic link"}


def file_kind(mode: int) -> str:
    """'a FIFO', 'a directory', ... for a stat mode (messages)."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def read_regular_bytes(path, limit: int, dir_fd=None, follow_symlinks: bool = True) -> bytes:
    """The collection's one bounded reader of an input file: the bytes of a regular file, at most ``limit``.

    A FIFO, device or socket is never opened (stat first), and the open is non-blocking and checked
    again with fstat, so a file swapped in between never hangs the reader; a file longer than
    ``limit`` raises FileTooLarge instead of being cut. ``dir_fd``/``follow_symlinks`` as for os.open:
    with ``follow_symlinks=False`` a symbolic link is NotRegularFile.
    """
    shown = os.fsdecode(path)
    st = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(f"{shown}: is {file_kind(st.st_mode)}, not a regular file")
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{shown}: is {file_kind(st.st_mode)}, not a regular file")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise FileTooLarge(f"{shown}: is larger than {limit} bytes")
    finally:
        os.close(fd)


def sha256_file(path: str) -> str:
    """The sha256 (hex) of a file's contents, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()

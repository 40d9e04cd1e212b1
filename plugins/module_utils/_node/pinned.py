# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Hash-pinned files: the bytes whose SHA-256 was checked are the bytes that are executed or preloaded.

Hashing a path and then handing the same path to ``execve`` or to the dynamic loader leaves a
window in which the file can be swapped (rename) or rewritten: the pinned hash then vouches for
bytes that never run. ``pin_file`` closes it: it opens the file once (no symlink, no FIFO, no
device), copies it into an anonymous memory file while hashing what it copies, seals the copy
against any further write, and only then compares the hash. Callers execute or preload the copy
through ``/proc/self/fd/<n>`` (``Pinned.proc_path``), which names that descriptor and nothing else.

When the kernel refuses an executable memfd (``vm.memfd_noexec=2``) a library gets a
non-executable one (it is mapped, never exec'd); when it refuses memfd_create altogether (very old
kernels), the copy is an unlinked file of a private 0700 temporary directory, reopened read-only:
nothing can reach it by name and only its open descriptor remains.

Node-side, stdlib only, Python >= 3.9; copied into the supervisor's run directory.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import stat
import tempfile
from typing import Optional

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError, quote

SHA256_RE = re.compile(r"[0-9a-f]{64}", re.ASCII)
# An executable or a preloaded library is megabytes; a bound keeps a hostile path (a huge sparse
# file) from filling memory.
MAX_PINNED_BYTES = 1 << 30
_CHUNK = 1 << 20
_SEALS = ("F_SEAL_SEAL", "F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_WRITE")


class PinError(OrbiteError):
    """A file could not be pinned: missing, not a regular file, too large, unreadable."""

    code = "pin.error"


class PinMismatch(PinError):
    """The file's bytes do not have the pinned SHA-256; nothing of it was run."""

    code = "pin.mismatch"

    def __init__(self, msg: str, path: str, expected: str, found: str):
        super().__init__(msg, path=path, expected=expected, found=found)
        self.path = path
        self.expected = expected
        self.found = found


def is_sha256(value) -> bool:
    return isinstance(value, str) and SHA256_RE.fullmatch(value) is not None


class Pinned:
    """An anonymous, sealed copy of a file, open as ``fd``; close it (or use ``with``) when done."""

    def __init__(self, fd: int, path: str, sha256: str, size: int, kind: str):
        self.fd = fd
        self.path = path
        self.sha256 = sha256
        self.size = size
        self.kind = kind  # "memfd" or "private-copy"

    @property
    def proc_path(self) -> str:
        """The copy's name for exec or LD_PRELOAD in a process that has this descriptor at the same number."""
        return f"/proc/self/fd/{self.fd}"

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Pinned:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def as_dict(self) -> dict:
        return {"path": self.path, "sha256": self.sha256, "size": self.size, "copy": self.kind}


_MFD_NOEXEC_SEAL = 0x0008  # Linux 6.3: the only memfd a vm.memfd_noexec=2 policy allows; mmap still works


def _memfd(executable: bool) -> Optional[int]:
    create = getattr(os, "memfd_create", None)
    if create is None:
        return None
    flags = [os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING]
    if not executable:  # a library is mapped, never exec'd: a non-executable memfd serves
        flags.append(flags[0] | _MFD_NOEXEC_SEAL)
    for flag in flags:
        try:
            return create("orbite-pinned", flag)
        except OSError:
            continue
    return None


def _seal(fd: int) -> None:
    seals = 0
    for name in _SEALS:
        seals |= getattr(fcntl, name, 0)
    add = getattr(fcntl, "F_ADD_SEALS", None)
    if add is not None and seals:
        fcntl.fcntl(fd, add, seals)


def _private_copy_fd():
    """(write fd, reopen) of an unlinked file in a fresh 0700 directory."""
    directory = tempfile.mkdtemp(prefix="orbite-pin-")
    try:
        fd, name = tempfile.mkstemp(dir=directory)
        os.unlink(name)
    finally:
        os.rmdir(directory)
    return fd


def pin_file(path, expected_sha256: Optional[str] = None, what: str = "file", executable: bool = True) -> Pinned:
    """Copy ``path`` into a sealed anonymous file while hashing it; check ``expected_sha256`` if given.

    ``executable=False`` (a library to preload) also accepts a memfd the kernel will not exec.

    Raises PinMismatch (the copy is discarded) or PinError; never follows a symlink, never opens a
    FIFO or device for reading (a FIFO would block), never reads more than MAX_PINNED_BYTES.
    """
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise PinError(f"{what} {quote(path)}: must be an absolute path")
    if expected_sha256 is not None and not is_sha256(expected_sha256):
        raise PinError(f"{what} {path}: pinned sha256 {quote(expected_sha256)} must be 64 lowercase hex digits")
    try:
        src = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        why = "is a symbolic link" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
        raise PinError(f"{what} {path}: cannot be opened: {why}", path=path) from None
    copy = -1
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            raise PinError(f"{what} {path}: must be a regular file", path=path)
        if st.st_size > MAX_PINNED_BYTES:
            raise PinError(f"{what} {path}: {st.st_size} bytes, more than {MAX_PINNED_BYTES}", path=path)
        copy = _memfd(executable)
        kind = "memfd"
        if copy is None:
            copy, kind = _private_copy_fd(), "private-copy"
        digest = hashlib.sha256()
        size = 0
        while True:
            chunk = os.read(src, _CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_PINNED_BYTES:
                raise PinError(f"{what} {path}: grew past {MAX_PINNED_BYTES} bytes while read", path=path)
            digest.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(copy, view):]
        if kind == "memfd":
            _seal(copy)
        else:
            # Owner read and execute only; executing a file that is open for writing fails (ETXTBSY),
            # so keep a read-only descriptor.
            os.fchmod(copy, 0o500)
            reopened = os.open(f"/proc/self/fd/{copy}", os.O_RDONLY | os.O_CLOEXEC)
            os.close(copy)
            copy = reopened
        found = digest.hexdigest()
        if expected_sha256 is not None and found != expected_sha256:
            raise PinMismatch(
                f"{what} {path}: sha256 {found} does not match the pinned {expected_sha256}; it is not run",
                path, expected_sha256, found,
            )
        pinned = Pinned(copy, path, found, size, kind)
        copy = -1
        return pinned
    except OSError as exc:
        raise PinError(f"{what} {path}: cannot be copied: {exc.strerror or exc}", path=path) from None
    finally:
        os.close(src)
        if copy >= 0:
            os.close(copy)

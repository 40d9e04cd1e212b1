# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""One flock-based resource lock per RNIC.

A lock is ``<lock_dir>/<rnic>.lock``. Holding it means holding an exclusive ``flock`` on that file,
so the kernel releases it when the holder dies, however it dies. The file's content only *names*
the owner (a JSON object, see docs/supervisor.md); it never decides who holds the lock:

- while held, the content is the holder's record with ``"state": "held"``;
- a clean release rewrites it with ``"state": "released"`` before unlocking;
- so an acquirer that finds ``"held"`` in a file whose flock it just obtained knows the previous
  owner died without releasing (``previous_state: "stale"``).

Node-side, stdlib only, Python >= 3.9; copied verbatim into the supervisor's run directory.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import random
import stat
import time
from typing import Callable, Dict, Optional

from ansible_collections.orbite.qualification.plugins.module_utils._common import names
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError

LOCK_SCHEMA = "orbite.rnic-lock"
LOCK_SCHEMA_VERSION = 1
LOCK_SUFFIX = ".lock"
# Device names as the kernel shows them under /sys/class/infiniband (mlx5_0, rxe0, ...).
_MAX_OWNER_BYTES = 65536


class LockError(OrbiteError):
    """Base class of every lock failure."""

    code = "lock.error"


class LockInputError(LockError):
    """A lock argument (RNIC name, lock dir) breaks a rule."""


class LockDirError(LockInputError):
    """The lock directory is not private to this user."""


class LockTimeout(LockError):
    """The lock stayed held by someone else for the whole timeout."""

    def __init__(self, msg: str, rnic: str, owner: Optional[Dict]):
        super().__init__(msg)
        self.rnic = rnic
        self.owner = owner


def validate_rnic_name(name) -> str:
    if not names.is_name(name):
        raise LockInputError(f"RNIC name {names.quote(name)}: must be {names.NAME_RULE}")
    return name


def check_private_dir(path: str, what: str) -> None:
    """Raise LockDirError unless path is a real directory owned by us with no group/other access."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise LockDirError(f"{what} {path}: does not exist") from None
    _check_private(st, path, what)


def open_private_dir(path: str, what: str) -> int:
    """An open descriptor of ``path`` once it is checked private as check_private_dir says, the check made on
    that descriptor (fstat): reading through it (``dir_fd``) reads the directory checked, even if ``path`` is
    swapped for a link or another directory after the check. The last component is never a followed link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise LockDirError(f"{what} {path}: does not exist") from None
    except OSError as exc:  # ELOOP: a link; ENOTDIR: a file
        raise LockDirError(f"{what} {path}: must be a real directory (not a symlink or file): {exc.strerror}") from None
    try:
        _check_private(os.fstat(fd), path, what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_private(st: os.stat_result, path: str, what: str) -> None:
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise LockDirError(f"{what} {path}: must be a real directory (not a symlink or file)")
    mode = stat.S_IMODE(st.st_mode)
    euid = os.geteuid()
    if st.st_uid != euid or mode & 0o077:
        raise LockDirError(
            f"{what} {path}: has mode {mode:04o} owned by uid {st.st_uid}; rule: a directory owned by "
            f"uid {euid} with mode 0700 (no group or other access)"
        )


def ensure_private_dir(path: str, what: str, create: bool = True) -> str:
    """Create path (mode 0700, parents 0755) when missing, then check it is private."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise LockDirError(f"{what} {path!r}: must be an absolute path")
    path = os.path.normpath(path)
    if create and not os.path.lexists(path):
        parent = os.path.dirname(path)
        os.makedirs(parent, mode=0o755, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass  # a concurrent creator; the check below decides
    check_private_dir(path, what)
    return path


def lock_path(lock_dir: str, rnic: str) -> str:
    return os.path.join(lock_dir, validate_rnic_name(rnic) + LOCK_SUFFIX)


def _parse_owner(raw: bytes) -> Optional[Dict]:
    if not raw.strip():
        return None
    try:
        owner = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {"unparsable": raw[:200].decode("utf-8", "replace")}
    return owner if isinstance(owner, dict) else {"unparsable": repr(owner)[:200]}


def read_owner(path: str) -> Optional[Dict]:
    """The owner record currently written in a lock file (None when empty or absent)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {"unparsable": "not a regular file"}
        return _parse_owner(os.pread(fd, _MAX_OWNER_BYTES, 0))
    finally:
        os.close(fd)


def describe_owner(owner: Optional[Dict]) -> str:
    if not owner:
        return "an unnamed holder (empty lock file)"
    if "unparsable" in owner:
        return "an unknown holder (unparsable lock file: {!r})".format(owner["unparsable"])
    if owner.get("state") == "released":
        # Someone holds the flock without having written its record (not one of our supervisors).
        return "a holder that left no record (the file's last owner, run {} pid {}, released it at {})".format(
            owner.get("run_id"), owner.get("pid"), owner.get("released_at") or "an unknown time"
        )
    return "run {} of controller {}, pid {} on {} (boot {}), since {}".format(
        owner.get("run_id"),
        owner.get("controller"),
        owner.get("pid"),
        owner.get("hostname"),
        owner.get("boot_id"),
        owner.get("acquired_at"),
    )


def iso_time(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int((ts % 1) * 1e6):06d}Z"


class RnicLock:
    """A held lock. Release exactly once; the kernel releases it anyway if the process dies."""

    def __init__(
        self,
        rnic: str,
        path: str,
        fd: int,
        owner: Dict,
        *,
        previous_state: str,
        previous_owner: Optional[Dict],
        waited_s: float,
    ):
        self.rnic = rnic
        self.path = path
        self.fd = fd
        self.owner = owner
        self.previous_state = previous_state
        self.previous_owner = previous_owner
        self.waited_s = waited_s

    @property
    def held(self) -> bool:
        return self.fd >= 0

    def release(self) -> Dict:
        """Mark the file released, drop the flock and close; return the released record."""
        if self.fd < 0:
            raise LockError(f"lock {self.path} is not held")
        record = dict(self.owner, state="released", released_at=iso_time(time.time()))
        try:
            _rewrite(self.fd, record)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1
        return record

    def update(self, **fields) -> Dict:
        """Rewrite the held lock's record with ``fields`` changed (a lease renewal, say)."""
        if self.fd < 0:
            raise LockError(f"lock {self.path} is not held")
        record = dict(self.owner, **fields)
        _rewrite(self.fd, record)
        self.owner = record
        return record

    def as_dict(self) -> Dict:
        return {"rnic": self.rnic, "path": self.path, "owner": self.owner}


def _rewrite(fd: int, record: Dict) -> None:
    # New bytes first, then cut the tail: a concurrent reader (lease enforcement) sees the old record,
    # the new one, or an unparsable mix; never an empty file it would take for "no owner".
    data = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
    if os.pwrite(fd, data, 0) != len(data):
        raise OSError(errno.ENOSPC, "short write of the lock record")
    os.ftruncate(fd, len(data))


def acquire(
    lock_dir: str,
    rnic: str,
    owner: Dict,
    timeout: float = 0.0,
    on_busy: Optional[Callable[[str], None]] = None,
) -> RnicLock:
    """Take the flock of rnic's lock file, waiting up to timeout seconds, and write owner into it.

    lock_dir must already be private (see ensure_private_dir). Raises LockTimeout naming the
    current owner when the lock stays held. ``on_busy(path)`` is called on each busy poll (the
    supervisor enforces an expired lease of a hung holder from there).
    """
    path = lock_path(lock_dir, rnic)
    start = time.monotonic()
    deadline = start + max(0.0, float(timeout))
    delay = 0.0005
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise LockError(f"flock {path}: {exc}") from None
            now = time.monotonic()
            if now >= deadline:
                current = read_owner(path)
                raise LockTimeout(
                    f"RNIC lock {rnic} ({path}) still held after {float(timeout):.1f} s by {describe_owner(current)}",
                    rnic,
                    current,
                ) from None
            if on_busy is not None:
                on_busy(path)
                now = time.monotonic()
                if now >= deadline:
                    continue
            # Jittered exponential back-off: contenders do not wake in lock-step.
            time.sleep(min(delay * (0.5 + random.random()), deadline - now))
            delay = min(delay * 2, 0.02)
            continue
        # We hold the flock; make sure the path still names this very file.
        try:
            st_fd = os.fstat(fd)
            st_path = os.lstat(path)
        except FileNotFoundError:
            st_path = None
        if st_path is None or (st_fd.st_dev, st_fd.st_ino) != (st_path.st_dev, st_path.st_ino):
            os.close(fd)
            continue
        if not stat.S_ISREG(st_fd.st_mode) or st_fd.st_uid != os.geteuid():
            os.close(fd)
            raise LockInputError(f"lock file {path}: must be a regular file owned by uid {os.geteuid()}")
        break
    waited = time.monotonic() - start
    previous = _parse_owner(os.pread(fd, _MAX_OWNER_BYTES, 0))
    if previous is None:
        previous_state = "none"
    elif previous.get("state") == "released":
        previous_state = "released"
    else:
        # flock was free yet the file says held: its owner died without releasing.
        previous_state = "stale"
    record = dict(owner)
    record.update(
        schema=LOCK_SCHEMA, version=LOCK_SCHEMA_VERSION, rnic=rnic, state="held", acquired_at=iso_time(time.time())
    )
    record.setdefault("pid", os.getpid())
    try:
        _rewrite(fd, record)
    except OSError:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        raise
    return RnicLock(rnic, path, fd, record, previous_state=previous_state, previous_owner=previous, waited_s=waited)


def probe(lock_dir: str, rnic: str) -> bool:
    """True when the lock is free right now (takes and drops the flock; writes nothing)."""
    return probe_path(lock_path(lock_dir, rnic))


def probe_path(path: str) -> bool:
    """probe() for a lock file named by its path (a lease record lists paths)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True

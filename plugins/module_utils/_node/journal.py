# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The supervisor journal: JSON lines, each written whole or not at all (see docs/supervisor.md).

Every event is one ``write`` of one complete line on an O_APPEND descriptor. A write that fails or
is cut short (a full disk) is undone by truncating the file back to where it was, so a reader never
finds half a line; the caller gets a JournalError with a stable code and decides what the failure
means for the request it was serving. ``sync`` (fsync) runs at the end of each runner and when the
journal is closed.

``append_event`` adds one line to the journal of a supervisor that no longer writes it (hung or
killed), with the next ``seq``, so whoever enforced its end says so where the verifier looks.

Node-side, stdlib only, Python >= 3.9; copied into the supervisor's run directory.
"""

from __future__ import annotations

import json
import os
import time
from typing import Dict, Optional

from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import OrbiteError
from ansible_collections.orbite.qualification.plugins.module_utils._node.locks import iso_time

JOURNAL_SCHEMA = "orbite.supervisor-journal"
JOURNAL_VERSION = 1
_TAIL_BYTES = 1 << 16


class JournalError(OrbiteError):
    """An event could not be written whole (disk full, I/O error, journal closed)."""

    code = "supervisor.journal_error"


def write_whole_line(fd: int, data: bytes, what: str) -> None:
    """One write of a complete line; on failure or a short write the file is cut back, then JournalError."""
    try:
        before = os.fstat(fd).st_size
    except OSError as exc:
        raise JournalError(f"{what}: {exc.strerror or exc}") from None
    try:
        written = os.write(fd, data)
    except OSError as exc:
        _cut(fd, before)
        raise JournalError(f"{what}: an event could not be written ({exc.strerror or exc})") from None
    if written != len(data):
        _cut(fd, before)
        raise JournalError(f"{what}: an event could not be written whole ({written} of {len(data)} bytes; "
                           "is the disk full?)")


def _cut(fd: int, size: int) -> None:
    try:
        os.ftruncate(fd, size)
    except OSError:
        pass


class Journal:
    """Append-only JSON lines; the first line carries schema and version."""

    def __init__(self, path: str, header: Dict):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self.seq = 0
        self.error: Optional[str] = None  # the first write failure, reported by status and stop
        first = {"schema": JOURNAL_SCHEMA, "version": JOURNAL_VERSION}
        first.update(header)
        try:
            self.event("journal_open", **first)
        except JournalError:
            os.close(self.fd)
            self.fd = -1
            raise

    @property
    def open(self) -> bool:
        return self.fd >= 0

    def event(self, ev: str, at: Optional[float] = None, **fields) -> Dict:
        """Write one event, stamped ``at`` (time.time(); default now); raise JournalError (nothing written) when
        it cannot be written whole."""
        if self.fd < 0:
            raise JournalError(f"journal {self.path} is closed")
        now = time.time() if at is None else at
        rec = {"seq": self.seq, "ev": ev, "t": round(now, 6), "time": iso_time(now)}
        rec.update(fields)
        try:
            write_whole_line(self.fd, (json.dumps(rec) + "\n").encode("utf-8"), f"journal {self.path}")
        except JournalError as exc:
            if self.error is None:
                self.error = str(exc)
            raise
        self.seq += 1
        return rec

    def note(self, ev: str, **fields) -> bool:
        """event() for paths that must go on (shutdown, reaping): a failure is kept in ``error``."""
        try:
            self.event(ev, **fields)
        except JournalError:
            return False
        return True

    def sync(self) -> bool:
        if self.fd < 0:
            return False
        try:
            os.fsync(self.fd)
        except OSError as exc:
            if self.error is None:
                self.error = f"journal {self.path}: fsync failed ({exc.strerror or exc})"
            return False
        return True

    def close(self, **fields) -> None:
        """Write journal_close, fsync and close (best effort: a failure is kept in ``error``)."""
        if self.fd < 0:
            return
        self.note("journal_close", **fields)
        self.sync()
        os.close(self.fd)
        self.fd = -1


def last_event(path: str) -> Optional[Dict]:
    """The last complete event of a journal (None if there is none or it cannot be read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        tail = os.pread(fd, _TAIL_BYTES, max(0, size - _TAIL_BYTES))
    except OSError:
        return None
    finally:
        os.close(fd)
    for line in reversed(tail.splitlines()):
        try:
            rec = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            continue
        if isinstance(rec, dict):
            return rec
    return None


def append_event(path: str, ev: str, **fields) -> Dict:
    """Append one event to a journal its own supervisor no longer writes; raise JournalError or OSError."""
    last = last_event(path)
    seq = last.get("seq") if last else None
    now = time.time()
    rec = {"seq": seq + 1 if isinstance(seq, int) and not isinstance(seq, bool) else None, "ev": ev,
           "t": round(now, 6), "time": iso_time(now), "written_by_pid": os.getpid()}
    rec.update(fields)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        write_whole_line(fd, (json.dumps(rec) + "\n").encode("utf-8"), f"journal {path}")
        os.fsync(fd)
    finally:
        os.close(fd)
    return rec

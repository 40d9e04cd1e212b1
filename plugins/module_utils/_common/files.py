# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The collection's one atomic writer: write a temporary file beside the target, fsync, rename."""

import json
import os
import tempfile
from typing import Any


def atomic_write_bytes(path: str, data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` so a reader sees the old or the new file, never a part.

    The file and its directory are fsynced, so the new content survives a crash once this returns.
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_text(path: str, text: str, mode: int = 0o600) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def atomic_write_json(path: str, data: Any, mode: int = 0o600, indent: int = 2) -> None:
    """JSON with sorted keys and a final newline, written atomically."""
    atomic_write_text(path, json.dumps(data, indent=indent, sort_keys=True) + "\n", mode)

# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Checked-hash bytecode (PEP 552): the one way the collection writes a ``.pyc``.

An interpreter uses such a ``.pyc`` only when its magic number is its own and the hash of the source beside it
matches, else it compiles that source as before, so bytecode shipped beside a source never runs stale and a node
with another Python is unaffected. Marshalled in format 2, which has no back-references: the bytes do not depend
on what else the process holds (the simulated runner's zipapp is pinned by sha256, module and action alike).
Stdlib only: nodes write it too (the supervisor's copied program).
"""

import importlib.util
import marshal

# PEP 552 flags: hash-based (bit 0), checked against the source (bit 1).
_CHECKED_HASH = (0b11).to_bytes(4, "little")
# No back-references, which follow reference counts: the same bytes in any process (format 4 fails
# tests/unit/plugins/action/test_in_process.py, whose action and module then hash different files).
_MARSHAL_VERSION = 2


def checked_pyc(source, code):
    """The ``.pyc`` bytes of ``code`` (compiled from ``source``, bytes) for this interpreter, checked-hash."""
    return (importlib.util.MAGIC_NUMBER + _CHECKED_HASH + importlib.util.source_hash(source)
            + marshal.dumps(code, _MARSHAL_VERSION))

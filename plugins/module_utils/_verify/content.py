# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The seeded content of a round, recomputed by the verifier from docs/content.md alone.

The verifier shares no code with any runner: this is an implementation of its own of the document's
formula (tests/unit/plugins/module_utils/_verify/test_content.py holds it to the document's worked
example). Only what the digest rules need: the expected SHA-256 of any range of a parent's payload,
and the expected SHA-256 of a parent's guard windows for a guard seed. The arena layout (the guard
G, each parent's region and offset) is the profile model's, carried by the workload the rules read.
"""

from __future__ import annotations

import hashlib

from ansible_collections.orbite.qualification.plugins.module_utils._profile.model import GUARD_BYTES

PARENT_SHIFT = 8  # offset between two parents' windows of the round stream
POISON = 0xA5  # what a destination payload byte holds before the round (docs/content.md)
_DOMAIN = b"orbite-sim-input"
_GUARD_DOMAIN = b"orbite-sim-guard"


class RoundContent:
    """The payload of every parent for one round's seed: T(s), one SHAKE128 stream, parent p's
    payload being the window T[8p : 8p + L]."""

    def __init__(self, seed, parents, payload):
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 64:  # a bool is no seed
            raise ValueError(f"seed={seed!r}: not a 64-bit unsigned integer")
        self.payload = payload
        length = payload + PARENT_SHIFT * (parents - 1)
        self._stream = memoryview(hashlib.shake_128(_DOMAIN + seed.to_bytes(8, "little")).digest(length))

    def payload_of(self, parent):
        start = PARENT_SHIFT * parent
        return self._stream[start:start + self.payload]

    def digest(self, parent, start, length):
        """SHA-256 of parent's payload bytes [start, start + length)."""
        base = PARENT_SHIFT * parent + start
        return hashlib.sha256(self._stream[base:base + length]).digest()


def guard_digests(guard_seed, parent):
    """(SHA-256 of leading(g, p), SHA-256 of trailing(g, p)): B(g, p) = SHAKE128("orbite-sim-guard" ||
    u64le(g) || u32le(p), 2G), the leading guard its first G bytes, the trailing one the next G."""
    if isinstance(guard_seed, bool) or not isinstance(guard_seed, int) or not 0 <= guard_seed < 1 << 64:
        raise ValueError(f"guard_seed={guard_seed!r}: not a 64-bit unsigned integer")
    both = hashlib.shake_128(_GUARD_DOMAIN + guard_seed.to_bytes(8, "little") + parent.to_bytes(4, "little")).digest(
        2 * GUARD_BYTES)
    return hashlib.sha256(both[:GUARD_BYTES]).digest(), hashlib.sha256(both[GUARD_BYTES:]).digest()

# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Seeded input, guards and the byte/guard checks of one destination region.

Layout of the arena (the ``data`` MR): parent p's region starts at ``p * stride``; it is
``guard | payload | guard`` with ``stride = payload + 2 * GUARD_BYTES``.

Input of a round is one ``shake_128`` stream of the round's seed, ``payload + 8 * (parents - 1)``
bytes long; parent p's payload is the window starting at ``8 * p``. So no byte pattern repeats
inside a parent (a slice landing at the wrong offset fails), two parents differ everywhere (their
windows are shifted), the destination regenerates everything from the 8-byte seed, and a fresh seed
every round means a stale copy never passes. Generating one window-stream instead of one stream per
parent keeps hashing to about one payload per round.
"""

import hashlib

GUARD_BYTES = 4096
POISON = 0xA5
PARENT_SHIFT = 8


def stride(payload):
    return payload + 2 * GUARD_BYTES


def region_offset(parent, payload):
    """Offset of parent's payload (after its leading guard) in the arena."""
    return parent * stride(payload) + GUARD_BYTES


def round_seed(base_seed, epoch, round_no):
    h = hashlib.shake_128(b"orbite-sim-round" + base_seed.to_bytes(8, "little") + epoch.to_bytes(8, "little")
                          + round_no.to_bytes(4, "little"))
    return int.from_bytes(h.digest(8), "little")


class RoundInput:
    """The expected payload of every parent for one seed."""

    def __init__(self, seed, parents, payload):
        self.seed = seed
        self.payload = payload
        stream = hashlib.shake_128(b"orbite-sim-input" + seed.to_bytes(8, "little"))
        self._view = memoryview(stream.digest(payload + PARENT_SHIFT * (parents - 1)))

    def parent(self, p):
        start = PARENT_SHIFT * p
        return self._view[start : start + self.payload]


def guard_bytes(seed, parent):
    """Leading and trailing guard contents for a parent."""
    h = hashlib.shake_128(b"orbite-sim-guard" + seed.to_bytes(8, "little") + parent.to_bytes(4, "little"))
    both = h.digest(2 * GUARD_BYTES)
    return both[:GUARD_BYTES], both[GUARD_BYTES:]


def fill_input(arena, parents, payload, seed):
    data = RoundInput(seed, parents, payload)
    for p in range(parents):
        off = region_offset(p, payload)
        arena[off : off + payload] = data.parent(p)


def prepare_destination(arena, parents, payload, guard_seed):
    """Poison every payload region and write fresh guards around it."""
    poison = bytes([POISON]) * payload
    for p in range(parents):
        off = region_offset(p, payload)
        lead, trail = guard_bytes(guard_seed, p)
        arena[off - GUARD_BYTES : off] = lead
        arena[off : off + payload] = poison
        arena[off + payload : off + payload + GUARD_BYTES] = trail


def _diff(arena, start, expected):
    """(changed byte count, first changed offset or None) of arena[start:...] against ``expected``."""
    length = len(expected)
    if arena[start : start + length] == expected:  # bytearray == buffer: one memcmp
        return 0, None
    changed = 0
    first = None
    chunk = 4096
    for base in range(0, length, chunk):
        have = arena[start + base : start + min(base + chunk, length)]
        want = bytes(expected[base : base + chunk])
        if have != want:
            for i, (x, y) in enumerate(zip(have, want)):
                if x != y:
                    changed += 1
                    if first is None:
                        first = base + i
    return changed, first


def check_region(arena, parent, expected, guard_seed):
    """The ledger's byte_check and guard_check for one parent (``expected``: a RoundInput)."""
    payload = expected.payload
    off = region_offset(parent, payload)
    mismatched, first = _diff(arena, off, expected.parent(parent))
    lead, trail = guard_bytes(guard_seed, parent)
    lead_changed = _diff(arena, off - GUARD_BYTES, lead)[0]
    trail_changed = _diff(arena, off + payload, trail)[0]
    byte_check = {"checked_bytes": payload, "mismatched_bytes": mismatched, "first_mismatch": first,
                  "ok": mismatched == 0}
    # The guard windows as they are after the round, hashed: the verifier recomputes what they must
    # be from the round's guard seed with its own code (docs/content.md).
    lead_now = hashlib.sha256(arena[off - GUARD_BYTES : off]).hexdigest()
    trail_now = hashlib.sha256(arena[off + payload : off + payload + GUARD_BYTES]).hexdigest()
    guard_check = {"guard_bytes": GUARD_BYTES, "leading_changed": lead_changed,
                   "trailing_changed": trail_changed, "leading_sha256": lead_now, "trailing_sha256": trail_now,
                   "ok": lead_changed == 0 and trail_changed == 0}
    return byte_check, guard_check

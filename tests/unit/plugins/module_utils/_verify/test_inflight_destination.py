"""inflight_dma.destination's expected prefix: receipts define ``copied_bytes`` as the longest prefix of the destination
holding the round's content (docs/receipts.md 1.9b), so a correct copy that stopped at the stall point before a content
byte equal to the poison sentinel reports one more byte (that byte holds both).

On main the rule expected exactly the stall point: such a fault round (about one in 256, by its random seed) failed a
correct engine (seen in a gate run: expected 2101251 copied, the runner counted 2101252 over the right bytes, sha256
equal). The sim's own measurement of the same region is the second witness here.
"""

import sys

import pytest
from helpers.paths import REPO

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify import content
from ansible_collections.orbite.qualification.plugins.module_utils._verify.rules.inflight_dma import (
    prefix_holding_content,
)

PAYLOAD = 4 << 20  # the shipped in-flight profile's WR
STALL = model.inflight_stall_bytes(PAYLOAD)


def _seed(poison_run):
    """The first seed whose content from the stall point starts with exactly ``poison_run`` poison bytes (the content is
    one SHAKE128 stream, so a shorter payload's bytes are the longer one's prefix: only those up to the window)."""
    for seed in range(1 << 12):
        window = bytes(content.RoundContent(seed, 1, STALL + poison_run + 1).payload_of(0)[STALL:])
        if window == bytes([content.POISON]) * poison_run + window[-1:] and window[-1] != content.POISON:
            return seed
    raise AssertionError(f"no seed below 4096 has {poison_run} poison bytes at the stall point")


def _runner_measure(want):
    """What the simulated runner reports for the region a copy stopped at STALL leaves (sim/orbite_sim/inflight.py)."""
    sys.path.insert(0, str(REPO / "sim"))
    from orbite_sim import inflight  # the runner's code, for the cross-check only

    region = bytes(want[:STALL]) + bytes([content.POISON]) * (PAYLOAD - STALL)
    copied = inflight._common_prefix(region, bytes(want))
    return copied, region[copied:].count(content.POISON)


@pytest.mark.parametrize("poison_run", [0, 1])
def test_the_expected_prefix_counts_content_bytes_equal_to_the_sentinel(poison_run):
    want = content.RoundContent(_seed(poison_run), 1, PAYLOAD).payload_of(0)
    copied = prefix_holding_content(want, STALL)
    assert copied == STALL + poison_run
    # The runner's count of the same bytes agrees, and so does the untouched count the rule expects.
    assert _runner_measure(want) == (copied, PAYLOAD - copied)


"""The seeded content (docs/content.md): the verifier's implementation against the document's worked
example, and against the simulated runner's implementation (two implementations, one document)."""

import hashlib
import random
import re
import sys

import pytest
from helpers.paths import REPO

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify import content

sys.path.insert(0, str(REPO / "sim"))
from orbite_sim import content as sim_content  # the runner's side, for the cross-check only

DOC = (REPO / "docs" / "content.md").read_text()


def _doc_value(label):
    """The hex value the worked example gives for ``label`` (e.g. 'T(s)')."""
    match = re.search(re.escape(label) + r"\s*=\s*([0-9a-f]+)", DOC)
    assert match, label
    return match.group(1)


def test_worked_example_of_the_document():
    seed, parents, payload = 0x0123456789ABCDEF, 2, 20
    round_content = content.RoundContent(seed, parents, payload)
    assert (model.region_stride(payload), model.region_offset(0, payload),
            model.region_offset(1, payload)) == (8212, 4096, 12308)
    assert bytes(round_content.payload_of(0)).hex() == _doc_value("payload(s,0)")
    assert bytes(round_content.payload_of(1)).hex() == _doc_value("payload(s,1)")
    stream = _doc_value("T(s)")
    assert stream.startswith(_doc_value("payload(s,0)")) and stream.endswith(_doc_value("payload(s,1)"))
    assert round_content.digest(0, 0, payload).hex() == _doc_value("SHA-256(payload(s,0))")
    assert round_content.digest(1, 0, payload).hex() == _doc_value("SHA-256(payload(s,1))")
    assert round_content.digest(1, 4, 8).hex() == "f81e46fab9a7b2e28a36ecfff2db2e322c6e1bf4ba138ccc43ef48988ca9a6d0"
    assert "f81e46fab9a7b2e28a36ecfff2db2e322c6e1bf4ba138ccc43ef48988ca9a6d0" in DOC


def test_guard_digests_of_the_document():
    lead, trail = content.guard_digests(1, 0)
    assert lead.hex() == _doc_value("SHA-256(leading(1,0))")
    assert trail.hex() == _doc_value("SHA-256(trailing(1,0))")
    assert content.guard_digests(2, 0) != (lead, trail) and content.guard_digests(1, 1) != (lead, trail)
    for bad in (True, -1, 1 << 64, "1", None):
        with pytest.raises(ValueError, match="guard_seed="):
            content.guard_digests(bad, 0)


def test_the_runner_follows_the_same_document():
    # The simulated runner's own implementation gives the document's vectors too (round seeds are
    # the runner's alone: the verifier never recomputes them).
    data = sim_content.RoundInput(0x0123456789ABCDEF, 2, 20)
    assert bytes(data.parent(1)).hex() == _doc_value("payload(s,1)")
    lead, trail = sim_content.guard_bytes(1, 0)
    assert lead[:16].hex() == _doc_value("leading(1,0)[0:16]")
    assert trail[:16].hex() == _doc_value("trailing(1,0)[0:16]")
    assert hashlib.sha256(lead).hexdigest() == _doc_value("SHA-256(leading(1,0))")
    assert hashlib.sha256(trail).hexdigest() == _doc_value("SHA-256(trailing(1,0))")
    assert (hashlib.sha256(lead).digest(), hashlib.sha256(trail).digest()) == content.guard_digests(1, 0)
    assert sim_content.round_seed(1, 2, 3) == 6587757976185564365
    assert (sim_content.GUARD_BYTES, sim_content.PARENT_SHIFT) == (model.GUARD_BYTES, content.PARENT_SHIFT)


@pytest.mark.parametrize("trial", range(20))
def test_both_implementations_agree_on_any_range(trial):
    rng = random.Random(trial)
    parents, payload = rng.randint(1, 32), rng.randint(1, 70000)
    seed = rng.getrandbits(64)
    mine, theirs = content.RoundContent(seed, parents, payload), sim_content.RoundInput(seed, parents, payload)
    for _ in range(5):
        parent = rng.randrange(parents)
        start = rng.randrange(payload)
        length = rng.randint(0, payload - start)
        assert mine.digest(parent, start, length) == hashlib.sha256(
            bytes(theirs.parent(parent)[start:start + length])).digest()
        assert model.region_offset(parent, payload) == sim_content.region_offset(parent, payload)


@pytest.mark.parametrize("seed", [-1, 1 << 64, "7", None, True])
def test_a_seed_out_of_range_is_refused(seed):
    with pytest.raises(ValueError, match="not a 64-bit unsigned integer"):
        content.RoundContent(seed, 2, 20)

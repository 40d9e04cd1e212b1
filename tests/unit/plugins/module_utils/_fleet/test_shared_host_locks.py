"""Two pairs that share hosts, forced into one wave: the RNIC locks serialise them, never the wave order.

The fleet planner never puts two pairs that share a host into one wave; this test does it on purpose, with
two runner pairs on the same two fake hosts (tests/helpers/sim_pair.py: real lock supervisors, real
simulated runners, the gate's receipts). The second pair asks for the locks while the first holds them: it
waits, and the journals show disjoint lock intervals on each host; both runs still verify PASS.
"""

import threading
import time

import pytest
from helpers import node_root, sim_pair

from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run

CASE = "write-events"
PROFILE = dict(sim_pair.SMALL_HOST, operation="write", rdma_events=True, parents=4, payload=200000, num_lanes=1)


def _interval(journal):
    events = node_root.journal(journal)
    acquired = [e for e in events if e["ev"] == "lock_acquire"]
    released = [e["t"] for e in events if e["ev"] == "lock_release"]
    assert acquired and len(released) == len(acquired), events
    return min(e["t"] for e in acquired), max(released), max(e["waited_s"] for e in acquired)


def _holds(journal):
    """Whether a live supervisor's journal already records a lock taken (a line may be half written)."""
    try:
        return bool(journal.exists() and node_root.events(journal, "lock_acquire"))
    except ValueError:
        return False


@pytest.mark.slow
def test_two_pairs_sharing_hosts_in_one_wave_are_serialised_by_the_locks(tmp_path):
    sim_pair.runner_zipapp()  # built once, before the threads
    sim_pair.make_hosts()
    first, second = tmp_path / "fleet-p1", tmp_path / "fleet-p2"
    errors = []

    def run(run_dir):
        try:
            sim_pair.run_pair(run_dir, CASE, PROFILE)
        except Exception as error:  # reported by the main thread
            errors.append(error)

    one = threading.Thread(target=run, args=(first,))
    one.start()
    # The second pair starts once the first holds the source host's locks: same wave, same RNICs.
    holding = first / "supervisors" / f"{CASE}-source" / "journal.jsonl"
    deadline = time.monotonic() + 60
    while not _holds(holding):
        assert time.monotonic() < deadline and one.is_alive(), "the first pair never took its locks"
        time.sleep(0.01)
    two = threading.Thread(target=run, args=(second,))
    two.start()
    one.join(180)
    two.join(180)
    assert not errors, errors

    for role in ("source", "requester"):  # source: sim-a, requester: sim-b, in both pairs
        held = _interval(first / "cases" / CASE / role / "journal.jsonl")
        then = _interval(second / "cases" / CASE / role / "journal.jsonl")
        assert held[1] <= then[0], f"{role} host: pair 2 locked at {then[0]} while pair 1 held until {held[1]}"
    # The second source supervisor asked while the first held the locks, and waited for them.
    assert _interval(second / "cases" / CASE / "source" / "journal.jsonl")[2] > 0
    for run_dir in (first, second):
        assert verify_run(str(run_dir), write=False)["verdict"] == "PASS"

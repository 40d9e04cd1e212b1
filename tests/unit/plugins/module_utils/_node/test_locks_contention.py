"""RNIC lock contention: 32 concurrent acquirers x 200 trials on one lock, checked by a witness.

The witness shares nothing with rnic_lock: each holder (1) creates a marker file with O_EXCL, which
fails if anyone else is inside, and (2) records its hold interval on CLOCK_MONOTONIC; afterwards
the intervals of all holders are sorted and must not overlap. Real processes, real flock.
"""

import multiprocessing
import os
import time

import pytest
from ansible_collections.orbite.qualification.plugins.module_utils._node import locks as rnic_lock

WORKERS = 32
TRIALS = 200
RNIC = "mlx5_0"


def _no_lock(lock_dir, rnic, owner, timeout=0.0):
    """What acquire would be without its flock: used to prove the witness can fail."""

    class _Fake:
        def release(self):
            return {}

    return _Fake()


def _worker(index, lock_dir, witness_dir, trials, go, out, use_real_lock):
    acquire = rnic_lock.acquire if use_real_lock else _no_lock
    marker = os.path.join(witness_dir, "inside")
    intervals, collisions = [], 0
    go.wait()
    for _ in range(trials):
        lock = acquire(lock_dir, RNIC, {"run_id": f"w{index}"}, timeout=120)
        begin = time.monotonic_ns()
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            collisions += 1
            fd = None
        os.sched_yield()  # give a second holder, if the lock let one in, the chance to show up
        if fd is not None:
            os.close(fd)
            os.unlink(marker)
        end = time.monotonic_ns()
        lock.release()
        intervals.append((begin, end, index))
    out.put((index, collisions, intervals))


def _run(tmp_path, workers, trials, use_real_lock):
    lock_dir = rnic_lock.ensure_private_dir(str(tmp_path / "locks"), "lock_dir")
    witness_dir = tmp_path / "witness"
    witness_dir.mkdir()
    ctx = multiprocessing.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(i, lock_dir, str(witness_dir), trials, go, out, use_real_lock))
             for i in range(workers)]
    for p in procs:
        p.start()
    go.set()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    collisions = sum(r[1] for r in results)
    intervals = sorted(iv for r in results for iv in r[2])
    overlaps = sum(1 for a, b in zip(intervals, intervals[1:]) if b[0] < a[1] and a[2] != b[2])
    return collisions, overlaps, len(intervals)


@pytest.mark.slow
def test_never_two_holders_at_once(tmp_path):
    # Guards rnic_lock.acquire's fcntl.flock(LOCK_EX): without it both witnesses fire.
    collisions, overlaps, holds = _run(tmp_path, WORKERS, TRIALS, use_real_lock=True)
    assert holds == WORKERS * TRIALS
    assert collisions == 0
    assert overlaps == 0
    assert rnic_lock.probe(str(tmp_path / "locks"), RNIC)  # and nobody holds it afterwards


def test_witness_sees_two_holders_without_the_lock(tmp_path):
    # The witness is not a test that cannot fail: the same harness without flock is caught.
    collisions, overlaps, _ = _run(tmp_path, 8, 100, use_real_lock=False)
    assert collisions + overlaps > 0

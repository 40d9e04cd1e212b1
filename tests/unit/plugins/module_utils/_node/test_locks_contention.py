"""RNIC lock contention: 32 concurrent acquirers x 200 trials on one lock, checked by a witness.

The witness shares nothing with rnic_lock: each holder (1) creates a marker file with O_EXCL, which
fails if anyone else is inside, and (2) records its hold interval on CLOCK_MONOTONIC; afterwards
the intervals of all holders are sorted and must not overlap. Real processes, real flock.

The same harness runs with names that differ only by whitespace, case or a Unicode look-alike. The
witness keys each holder by the device a lenient reader would take its name for (NFKC, stripped,
look-alike letters folded; case kept, since Linux device names are case-sensitive): two holders
of one key at once is a double grant. Decision (docs/security.md): look-alike names are refused
by the one name grammar; case-different names are distinct RNICs, so distinct lock files.
"""

import multiprocessing
import os
import re
import time
import unicodedata

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


def _worker(index, lock_dir, witness_dir, trials, go, out, use_real_lock, name=RNIC):
    acquire = rnic_lock.acquire if use_real_lock else _no_lock
    marker = os.path.join(witness_dir, "inside-" + witness_key(name).encode().hex())
    intervals, collisions = [], 0
    go.wait()
    for _ in range(trials):
        try:
            lock = acquire(lock_dir, name, {"run_id": f"w{index}"}, timeout=120)
        except rnic_lock.LockInputError:
            out.put((index, 0, [], name))  # refused: never a holder
            return
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
    out.put((index, collisions, intervals, None))


def _run(tmp_path, workers, trials, use_real_lock, names=(RNIC,), lenient=False):
    lock_dir = rnic_lock.ensure_private_dir(str(tmp_path / "locks"), "lock_dir")
    witness_dir = tmp_path / "witness"
    witness_dir.mkdir()
    ctx = multiprocessing.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    target = _lenient_worker if lenient else _worker
    procs = [ctx.Process(target=target, args=(i, lock_dir, str(witness_dir), trials, go, out, use_real_lock,
                                              names[i % len(names)]))
             for i in range(workers)]
    for p in procs:
        p.start()
    go.set()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    collisions = sum(r[1] for r in results)
    key_of = {i: witness_key(names[i % len(names)]) for i in range(workers)}
    intervals = sorted(iv for r in results for iv in r[2])
    # Two holders of the same device (witness key) whose intervals overlap: a double grant.
    overlaps = 0
    for key in set(key_of.values()):
        mine = [iv for iv in intervals if key_of[iv[2]] == key]
        overlaps += sum(1 for a, b in zip(mine, mine[1:]) if b[0] < a[1] and a[2] != b[2])
    refused = sorted({r[3] for r in results if r[3] is not None})
    if names == (RNIC,):
        return collisions, overlaps, len(intervals)
    return collisions, overlaps, len(intervals), refused


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


# ---------------------------------------------------------------------------------------------
# Look-alike names

# Folded to Latin by the witness: what a reader that "cleans up" a name would take it for.
_CONFUSABLES = str.maketrans({"\u0430": "a", "\u0435": "e", "\u043e": "o", "\u0441": "c", "\u0445": "x",
                              "\u043c": "m", "\u0456": "i", "\u200b": None, "\u00a0": None})
LOOKALIKES = (
    "mlx5_0",
    "mlx5_0\n",  # what re.match(... $) accepted
    " mlx5_0",
    "mlx5_0 ",
    "mlx5_0\t",
    "\uff4d\uff4c\uff58\uff15_\uff10",  # fullwidth: NFKC gives mlx5_0
    "mlx5_\u0660",  # Arabic-Indic zero
    "ml\u04455_0",  # Cyrillic ha
    "mlx5\u200b_0",  # zero-width space
    "MLX5_0",  # another case: another device on Linux, another lock file
    "Mlx5_0",
)
VALID = ("MLX5_0", "Mlx5_0", "mlx5_0")


def witness_key(name):
    folded = unicodedata.normalize("NFKC", name).translate(_CONFUSABLES).strip()
    return re.sub(r"\s+", "", folded)


def _lenient_worker(*args):
    """The grammar main had before the one name grammar: re.match with '$' (a trailing newline passes)."""
    def lenient(name):
        if not isinstance(name, str) or not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", name):
            raise rnic_lock.LockInputError(f"RNIC name {name!r}")
        return name

    rnic_lock.validate_rnic_name = lenient  # this forked worker only
    _worker(*args)


@pytest.mark.slow
def test_lookalike_names_never_double_grant(tmp_path):
    collisions, overlaps, holds, refused = _run(tmp_path, WORKERS, TRIALS, use_real_lock=True, names=LOOKALIKES)
    assert collisions == 0 and overlaps == 0
    assert refused == sorted(set(LOOKALIKES) - set(VALID))  # every look-alike refused by the grammar
    holders = sum(1 for i in range(WORKERS) if LOOKALIKES[i % len(LOOKALIKES)] in VALID)
    assert holds == holders * TRIALS
    # case-different names are distinct RNICs: one lock file each, nothing else in the lock dir
    assert sorted(os.listdir(tmp_path / "locks")) == sorted(f"{n}.lock" for n in VALID)


def test_witness_sees_the_double_grant_of_a_lenient_grammar(tmp_path):
    # The look-alike witness is not a test that cannot fail: main's grammar let "mlx5_0\n" lock a
    # second file for the same device, and the witness catches the two holders.
    names = ("mlx5_0", "mlx5_0\n")
    collisions, overlaps, _holds, refused = _run(tmp_path, 8, 100, use_real_lock=True, names=names, lenient=True)
    assert refused == [] and collisions + overlaps > 0

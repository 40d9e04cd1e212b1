"""Measure RNIC lock and supervisor latencies (prints figures; asserts nothing).

- acquire / release of one uncontended lock (flock + owner record rewrite);
- hand-over time under contention (8 processes taking turns on one lock);
- supervisor start-to-ready (launch, both locks, identity recheck, socket) and stop.

Run: .venv/bin/python bench/bench_locks.py [--quick]
"""

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.orbite.qualification.plugins.module_utils._node import locks as rnic_lock  # noqa: E402
from ansible_collections.orbite.qualification.plugins.module_utils._node.client import (  # noqa: E402
    SupervisorClient,
    start_supervisor,
)


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def show(name, seconds):
    us = [s * 1e6 for s in seconds]
    print(f"{name:<40} n={len(us):<5} median {statistics.median(us):9.1f} us   p90 {pct(us, 0.9):9.1f} us   "
          f"p99 {pct(us, 0.99):9.1f} us   max {max(us):9.1f} us")
    return statistics.median(us)


def bench_uncontended(lock_dir, n):
    acq, rel = [], []
    for i in range(n):
        t0 = time.perf_counter()
        lock = rnic_lock.acquire(lock_dir, "mlx5_0", {"run_id": f"bench-{i}"})
        t1 = time.perf_counter()
        lock.release()
        t2 = time.perf_counter()
        acq.append(t1 - t0)
        rel.append(t2 - t1)
    return show("lock acquire (uncontended)", acq), show("lock release", rel)


def _contender(lock_dir, turns, go, out):
    go.wait()
    waits = []
    for _ in range(turns):
        t0 = time.perf_counter()
        lock = rnic_lock.acquire(lock_dir, "mlx5_1", {"run_id": "contender"}, timeout=60)
        waits.append(time.perf_counter() - t0)
        lock.release()
    out.put(waits)


def bench_contended(lock_dir, workers, turns):
    ctx = multiprocessing.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_contender, args=(lock_dir, turns, go, out)) for _ in range(workers)]
    for p in procs:
        p.start()
    t0 = time.perf_counter()
    go.set()
    waits = [w for _ in procs for w in out.get(timeout=120)]
    elapsed = time.perf_counter() - t0
    for p in procs:
        p.join()
    med = show(f"lock acquire ({workers} contenders)", waits)
    print(f"{'  hand-overs per second':<40} {len(waits) / elapsed:9.0f}")
    return med


def make_root(base):
    kernel = base / "proc" / "sys" / "kernel"
    (kernel / "random").mkdir(parents=True)
    (kernel / "hostname").write_text("bench\n")
    (kernel / "random" / "boot_id").write_text("0f0e0d0c-0b0a-4998-8776-655443322110\n")
    (kernel / "osrelease").write_text("6.1.0\n")
    return str(base)


def bench_supervisor(root, n):
    ready_times, stop_times = [], []
    lock_dir = os.path.join(root, "run", "orbite", "locks")
    for i in range(n):
        run_dir = os.path.join(root, "run", "orbite", "supervisors", f"bench-{i}")
        t0 = time.perf_counter()
        start_supervisor(run_dir, f"bench-{i}", ["mlx5_0", "mlx5_1"], lock_dir, root=root, lease=60, lock_timeout=5)
        t1 = time.perf_counter()
        SupervisorClient(run_dir).stop()
        t2 = time.perf_counter()
        ready_times.append(t1 - t0)
        stop_times.append(t2 - t1)
    show("supervisor start-to-ready", ready_times)
    show("supervisor stop (locks released)", stop_times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args()
    n_lock, n_sup, turns = (300, 5, 50) if args.quick else (3000, 20, 300)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        root = make_root(base / "root")
        lock_dir = rnic_lock.ensure_private_dir(os.path.join(root, "run", "orbite", "locks"), "lock_dir")
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, lock dir on {tmp}")
        acq, _ = bench_uncontended(lock_dir, n_lock)
        contended = bench_contended(lock_dir, 8, turns)
        print(f"{'  contended / uncontended median':<40} {contended / acq:9.1f}x")
        bench_supervisor(root, n_sup)


if __name__ == "__main__":
    main()

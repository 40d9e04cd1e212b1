"""Measure RNIC lock and supervisor latencies (prints figures; asserts nothing).

- acquire / release of one uncontended lock (flock + owner record rewrite);
- hand-over time under contention (8 processes taking turns on one lock);
- supervisor start-to-ready (launch, both locks, identity recheck, lease record, socket) and stop;
- launch of a child with one hash-pinned LD_PRELOAD library (copy + hash + keeper + exec), then reap.

Run: .venv/bin/python bench/bench_locks.py [--quick]
Side by side with another tree of the collection (a copy of HEAD, say), in one run, alternating
rounds so both see the same machine load:
    git archive HEAD | tar -x -C /tmp/base && .venv/bin/python bench/bench_locks.py --compare /tmp/base
"""

import argparse
import hashlib
import inspect
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _tree_from_argv():
    """--tree DIR: measure the collection in DIR (imports must come from there, so look before importing)."""
    if "--tree" in sys.argv:
        return Path(sys.argv[sys.argv.index("--tree") + 1]).resolve()
    return REPO


TREE = _tree_from_argv()
_LINK = TREE / ".collections" / "ansible_collections" / "orbite" / "qualification"
if not _LINK.exists():
    _LINK.parent.mkdir(parents=True, exist_ok=True)
    os.symlink("../../..", _LINK)
sys.path.insert(0, str(TREE / ".collections"))

from ansible_collections.orbite.qualification.plugins.module_utils._node import daemon  # noqa: E402
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
    return acq, rel


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
    return waits, len(waits) / elapsed


def make_root(base):
    kernel = base / "proc" / "sys" / "kernel"
    (kernel / "random").mkdir(parents=True)
    (kernel / "hostname").write_text("bench\n")
    (kernel / "random" / "boot_id").write_text("0f0e0d0c-0b0a-4998-8776-655443322110\n")
    (kernel / "osrelease").write_text("6.1.0\n")
    return str(base)


def _preload_arg(lib):
    """The ld_preload entry this tree's supervisor takes: {path, sha256} (pinned) or a bare path (older)."""
    if "sha256" in inspect.getsource(daemon.validate_launch_request):
        with open(lib, "rb") as handle:
            return {"path": lib, "sha256": hashlib.sha256(handle.read()).hexdigest()}
    return lib


def bench_supervisor(root, n):
    ready_times, stop_times, launch_times = [], [], []
    lock_dir = os.path.join(root, "run", "orbite", "locks")
    lib = os.path.realpath("/lib/x86_64-linux-gnu/libm.so.6")
    true = "/bin/true" if os.path.exists("/bin/true") else "/usr/bin/true"
    for i in range(n):
        run_dir = os.path.join(root, "run", "orbite", "supervisors", f"bench-{i}")
        t0 = time.perf_counter()
        start_supervisor(run_dir, f"bench-{i}", ["mlx5_0", "mlx5_1"], lock_dir, root=root, lease=60, lock_timeout=5)
        t1 = time.perf_counter()
        client = SupervisorClient(run_dir)
        if os.path.isfile(lib):
            t_launch = time.perf_counter()
            child = client.launch([true], env={"PATH": "/usr/bin:/bin"}, ld_preload=[_preload_arg(lib)])
            client.wait(child["child_id"], timeout=30)
            launch_times.append(time.perf_counter() - t_launch)
        t2 = time.perf_counter()
        client.stop()
        t3 = time.perf_counter()
        ready_times.append(t1 - t0)
        stop_times.append(t3 - t2)
    return ready_times, stop_times, launch_times


def measure(quick):
    n_lock, n_sup, turns = (300, 5, 50) if quick else (3000, 20, 300)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        root = make_root(base / "root")
        lock_dir = rnic_lock.ensure_private_dir(os.path.join(root, "run", "orbite", "locks"), "lock_dir")
        results["lock acquire (uncontended)"], results["lock release"] = bench_uncontended(lock_dir, n_lock)
        results["lock acquire (8 contenders)"], results["hand-overs per second"] = bench_contended(lock_dir, 8, turns)
        (results["supervisor start-to-ready"], results["supervisor stop (locks released)"],
         results["launch + reap, one pinned preload"]) = bench_supervisor(root, n_sup)
    return results


def compare(other, rounds, quick):
    """Alternate rounds of this tree and ``other`` (each in a process of its own); print medians side by side."""
    trees = {"before": Path(other).resolve(), "after": REPO}
    samples = {"before": {}, "after": {}}
    for index in range(rounds):
        order = ("before", "after") if index % 2 == 0 else ("after", "before")
        for label in order:
            command = [sys.executable, __file__, "--tree", str(trees[label]), "--json"] + (["--quick"] if quick else [])
            run = subprocess.run(command, capture_output=True, text=True, check=True)
            for name, found in json.loads(run.stdout.strip().splitlines()[-1]).items():
                samples[label].setdefault(name, []).extend(found if isinstance(found, list) else [found])
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {rounds} alternating rounds per tree; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"before = {trees['before']}\nafter  = {trees['after']}\n")
    print(f"{'measure (median)':<40} {'before':>12} {'after':>12} {'change':>8}")
    for name in samples["after"]:
        before, after = samples["before"].get(name), samples["after"][name]
        if not before or not after:
            print(f"{name:<40} {'-':>12} {statistics.median(after) * 1e6:>10.1f}us")
            continue
        if name == "hand-overs per second":
            b, a = statistics.median(before), statistics.median(after)
            print(f"{name:<40} {b:>12.0f} {a:>12.0f} {100 * (a - b) / b:>+7.1f}%")
            continue
        b, a = statistics.median(before) * 1e6, statistics.median(after) * 1e6
        print(f"{name:<40} {b:>10.1f}us {a:>10.1f}us {100 * (a - b) / b:>+7.1f}%   "
              f"(p90 {pct(before, 0.9) * 1e6:.0f} / {pct(after, 0.9) * 1e6:.0f} us)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--tree", help="measure the collection in this directory instead of this checkout")
    parser.add_argument("--json", action="store_true", help="print the samples as one JSON line")
    parser.add_argument("--compare", metavar="DIR", help="another tree to measure side by side (alternating)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per tree with --compare")
    args = parser.parse_args()
    if args.compare:
        compare(args.compare, args.rounds, args.quick)
        return
    results = measure(args.quick)
    if args.json:
        print(json.dumps(results))
        return
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, tree {TREE}")
    acq = show("lock acquire (uncontended)", results["lock acquire (uncontended)"])
    show("lock release", results["lock release"])
    contended = show("lock acquire (8 contenders)", results["lock acquire (8 contenders)"])
    print(f"{'  hand-overs per second':<40} {results['hand-overs per second']:9.0f}")
    print(f"{'  contended / uncontended median':<40} {contended / acq:9.1f}x")
    show("supervisor start-to-ready", results["supervisor start-to-ready"])
    show("supervisor stop (locks released)", results["supervisor stop (locks released)"])
    if results["launch + reap, one pinned preload"]:
        show("launch + reap, one pinned preload", results["launch + reap, one pinned preload"])


if __name__ == "__main__":
    main()

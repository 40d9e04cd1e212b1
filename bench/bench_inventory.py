"""Benchmark: inventory of a large generated host against simply reading every file of it once.

Host: 16 mlx5-like devices x 2 ports x 256 used GID slots (fake_sysfs.bench_host_spec). Prints the
median of several runs of each, measured side by side in one process, and their ratio; also the
ipaddress fallback (nodes without netaddr) and a before/after comparison of two such inventories.

    .venv/bin/python bench/bench_inventory.py [--devices 16] [--ports 2] [--gids 256] [--runs 5]
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, ".collections"))

from ansible_collections.orbite.qualification.plugins.module_utils._sim import fake_sysfs  # noqa: E402
from ansible_collections.orbite.qualification.plugins.module_utils._inventory import sysfs as sysfs_inventory  # noqa: E402
from ansible_collections.orbite.qualification.plugins.module_utils._inventory.compare import (  # noqa: E402
    diff_inventories,
)


def read_every_file(root):
    """The baseline: open and read each regular file under root once (links not followed)."""
    count = 0
    for base, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(base, name)
            if os.path.islink(path):
                continue
            with open(path, "rb") as handle:
                handle.read()
            count += 1
    return count


def timed(func):
    start = time.perf_counter()
    result = func()
    return time.perf_counter() - start, result


def cold_inventory(root, backend):
    """read_inventory as a fresh module process runs it (empty GID classification cache)."""
    saved = sysfs_inventory.IP_BACKEND
    sysfs_inventory._classify.cache_clear()
    sysfs_inventory.IP_BACKEND = backend
    try:
        return sysfs_inventory.read_inventory(root)
    finally:
        sysfs_inventory.IP_BACKEND = saved


def median_time(func, runs):
    results = [timed(func) for _ in range(runs)]
    return statistics.median(t for t, _ in results), results[-1][1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=16)
    parser.add_argument("--ports", type=int, default=2)
    parser.add_argument("--gids", type=int, default=256)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="orbite-bench-inventory-")
    try:
        root = os.path.join(work, "host")
        start = time.perf_counter()
        written = fake_sysfs.write_host(root, fake_sysfs.bench_host_spec(args.devices, args.ports, args.gids))
        write_s = time.perf_counter() - start
        print(
            f"host: {args.devices} devices x {args.ports} ports x {args.gids} GIDs, "
            f"{written['files']} files + {written['links']} links, written in {write_s:.2f} s"
        )

        read_every_file(root)  # warm the page cache for every measurement
        # Interleave the three measurements so they all see the same machine load.
        times = {"baseline": [], "netaddr": [], "ipaddress": []}
        files, inventory, fallback = 0, None, None
        for _ in range(args.runs):
            t, files = timed(lambda: read_every_file(root))
            times["baseline"].append(t)
            t, inventory = timed(lambda: cold_inventory(root, sysfs_inventory.IP_BACKEND))
            times["netaddr"].append(t)
            t, fallback = timed(lambda: cold_inventory(root, "ipaddress"))
            times["ipaddress"].append(t)
        base_s, inv_s, fb_s = (statistics.median(times[k]) for k in ("baseline", "netaddr", "ipaddress"))
        gids = sum(len(p["gids"]) for d in inventory["devices"].values() for p in d["ports"].values())
        same = "same inventory" if fallback == inventory else "DIFFERENT inventory"
        print(f"medians of {args.runs} interleaved runs:")
        print(f"  read every file once ({files} files):    {base_s * 1000:8.1f} ms")
        print(
            f"  read_inventory ({sysfs_inventory.IP_BACKEND}, {gids} GIDs listed): {inv_s * 1000:8.1f} ms"
            f"  ratio {inv_s / base_s:.2f}x"
        )
        print(f"  read_inventory (ipaddress fallback):     {fb_s * 1000:8.1f} ms  ratio {fb_s / base_s:.2f}x, {same}")

        diff_s, diff = median_time(lambda: diff_inventories(inventory, fallback), args.runs)
        print(
            f"diff_inventories of two such inventories: {diff_s * 1000:.1f} ms (median of {args.runs}),"
            f" {len(diff)} differences"
        )
        if inventory["errors"]:
            print(f"unexpected errors in the inventory: {inventory['errors'][:3]}")
            return 1
    finally:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())

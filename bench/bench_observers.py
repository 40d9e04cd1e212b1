"""Overhead of the native observers on the loopback verbs provider's data path.

Builds observers/ (plain) into a temporary directory, writes a fake host with
fake_sysfs (GIDs on 127.0.3.x) and times the driver's `threads` scenario (three
posting threads, one poller, 12,000 payload WRs over loopback TCP) with no
observer, with accounting, and with cq_fault recording only, side by side in
one run.  Prints figures; asserts nothing.  The provider moves small WRs in
tens of microseconds, so the ratio differs from what a real RNIC would show.
Run it in a network namespace:
`unshare -n bash -c 'ip link set lo up && .venv/bin/python bench/bench_observers.py'`.
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.orbite.qualification.plugins.module_utils._sim import fake_sysfs  # noqa: E402

RUNS = 7


def _write_host(root):
    """The fake host the driver opens: mlx5_0 and mlx5_1 with IPv4 GIDs 127.0.3.10 and .11."""
    spec = fake_sysfs.sim_host_spec(0, "bench-host")
    for k, dev in enumerate(spec["devices"]):
        gids = dev["ports"][0]["gids"]
        gids["2"], gids["3"] = fake_sysfs.roce_gid_pair(f"127.0.3.{10 + k}", gids["2"]["ndev"])
    fake_sysfs.write_host(str(root), spec)


def _time_once(driver, env):
    start = time.perf_counter()
    subprocess.run([driver, "threads"], env=env, check=True, capture_output=True, timeout=120)
    return time.perf_counter() - start


def main():
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "obs"
        subprocess.run(["make", "-s", "-C", str(REPO / "observers"), f"OUT={out}", "tests"], check=True)
        driver = str(out / "tests" / "obs_driver_direct")
        _write_host(Path(tmp) / "host")
        base = dict(
            os.environ,
            LD_LIBRARY_PATH=str(out / "provider"),
            ORBITE_PROVIDER_ROOT=f"{tmp}/host",
            ORBITE_OBSERVER_LOG=f"{tmp}/log",
        )
        variants = {
            "none": base,
            "accounting": dict(base, LD_PRELOAD=str(out / "liborbite_accounting.so")),
            "cq_fault (unarmed)": dict(base, LD_PRELOAD=str(out / "liborbite_cq_fault.so")),
        }
        results = {name: [] for name in variants}
        for _ in range(RUNS):  # interleaved, so drift hits every variant alike
            for name, env in variants.items():
                results[name].append(_time_once(driver, env))
        best = {name: min(times) for name, times in results.items()}
        print(f"threads scenario, 12000 payload WRs, best of {RUNS}:")
        for name, seconds in best.items():
            print(f"  {name:20s} {seconds * 1000:8.1f} ms  x{seconds / best['none']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Overhead of the native observers on the fake verbs device's data path.

Builds observers/ (plain) into a temporary directory and times the driver's
`threads` scenario (three posting threads, one poller, 12,000 payload WRs)
with no observer, with accounting, and with cq_fault recording only, side by
side in one run.  Prints figures; asserts nothing.  The fake device is pure
software, so the ratio overstates what a real RNIC would show.
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUNS = 7


def _time_once(driver, env):
    start = time.perf_counter()
    subprocess.run([driver, "threads"], env=env, check=True, capture_output=True, timeout=120)
    return time.perf_counter() - start


def main():
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "obs"
        subprocess.run(["make", "-s", "-C", str(REPO / "observers"), f"OUT={out}", "tests"], check=True)
        driver = str(out / "tests" / "obs_driver_direct")
        base = dict(os.environ, LD_LIBRARY_PATH=str(out / "tests" / "lib"), ORBITE_OBSERVER_LOG=f"{tmp}/log")
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

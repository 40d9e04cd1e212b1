"""Native reference runner vs simulated runner on the loopback verbs provider, side by side.

For the frozen rail-accounting profile (16 x 4,194,305 B, block 1 MiB, 64 WRs a round), READ/polling
and WRITE/events, interleaved (sim, native, sim, native, ...) so that load from other jobs weighs on
both alike; prints per runner the median wall time of one round (prepare + transfer + check +
drain, the requester's ``duration_s``), its transfer time and payload rate, and the whole
two-process run (start to both exits). The native runner is the release build of runners/reference
(tests/helpers/reference_runner.py builds it, offline and locked); the accounting observer is
preloaded into both requesters, as in the gate.

The runners bind loopback addresses: run it in a network namespace of its own
(``unshare -n bash -c 'ip link set lo up && .venv/bin/python bench/bench_native_runner.py'``).

Usage: .venv/bin/python bench/bench_native_runner.py [--repeat N]
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "fixtures" / "sim"))
sys.path.insert(0, str(REPO / "tests"))
import sim_harness as H  # noqa: E402 - also puts the collection on sys.path
from helpers.reference_runner import reference_runner  # noqa: E402


def one_run(operation, events, runner_argv):
    prof = H.profile("installed-rail-accounting", operation, events)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = H.run_pair(tmp, prof, runner_argv=runner_argv)
        wall = time.perf_counter() - start
    if result["rc"] != {"source": 0, "requester": 0}:
        raise SystemExit(f"run failed: {result['rc']} {result['stderr']}")
    rounds = result["requester"]["rounds"]
    return {"round_s": [r["duration_s"] for r in rounds], "transfer_s": [r["timing"]["transfer_s"] for r in rounds],
            "rate": [r["counters"]["public"]["bytes"] / r["timing"]["transfer_s"] for r in rounds], "wall_s": [wall]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="interleaved runs of each runner per operation")
    args = parser.parse_args()
    runners = {"sim": None, "native": [reference_runner()["path"]]}
    results = {(k, op): {} for k in runners for op in ("read", "write")}
    for _attempt in range(args.repeat):
        for operation, events in (("read", False), ("write", True)):
            for kind, argv in runners.items():
                for key, values in one_run(operation, events, argv).items():
                    results[(kind, operation)].setdefault(key, []).extend(values)
    print(f"{'runner':7s} {'operation':14s} {'round (s)':>10s} {'transfer (s)':>13s} {'payload MB/s':>13s} "
          f"{'whole run (s)':>14s}")
    for operation, mode in (("read", "polling"), ("write", "events")):
        for kind in runners:
            r = results[(kind, operation)]
            print(f"{kind:7s} {operation + '/' + mode:14s} {statistics.median(r['round_s']):10.3f} "
                  f"{statistics.median(r['transfer_s']):13.3f} {statistics.median(r['rate']) / 1e6:13.1f} "
                  f"{statistics.median(r['wall_s']):14.2f}")


if __name__ == "__main__":
    main()

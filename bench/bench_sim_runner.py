"""Simulated runner throughput against raw loopback TCP, side by side in one run.

Prints, for the frozen rail-accounting profile (16 x 4,194,305 B, block 1 MiB, 64 WRs a round):
- raw loopback: one process sendall()s 1 MiB memoryview chunks, another recv_into()s them into a
  bytearray (the best a Python process pair can do on this box);
- simulated payload throughput: payload bytes / transfer time of each round (posting the first WR
  to reaping the last CQE; the loopback verbs provider moves the bytes), READ/polling and
  WRITE/events, and the ratio to raw (goal >= 0.9x);
- the wall time of one whole rail-accounting round (prepare + transfer + check + drain).
The provider's figure is taken without an observer preloaded (``--observer`` adds the accounting
observer, whose own work, its digests of the landed bytes included, then counts too).

The runners bind loopback addresses: run it in a network namespace of its own when a lab runs beside it
(``unshare -n bash -c 'ip link set lo up && .venv/bin/python bench/bench_sim_runner.py'``).

Usage: .venv/bin/python bench/bench_sim_runner.py [--raw-mib MiB]
"""

import argparse
import multiprocessing
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "sim"))
import sim_harness as H

CHUNK = 1 << 20


def _receiver(port, total):
    sock = socket.create_connection(("127.0.0.1", port))
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    got = 0
    while got < total:
        n = sock.recv_into(view, min(CHUNK, total - got))
        if n == 0:
            break
        got += n
    sock.sendall(b"k")
    sock.close()


def raw_loopback(total):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    proc = multiprocessing.Process(target=_receiver, args=(listener.getsockname()[1], total))
    proc.start()
    conn = listener.accept()[0]
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        conn.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
    data = memoryview(bytearray(CHUNK))
    start = time.perf_counter()
    sent = 0
    while sent < total:
        conn.sendall(data[: min(CHUNK, total - sent)])
        sent += CHUNK
    conn.recv(1)  # the receiver has everything
    elapsed = time.perf_counter() - start
    conn.close()
    listener.close()
    proc.join()
    return total / elapsed


def sim_run(operation, events, observers=()):
    prof = H.profile("installed-rail-accounting", operation, events)
    with tempfile.TemporaryDirectory() as tmp:
        result = H.run_pair(tmp, prof, observers=observers)
    if result["rc"] != {"source": 0, "requester": 0}:
        raise SystemExit(f"simulated run failed: {result['rc']} {result['stderr']}")
    rounds = result["requester"]["rounds"]
    rates = [r["counters"]["public"]["bytes"] / r["timing"]["transfer_s"] for r in rounds]
    return rates, [r["duration_s"] for r in rounds], [r["timing"] for r in rounds]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raw-mib", type=int, default=192, help="bytes moved by the raw measurement (MiB)")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved raw/READ/WRITE measurements")
    parser.add_argument("--observer", action="store_true",
                        help="preload the accounting observer into the requester (its own cost included)")
    args = parser.parse_args()
    observers = ("accounting",) if args.observer else ()
    # Interleaved, so that load from other jobs on the box weighs on both sides of each ratio alike.
    raws, ratios = [], {"read": [], "write": []}
    results = {"read": ([], [], []), "write": ([], [], [])}
    for _attempt in range(args.repeat):
        for operation, events in (("read", False), ("write", True)):
            raw = raw_loopback(args.raw_mib << 20)
            rates, durations, timings = sim_run(operation, events, observers)
            raws.append(raw)
            ratios[operation].append(statistics.median(rates) / raw)
            for into, values in zip(results[operation], (rates, durations, timings)):
                into.extend(values)
    print(f"raw loopback TCP (python sendall -> recv_into, 1 MiB chunks): {statistics.median(raws) / 1e6:8.1f} MB/s "
          f"(median of {[round(r / 1e6) for r in raws]})")
    for operation, events in (("read", False), ("write", True)):
        rates, durations, timings = results[operation]
        mode = "events" if events else "polling"
        print(f"simulated {operation:5s}/{mode:7s} payload: {statistics.median(rates) / 1e6:8.1f} MB/s  "
              f"ratio to raw {statistics.median(ratios[operation]):4.2f}x (goal >= 0.9x; median of the paired "
              f"ratios {[round(r, 2) for r in ratios[operation]]})")
        print(f"  one rail-accounting round (16 x 4,194,305 B, 64 WRs): median {statistics.median(durations):.3f} s; "
              f"round 1 split {timings[0]}")


if __name__ == "__main__":
    main()

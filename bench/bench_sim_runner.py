"""Simulated runner throughput against raw loopback TCP, side by side in one run.

Prints, for the frozen rail-accounting profile (16 x 4,194,305 B, block 1 MiB, 64 WRs a round):
- raw loopback: one process sendall()s 1 MiB memoryview chunks, another recv_into()s them into a
  bytearray (the best a Python process pair can do on this box);
- simulated payload throughput: payload bytes / transfer time of each round (posting the first WR
  to reaping the last CQE), READ/polling and WRITE/events, and the ratio to raw (goal >= 0.5x);
- the wall time of one whole rail-accounting round (prepare + transfer + check + drain).

Usage: .venv/bin/python bench/bench_sim_runner.py [--rounds-bytes MiB]
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


def sim_run(operation, events):
    prof = H.profile("installed-rail-accounting", operation, events)
    with tempfile.TemporaryDirectory() as tmp:
        result = H.run_pair(tmp, prof)
    if result["rc"] != {"source": 0, "requester": 0}:
        raise SystemExit(f"simulated run failed: {result['rc']} {result['stderr']}")
    rounds = result["requester"]["rounds"]
    rates = [r["counters"]["public"]["bytes"] / r["timing"]["transfer_s"] for r in rounds]
    return rates, [r["duration_s"] for r in rounds], [r["timing"] for r in rounds]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raw-mib", type=int, default=192, help="bytes moved by the raw measurement (MiB)")
    args = parser.parse_args()
    raws = [raw_loopback(args.raw_mib << 20) for _attempt in range(3)]
    raw = statistics.median(raws)
    print(f"raw loopback TCP (python sendall -> recv_into, 1 MiB chunks): {raw / 1e6:8.1f} MB/s "
          f"(median of {[round(r / 1e6) for r in raws]})")
    for operation, events in (("read", False), ("write", True)):
        rates, durations, timings = sim_run(operation, events)
        rate = statistics.median(rates)
        mode = "events" if events else "polling"
        print(f"simulated {operation:5s}/{mode:7s} payload: {rate / 1e6:8.1f} MB/s  ratio to raw {rate / raw:4.2f}x "
              f"(goal >= 0.5x)  rounds {[round(r / 1e6) for r in rates]} MB/s")
        print(f"  one rail-accounting round (16 x 4,194,305 B, 64 WRs): median {statistics.median(durations):.3f} s; "
              f"round 1 split {timings[0]}")


if __name__ == "__main__":
    main()

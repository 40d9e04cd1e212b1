"""Payload throughput of the loopback verbs provider against raw loopback TCP and raw process_vm_readv, side by side.

    .venv/bin/python bench/bench_provider.py [--total BYTES] [--runs N] [--wait events|sleep|spin]

Builds observers/ (provider + test drivers) into a temporary directory, writes two fake hosts with
fake_sysfs (GIDs on 127.0.1.x and 127.0.2.x), and measures, interleaved so that load drift on a
shared machine hits every variant alike:

- raw TCP: one connection 127.0.2.10 -> 127.0.1.10, 1 MiB send()/recv() calls cycling through a
  32 MiB buffer on both sides, the receiver's one-byte answer after the last byte ends the clock;
- raw process_vm_readv: one process copies out of another's 32 MiB buffer in 1 MiB calls (the floor
  of the provider's single-copy path);
- the provider, on its single-copy path (process_vm_readv/writev, what it chooses between two
  processes of one user) and on its TCP path (``ORBITE_PROVIDER_PAYLOAD=tcp``): an RC QP pair
  between the two fake hosts (two processes), 1 MiB and 4 MiB RDMA READs and WRITEs, 8 WRs in
  flight, cycling through 32 MiB of registered memory, each WR's completion only after its bytes
  landed (WRITE: acknowledged by the peer), the clock from the first post to the last completion.
  The program waits for completions with the completion channel by default (``--wait sleep``:
  polling with a 50 us sleep; ``spin``: busy polling, which takes a CPU away from the data movers
  on a small machine).

Prints the median MB/s of each variant and its ratios to raw TCP and raw process_vm_readv (goals at
1 MiB: the single-copy path >= 0.8x process_vm_readv and never below TCP; the TCP path >= 0.9x TCP).
Asserts nothing. Uses loopback addresses and ephemeral ports only: safe outside a network namespace.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.orbite.qualification.plugins.module_utils._sim import fake_sysfs  # noqa: E402

SPAN = 32 << 20


def write_host(root, index, hostname):
    """A sim-lab host whose IPv4 GIDs are loopback addresses 127.0.<index+1>.<10+k>."""
    spec = fake_sysfs.sim_host_spec(index, hostname)
    for k, dev in enumerate(spec["devices"]):
        gids = dev["ports"][0]["gids"]
        gids["2"], gids["3"] = fake_sysfs.roce_gid_pair(f"127.0.{index + 1}.{10 + k}", gids["2"]["ndev"])
    fake_sysfs.write_host(str(root), spec)


def run_tcp(build, total):
    out = subprocess.run(
        [str(build / "tests" / "tcp_bench"), "127.0.2.10", "127.0.1.10", str(1 << 20), str(total), str(SPAN)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(out.stdout)["mb_per_s"]


def run_pvm(build, total):
    out = subprocess.run(
        [str(build / "tests" / "pvm_bench"), str(1 << 20), str(total), str(SPAN)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(out.stdout)["mb_per_s"]


def run_provider(build, hosts, tmp, op, msg, total, wait, payload):
    driver = str(build / "tests" / "prov_driver")
    rendezvous = str(Path(tmp) / f"rv-{op}-{msg}-{payload}")
    base = dict(os.environ, LD_LIBRARY_PATH=str(build), ORBITE_PROVIDER_PAYLOAD=payload)
    base.pop("LD_PRELOAD", None)
    server = subprocess.Popen(
        [driver, "server", rendezvous, "mlx5_0"],
        env=dict(base, ORBITE_PROVIDER_ROOT=str(hosts[0])),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        client = subprocess.run(
            [driver, "client", rendezvous, "mlx5_0", "bench", op, str(msg), str(total), "8", wait, str(SPAN)],
            env=dict(base, ORBITE_PROVIDER_ROOT=str(hosts[1])),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        server.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    if client.returncode != 0 or server.returncode != 0:
        raise SystemExit(f"bench_provider: {op} {msg} failed: {client.stderr.strip()} {server.stderr.read().strip()}")
    (line,) = [json.loads(x) for x in client.stdout.splitlines() if '"bench"' in x]
    return line["mb_per_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total", type=int, default=1 << 30, help="bytes moved per measurement (1 GiB)")
    parser.add_argument("--runs", type=int, default=5, help="interleaved rounds; medians are printed (5)")
    parser.add_argument("--wait", choices=("events", "sleep", "spin"), default="events")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-provider-") as tmp:
        out = Path(tmp) / "build"
        subprocess.run(
            ["make", "-s", "-C", str(REPO / "observers"), f"OUT={out}", "provider-tests"], check=True, timeout=600
        )
        build = out / "provider"
        hosts = [Path(tmp) / "host-a", Path(tmp) / "host-b"]
        write_host(hosts[0], 0, "bench-a")
        write_host(hosts[1], 1, "bench-b")
        variants = [("tcp", None, 1 << 20, None), ("process_vm_readv", None, 1 << 20, None)] + [
            (f"{path} RDMA_{op} {msg >> 20} MiB", op, msg, payload)
            for payload, path in (("auto", "single-copy"), ("tcp", "TCP path"))
            for op in ("READ", "WRITE")
            for msg in (1 << 20, 4 << 20)
        ]
        results = {name: [] for name, *_ in variants}
        for _ in range(args.runs):
            for name, op, msg, payload in variants:
                if name == "tcp":
                    results[name].append(run_tcp(build, args.total))
                elif name == "process_vm_readv":
                    results[name].append(run_pvm(build, args.total))
                else:
                    results[name].append(run_provider(build, hosts, tmp, op, msg, args.total, args.wait, payload))
        tcp = statistics.median(results["tcp"])
        pvm = statistics.median(results["process_vm_readv"])
        print(
            f"payload throughput, {args.total >> 20} MiB per measurement, median of {args.runs}, "
            f"8 WRs in flight, completions by {args.wait}:"
        )
        print(f"  {'raw loopback TCP (1 MiB calls)':42s} {tcp:9.1f} MB/s")
        print(f"  {'raw process_vm_readv (1 MiB calls)':42s} {pvm:9.1f} MB/s  x{pvm / tcp:.2f} of TCP")
        for name, op, *_ in variants:
            if op is None:
                continue
            value = statistics.median(results[name])
            print(
                f"  {'provider ' + name:42s} {value:9.1f} MB/s  x{value / tcp:.2f} of TCP"
                f"  x{value / pvm:.2f} of process_vm_readv"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""rdma-core's own clients between two fake hosts on the loopback verbs provider (issue 30).

The server runs on fake host A (GIDs 127.0.1.x), the client on fake host B (127.0.2.x); each picks
the provider with LD_LIBRARY_PATH and ORBITE_PROVIDER_ROOT.  Their out-of-band TCP exchange uses a
free ephemeral loopback port, so nothing collides with a simulated lab.  perftest runs in its default
posting mode (the extended QP's wr_* family), ibv_rc_pingpong checks the received bytes (-c),
ibv_srq_pingpong serves several QPs from one shared receive queue.
librdmacm's programs have no RDMA CM here (no /dev/infiniband/rdma_cm): they must end with their own
error, never a signal.
"""

import os
import random
import re
import shutil
import socket
import subprocess
import time

import pytest
from helpers.native import (
    SANITIZER_MARKS,
    build_provider,
    libasan,
    provider_env,
    verbs_headers_missing,
    write_provider_host,
)

_MISSING = verbs_headers_missing()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"the provider cannot be built: {_MISSING}")

ITERS = 5
TIMEOUT = 60
PERFTEST = "perftest (apt install perftest)"
VERBS_UTILS = "ibverbs-utils"
RDMACM_UTILS = "rdmacm-utils"


class Provider:
    def __init__(self, path, asan_lib):
        self.path = path
        self.asan_lib = asan_lib

    def env(self, root):
        return provider_env(self.path, root, self.asan_lib)


@pytest.fixture(scope="module", params=["plain", "asan"])
def provider(request, tmp_path_factory):
    asan_lib = None
    if request.param == "asan":
        asan_lib = libasan()
        if asan_lib is None:
            pytest.skip("libasan is not installed (gcc's AddressSanitizer runtime)")
    out = tmp_path_factory.mktemp(f"prov-clients-{request.param}")
    return Provider(build_provider(out, san=asan_lib is not None), asan_lib)


def _no_sanitizer_report(out):
    for mark in SANITIZER_MARKS:
        assert mark not in out, out


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    base = tmp_path_factory.mktemp("hosts")
    return (write_provider_host(base / "sim-a", 0, "sim-a"), write_provider_host(base / "sim-b", 1, "sim-b"))


def _need(tool, package):
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed ({package}; scripts/setup-system.sh installs it)")


def _free_port():
    """A free loopback port below the kernel's ephemeral range: a port the kernel handed out could be handed out
    again (a provider connection, another test) before the tool binds it ("Couldn't listen to port")."""
    low = 20000
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = min(low, int(f.read().split()[0]) - 1000)
    except (OSError, ValueError, IndexError):
        pass
    for port in random.sample(range(low - 8000, low), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free loopback port in [{low - 8000}, {low})")


def _listening(port):
    """Whether some socket listens on TCP <port> (/proc/net/tcp[6], state 0A); probing by
    connecting would be taken for the client by a one-shot server."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def run_pair(provider, hosts, server_args, client_args, port):
    """Server on host A, then (once it listens on <port>) the client on host B; both bounded."""
    server = subprocess.Popen(
        server_args,
        env=provider.env(hosts[0]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        while not _listening(port):
            assert server.poll() is None, server.communicate()[0]
            assert time.monotonic() < deadline, f"{server_args[0]} never listened on port {port}"
            time.sleep(0.05)
        client = subprocess.run(
            client_args,
            env=provider.env(hosts[1]),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        sout = server.communicate(timeout=TIMEOUT)[0]
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    _no_sanitizer_report(client.stdout)
    _no_sanitizer_report(sout)
    assert client.returncode == 0, f"client {client_args}: rc {client.returncode}\n{client.stdout}"
    assert server.returncode == 0, f"server {server_args}: rc {server.returncode}\n{sout}"
    return sout, client.stdout


# ---------------------------------------------------------------- pingpong --


def test_rc_pingpong_checks_every_byte(provider, hosts):
    _need("ibv_rc_pingpong", VERBS_UTILS)
    port = _free_port()
    args = ["ibv_rc_pingpong", "-d", "mlx5_0", "-g", "3", "-n", str(ITERS), "-c", "-p", str(port)]
    sout, cout = run_pair(provider, hosts, args, [*args, "127.0.0.1"], port)
    for out, local, remote in ((sout, "127.0.1.10", "127.0.2.10"), (cout, "127.0.2.10", "127.0.1.10")):
        assert "local address:  LID 0x0000, QPN" in out and f"GID ::ffff:{local}" in out, out
        assert "remote address: LID 0x0000, QPN" in out and f"GID ::ffff:{remote}" in out, out
        assert f"{ITERS} iters in" in out, out
        assert "Failed status" not in out and "invalid data" not in out, out  # -c prints, exits 0


def test_srq_pingpong_serves_every_qp_from_one_shared_receive_queue(provider, hosts):
    _need("ibv_srq_pingpong", VERBS_UTILS)
    port, qps = _free_port(), 4
    args = ["ibv_srq_pingpong", "-d", "mlx5_0", "-g", "3", "-n", str(ITERS), "-q", str(qps), "-p", str(port)]
    sout, cout = run_pair(provider, hosts, args, [*args, "127.0.0.1"], port)
    for out, remote in ((sout, "127.0.2.10"), (cout, "127.0.1.10")):
        assert out.count("remote address: LID 0x0000, QPN") == qps, out
        assert out.count(f"GID ::ffff:{remote}") == qps, out
        assert f"{ITERS} iters in" in out, out


# ---------------------------------------------------------------- perftest --

RESULT_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+\d", re.M)


def _result(out):
    """(bytes, iterations) of perftest's result row."""
    rows = RESULT_ROW.findall(out.split("#bytes", 1)[-1])
    assert rows, out
    return tuple(int(x) for x in rows[0])


@pytest.mark.parametrize(
    "tool, size",
    [
        ("ib_write_bw", 65536),
        ("ib_read_bw", 65536),
        ("ib_send_bw", 65536),
        ("ib_atomic_bw", 8),
        ("ib_write_lat", 2),
        ("ib_read_lat", 2),
        ("ib_send_lat", 2),
        ("ib_atomic_lat", 8),
    ],
)
def test_perftest_runs_in_its_default_posting_mode(provider, hosts, tool, size):
    _need(tool, PERFTEST)
    port = _free_port()
    args = [tool, "-d", "mlx5_0", "-x", "3", "-n", str(ITERS), "-p", str(port)]
    sout, cout = run_pair(provider, hosts, args, [*args, "127.0.0.1"], port)
    assert _result(cout) == (size, ITERS), cout
    if tool.endswith("_bw") or tool in ("ib_write_lat", "ib_send_lat"):
        assert _result(sout) == (size, ITERS), sout  # the other tools' servers only serve
    for out in (sout, cout):
        assert "GID: 00:00:00:00:00:00:00:00:00:00:255:255:127:00:01:10" in out, out
        assert "GID: 00:00:00:00:00:00:00:00:00:00:255:255:127:00:02:10" in out, out
        assert "Completion with error" not in out, out


# --------------------------------------------------------------- librdmacm --


@pytest.mark.parametrize(
    "args, package, message",
    [
        (["rping", "-s", "-a", "127.0.0.1", "-C", "3"], RDMACM_UTILS, "failed to create RDMA CM event channel"),
        (["rping", "-c", "-a", "127.0.0.1", "-C", "3"], RDMACM_UTILS, "failed to create RDMA CM event channel"),
        (["ucmatose"], RDMACM_UTILS, "failed to create RDMA CM event channel"),
        (["ucmatose", "-s", "127.0.0.1"], RDMACM_UTILS, "failed to create RDMA CM event channel"),
        (["ib_write_bw", "-R", "-d", "mlx5_0", "-n", "5"], PERFTEST, "rdma_create_event_channel failed"),
        (["ib_write_bw", "-R", "-d", "mlx5_0", "-n", "5", "127.0.0.1"], PERFTEST, "rdma_create_event_channel failed"),
    ],
)
def test_librdmacm_programs_end_with_their_own_error(provider, hosts, args, package, message):
    _need(args[0], package)
    if os.path.exists("/dev/infiniband/rdma_cm"):
        pytest.skip("this machine has an RDMA CM device: the programs would use it")
    port = _free_port()
    if args[0] == "ib_write_bw":
        args = [*args[:1], "-p", str(port), *args[1:]]
    done = subprocess.run(
        args,
        env=provider.env(hosts[0]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    _no_sanitizer_report(done.stdout)
    assert done.returncode > 0, f"{args}: rc {done.returncode} (a signal is < 0)\n{done.stdout}"
    assert message in done.stdout, done.stdout

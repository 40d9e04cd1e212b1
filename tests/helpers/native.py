"""What the native tests (observers, provider) need from the machine: a C toolchain, rdma-core headers, ASan."""

import os
import shutil
import subprocess

SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")
HELD_KINDS = ("ctx", "pd", "mr", "mw", "cq", "channel", "qp")


def verbs_headers_missing():
    """Why the native code cannot be built here, or None."""
    if shutil.which("gcc") is None or shutil.which("make") is None:
        return "gcc or make is not installed"
    probe = subprocess.run(
        ["gcc", "-E", "-x", "c", "-", "-o", os.devnull],
        input="#include <infiniband/verbs.h>\n#include <linux/seccomp.h>\n",
        capture_output=True,
        text=True,
        check=False,
    )
    return "infiniband/verbs.h is missing (install libibverbs-dev)" if probe.returncode else None


def libasan():
    """The path of gcc's libasan.so (to preload into a non-ASan program), or None."""
    out = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True, check=False)
    path = out.stdout.strip()
    return path if out.returncode == 0 and os.path.isabs(path) and os.path.exists(path) else None


INSTALLED_LIBIBVERBS = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1"


def build_provider(out, san=False):
    """Builds the loopback verbs provider (with ASan + UBSan if <san>) into <out>/provider; returns that directory."""
    repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    done = subprocess.run(
        ["make", "-s", "-C", os.path.join(repo, "observers"), f"OUT={out}", "provider", *(["SAN=1"] if san else [])],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return os.path.join(str(out), "provider")


def write_provider_host(root, index, hostname, address=None):
    """A sim-lab host (two mlx5-like RoCE devices) whose IPv4 GIDs (index 2/3) are 127.0.<index+1>.1x, or
    address(k) for device k."""
    from ansible_collections.orbite.qualification.plugins.module_utils._sim import fake_sysfs

    spec = fake_sysfs.sim_host_spec(index, hostname)
    for k, dev in enumerate(spec["devices"]):
        gids = dev["ports"][0]["gids"]
        ip = address(k) if address else f"127.0.{index + 1}.{10 + k}"
        gids["2"], gids["3"] = fake_sysfs.roce_gid_pair(ip, gids["2"]["ndev"])
    fake_sysfs.write_host(str(root), spec)
    return root


def provider_env(provider_dir, root, asan_lib=None):
    """The environment that makes a program use the provider on the fake host <root>; with <asan_lib>
    (a SAN=1 provider in a program built without it) the sanitizer runtime is preloaded first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBITE_") and k != "LD_PRELOAD"}
    env.update(LD_LIBRARY_PATH=str(provider_dir), ORBITE_PROVIDER_ROOT=str(root))
    if asan_lib:
        # rdma-core's clients do not free everything at exit: leaks are theirs, not the provider's.
        env.update(LD_PRELOAD=asan_lib, ASAN_OPTIONS="detect_leaks=0:exitcode=23")
        env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    return env


def dynamic_symbols(lib):
    """The defined dynamic symbols of a shared library as name@version strings (readelf's spelling)."""
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(lib)], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        cols = line.split()
        if len(cols) >= 8 and cols[0].endswith(":") and cols[6] != "UND" and cols[3] != "SECTION":
            found.add(cols[7].split(" ")[0])
    return found

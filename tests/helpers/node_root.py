"""Shared helpers of the supervisor tests: a fake host root, journal reading, process liveness."""

import json
import sys
import time

BOOT = "0f0e0d0c-0b0a-4998-8776-655443322110"
SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def make_root(base, hostname="sim-a", boot_id=BOOT):
    kernel = base / "proc" / "sys" / "kernel"
    (kernel / "random").mkdir(parents=True, exist_ok=True)
    (kernel / "hostname").write_text(hostname + "\n")
    (kernel / "random" / "boot_id").write_text(boot_id + "\n")
    (kernel / "osrelease").write_text("6.1.0-sim\n")
    return str(base)


def journal(path):
    with open(path) as handle:
        return [json.loads(line) for line in handle]


def events(path, ev):
    return [e for e in journal(path) if e["ev"] == ev]


def alive(pid):
    """True while pid runs (a zombie no longer holds its fds or locks: counted as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def wait_dead(pid, timeout=10.0):
    deadline = time.monotonic() + timeout
    while alive(pid):
        assert time.monotonic() < deadline, f"pid {pid} still alive"
        time.sleep(0.01)

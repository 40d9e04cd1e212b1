"""Shared helpers of the supervisor tests: a fake host root, journal reading, process liveness."""

import contextlib
import json
import os
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
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between the open and the read
        return False
    return state not in ("Z", "X")


def wait_dead(pid, timeout=10.0):
    deadline = time.monotonic() + timeout
    while alive(pid):
        assert time.monotonic() < deadline, f"pid {pid} still alive"
        time.sleep(0.01)


@contextlib.contextmanager
def supervised_host(base, run_id="run-1"):
    """A real supervisor of run_id over mlx5_0 on a fake host root at base/host: (root, run_dir);
    stopped, its children killed, on the way out."""
    from ansible_collections.orbite.qualification.plugins.module_utils._node.client import (
        SupervisorClient,
        SupervisorNotRunning,
        start_supervisor,
    )

    root = make_root(base / "host")
    run_dir = os.path.join(root, "run", "orbite", "supervisors", run_id)
    os.makedirs(os.path.dirname(run_dir), exist_ok=True)
    start_supervisor(run_dir, run_id, ["mlx5_0"], os.path.join(root, "run", "orbite", "locks"), root=root,
                     lease=120, lock_timeout=5)
    try:
        yield root, run_dir
    finally:
        try:
            SupervisorClient(run_dir).stop(force=True)
        except SupervisorNotRunning:
            pass

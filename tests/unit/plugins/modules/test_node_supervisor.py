"""The node_supervisor module, run as Ansible runs it: stop escalates on a hung supervisor, start
never reports another start's locks as its own.

On main ``state: stopped`` on a SIGSTOPped supervisor failed on the status request that never got an
answer (and a module without a timeout would have hung); nothing was ever killed.
"""

import os
import signal
import time

import pytest
from helpers.modules import run_module as run_helper
from helpers.node_root import make_root

from ansible_collections.orbite.qualification.plugins.module_utils._node import locks as rnic_lock

BOOT = "0f0e0d0c-0b0a-4998-8776-655443322110"


def run_module(tmp_path, **args):
    return run_helper("node_supervisor", tmp_path, args)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


@pytest.fixture
def root(tmp_path):
    make_root(tmp_path / "host")
    path = str(tmp_path / "host")
    yield path
    for name in os.listdir("/proc"):  # whatever a failed assertion left behind, by command line
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as handle:
                    if path.encode() in handle.read():
                        os.kill(int(name), signal.SIGKILL)
                        os.kill(int(name), signal.SIGCONT)
            except OSError:
                continue


def test_stopped_escalates_on_a_hung_supervisor(tmp_path, root):
    started = run_module(tmp_path, state="started", run_id="run-1", locks=["mlx5_0"], root=root, lease=60)
    pid = started["supervisor"]["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        stopped = run_module(tmp_path, state="stopped", run_id="run-1", root=root, force=True, stop_timeout=1)
        took = time.monotonic() - t0
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGCONT)
    assert stopped.get("failed") is not True, stopped
    assert stopped["changed"] is True and stopped["running"] is False
    assert stopped["summary"]["reason"] == "escalated"
    assert stopped["summary"]["escalation"] == ["SIGTERM", "SIGKILL"]
    assert stopped["summary"]["locks_released"] is True and took < 30
    assert not alive(pid) and rnic_lock.probe(os.path.join(root, "run", "orbite", "locks"), "mlx5_0")
    again = run_module(tmp_path, state="stopped", run_id="run-1", root=root)  # an always: section, twice
    assert again["changed"] is False and again["running"] is False


def test_started_with_other_locks_than_the_running_supervisor_fails(tmp_path, root):
    run_module(tmp_path, state="started", run_id="run-1", locks=["mlx5_0"], root=root, lease=60)
    same = run_module(tmp_path, state="started", run_id="run-1", locks=["mlx5_0"], root=root, lease=60)
    assert same["changed"] is False and same["running"] is True
    other = run_module(tmp_path, state="started", run_id="run-1", locks=["mlx5_1"], root=root, lease=60)
    assert other["failed"] is True and other["error"] == "supervisor.already_running"
    assert "holding ['mlx5_0'], not ['mlx5_1']" in other["msg"]
    run_module(tmp_path, state="stopped", run_id="run-1", root=root, force=True)

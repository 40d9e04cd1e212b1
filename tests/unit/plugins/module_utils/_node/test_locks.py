"""RNIC lock files: owner records, clean release vs. stale owner, timeouts naming the owner, bad input.

Each test breaks one rule of plugins/module_utils/_node/locks.py; the comment names the line it guards.
"""

import json
import multiprocessing
import os
import signal

import pytest
from ansible_collections.orbite.qualification.plugins.module_utils._node import locks as rnic_lock
from ansible_collections.orbite.qualification.plugins.module_utils._node.locks import (
    LockDirError,
    LockInputError,
    LockTimeout,
    acquire,
    ensure_private_dir,
    probe,
    read_owner,
)

OWNER = {"run_id": "run-1", "controller": "ctl", "hostname": "host-a", "boot_id": "b" * 8}


@pytest.fixture
def lock_dir(tmp_path):
    return ensure_private_dir(str(tmp_path / "locks"), "lock_dir")


def _hold_in_child(lock_dir, rnic, ready, owner):
    acquire(lock_dir, rnic, owner)
    ready.set()
    signal.pause()


@pytest.fixture
def holder(lock_dir):
    """A separate process holding mlx5_0 (killed, by pid, at teardown)."""
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    proc = ctx.Process(target=_hold_in_child, args=(lock_dir, "mlx5_0", ready, dict(OWNER, run_id="other-run")))
    proc.start()
    assert ready.wait(10)
    yield proc
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)


def test_acquire_writes_owner_record(lock_dir):
    lock = acquire(lock_dir, "mlx5_0", OWNER)
    record = read_owner(lock.path)
    assert record["state"] == "held" and record["run_id"] == "run-1" and record["pid"] == os.getpid()
    assert record["schema"] == "orbite.rnic-lock" and record["version"] == 1
    assert lock.previous_state == "none"
    assert oct(os.stat(lock.path).st_mode & 0o777) == oct(0o600)
    lock.release()


def test_clean_release_is_recorded_and_lock_is_free(lock_dir):
    # Guards RnicLock.release: the "released" rewrite and the LOCK_UN.
    lock = acquire(lock_dir, "mlx5_0", OWNER)
    lock.release()
    assert probe(lock_dir, "mlx5_0")
    assert read_owner(lock.path)["state"] == "released"
    again = acquire(lock_dir, "mlx5_0", dict(OWNER, run_id="run-2"))
    assert again.previous_state == "released"
    again.release()


def test_dead_owner_is_reacquired_and_reported_stale(lock_dir, holder):
    # Guards acquire's previous_state "stale": flock free but the file still says held.
    with pytest.raises(LockTimeout):
        acquire(lock_dir, "mlx5_0", OWNER, timeout=0)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    lock = acquire(lock_dir, "mlx5_0", OWNER, timeout=0)  # immediately: the kernel dropped the flock
    assert lock.previous_state == "stale"
    assert lock.previous_owner["run_id"] == "other-run" and lock.previous_owner["pid"] == holder.pid
    lock.release()


def test_timeout_names_the_current_owner(lock_dir, holder):
    # Guards the LockTimeout message built from read_owner/describe_owner.
    with pytest.raises(LockTimeout) as caught:
        acquire(lock_dir, "mlx5_0", OWNER, timeout=0.2)
    assert caught.value.owner["run_id"] == "other-run"
    assert "run other-run of controller ctl" in str(caught.value)
    assert f"pid {holder.pid}" in str(caught.value)
    assert caught.value.rnic == "mlx5_0"


def test_other_rnic_is_independent(lock_dir, holder):
    lock = acquire(lock_dir, "mlx5_1", OWNER, timeout=0)
    lock.release()


@pytest.mark.parametrize("name", ["a/b", "../mlx5_0", ".hidden", "", "x" * 65, "mlx5 0", None, 3])
def test_rnic_name_rules(lock_dir, name):
    # Guards validate_rnic_name: no path separator, no leading dot, bounded length.
    with pytest.raises(LockInputError) as caught:
        acquire(lock_dir, name, OWNER)
    assert repr(name) in str(caught.value)
    assert os.listdir(lock_dir) == []


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o701])
def test_lock_dir_with_group_or_other_access_is_refused(tmp_path, mode):
    # Guards check_private_dir's mode rule.
    path = tmp_path / "locks"
    path.mkdir()
    path.chmod(mode)
    with pytest.raises(LockDirError) as caught:
        ensure_private_dir(str(path), "lock_dir")
    msg = str(caught.value)
    assert str(path) in msg and f"{mode:04o}" in msg and "0700" in msg


def test_lock_dir_symlink_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "locks"
    link.symlink_to(real)
    with pytest.raises(LockDirError, match="real directory"):
        ensure_private_dir(str(link), "lock_dir")


@pytest.mark.root
def test_lock_dir_owned_by_someone_else_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to chown the directory to another uid")
    path = tmp_path / "locks"
    path.mkdir(mode=0o700)
    os.chown(path, 65534, 65534)
    with pytest.raises(LockDirError, match="owned by uid 65534"):
        ensure_private_dir(str(path), "lock_dir")


def test_lock_dir_is_created_private(tmp_path):
    path = ensure_private_dir(str(tmp_path / "a" / "locks"), "lock_dir")
    assert os.stat(path).st_mode & 0o777 == 0o700


def test_lock_file_symlink_is_not_followed(lock_dir, tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("")
    os.symlink(target, os.path.join(lock_dir, "mlx5_0.lock"))
    with pytest.raises(OSError):
        acquire(lock_dir, "mlx5_0", OWNER)
    assert target.read_text() == ""


def test_unparsable_owner_is_reported_not_crashed(lock_dir):
    path = os.path.join(lock_dir, "mlx5_0.lock")
    with open(path, "w") as handle:
        handle.write("garbage{")
    lock = acquire(lock_dir, "mlx5_0", OWNER)
    assert lock.previous_state == "stale" and "unparsable" in lock.previous_owner
    lock.release()
    assert json.loads(open(path).read())["state"] == "released"


def test_release_twice_is_an_error(lock_dir):
    lock = acquire(lock_dir, "mlx5_0", OWNER)
    lock.release()
    with pytest.raises(rnic_lock.LockError):
        lock.release()

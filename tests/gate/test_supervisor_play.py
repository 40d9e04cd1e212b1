"""The node modules (lock supervisor, supervised processes, identity) through ansible-playbook, in a play.

localhost, connection local, a temporary fake host root; real supervisor processes and flocks.
"""

import json
import os
import subprocess
import sys

import pytest
from helpers.gate import process_alive as alive

from ansible_collections.orbite.qualification.plugins.module_utils._node import locks as rnic_lock

BOOT = "0f0e0d0c-0b0a-4998-8776-655443322110"
PLAY = "tests/fixtures/node/block_always.yml"


def make_root(base):
    kernel = base / "proc" / "sys" / "kernel"
    (kernel / "random").mkdir(parents=True)
    (kernel / "hostname").write_text("sim-a\n")
    (kernel / "random" / "boot_id").write_text(BOOT + "\n")
    (kernel / "osrelease").write_text("6.1.0-sim\n")
    return str(base)


def run(cmd, repo_root, ansible_env):
    return subprocess.run(cmd, check=False, cwd=repo_root, env=ansible_env, capture_output=True, text=True, timeout=120)


def playbook(repo_root, ansible_env, tmp_path, root, **extra):
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
           "-e", f"ansible_python_interpreter={sys.executable}", "-e", "run_id=role-run",
           "-e", f"node_root={root}", "-e", f"out_dir={tmp_path}"]
    for key, value in extra.items():
        cmd += ["-e", f"{key}={value}"]
    return run([*cmd, PLAY], repo_root, ansible_env)


@pytest.fixture
def fake_root(tmp_path):
    root = make_root(tmp_path / "root")
    yield root
    # Kill, by pid, any supervisor a failed assertion left behind.
    pid_file = os.path.join(root, "run", "orbite", "supervisors", "role-run", "supervisor.pid")
    if os.path.exists(pid_file):
        pid = int(open(pid_file).read())
        if alive(pid) and root.encode() in open(f"/proc/{pid}/cmdline", "rb").read():
            os.kill(pid, 9)


@pytest.mark.slow
def test_block_always_releases_locks_when_a_task_fails(repo_root, ansible_env, tmp_path, fake_root):
    result = playbook(repo_root, ansible_env, tmp_path, fake_root, fail_in_block="true")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "A task that fails" in result.stdout
    during = json.loads((tmp_path / "during.json").read_text())
    # The supervisor outlived the node_supervisor module (and its AnsiballZ temp dir): it served a
    # launch from a later task.
    sup_pid, child = during["supervisor"]["pid"], during["child"]["child"]
    assert during["child"]["env_stripped"] == ["RDMAV_ALLOW_DISASSOC_DESTROY"]
    stopped = json.loads((tmp_path / "stopped.json").read_text())
    summary = stopped["summary"]
    assert summary["locks_released"] is True and summary["children_killed"] == [child["child_id"]]
    lock_dir = os.path.join(fake_root, "run", "orbite", "locks")
    assert rnic_lock.probe(lock_dir, "mlx5_0") and rnic_lock.probe(lock_dir, "mlx5_1")
    assert not alive(child["pid"]) and not alive(sup_pid)
    fetched = tmp_path / "journals" / "localhost" / "journal.jsonl"
    kinds = [json.loads(line)["ev"] for line in fetched.read_text().splitlines()]
    assert kinds[0] == "journal_open" and kinds[-1] == "journal_close"
    assert kinds.count("lock_release") == 2 and "child_exit" in kinds


@pytest.mark.slow
def test_contention_fails_naming_the_owner_and_stop_is_harmless(repo_root, ansible_env, tmp_path, fake_root):
    lock_dir = rnic_lock.ensure_private_dir(os.path.join(fake_root, "run", "orbite", "locks"), "lock_dir")
    held = rnic_lock.acquire(lock_dir, "mlx5_1", {"run_id": "holder-run", "controller": "other-ctl"})
    try:
        result = playbook(repo_root, ansible_env, tmp_path, fake_root, fail_in_block="false",
                          node_lock_timeout="0.5")
    finally:
        held.release()
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert "lock_timeout" in out and "run holder-run of controller other-ctl" in out
    stopped = json.loads((tmp_path / "stopped.json").read_text())
    assert stopped["running"] is False and stopped["changed"] is False
    assert rnic_lock.probe(lock_dir, "mlx5_0")  # the one it had taken was given back


@pytest.fixture(scope="module")
def module_results(repo_root, ansible_env, tmp_path_factory):
    """Run tests/fixtures/node/modules.yml once; each test below checks one of its cases."""
    tmp = tmp_path_factory.mktemp("modules")
    root = make_root(tmp / "root")
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
           "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"node_root={root}", "-e", f"out_dir={tmp}",
           "tests/fixtures/node/modules.yml"]
    result = run(cmd, repo_root, ansible_env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    return root, json.loads((tmp / "modules.json").read_text())


def test_node_identity_module_reads_the_fake_root(module_results):
    _, res = module_results
    assert res["identity_ok"]["identity"]["boot_id"] == BOOT
    assert res["identity_ok"]["identity"]["hostname"] == "sim-a"
    assert res["identity_bad"]["failed"] is True
    assert "root /nonexistent-root: is not a directory" in res["identity_bad"]["msg"]


@pytest.mark.parametrize(
    ("index", "needle"),
    [(0, "RNIC name 'mlx5/0'"), (1, "lease -1.0: must be a number of seconds"), (2, "run_id 'a/b'")],
)
def test_node_supervisor_bad_input_is_a_clear_error(module_results, index, needle):
    root, res = module_results
    bad = res["bad_start"][index]
    assert bad["failed"] is True and needle in bad["msg"], bad
    # nothing was created for the refused run (modules.yml starts no other role-run supervisor)
    assert not os.path.exists(os.path.join(root, "run", "orbite", "supervisors", "role-run"))


def test_node_supervisor_check_mode_starts_nothing(module_results):
    root, res = module_results
    assert res["check_start"]["changed"] is True and res["check_start"]["running"] is False
    assert not os.path.exists(os.path.join(root, "run", "orbite", "supervisors", "role-run", "control.sock"))


def test_stop_without_a_supervisor_is_a_no_op(module_results):
    _, res = module_results
    assert res["idle_stop"]["changed"] is False and res["idle_stop"]["running"] is False


def test_supervised_process_module_launch_wait_signal(module_results):
    root, res = module_results
    child = res["launched"]["child"]
    assert res["launched"]["changed"] is True and child["running"] is True
    assert res["waited"]["timed_out"] is True and res["waited"]["child"]["pid"] == child["pid"]
    wrong = res["wrong_signal"]
    assert wrong["failed"] is True and wrong["error"] == "supervisor.signal_refused" and "start time" in wrong["msg"]
    done = res["signalled"]["child"]
    assert done["exit_signal"] == 15 and done["running"] is False and not alive(child["pid"])
    assert res["proc_stop"]["summary"]["locks_released"] is True
    assert rnic_lock.probe(os.path.join(root, "run", "orbite", "locks"), "mlx5_0")

"""The molecule scenarios (extensions/molecule): every one is run by `make molecule`, shares the namespaced
lab's files, and the probe their verify runs on each host finds held locks and leftover processes."""

import fcntl
import importlib.util
import os
import re
import subprocess

import yaml
from helpers.paths import REPO

MOLECULE = REPO / "extensions" / "molecule"
SHARED = MOLECULE / "shared"


def _leftovers():
    spec = importlib.util.spec_from_file_location("molecule_leftovers", SHARED / "leftovers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_molecule_runs_every_scenario_on_the_shared_lab():
    scenarios = sorted(p.parent.name for p in MOLECULE.glob("*/molecule.yml"))
    (listed,) = re.findall(r"^MOLECULE_SCENARIOS := (.*)$", (REPO / "Makefile").read_text(), re.M)
    assert sorted(listed.split()) == scenarios and "restart" in scenarios
    for name in scenarios:
        config = yaml.safe_load((MOLECULE / name / "molecule.yml").read_text())["provisioner"]
        # One copy of the lab's create/destroy and inventory, resolved from the scenario's directory.
        assert {k: (MOLECULE / name / v).resolve() for k, v in config["inventory"]["links"].items()} == {
            "group_vars": SHARED / "inventory" / "group_vars", "host_vars": SHARED / "inventory" / "host_vars"}
        assert {k: (MOLECULE / name / v).resolve() for k, v in config["playbooks"].items()} == {
            "create": SHARED / "create.yml", "destroy": SHARED / "destroy.yml"}
        verify = yaml.safe_load((MOLECULE / name / "verify.yml").read_text())[0]  # scenario plays may follow
        assert (MOLECULE / name / verify["ansible.builtin.import_playbook"]).resolve() == SHARED / "verify.yml"
        assert verify["vars"]["molecule_cases"], name


def test_the_probe_finds_a_held_lock_only(tmp_path):
    for name in ("mlx5_0.lock", "mlx5_1.lock", "notes.txt"):
        (tmp_path / name).write_text("")
    leftovers = _leftovers()
    assert leftovers.held_locks(str(tmp_path)) == []
    # flock belongs to the open file description: another open of the file is another holder.
    with open(tmp_path / "mlx5_1.lock") as holder, open(tmp_path / "notes.txt") as other:
        fcntl.flock(holder, fcntl.LOCK_EX)
        fcntl.flock(other, fcntl.LOCK_EX)
        assert leftovers.held_locks(str(tmp_path)) == [str(tmp_path / "mlx5_1.lock")]
    assert leftovers.held_locks(str(tmp_path)) == []


def test_the_probe_lists_a_child_left_running_but_not_its_own_chain():
    child = subprocess.Popen(["sleep", "60"])
    try:
        found = {p["pid"]: p for p in _leftovers().leftover_processes()}
        assert found[child.pid]["exe"].endswith("/sleep") and found[child.pid]["cmdline"] == "sleep 60"
        assert os.getpid() not in found and os.getppid() not in found
    finally:
        child.kill()
        child.wait()


def test_a_process_inside_an_ssh_session_is_not_left_but_a_detached_one_is():
    # PID 1 is the host's sshd (the listener), 10 a session's sshd, 11 its shell, 12 a transient rc-script
    # child; 20 a supervisor detached to PID 1 and 21 its runner.
    parents = {10: 1, 11: 10, 12: 11, 20: 1, 21: 20}
    sshd = {1, 10}
    in_session = _leftovers().in_ssh_session
    assert [pid for pid in sorted(parents) if in_session(pid, parents.__getitem__, sshd.__contains__)] == [11, 12]

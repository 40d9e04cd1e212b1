"""The simulated lab through ansible-playbook: local lab with inventories/sim, namespaced lab over SSH (a fleet of
four namespaced hosts, two pairs at once, reaches PASS over SSH).

Red checks (disable the behaviour, exactly the named test fails):
- role absent.yml's `default([])` on the recorded hosts: test_local_lab_create_use_destroy (second destroy);
- inventory.yml.j2 `ansible_ssh_host_key_checking: true`: test_namespaced_lab_over_ssh (swapped keys
  would connect, since ansible.cfg's host_key_checking=False adds StrictHostKeyChecking=no first);
- _namespace.SETUP_SCRIPT's boot ID / sys / run/orbite binds and the PID namespace: the matching
  assertions of test_namespaced_lab_over_ssh.
"""

import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import node_root
from helpers.paths import FIXTURES

from ansible_collections.orbite.qualification.plugins.module_utils._sim import namespace as ns

BIN = Path(sys.executable).parent
PROBE = FIXTURES / "sim_lab" / "probe.yml"


def _run(cmd, repo_root, env, timeout=120):
    result = subprocess.run(cmd, cwd=repo_root, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    return result


def _lab(repo_root, env, **lab_vars):
    cmd = [str(BIN / "ansible-playbook"), str(repo_root / "playbooks" / "sim_lab.yml"), "-e", json.dumps(lab_vars)]
    return _run(cmd, repo_root, env)


def _changed(result):
    match = re.search(r"localhost\s+:\s+ok=\d+\s+changed=(\d+)\s+unreachable=0\s+failed=0", result.stdout)
    assert match, result.stdout + result.stderr
    return int(match.group(1))


def _probe(repo_root, env, inventory, out, **extra):
    out.mkdir(exist_ok=True)
    cmd = [
        str(BIN / "ansible-playbook"),
        "-i",
        str(inventory),
        str(PROBE),
        "-e",
        json.dumps({"probe_out": str(out), **extra}),
    ]
    result = _run(cmd, repo_root, env)
    assert result.returncode == 0, result.stdout + result.stderr
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


def test_local_lab_create_use_destroy(repo_root, ansible_env, tmp_path):
    # The lab and inventories/sim both derive from the work directory (here the environment's
    # ORBITE_WORK_DIR), so no path is passed to any of the playbooks.
    work = tmp_path / "work"
    env = dict(ansible_env, ORBITE_WORK_DIR=str(work))
    lab = work / "sim-lab"
    # The host list as an AWX survey sends it (one string); then as a list: the same lab.
    created = _lab(repo_root, env, sim_lab_hosts="sim-a, sim-b")
    assert created.returncode == 0, created.stdout + created.stderr
    assert _changed(created) > 0
    assert f"local lab {lab}: sim-a, sim-b reached through -i {repo_root}/inventories/sim" in " ".join(
        created.stdout.split())
    again = _lab(repo_root, env, sim_lab_hosts=["sim-a", "sim-b"])
    assert _changed(again) == 0

    # Modules read each host of inventories/sim through its root.
    shown = _probe(repo_root, env, repo_root / "inventories" / "sim", tmp_path / "probe")
    assert sorted(shown) == ["sim-a", "sim-b"]
    for name, facts in shown.items():
        assert facts["identity"]["hostname"] == name
        assert facts["identity"]["root"] == str(lab / name)
        assert facts["identity"]["boot_id"] == (lab / name / "proc/sys/kernel/random/boot_id").read_text().strip()
    assert shown["sim-a"]["identity"]["boot_id"] != shown["sim-b"]["identity"]["boot_id"]

    destroyed = _lab(repo_root, env, sim_lab_state="absent")
    assert _changed(destroyed) > 0
    assert not lab.exists()
    again = _lab(repo_root, env, sim_lab_state="absent")
    assert _changed(again) == 0


def test_bad_lab_request_fails_clearly(repo_root, ansible_env, tmp_path):
    result = _lab(repo_root, ansible_env, sim_lab_dir=str(tmp_path / "lab"), sim_lab_hosts=["sim-a", "Bad/Name"])
    assert result.returncode != 0
    assert "name='Bad/Name': must be one lower-case DNS label" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    # A fleet lab of N hosts: N from 2 to 8, refused by name before anything is created.
    result = _lab(repo_root, ansible_env, sim_lab_dir=str(tmp_path / "lab9"), sim_lab_count=9)
    assert result.returncode != 0
    assert 'sim_lab_count=9: must be a whole number from 2 to 8 (the lab\'s hosts sim-a..sim-h' in " ".join(
        result.stdout.split()), result.stdout[-2000:]
    assert not (tmp_path / "lab9").exists()
    # RNICs a host: 2 or 4 (two lanes of a case's two rails), refused by name before anything is created.
    result = _lab(repo_root, ansible_env, sim_lab_dir=str(tmp_path / "lab3"), sim_lab_rnics="3")
    assert result.returncode != 0
    assert 'sim_lab_rnics="3": must be 2 or 4' in " ".join(result.stdout.split()), result.stdout[-2000:]
    assert not (tmp_path / "lab3").exists()


@pytest.mark.parametrize("lab_vars", [{"sim_lab_dir": "{inside}/sim-lab"}, {"orbite_work_dir": "{inside}"},
                                      {"sim_lab_inventory": "{inside}/inventory.yml"}])
def test_lab_is_never_written_into_the_collection(repo_root, ansible_env, tmp_path, lab_vars):
    inside = repo_root / "out" / tmp_path.name  # a path of the checkout no other run uses
    lab_vars = {key: value.format(inside=inside) for key, value in lab_vars.items()}
    env = dict(ansible_env, ORBITE_WORK_DIR=str(tmp_path / "work"))
    result = _lab(repo_root, env, **lab_vars)
    assert result.returncode != 0
    (key,) = [k for k in lab_vars if k != "orbite_work_dir"] or ["sim_lab_dir"]
    assert f"{key}={inside}/" in result.stdout and f"is inside the collection {repo_root}," in result.stdout
    assert not inside.exists() and not (tmp_path / "work").exists()


def test_work_dir_must_be_absolute(repo_root, ansible_env):
    result = _lab(repo_root, dict(ansible_env, ORBITE_WORK_DIR="relative/work"))
    assert result.returncode != 0
    # The lookup that gives the default names the variable, the value and the rule.
    assert "ORBITE_WORK_DIR gives 'relative/work': must be an absolute path" in " ".join(result.stdout.split())


def _free_port_pair():
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        try:
            ns.check_port_free("127.0.0.1", port)
            ns.check_port_free("127.0.0.1", port + 1)
        except ns.NamespaceError:
            continue
        return port
    raise AssertionError("no two consecutive free ports on 127.0.0.1")


def _needs_namespaces():
    if os.geteuid() != 0:
        pytest.skip("namespaced hosts need root (mount, UTS and PID namespaces)")
    for tool in ("unshare", "/usr/sbin/sshd", "ssh", "ssh-keygen"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is missing (scripts/setup-system.sh installs openssh-server and openssh-client)")


def _records(lab):
    return {p.stem: json.loads(p.read_text()) for p in (lab / ".lab" / "hosts").glob("*.json")}


def _cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


HOSTS = ["sim-a", "sim-b", "sim-c", "sim-d"]
# Two disjoint pairs of the namespaced hosts, and the smallest installed-host profile (test_gate_fleet.py's).
FLEET_PAIRS = [["sim-a", "sim-c"], ["sim-d", "sim-b"]]
FLEET_PROFILE = {
    "source": "sim-a", "requester": "sim-b", "source_kind": "cpu", "requester_kind": "cpu", "transport": "rdma",
    "mode": "installed-host", "operation": "write", "rdma_events": True, "parents": 4, "payload": 200000,
    "block": 65536, "num_lanes": 1, "mask": 3,
}


def _fleet_over_ssh(repo_root, env, lab, tmp_path, identities):
    """playbooks/fleet.yml over SSH: both pairs in one wave reach PASS, each lock taken inside its own host
    (the hostname and boot ID of the host's namespaces), the two pairs' lock intervals overlapping."""
    profile = tmp_path / "small.json"
    profile.write_text(json.dumps(FLEET_PROFILE))
    runs = tmp_path / "runs"
    extra = {"orbite_output_dir": str(runs), "orbite_profile_file": str(profile), "orbite_fleet_id": "ns-fleet",
             "orbite_fleet_pairing": "list", "orbite_fleet_pairs": FLEET_PAIRS}
    result = _run([str(BIN / "ansible-playbook"), "-vv", "-i", str(lab / "inventory.yml"), str(repo_root / "playbooks"
                   / "fleet.yml"), "-e", json.dumps(extra)], repo_root, env, timeout=600)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    # Every node step over SSH ran lean (docs/node-steps.md): per host the deploy with the supervisor's start, the
    # runner's start (and wait), the stop and fetch; none as a module.
    for host in HOSTS:
        for step in ("node_supervisor", "runner", "fetch_receipts"):
            assert f"<{host}> orbite.qualification.{step}: lean node step" in result.stdout, (host, step)
    assert ": run as a module (" not in result.stdout
    verdict = json.loads((runs / "ns-fleet" / "fleet-verdict.json").read_text())
    assert verdict["verdict"] == "PASS" and verdict["complete"] and verdict["waves"] == [["p1", "p2"]]
    assert [(r["pair"], r["source"], r["requester"], r["verdict"]) for r in verdict["rows"]] == [
        ("p1", "sim-a", "sim-c", "PASS"), ("p2", "sim-d", "sim-b", "PASS")]
    intervals = []
    for pair, hosts in zip(("p1", "p2"), FLEET_PAIRS):
        for role, host in zip(("source", "requester"), hosts):
            journal = runs / "ns-fleet" / f"ns-fleet-{pair}" / "cases" / "write-events" / role / "journal.jsonl"
            acquired = node_root.events(journal, "lock_acquire")
            owners = {(e["owner"]["hostname"], e["owner"]["boot_id"]) for e in acquired}
            assert owners == {(host, identities[host]["boot_id"])}, (pair, role, owners)
            released = node_root.events(journal, "lock_release")
            intervals.append((min(e["t"] for e in acquired), max(e["t"] for e in released)))
    assert max(start for start, _ in intervals) < min(end for _, end in intervals), intervals  # one wave


@pytest.mark.root
@pytest.mark.slow
def test_namespaced_lab_over_ssh(repo_root, ansible_env, tmp_path):
    _needs_namespaces()
    lab = tmp_path / "lab"
    base = _free_port_pair()
    lab_vars = {"sim_lab_dir": str(lab), "sim_lab_kind": "namespaced", "sim_lab_ssh_port_base": str(base),
                "sim_lab_count": "4"}  # a survey's string, as AWX gives it
    # A private control-path dir: a multiplexed connection must not bypass the host-key check.
    control = tempfile.mkdtemp(prefix="cp", dir="/tmp")
    env = {**ansible_env, "ANSIBLE_SSH_CONTROL_PATH_DIR": control}
    try:
        created = _lab(repo_root, env, **lab_vars)
        assert created.returncode == 0, created.stdout + created.stderr
        inventory = lab / "inventory.yml"
        records = _records(lab)
        assert sorted(records) == HOSTS

        # Strict host-key checking: with the two pinned keys swapped, neither host is reachable.
        known = (lab / ".lab/ssh/known_hosts").read_text().splitlines()
        swapped = [f"{a.split()[0]} {' '.join(b.split()[1:])}" for a, b in zip(known, reversed(known))]
        (tmp_path / "swapped_known_hosts").write_text("\n".join(swapped) + "\n")
        (tmp_path / "swapped.yml").write_text(
            inventory.read_text().replace(str(lab / ".lab/ssh/known_hosts"), str(tmp_path / "swapped_known_hosts"))
        )
        refused = _run(
            [str(BIN / "ansible"), "-i", str(tmp_path / "swapped.yml"), "sim", "-m", "ansible.builtin.ping"],
            repo_root,
            env,
        )
        assert refused.returncode != 0
        assert refused.stdout.count("UNREACHABLE") == len(HOSTS), refused.stdout
        assert "Host key verification failed" in refused.stdout + refused.stderr

        shown = _probe(repo_root, env, inventory, tmp_path / "probe")
        assert sorted(shown) == HOSTS
        machine_boot_id = ns.machine_boot_id()
        for index, name in enumerate(HOSTS):
            identity, paths = shown[name]["identity"], shown[name]["paths"]
            boot_id, hostname, infiniband, gid, lock_mode = paths
            # UTS hostname and the bind-mounted boot ID, as node_identity (root: /) sees them.
            assert identity["root"] == "/" and identity["hostname"] == hostname == name
            assert boot_id == identity["boot_id"] != machine_boot_id
            assert boot_id == (lab / name / "proc/sys/kernel/random/boot_id").read_text().strip()
            # The host's own /sys tree.
            assert infiniband.split() == ["mlx5_0", "mlx5_1"]
            assert ipaddress.IPv6Address(gid).ipv4_mapped == ipaddress.IPv4Address(f"127.51.100.{10 + 2 * index}")
            # Its own private lock dir, which is the lab's <host>/run/orbite/locks.
            assert lock_mode == "700"
            assert sorted(os.listdir(lab / name / "run/orbite/locks")) == [f"probe-{name}"]
        assert len({facts["identity"]["boot_id"] for facts in shown.values()}) == len(HOSTS)
        # rdma-core's libibverbs enumerated each host's fake devices, as the inventory lists them, with
        # the GUIDs of the lab's files; a context cannot open without a kernel driver, and it says so.
        for name in HOSTS:
            verbs, devices = shown[name]["verbs"], shown[name]["devices"]
            assert (verbs["status"], verbs["sysfs"], verbs["mismatches"]) == ("checked", "/sys", []), verbs
            guids = [(lab / name / f"sys/class/infiniband/mlx5_{k}/node_guid").read_text().strip() for k in (0, 1)]
            assert [(e["name"], e["node_guid"]) for e in verbs["enumerated"]] == list(zip(sorted(devices), guids))
            assert [(lim["device"], lim["step"]) for lim in verbs["limits"]] == [
                ("mlx5_0", "ibv_open_device"), ("mlx5_1", "ibv_open_device")]

        # Every process of each host, found by its mount namespace, including the daemonized one.
        started = []
        for record in records.values():
            inside = ns.processes_in_mount_namespace(record["processes"]["mount_namespace"])
            assert any(_cmdline(p["pid"]) == "sleep 600" for p in inside), [_cmdline(p["pid"]) for p in inside]
            assert record["processes"]["holder"] in inside and record["processes"]["init"] in inside
            started += inside

        _fleet_over_ssh(repo_root, env, lab, tmp_path, {name: facts["identity"] for name, facts in shown.items()})

        destroyed = _lab(repo_root, env, **lab_vars, sim_lab_state="absent")
        assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
        left = [(p["pid"], _cmdline(p["pid"])) for p in started if ns.identity_alive(p)]
        assert left == []
        assert not lab.exists()
        assert os.listdir(control) == []  # no multiplexing master outlived its host
    finally:
        if (lab / ".lab" / "hosts").is_dir():  # a failed run must not leave namespaces behind
            for record in _records(lab).values():
                ns.stop_host(record.get("processes"))
        shutil.rmtree(control, ignore_errors=True)

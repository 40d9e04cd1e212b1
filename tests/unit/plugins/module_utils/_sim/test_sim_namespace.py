"""Namespaced fake hosts through module_utils (root only): start, keep, restart, reboot, stop.

The host's namespace is inspected through /proc/<pid>/root, which resolves paths in that process's
mount namespace, so no SSH is needed here (tests/gate/test_sim_lab_playbooks.py goes over SSH).
"""

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ansible_collections.orbite.qualification.plugins.module_utils._sim import namespace as ns
from ansible_collections.orbite.qualification.plugins.module_utils._sim import hosts as sh

pytestmark = pytest.mark.root


@pytest.fixture
def lab(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("namespaced hosts need root (mount, UTS and PID namespaces)")
    for tool in ("unshare", "/usr/sbin/sshd", "ssh-keygen"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is missing (scripts/setup-system.sh installs openssh-server)")
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    lab = tmp_path / "lab"
    yield lab, str(key) + ".pub"
    for record_path in (lab / ".lab" / "hosts").glob("*.json"):  # never leave a namespace behind
        ns.stop_host(json.loads(record_path.read_text()).get("processes"))


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _request(lab, key, port, **extra):
    params = {
        "lab_dir": str(lab),
        "name": "sim-a",
        "index": 0,
        "kind": "namespaced",
        "ssh_port": port,
        "authorized_key_file": key,
        **extra,
    }
    return sh.build_request(params)


def _inside(host, rel):
    """A path as the host's processes see it."""
    return Path(f"/proc/{host['processes']['init']['pid']}/root", rel)


def test_namespaced_host_lifecycle(lab):
    lab_dir, key = lab
    port = _free_port()
    changed, host = sh.ensure_present(_request(lab_dir, key, port))
    assert changed and ns.host_running(host["processes"])
    assert host["orbite_root"] == "/" and host["lock_dir"] == "/run/orbite/locks"
    # The fake root shown at the real paths, and nothing of the machine's own /sys.
    assert _inside(host, "proc/sys/kernel/random/boot_id").read_text().strip() == host["boot_id"]
    assert host["boot_id"] != ns.machine_boot_id()
    assert sorted(os.listdir(_inside(host, "sys/class/infiniband"))) == ["mlx5_0", "mlx5_1"]
    assert sorted(os.listdir(_inside(host, "sys/class/net"))) == ["ens1f0", "ens2f0"]
    # libibverbs' character devices, in the host's own /dev/infiniband only, numbered by the tree.
    for k in (0, 1):
        node = os.stat(_inside(host, f"dev/infiniband/uverbs{k}"))
        numbers = _inside(host, f"sys/class/infiniband_verbs/uverbs{k}/dev").read_text().strip()
        assert stat.S_ISCHR(node.st_mode) and f"{os.major(node.st_rdev)}:{os.minor(node.st_rdev)}" == numbers
    assert os.stat(_inside(host, "dev/infiniband")).st_dev != os.stat("/dev/infiniband").st_dev  # its own tmpfs
    (lab_dir / "sim-a/run/orbite/locks/mark").write_text("x")
    assert _inside(host, "run/orbite/locks/mark").exists()
    # The node work dir (/var/tmp/orbite for the runner role) is the host's own, kept in its root.
    (lab_dir / "sim-a/var/tmp/mark").write_text("x")
    assert _inside(host, "var/tmp/mark").exists() and not Path("/var/tmp/mark").exists()
    assert not _inside(host, "tmp/mark").exists()
    assert host["ssh"]["known_hosts_line"].startswith(f"[127.0.0.1]:{port} ssh-ed25519 ")

    # Idempotent: the same processes, the same boot.
    changed, again = sh.ensure_present(_request(lab_dir, key, port))
    assert not changed and again == host

    # A changed port restarts the host: new processes, a fresh boot ID, the old ones gone.
    new_port = _free_port()
    changed, moved = sh.ensure_present(_request(lab_dir, key, new_port))
    assert changed and moved["ssh"]["port"] == new_port
    assert moved["boot_id"] != host["boot_id"]
    assert not ns.identity_alive(host["processes"]["init"]) and not ns.identity_alive(host["processes"]["holder"])

    # A host whose PID 1 died is down: present starts it again, as a reboot.
    os.kill(moved["processes"]["init"]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while ns.host_running(moved["processes"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    changed, rebooted = sh.ensure_present(_request(lab_dir, key, new_port))
    assert changed and ns.host_running(rebooted["processes"])
    assert rebooted["boot_id"] not in (host["boot_id"], moved["boot_id"])
    assert rebooted["processes"]["init"] != moved["processes"]["init"]


def test_destroy_ends_only_the_hosts_processes(lab):
    lab_dir, key = lab
    _, host = sh.ensure_present(_request(lab_dir, key, _free_port()))
    inside = ns.processes_in_mount_namespace(host["processes"]["mount_namespace"])
    # unshare itself (the holder) joins the new mount namespace; sshd is PID 1 of the new PID one.
    assert sorted(p["pid"] for p in inside) == sorted(
        [host["processes"]["init"]["pid"], host["processes"]["holder"]["pid"]]
    )
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        changed, gone = sh.ensure_absent(sh.build_request({"lab_dir": str(lab_dir), "name": "sim-a"}, "absent"))
        assert changed
        assert sorted(gone["ended_pids"]) == sorted(
            [host["processes"]["init"]["pid"], host["processes"]["holder"]["pid"]]
        )
        assert not ns.identity_alive(host["processes"]["init"])
        assert not ns.identity_alive(host["processes"]["holder"])
        assert bystander.poll() is None
        assert not (lab_dir / "sim-a").exists() and not (lab_dir / ".lab/ns/sim-a").exists()
        changed, _ = sh.ensure_absent(sh.build_request({"lab_dir": str(lab_dir), "name": "sim-a"}, "absent"))
        assert not changed
    finally:
        bystander.kill()
        bystander.wait()


def test_a_host_that_cannot_start_says_why_and_can_be_destroyed(lab):
    # Guards _namespace.start_host's early-exit check: an sshd that dies is reported with its log.
    lab_dir, key = lab
    request = _request(lab_dir, key, _free_port(), sshd="/bin/false")
    with pytest.raises(sh.SimLabNamespaceError, match="namespace exited with status 1 before sshd listened"):
        sh.ensure_present(request)
    record = sh.load_record(request)
    assert record["status"] == "creating"
    changed, _ = sh.ensure_absent(sh.build_request({"lab_dir": str(lab_dir), "name": "sim-a"}, "absent"))
    assert changed and not (lab_dir / "sim-a").exists()

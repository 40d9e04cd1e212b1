"""Simulated lab, local hosts and process identity: plugins/module_utils/_sim/hosts.py and _namespace.py.

Each test that guards a rule names the line (function) it guards: disable that behaviour and
exactly that test fails.
"""

import ipaddress
import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.paths import REPO
import yaml

from ansible_collections.orbite.qualification.plugins.module_utils._sim import namespace as ns
from ansible_collections.orbite.qualification.plugins.module_utils._sim import hosts as sh
from ansible_collections.orbite.qualification.plugins.module_utils._node.identity import read_identity



def _request(lab, name="sim-a", index=0, **extra):
    return sh.build_request({"lab_dir": str(lab), "name": name, "index": index, **extra})


def _read(path):
    return Path(path).read_text().strip()


# ---------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"lab_dir": "relative/lab", "name": "sim-a", "index": 0}, "lab_dir"),
        ({"lab_dir": "/", "name": "sim-a", "index": 0}, "lab_dir"),
        ({"lab_dir": "/tmp/lab", "name": "../etc", "index": 0}, "name"),
        ({"lab_dir": "/tmp/lab", "name": "Sim_A", "index": 0}, "name"),
        ({"lab_dir": "/tmp/lab", "name": "sim-a", "index": "two"}, "index"),
        ({"lab_dir": "/tmp/lab", "name": "sim-a", "index": 100}, "index"),
        ({"lab_dir": "/tmp/lab", "name": "sim-a", "index": None}, "index"),
        ({"lab_dir": "/tmp/lab", "name": "sim-a", "index": 0, "kind": "vm"}, "kind"),
        ({"lab_dir": "/tmp/lab", "name": "sim-a", "index": 0, "kind": "namespaced"}, "ssh_port"),
        (
            {
                "lab_dir": "/tmp/lab",
                "name": "sim-a",
                "index": 0,
                "kind": "namespaced",
                "ssh_port": 2221,
                "ssh_address": "10.0.0.1",
                "authorized_key_file": "/k.pub",
            },
            "ssh_address",
        ),
        (
            {
                "lab_dir": "/tmp/lab",
                "name": "sim-a",
                "index": 0,
                "kind": "namespaced",
                "ssh_port": "70000",
                "authorized_key_file": "/k.pub",
            },
            "ssh_port",
        ),
        (
            {
                "lab_dir": "/tmp/lab",
                "name": "sim-a",
                "index": 0,
                "kind": "namespaced",
                "ssh_port": 2221,
                "authorized_key_file": "k.pub",
            },
            "authorized_key_file",
        ),
    ],
)
def test_bad_arguments_name_the_field_value_and_rule(params, field):
    with pytest.raises(sh.SimLabArgumentError) as caught:
        sh.build_request(params)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}=")
    assert caught.value.rule


def test_survey_strings_are_cast():
    request = sh.build_request(
        {
            "lab_dir": "/tmp/lab/",
            "name": "sim-b",
            "index": "1",
            "kind": "namespaced",
            "ssh_port": "2222",
            "authorized_key_file": "/k.pub",
        }
    )
    assert (request.index, request.ssh_port, request.lab_dir) == (1, 2222, "/tmp/lab")


def test_survey_strings_with_blanks_are_refused_not_trimmed():
    params = {"lab_dir": "/tmp/lab", "name": "sim-b", "index": " 1 ", "kind": "namespaced", "ssh_port": "2222",
              "authorized_key_file": "/k.pub"}
    with pytest.raises(sh.SimLabArgumentError) as caught:
        sh.build_request(params)
    assert caught.value.field == "index" and str(caught.value).startswith("index=")


def test_absent_needs_no_index():
    assert sh.build_request({"lab_dir": "/tmp/lab", "name": "sim-a"}, state="absent").index is None


# ---------------------------------------------------------------- local hosts


@pytest.fixture(scope="module")
def shared_lab(tmp_path_factory):
    """sim-a and sim-b, created once for the tests that only read them."""
    lab = tmp_path_factory.mktemp("shared") / "lab"
    hosts = {}
    for index, name in enumerate(("sim-a", "sim-b")):
        changed, hosts[name] = sh.ensure_present(_request(lab, name, index))
        assert changed
    return lab, hosts


def test_local_host_has_the_contract_layout(shared_lab):
    lab, hosts = shared_lab
    host, root = hosts["sim-a"], lab / "sim-a"
    assert host["root"] == host["orbite_root"] == str(root)
    assert _read(root / "proc/sys/kernel/hostname") == "sim-a"
    assert _read(root / "proc/sys/kernel/osrelease")
    assert len(_read(root / "etc/machine-id")) == 32
    assert sorted(os.listdir(root / "sys/class/infiniband")) == ["mlx5_0", "mlx5_1"]
    assert sorted(os.listdir(root / "sys/class/net")) == ["ens1f0", "ens2f0"]
    assert _read(root / "sys/devices/system/node/node1/cpulist") == "4-7"
    lock_dir = root / "run/orbite/locks"
    assert stat.S_IMODE(lock_dir.stat().st_mode) == 0o700 and host["lock_dir"] == str(lock_dir)
    identity = read_identity(str(root))  # the discovery helper's reader accepts it
    assert identity["hostname"] == "sim-a" and identity["boot_id"] == host["boot_id"]


def test_lab_state_dir_is_private(shared_lab):
    # Guards sim_host._private_dir: .lab holds the SSH keys of namespaced labs.
    lab, _ = shared_lab
    for path in (lab / ".lab", lab / ".lab" / "hosts"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert stat.S_IMODE((lab / ".lab/hosts/sim-a.json").stat().st_mode) == 0o600


def test_create_is_idempotent_and_keeps_the_boot_id(shared_lab):
    lab, hosts = shared_lab
    changed, again = sh.ensure_present(_request(lab, "sim-a", 0))
    assert not changed
    assert again == hosts["sim-a"]


def test_two_hosts_differ_in_hostname_boot_id_and_gids(shared_lab):
    _, hosts = shared_lab
    a, b = hosts["sim-a"], hosts["sim-b"]
    ids = [read_identity(h["root"]) for h in (a, b)]
    assert ids[0]["hostname"] != ids[1]["hostname"]
    assert ids[0]["boot_id"] != ids[1]["boot_id"]
    assert {r["ipv4"] for r in a["rails"]}.isdisjoint({r["ipv4"] for r in b["rails"]})


def test_boot_id_is_fresh_per_creation(tmp_path):
    # Guards sim_host._write_root's fresh uuid4: recreating a host is a reboot.
    _, first = sh.ensure_present(_request(tmp_path))
    sh.ensure_absent(_request(tmp_path))
    _, second = sh.ensure_present(_request(tmp_path))
    assert first["boot_id"] != second["boot_id"]


def test_rails_match_the_tree_and_inventories_sim(shared_lab):
    """The static inventory's rails are what the generator really wrote (read back from the files)."""
    inventory = REPO / "inventories" / "sim"
    for index, name in enumerate(("sim-a", "sim-b")):
        host = shared_lab[1][name]
        host_vars = yaml.safe_load((inventory / "host_vars" / f"{name}.yml").read_text())
        assert host_vars["sim_lab_index"] == index
        assert host_vars["orbite_rails"] == [
            {"device": r["device"], "port": r["port"], "gid_index": r["gid_index"]} for r in host["rails"]
        ]
        for rail in host_vars["orbite_rails"]:
            port = Path(host["root"], "sys/class/infiniband", rail["device"], "ports", str(rail["port"]))
            assert _read(port / "gid_attrs/types" / str(rail["gid_index"])) == "RoCE v2"
            gid = ipaddress.IPv6Address(_read(port / "gids" / str(rail["gid_index"])))
            assert gid.ipv4_mapped in ipaddress.IPv4Network("127.51.100.0/24")
        address = host_vars["orbite_service_address"]
        assert address.startswith("127.0.0.") and address.endswith(":7471")
    services = [
        yaml.safe_load((inventory / "host_vars" / f"{n}.yml").read_text())["orbite_service_address"]
        for n in ("sim-a", "sim-b")
    ]
    assert services[0] != services[1]


def test_destroy_removes_what_it_created_and_is_idempotent(tmp_path):
    sh.ensure_present(_request(tmp_path))
    changed, _ = sh.ensure_absent(_request(tmp_path))
    assert changed
    assert not (tmp_path / "sim-a").exists() and not (tmp_path / ".lab/hosts/sim-a.json").exists()
    changed, _ = sh.ensure_absent(_request(tmp_path))
    assert not changed


def test_refuses_to_overwrite_a_directory_it_did_not_create(tmp_path):
    # Guards sim_host._check_not_foreign in ensure_present.
    (tmp_path / "sim-a").mkdir()
    (tmp_path / "sim-a" / "precious").write_text("x")
    with pytest.raises(sh.SimLabStateError, match="refusing to overwrite"):
        sh.ensure_present(_request(tmp_path))
    assert (tmp_path / "sim-a" / "precious").read_text() == "x"
    assert not (tmp_path / "sim-a" / "sys").exists()


def test_the_record_names_the_collection_that_made_the_host(tmp_path):
    sh.ensure_present(_request(tmp_path, created_by="/checkouts/a/"))
    assert json.loads((tmp_path / ".lab/hosts/sim-a.json").read_text())["created_by"] == "/checkouts/a"
    with pytest.raises(sh.SimLabArgumentError, match=r"^created_by='checkouts/a': must be the absolute path"):
        _request(tmp_path, created_by="checkouts/a")


def test_a_root_another_lab_left_unmarked_is_refused_naming_that_lab_and_orbite_work_dir(tmp_path):
    """Two checkouts, one default work directory: the second's refusal says whose lab it is and how to pick
    another (the sim lab's own words of the refusal stay: it is right to refuse)."""
    lab = tmp_path / "work" / "sim-lab"
    sh.ensure_present(_request(lab, created_by="/checkouts/a"))
    (lab / "sim-a" / ".orbite-fake-host").unlink()  # e.g. written by another version of the collection
    with pytest.raises(sh.SimLabStateError) as caught:
        sh.ensure_present(_request(lab, created_by="/checkouts/b"))
    message = str(caught.value)
    assert "already has sys, proc, etc/machine-id not written by write_host; refusing to replace it" in message
    assert f"it is the lab /checkouts/a made (lab {lab}, work directory {lab.parent})" in message
    assert message.endswith("pick another work directory: ORBITE_WORK_DIR=<dir> (or -e orbite_work_dir=<dir>)")


def test_a_foreign_root_beside_another_labs_hosts_names_that_lab(tmp_path):
    sh.ensure_present(_request(tmp_path, created_by="/checkouts/a"))
    (tmp_path / "sim-b").mkdir()
    (tmp_path / "sim-b" / "precious").write_text("x")
    with pytest.raises(sh.SimLabStateError, match=r"refusing to overwrite it; it is the lab /checkouts/a made .*"
                                                  r"ORBITE_WORK_DIR=<dir>"):
        sh.ensure_present(_request(tmp_path, name="sim-b", index=1, created_by="/checkouts/b"))


def test_a_refusal_with_no_record_of_its_maker_still_says_how_to_pick_another_work_dir(tmp_path):
    (tmp_path / "sim-a").mkdir()
    (tmp_path / "sim-a" / "precious").write_text("x")
    with pytest.raises(sh.SimLabStateError, match=r"no lab record there names who made it .*ORBITE_WORK_DIR=<dir>"):
        sh.ensure_present(_request(tmp_path, created_by="/checkouts/b"))


def test_refuses_to_delete_a_directory_it_did_not_create(tmp_path):
    # Guards sim_host._check_not_foreign in ensure_absent.
    (tmp_path / "sim-a").mkdir()
    (tmp_path / "sim-a" / "precious").write_text("x")
    with pytest.raises(sh.SimLabStateError, match="refusing to delete"):
        sh.ensure_absent(sh.build_request({"lab_dir": str(tmp_path), "name": "sim-a"}, state="absent"))
    assert (tmp_path / "sim-a" / "precious").exists()


def test_refuses_a_record_that_is_not_ours(tmp_path):
    # Guards sim_host.load_record's schema check.
    (tmp_path / ".lab/hosts").mkdir(parents=True)
    (tmp_path / ".lab/hosts/sim-a.json").write_text(json.dumps({"schema": "other"}))
    (tmp_path / "sim-a").mkdir()
    with pytest.raises(sh.SimLabStateError, match=r"not a orbite\.sim-host record"):
        sh.ensure_absent(sh.build_request({"lab_dir": str(tmp_path), "name": "sim-a"}, state="absent"))
    assert (tmp_path / "sim-a").exists()


@pytest.mark.parametrize("field", ["kind", "index"])
def test_an_existing_host_of_another_kind_or_index_is_not_reused(tmp_path, field):
    sh.ensure_present(_request(tmp_path))
    record = json.loads((tmp_path / ".lab/hosts/sim-a.json").read_text())
    record[field] = "namespaced" if field == "kind" else 7
    (tmp_path / ".lab/hosts/sim-a.json").write_text(json.dumps(record))
    with pytest.raises(sh.SimLabStateError, match=f"exists as {field}="):
        sh.ensure_present(_request(tmp_path))


def test_a_damaged_root_is_repaired(tmp_path):
    # Guards sim_host._root_intact: a missing lock dir makes the host be written again.
    sh.ensure_present(_request(tmp_path))
    os.rmdir(tmp_path / "sim-a/run/orbite/locks")
    changed, host = sh.ensure_present(_request(tmp_path))
    assert changed
    assert stat.S_IMODE(Path(host["lock_dir"]).stat().st_mode) == 0o700


def test_a_half_created_host_is_finished_or_destroyed(tmp_path):
    # Guards the 'creating' record written before the tree: a crash leaves a destroyable host.
    sh.ensure_present(_request(tmp_path))
    record = json.loads((tmp_path / ".lab/hosts/sim-a.json").read_text())
    record["status"] = "creating"
    (tmp_path / ".lab/hosts/sim-a.json").write_text(json.dumps(record))
    changed, _ = sh.ensure_present(_request(tmp_path))
    assert changed
    assert json.loads((tmp_path / ".lab/hosts/sim-a.json").read_text())["status"] == "ready"


def test_check_mode_changes_nothing(tmp_path):
    changed, _ = sh.ensure_present(_request(tmp_path), check_mode=True)
    assert changed and not (tmp_path / "sim-a").exists() and not (tmp_path / ".lab").exists()
    sh.ensure_present(_request(tmp_path))
    changed, _ = sh.ensure_absent(_request(tmp_path), check_mode=True)
    assert changed and (tmp_path / "sim-a/sys").exists()


def test_namespaced_needs_root(tmp_path, monkeypatch):
    # Guards sim_host._require_namespace_tools: a clear error instead of a failing unshare.
    key = tmp_path / "id.pub"
    key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB0= me\n")
    monkeypatch.setattr(sh.os, "geteuid", lambda: 1000)
    request = _request(
        tmp_path / "lab", kind="namespaced", ssh_port=2299, authorized_key_file=str(key), ssh_user="nobody"
    )
    with pytest.raises(sh.SimLabNamespaceError, match="needs root"):
        sh.ensure_present(request)
    assert not (tmp_path / "lab").exists()


def test_authorized_key_file_must_hold_public_keys(tmp_path):
    key = tmp_path / "id"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n")
    request = _request(
        tmp_path / "lab", kind="namespaced", ssh_port=2299, authorized_key_file=str(key), ssh_user="root"
    )
    with pytest.raises(sh.SimLabArgumentError) as caught:
        sh._authorized_keys(request)
    assert caught.value.field == "authorized_key_file"


# ---------------------------------------------------------------- process identity (_namespace)


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_identity_is_pid_plus_start_time(sleeper):
    identity = ns.process_identity(sleeper.pid)
    assert ns.identity_alive(identity)
    assert not ns.identity_alive({**identity, "start_time": identity["start_time"] - 1})
    assert not ns.identity_alive({**identity, "machine_boot_id": "00000000-0000-0000-0000-000000000000"})


def test_a_reused_pid_is_never_signalled(sleeper):
    # Guards _namespace._open_verified: the start time is checked before any signal is sent.
    identity = ns.process_identity(sleeper.pid)
    stale = {**identity, "start_time": identity["start_time"] - 1}
    assert ns.end_process(stale) is False
    time.sleep(0.1)
    assert sleeper.poll() is None
    assert ns.end_process(identity) is True
    assert ns.process_start_time(sleeper.pid) is None  # ended, and reaped by end_process


def test_stop_host_without_a_record_does_nothing():
    assert ns.stop_host(None) == []
    assert ns.stop_host({}) == []


def test_a_busy_port_is_reported_before_anything_starts():
    # Guards _namespace.check_port_free: otherwise another listener would pass the readiness check.
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ns.NamespaceError, match=f"ssh_port {port} on 127.0.0.1"):
            ns.check_port_free("127.0.0.1", port)


def test_sshd_config_only_lets_the_lab_key_in():
    text = ns.sshd_config_text("sim-a", "127.0.0.1", 2221, "root")
    assert "ListenAddress 127.0.0.1:2221" in text
    assert "PasswordAuthentication no" in text and "AllowUsers root" in text
    assert f"AuthorizedKeysFile {ns.SSHD_DIR_IN_HOST}/authorized_keys" in text

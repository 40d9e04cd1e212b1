"""node_identity reads hostname, boot ID, kernel release and machine-id relative to a root."""

import pytest
from ansible_collections.orbite.qualification.plugins.module_utils._node.identity import (
    IdentityError,
    identity_mismatches,
    read_identity,
)

BOOT = "0f0e0d0c-0b0a-4998-8776-655443322110"


def make_root(base, hostname="sim-a", boot_id=BOOT, osrelease="6.1.0-sim", machine_id=None):
    kernel = base / "proc" / "sys" / "kernel"
    (kernel / "random").mkdir(parents=True)
    if hostname is not None:
        (kernel / "hostname").write_text(hostname + "\n")
    if boot_id is not None:
        (kernel / "random" / "boot_id").write_text(boot_id + "\n")
    if osrelease is not None:
        (kernel / "osrelease").write_text(osrelease + "\n")
    if machine_id is not None:
        (base / "etc").mkdir()
        (base / "etc" / "machine-id").write_text(machine_id + "\n")
    return str(base)


def test_reads_relative_to_root(tmp_path):
    root = make_root(tmp_path, machine_id="a" * 32)
    assert read_identity(root) == {"root": root, "hostname": "sim-a", "boot_id": BOOT,
                                   "kernel_release": "6.1.0-sim", "machine_id": "a" * 32}


def test_machine_id_is_optional(tmp_path):
    assert read_identity(make_root(tmp_path))["machine_id"] is None


def test_real_host():
    ident = read_identity("/")
    assert ident["hostname"] and len(ident["boot_id"]) == 36


@pytest.mark.parametrize(
    ("field", "kwargs", "needle"),
    [
        ("hostname", {"hostname": None}, "proc/sys/kernel/hostname is missing"),
        ("boot_id", {"boot_id": None}, "boot_id is missing"),
        ("osrelease", {"osrelease": None}, "osrelease is missing"),
        ("hostname", {"hostname": "bad/name"}, "hostname 'bad/name'"),
        ("boot_id", {"boot_id": "not-a-uuid"}, "boot_id 'not-a-uuid'"),
        ("osrelease", {"osrelease": ""}, "kernel release"),
        ("machine_id", {"machine_id": "xyz"}, "machine_id 'xyz'"),
    ],
)
def test_bad_identity_files_name_the_file_and_rule(tmp_path, field, kwargs, needle):
    root = make_root(tmp_path, **kwargs)
    with pytest.raises(IdentityError) as caught:
        read_identity(root)
    assert needle in str(caught.value)


def test_relative_root_is_refused():
    with pytest.raises(IdentityError, match="absolute"):
        read_identity("relative/root")


def test_mismatches():
    observed = {"hostname": "a", "boot_id": BOOT}
    assert identity_mismatches({"hostname": "a", "boot_id": BOOT.upper()}, observed) == {}
    assert identity_mismatches({"hostname": None, "boot_id": None}, observed) == {}
    assert identity_mismatches({"hostname": "b", "boot_id": BOOT}, observed) == {
        "hostname": {"expected": "b", "observed": "a"}}

"""Installation manifest: schema validation, and the controller/node checks on a synthetic installation.

The installation here is made of plain files whose hashes the test computes itself (hashlib), and a
shell-script "binary" that answers --protocol, so no cargo is needed. The real cargo build is in
tests/gate/test_build_installed.py.
"""

import copy
import hashlib
import json
import os
import shutil
import stat

import pytest
from ansible_collections.orbite.qualification.plugins.module_utils._build import manifest as im

PROTOCOL = "orbite-installed-host-v4"


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _script(path, body):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def installation(tmp_path):
    """An output directory laid out as artifact_build writes it, and its manifest (hashes by hashlib)."""
    out = tmp_path / "out"
    files = {
        "archive": out / "orbite-0.4.0.crate",
        "consumer_manifest": out / "consumer" / "Cargo.toml",
        "lockfile": out / "consumer" / "Cargo.lock",
        "main": out / "consumer" / "main.rs",
        "resources": out / "consumer" / "resources.rs",
        "accounting": out / "observers" / "liborbite_accounting.so",
    }
    for name, path in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"{name} content\n".encode())
    binary = _script(
        out / "installed" / "bin" / "orbite-rdma-host", f'[ "$1" = --protocol ] && echo {PROTOCOL} && exit 0; exit 2'
    )

    def rec(path):
        return {"path": str(path.relative_to(out)), "sha256": _sha(path)}

    manifest = {
        "schema": "orbite.installation-manifest",
        "version": 1,
        "protocol": PROTOCOL,
        "package": {"name": "orbite", "version": "0.4.0"},
        "commit": "a" * 40,
        "dirty": False,
        "dirty_paths": [],
        "toolchain": "rustc 1.95.0 (59807616e 2026-04-14)",
        "toolchain_name": "stable",
        "features": ["rdma"],
        "fixture": "tests/hardware/rdma_host",
        "archive": rec(files["archive"]),
        "fixture_modules": [rec(files["main"]), rec(files["resources"])],
        "consumer_manifest": rec(files["consumer_manifest"]),
        "lockfile": rec(files["lockfile"]),
        "binary": rec(binary),
        "observers": {"accounting": rec(files["accounting"]), "cq_fault": None, "uverbs_fault": None,
                      "inflight_fault": None},
        "observers_absent_reason": "only the accounting observer was built in this test",
        "native_libraries": [],
        "build": {"builder": 1, "fingerprint": "b" * 64},
    }
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out, manifest


# ----------------------------------------------------------------------------------------------
# Validation: each rule broken alone is named by field


def test_valid_manifest_loads(installation):
    out, manifest = installation
    assert im.load_manifest(str(out / "manifest.json")) == manifest


BROKEN = [
    ("schema", lambda m: m.update(schema="orbite.receipt"), "schema"),
    ("version", lambda m: m.update(version=2), "version"),
    ("version bool", lambda m: m.update(version=True), "version"),
    ("commit short", lambda m: m.update(commit="abc123"), "commit"),
    ("dirty text", lambda m: m.update(dirty="no"), "dirty"),
    ("clean with paths", lambda m: m.update(dirty_paths=["M src/lib.rs"]), "dirty_paths"),
    ("feature", lambda m: m.update(features=["rdma", "bad feature"]), "features"),
    ("archive sha", lambda m: m["archive"].update(sha256="XYZ"), "archive.sha256"),
    ("binary absolute", lambda m: m["binary"].update(path="/usr/bin/x"), "binary.path"),
    ("lockfile escapes", lambda m: m["lockfile"].update(path="../Cargo.lock"), "lockfile.path"),
    ("no modules", lambda m: m.update(fixture_modules=[]), "fixture_modules"),
    ("module sha", lambda m: m["fixture_modules"][1].update(sha256=None), "fixture_modules[1].sha256"),
    ("observer keys", lambda m: m["observers"].pop("cq_fault"), "observers"),
    ("absent without reason", lambda m: m.update(observers_absent_reason=None), "observers_absent_reason"),
    (
        "library relative",
        lambda m: m.update(native_libraries=[{"soname": "libc.so.6", "path": "libc.so.6", "sha256": "c" * 64}]),
        "native_libraries[0].path",
    ),
    (
        "library soname",
        lambda m: m.update(native_libraries=[{"path": "/lib/libc.so.6", "sha256": "c" * 64}]),
        "native_libraries[0].soname",
    ),
    ("fingerprint", lambda m: m.update(build={}), "build"),
    ("protocol type", lambda m: m.update(protocol=4), "protocol"),
]


@pytest.mark.parametrize("case, breaker, field", BROKEN, ids=[b[0] for b in BROKEN])
def test_each_broken_field_is_named(installation, case, breaker, field):
    _, manifest = installation
    broken = copy.deepcopy(manifest)
    breaker(broken)
    with pytest.raises(im.ManifestError) as caught:
        im.validate_manifest(broken, origin="m.json")
    assert [p[0] for p in caught.value.problems] == [field]
    assert f"field {field!r}" in str(caught.value) and "m.json" in str(caught.value)


def test_not_json_and_missing_file_are_clear_errors(tmp_path):
    bad = tmp_path / "manifest.json"
    bad.write_text("{not json")
    with pytest.raises(im.ManifestError, match="must be JSON"):
        im.load_manifest(str(bad))
    with pytest.raises(im.ManifestError, match="must be readable"):
        im.load_manifest(str(tmp_path / "absent.json"))


# ----------------------------------------------------------------------------------------------
# Controller side


def _fields(mismatches):
    return [m.field for m in mismatches]


def test_controller_accepts_matching_installation(installation):
    out, manifest = installation
    binary = out / manifest["binary"]["path"]
    mismatches, checked = im.check_controller(manifest, str(out), binary=str(binary), expected_commit="a" * 40)
    assert mismatches == []
    assert {"artifact files", "commit", "binary", "binary --protocol"} <= set(checked)


def test_controller_rejects_dirty_unless_allowed(installation):
    # guards: `if manifest["dirty"] and not allow_dirty` in check_controller
    out, manifest = installation
    manifest.update(dirty=True, dirty_paths=["M src/lib.rs"])
    mismatches, _ = im.check_controller(manifest, str(out))
    assert _fields(mismatches) == ["dirty"] and mismatches[0].path == "M src/lib.rs"
    assert im.check_controller(manifest, str(out), allow_dirty=True)[0] == []


def test_controller_names_commit_and_protocol_mismatches(installation):
    out, manifest = installation
    manifest["protocol"] = "orbite-installed-host-v3"
    mismatches, _ = im.check_controller(manifest, str(out), expected_commit="b" * 40)
    assert _fields(mismatches) == ["protocol", "commit"]
    assert mismatches[1].expected == "b" * 40 and mismatches[1].found == "a" * 40


@pytest.mark.parametrize(
    "field, relative",
    [
        ("binary.sha256", "installed/bin/orbite-rdma-host"),
        ("lockfile.sha256", "consumer/Cargo.lock"),
        ("archive.sha256", "orbite-0.4.0.crate"),
        ("fixture_modules[1].sha256", "consumer/resources.rs"),
        ("consumer_manifest.sha256", "consumer/Cargo.toml"),
        ("observers.accounting.sha256", "observers/liborbite_accounting.so"),
    ],
)
def test_controller_names_each_tampered_file(installation, field, relative):
    # guards: check_artifact_files -> _compare_file for every record of artifact_records
    out, manifest = installation
    path = out / relative
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x01
    path.write_bytes(bytes(data))
    mismatches, _ = im.check_controller(manifest, str(out), probe=False)
    assert _fields(mismatches) == [field]
    assert mismatches[0].path == str(path) and mismatches[0].found == _sha(path)


def test_controller_names_missing_file(installation):
    out, manifest = installation
    (out / "consumer" / "Cargo.lock").unlink()
    mismatches, _ = im.check_controller(manifest, str(out))
    assert [(m.field, m.found) for m in mismatches] == [("lockfile", "missing")]


def test_controller_refuses_mismatched_binary_pair(installation, tmp_path):
    # guards: the `if binary:` block of check_controller (orbite_installation / orbite_binary pair)
    out, manifest = installation
    other = _script(tmp_path / "other" / "orbite-rdma-host", f"echo {PROTOCOL}")
    mismatches, _ = im.check_controller(manifest, str(out), binary=str(other))
    assert _fields(mismatches) == ["binary.sha256"] and mismatches[0].path == str(other)


def test_controller_requires_observers_the_mode_needs(installation):
    out, manifest = installation
    mismatches, _ = im.check_controller(manifest, str(out), require_observers=["accounting", "cq_fault"])
    assert _fields(mismatches) == ["observers.cq_fault"]
    assert "only the accounting observer" in mismatches[0].found
    with pytest.raises(im.ManifestError, match="require_observers"):
        im.check_controller(manifest, str(out), require_observers=["bogus"])


def test_missing_observers_reads_the_manifest(installation):
    _, manifest = installation
    assert im.missing_observers(manifest, ["accounting"]) == []
    assert im.missing_observers(manifest, ["uverbs_fault"]) == [
        ("uverbs_fault", "only the accounting observer was built in this test")
    ]


# ----------------------------------------------------------------------------------------------
# Node side


def _deploy(out, manifest, node):
    binary = node / "bin" / "orbite-rdma-host"
    binary.parent.mkdir(parents=True)
    shutil.copy2(out / manifest["binary"]["path"], binary)
    observer = node / "lib" / "liborbite_accounting.so"
    observer.parent.mkdir(parents=True)
    shutil.copy2(out / manifest["observers"]["accounting"]["path"], observer)
    return binary, observer


def test_node_accepts_deployed_copies(installation, tmp_path):
    out, manifest = installation
    binary, observer = _deploy(out, manifest, tmp_path / "node")
    mismatches, checked = im.check_node(
        manifest, str(binary), observers={"accounting": str(observer)}, require_observers=["accounting"]
    )
    assert mismatches == []
    assert {"binary", "observers.accounting", "native_libraries", "binary --protocol"} <= set(checked)


def test_node_names_changed_binary_byte(installation, tmp_path):
    out, manifest = installation
    binary, _ = _deploy(out, manifest, tmp_path / "node")
    binary.write_text(binary.read_text().replace("exit 2", "exit 3"))
    mismatches, _ = im.check_node(manifest, str(binary))
    assert _fields(mismatches) == ["binary.sha256"] and mismatches[0].path == str(binary)


def test_node_names_replaced_observer(installation, tmp_path):
    out, manifest = installation
    binary, observer = _deploy(out, manifest, tmp_path / "node")
    observer.write_bytes(b"another library\n")
    mismatches, _ = im.check_node(manifest, str(binary), observers={"accounting": str(observer)})
    assert _fields(mismatches) == ["observers.accounting.sha256"] and mismatches[0].path == str(observer)


def test_node_names_observer_absent_from_manifest_and_undeployed(installation, tmp_path):
    out, manifest = installation
    binary, observer = _deploy(out, manifest, tmp_path / "node")
    mismatches, _ = im.check_node(
        manifest, str(binary), observers={"cq_fault": str(observer)}, require_observers=["accounting"]
    )
    assert sorted(_fields(mismatches)) == ["observers.accounting", "observers.cq_fault"]


def test_node_protocol_answer_is_checked(installation, tmp_path):
    # guards: _check_protocol_answer in check_node
    _, manifest = installation
    wrong = _script(tmp_path / "node" / "orbite-rdma-host", "echo orbite-installed-host-v3")
    manifest["binary"]["sha256"] = _sha(wrong)
    mismatches, _ = im.check_node(manifest, str(wrong))
    assert _fields(mismatches) == ["protocol (binary --protocol)"]
    assert mismatches[0].found == "orbite-installed-host-v3"
    assert im.check_node(manifest, str(wrong), probe=False)[0] == []


def test_probe_reports_exit_status(tmp_path):
    failing = _script(tmp_path / "x", "echo boom >&2; exit 7")
    assert im.probe_protocol(str(failing)) == "exit status 7: boom"


# ----------------------------------------------------------------------------------------------
# Native libraries


LDD_SAMPLE = """\
\tlinux-vdso.so.1 (0x00007fd29aa0a000)
\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007fd29a980000)
\tlibibverbs.so.1 => not found
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007fd29a79e000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007fd29aa0c000)
"""


def test_parse_ldd():
    resolved, unresolved = im.parse_ldd(LDD_SAMPLE)
    assert resolved == [
        ("libgcc_s.so.1", "/lib/x86_64-linux-gnu/libgcc_s.so.1"),
        ("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
        ("ld-linux-x86-64.so.2", "/lib64/ld-linux-x86-64.so.2"),
    ]
    assert unresolved == ["libibverbs.so.1"]
    assert im.parse_ldd("\tstatically linked\n") == ([], [])


ELF = shutil.which("true")


@pytest.mark.skipif(ELF is None or shutil.which("ldd") is None, reason="needs ldd and a dynamic `true`")
def test_node_native_library_checks(tmp_path):
    binary = tmp_path / "true"
    shutil.copy2(ELF, binary)
    libraries, unresolved = im.resolve_native_libraries(str(binary))
    assert unresolved == [] and any(lib["soname"] == "libc.so.6" for lib in libraries)
    for lib in libraries:
        assert lib["sha256"] == hashlib.sha256(open(os.path.realpath(lib["path"]), "rb").read()).hexdigest()
    manifest = {
        "binary": {"path": "true", "sha256": _sha(binary)},
        "native_libraries": libraries,
        "observers": dict.fromkeys(im.OBSERVER_TOOLS),
        "observers_absent_reason": "none",
    }
    assert im.check_node(manifest, str(binary), probe=False)[0] == []

    pinned = copy.deepcopy(manifest)
    libc = next(lib for lib in pinned["native_libraries"] if lib["soname"] == "libc.so.6")
    libc["sha256"] = "0" * 64
    mismatches, _ = im.check_node(pinned, str(binary), probe=False)
    assert _fields(mismatches) == ["native_libraries[libc.so.6].sha256"]
    # guards: `if pin and ...` in _check_native_libraries
    assert im.check_node(pinned, str(binary), probe=False, pin_native_libraries=False)[0] == []

    extra = copy.deepcopy(manifest)
    extra["native_libraries"].append(
        {"soname": "libibverbs.so.1", "path": "/usr/lib/libibverbs.so.1", "sha256": "0" * 64}
    )
    extra["native_libraries"] = [lib for lib in extra["native_libraries"] if lib["soname"] != "libc.so.6"]
    mismatches, _ = im.check_node(extra, str(binary), probe=False)
    assert sorted((m.field, m.found) for m in mismatches) == [
        ("native_libraries[libc.so.6]", libc["path"]),
        ("native_libraries[libibverbs.so.1]", "not needed"),
    ]

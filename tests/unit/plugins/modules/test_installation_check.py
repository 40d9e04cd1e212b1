"""The installation_check module never runs a binary whose hash does not match, and runs only checked bytes.

On main the module recorded the hash mismatch of a tampered binary and then still ran ``ldd`` and
``<binary> --protocol`` on it, as root, on the controller and the node. Here the "binary" is a script
that leaves a marker when it runs, and ``ldd`` on PATH is a wrapper that logs what it was given.
"""

import hashlib
import os
import shutil

import pytest
from helpers.modules import run_module as run_helper
from helpers.paths import COLLECTIONS

PROTOCOL = "orbite-installed-host-v4"


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def world(tmp_path):
    """A binary that marks each run, an ldd wrapper that logs its argument, a manifest pinning the binary."""
    ldd = shutil.which("ldd")
    if ldd is None:
        pytest.skip("needs ldd")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "ldd"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "ldd.log"}\nexec {ldd} "$@"\n')
    wrapper.chmod(0o755)
    binary = tmp_path / "node" / "orbite-rdma-host"
    binary.parent.mkdir()
    binary.write_text(f'#!/bin/sh\necho "$0" >> {tmp_path / "ran.log"}\n'
                      f'[ "$1" = --protocol ] && echo {PROTOCOL} && exit 0; exit 2\n')
    binary.chmod(0o755)
    manifest = {
        "schema": "orbite.installation-manifest", "version": 1, "protocol": PROTOCOL,
        "package": {"name": "orbite", "version": "0.4.0"}, "commit": "a" * 40, "dirty": False, "dirty_paths": [],
        "toolchain": "rustc 1.95.0", "toolchain_name": "stable", "features": ["rdma"],
        "fixture": "tests/hardware/rdma_host",
        "archive": {"path": "a.crate", "sha256": "1" * 64},
        "fixture_modules": [{"path": "consumer/main.rs", "sha256": "2" * 64}],
        "consumer_manifest": {"path": "consumer/Cargo.toml", "sha256": "3" * 64},
        "lockfile": {"path": "consumer/Cargo.lock", "sha256": "4" * 64},
        "binary": {"path": "installed/bin/orbite-rdma-host", "sha256": _sha(binary)},
        "observers": {"accounting": None, "cq_fault": None, "uverbs_fault": None, "inflight_fault": None},
        "observers_absent_reason": "not built in this test", "native_libraries": [],
        "build": {"builder": 1, "fingerprint": "b" * 64},
    }
    env = dict(os.environ, PYTHONPATH=str(COLLECTIONS), PATH=f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    return {"tmp": tmp_path, "binary": binary, "manifest": manifest, "env": env}


def run_module(world, **args):
    return run_helper("installation_check", world["tmp"], args, env=world["env"], timeout=60)


def _log(world, name):
    path = world["tmp"] / name
    return path.read_text().split("\n")[:-1] if path.exists() else []


@pytest.mark.parametrize("scope", ["node", "controller"])
def test_a_tampered_binary_is_never_run_nor_traced(world, scope):
    world["binary"].write_text(world["binary"].read_text().replace("exit 2", "exit 3"))  # one byte changed
    args = {"scope": scope, "manifest_data": world["manifest"], "binary": str(world["binary"])}
    if scope == "controller":
        args["verify_files"] = False
    result = run_module(world, **args)
    assert result["failed"] is True and result["code"] == "installation.mismatch"
    assert [m["field"] for m in result["mismatches"]] == ["binary.sha256"]
    assert "binary --protocol" not in result["checked"] and "native_libraries" not in result["checked"]
    assert _log(world, "ran.log") == [] and _log(world, "ldd.log") == []


def test_a_matching_binary_is_run_and_traced_only_from_its_checked_copy(world):
    result = run_module(world, scope="node", manifest_data=world["manifest"], binary=str(world["binary"]))
    assert result.get("failed") is not True, result
    assert {"binary", "native_libraries", "binary --protocol"} <= set(result["checked"])
    # What ran and what ldd traced is the sealed copy (/proc/self/fd/N), never the path.
    assert _log(world, "ldd.log") and all(a.startswith("/proc/self/fd/") for a in _log(world, "ldd.log"))
    assert _log(world, "ran.log") and all(a.startswith("/proc/self/fd/") for a in _log(world, "ran.log"))

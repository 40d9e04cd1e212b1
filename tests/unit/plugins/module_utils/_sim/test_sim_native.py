"""The simulated lab's native build (provider and observers) and its manifest of pins.

A stand-in collection whose observers/Makefile writes known bytes makes the checks exact and fast;
the real build runs in the simulated runner's tests (tests/fixtures/sim/sim_harness.py uses the same
``build_native``) and in the gate tests.
"""

import hashlib
import json
import os
import shutil
import stat

import pytest
from helpers.modules import run_module

from ansible_collections.orbite.qualification.plugins.module_utils._sim import native

MAKEFILE = """\
OUT ?= build
provider:
\t@mkdir -p $(OUT)/provider
\t@printf 'provider-$(VERSION)' > $(OUT)/provider/libibverbs.so.1
all:
\t@for t in accounting cq_fault uverbs_fault inflight_fault; do printf "$$t" > $(OUT)/liborbite_$$t.so; done
"""
BROKEN = """\
provider all:
\t@echo "observers: cannot build: <infiniband/verbs.h> (Debian package libibverbs-dev) is missing" >&2; exit 1
"""


def _collection(tmp_path, makefile=MAKEFILE):
    root = tmp_path / "collection"
    (root / "observers").mkdir(parents=True)
    (root / "observers" / "Makefile").write_text(makefile)
    return str(root)


def _sha(data):
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(autouse=True)
def _compiler(monkeypatch):
    # The stand-in Makefile compiles nothing: any C compiler name that resolves will do.
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}" if name in ("make", "gcc", "cc") else None)


def test_the_manifest_pins_each_artifact_by_sha256(tmp_path):
    out = tmp_path / "native"
    changed, manifest = native.build_native(_collection(tmp_path), str(out))
    assert changed
    assert manifest["verbs_library"] == {"path": str(out / "provider" / "libibverbs.so.1"),
                                         "sha256": _sha(b"provider-")}
    assert manifest["observers"] == {tool: {"path": str(out / f"liborbite_{tool}.so"), "sha256": _sha(tool.encode())}
                                     for tool in native.TOOLS}
    on_disk = out / "manifest.json"
    assert json.loads(on_disk.read_text()) == manifest and stat.S_IMODE(on_disk.stat().st_mode) == 0o600


def test_a_rebuild_rehashes_and_reports_a_change_only_when_a_byte_changed(tmp_path, monkeypatch):
    collection, out = _collection(tmp_path), str(tmp_path / "native")
    native.build_native(collection, out)
    assert native.build_native(collection, out)[0] is False
    monkeypatch.setenv("VERSION", "2")  # make sees it as a variable: the provider's bytes change
    changed, manifest = native.build_native(collection, out)
    assert changed and manifest["verbs_library"]["sha256"] == _sha(b"provider-2")


def test_a_failed_build_names_what_is_missing(tmp_path):
    with pytest.raises(native.SimNativeError) as err:
        native.build_native(_collection(tmp_path, BROKEN), str(tmp_path / "native"))
    assert "provider all failed (exit 2)" in str(err.value) and "libibverbs-dev" in str(err.value)
    assert not (tmp_path / "native" / "manifest.json").exists()


@pytest.mark.parametrize(("field", "tool"), [("make", "no-such-make"), ("cc", "no-such-cc")])
def test_missing_tools_are_named(tmp_path, field, tool):
    args = {"make": "make", "cc": "gcc", field: tool}
    with pytest.raises(native.SimNativeError) as err:
        native.build_native(_collection(tmp_path), str(tmp_path / "native"), **args)
    assert f"{field}={tool!r}: not found on the controller" in str(err.value)


def test_remove_takes_only_a_build_of_its_own(tmp_path):
    out = tmp_path / "native"
    out.mkdir()
    (out / "keep").write_text("not ours")
    with pytest.raises(native.SimNativeError) as err:
        native.remove_native(str(out))
    assert "the lab did not build it" in str(err.value) and (out / "keep").exists()
    native.build_native(_collection(tmp_path), str(out))
    assert native.remove_native(str(out)) is True and not out.exists()
    assert native.remove_native(str(out)) is False


def test_the_module_builds_and_removes(tmp_path):
    collection, out = _collection(tmp_path), str(tmp_path / "native")
    args = {"collection_dir": collection, "out_dir": out, "cc": "sh"}  # the stand-in compiles nothing
    result = run_module("sim_native", tmp_path, args)
    assert result["changed"] and result["manifest_path"] == os.path.join(out, "manifest.json"), result
    assert result["manifest"]["observers"]["cq_fault"]["sha256"] == _sha(b"cq_fault")
    again = run_module("sim_native", tmp_path, args)
    assert again["changed"] is False
    gone = run_module("sim_native", tmp_path, {"collection_dir": collection, "out_dir": out, "state": "absent"})
    assert gone["changed"] and not os.path.exists(out)
    failed = run_module("sim_native", tmp_path, {"collection_dir": str(tmp_path), "out_dir": out})
    assert failed["failed"] and "has no observers/Makefile" in failed["msg"]

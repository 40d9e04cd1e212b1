"""deploy_artifacts: the run's pinned executables placed on a node in one call, each hashed where it lies against
the plan's pin, private, written only when the node does not hold exactly those bytes already."""

import base64
import hashlib
import os
import stat

import pytest
from helpers.modules import run_module

from ansible_collections.orbite.qualification.plugins.module_utils._run.deploy import (
    DeployError,
    DeployMismatch,
    deploy,
)

ZIPAPP, LIBRARY = b"PK\x03\x04 a zipapp", b"\x7fELF a library"


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def _file(name, dest, data, pin=None):
    return {"name": name, "dest": str(dest), "sha256": pin or hashlib.sha256(data).hexdigest(),
            "content": base64.b64encode(data).decode()}


def test_files_land_private_and_a_second_deploy_writes_nothing(tmp_path):
    run = tmp_path / "var" / "tmp" / "orbite" / "ra-1"
    files = [_file("runner", run / "orbite-sim-runner.pyz", ZIPAPP),
             _file("verbs_library", run / "native" / "libibverbs.so.1", LIBRARY)]
    placed = deploy(files)
    assert [(p["name"], p["changed"]) for p in placed] == [("runner", True), ("verbs_library", True)]
    assert (run / "orbite-sim-runner.pyz").read_bytes() == ZIPAPP
    assert (run / "native" / "libibverbs.so.1").read_bytes() == LIBRARY
    assert _mode(run / "orbite-sim-runner.pyz") == _mode(run / "native" / "libibverbs.so.1") == 0o600
    assert _mode(run) == _mode(run / "native") == _mode(tmp_path / "var") == 0o700
    assert [p["changed"] for p in deploy(files)] == [False, False]


def test_a_file_that_is_not_the_plans_build_is_refused_by_name(tmp_path):
    pin = hashlib.sha256(b"the build the plan pinned").hexdigest()
    files = [_file("runner", tmp_path / "runner.pyz", ZIPAPP),
             dict(_file("accounting", tmp_path / "native" / "liborbite_accounting.so", LIBRARY, pin),
                  src="/lab/native/liborbite_accounting.so")]
    with pytest.raises(DeployMismatch) as caught:
        deploy(files)
    message = str(caught.value)
    assert f"accounting {tmp_path}/native/liborbite_accounting.so has sha256 {hashlib.sha256(LIBRARY).hexdigest()}" \
        in message and f"the run's plan pins {pin} (/lab/native/liborbite_accounting.so)" in message
    assert message.endswith("a build that is not the run's never runs") and "runner" not in message
    assert [p["name"] for p in caught.value.details["placed"]] == ["runner"]


def test_a_link_where_a_file_goes_is_replaced_never_written_through(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(ZIPAPP)  # the right bytes, but behind a link
    os.symlink(target, tmp_path / "runner.pyz")
    (placed,) = deploy([_file("runner", tmp_path / "runner.pyz", ZIPAPP)])
    assert placed["changed"] and not os.path.islink(tmp_path / "runner.pyz")
    assert target.read_bytes() == ZIPAPP and (tmp_path / "runner.pyz").read_bytes() == ZIPAPP


@pytest.mark.parametrize(("change", "message"), [
    ({"dest": "relative/runner.pyz"}, r"files\[0\]\.dest='relative/runner\.pyz': must be an absolute path"),
    ({"sha256": "ABC"}, r"files\[0\]\.sha256='ABC': must be 64 lower-case hex digits"),
    ({"content": "not base64!"}, r"files\[0\]\.content: is not base64"),
])
def test_bad_input_is_named(tmp_path, change, message):
    with pytest.raises(DeployError, match=message):
        deploy([dict(_file("runner", tmp_path / "runner.pyz", ZIPAPP), **change)])
    assert not (tmp_path / "runner.pyz").exists()


def test_the_module_in_check_mode_writes_nothing_and_fails_by_code(tmp_path):
    item = dict(_file("runner", tmp_path / "run" / "runner.pyz", ZIPAPP), src="/controller/runner.pyz")
    checked = run_module("deploy_artifacts", tmp_path, {"files": [item], "_ansible_check_mode": True})
    assert checked["changed"] is True and not (tmp_path / "run").exists()
    assert "a zipapp" not in str(checked)  # the bytes are never echoed back
    bad = run_module("deploy_artifacts", tmp_path, {"files": [dict(item, sha256="0" * 64)]})
    assert bad["failed"] and bad["code"] == "deploy.mismatch" and "never runs" in bad["msg"]
